//! Stage-parallel cyclic training (`flatmem/cyclic_stages.h`): L ranks, one
//! per model stage, serve N staggered micro-batches back to back.
//!
//! Micro-batch m of a training step follows the cyclic schedule of
//! data-parallel rank m of N ([`Cyclic`](crate::cyclic::Cyclic) with N
//! ranks), so the micro-batches reach stage j one after another and rank j
//! serves all of them: L ranks do what data parallelism times model
//! parallelism does on N * L. Each stage's parameters live once, on its
//! rank; its gradient is summed locally (no all-reduce); only the boundary
//! tensors (activations forward, their gradients backward) travel.
//!
//! The schedule ([`StageSchedule`], pure): L stages, N micro-batches, S
//! steps, all times global time steps,
//!
//! ```text
//! offset(m) = floor(m 2L / N)            (every rule)
//! period P  = 2L (Delay1, Newest);  2L + offset(N-1) (Sync: the pipeline drains)
//! forward  of stage j for (m, s) at  offset(m) + P s + j
//! backward of stage j for (m, s) at  offset(m) + P s + 2L - 1 - j
//! ```
//!
//! Stage j runs every action scheduled for it at a time step (0, 1 or
//! more), backwards first, then forwards, each by ascending micro-batch.
//! Forward and backward of (m, s) at stage j use parameter version
//! `max(0, s - delay)`, delay 0 (Sync), 1 (Delay1) or the data-parallel
//! Newest delay of rank m at stage j, so the training equals
//! [`Cyclic`](crate::cyclic::Cyclic) on N ranks bit for bit (Delay1,
//! Newest). Version v = the stage parameters after the averages of steps
//! 0 .. v-1; keep K = [`versions_kept`](StageSchedule::versions_kept) of
//! them (version v in slot v % K).
//!
//! The runtime, [`CyclicStages`], drives one stage rank over a
//! [`Communicator`]; see the header for the failure rules (every wait
//! bounded by the timeout; a dead or wedged neighbour fails the others
//! naming stage, micro-batch, step and peer, and poisons the communicator).
//! Tensors are slices on the host by default; with [`Memory::Cuda`] they
//! are buffers of the communicator's CUDA device ([`DeviceBuffer`], through
//! the unsafe `*_stream` calls on a `cudaStream_t`) moved over NCCL.

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::time::Duration;

use crate::comm::Communicator;
use crate::convert::{entries, int32, int64, timeout_ms};
use crate::cyclic::{ActionKind, Memory, Rule};
use crate::error::{check, Error, Result, Status};
use crate::handle::{HandleKind, OwnedHandle};
use crate::sys;
use crate::tensor::{Desc, DeviceBuffer, Element};
use crate::version::check_version;

/// `FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT` (no `*_init` function exists;
/// compared with the compiler's expansion by `tests/header_macros.rs`).
pub const STAGES_SCHEDULE_INIT: sys::flatmem_cyclic_stages_schedule = sys::flatmem_cyclic_stages_schedule {
    struct_size: std::mem::size_of::<sys::flatmem_cyclic_stages_schedule>(),
    stages: 0,
    micro_batches: 0,
    steps: 0,
    rule: sys::FLATMEM_CYCLIC_DELAY1,
    reserved0: 0,
};

/// One action of one stage rank (`flatmem_cyclic_stages_action`; the C
/// side's -1 "none" values are `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StageAction {
    /// The global time step it belongs to (several actions may share one).
    pub time_step: u64,
    /// Forward, Backward, Idle (an update only, after the last step) or Done.
    pub kind: ActionKind,
    /// The stage (= the rank); None for Done.
    pub stage: Option<usize>,
    /// Forward / backward: micro-batch 0 .. N-1 and step 0 .. S-1.
    pub micro_batch: Option<usize>,
    pub step: Option<u64>,
    /// Forward / backward: the parameter version to use (slot version % K).
    pub version: Option<u64>,
    /// Before the action, form version `update_step + 1` from version
    /// `update_step` and the average of step `update_step`.
    pub update_step: Option<u64>,
    /// Call [`CyclicStages::receive`] before computing (the activation from
    /// stage - 1 for a forward, the output gradient from stage + 1 for a
    /// backward).
    pub receives: bool,
    /// Call [`CyclicStages::send`] after computing.
    pub sends: bool,
    /// (Every backward) call [`CyclicStages::accumulate`].
    pub accumulates: bool,
    /// Micro-batches whose activations the stage holds during the time step.
    pub activations_held: usize,
    /// This action's place among its time step's actions, and their number.
    pub index_in_time_step: usize,
    pub actions_in_time_step: usize,
}

impl StageAction {
    /// From the C struct; an action kind this crate does not know is an
    /// `Internal` error.
    pub fn from_raw(raw: &sys::flatmem_cyclic_stages_action) -> Result<StageAction> {
        let kind = ActionKind::from_raw(raw.kind).ok_or_else(|| {
            Error::new(Status::Internal, format!("action.kind: {} is not a flatmem_cyclic_action_kind", raw.kind))
        })?;
        let index = |v: i32| usize::try_from(v).ok();
        let count = |v: i64| u64::try_from(v).ok();
        Ok(StageAction {
            time_step: count(raw.time_step).unwrap_or(0),
            kind,
            stage: index(raw.stage),
            micro_batch: index(raw.micro_batch),
            step: count(raw.step),
            version: count(raw.version),
            update_step: count(raw.update_step),
            receives: raw.receives != 0,
            sends: raw.sends != 0,
            accumulates: raw.accumulates != 0,
            activations_held: index(raw.activations_held).unwrap_or(0),
            index_in_time_step: index(raw.index_in_time_step).unwrap_or(0),
            actions_in_time_step: index(raw.actions_in_time_step).unwrap_or(0),
        })
    }
}

/// Steady-state occupancy of one stage rank (`flatmem_cyclic_stages_occupancy`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Occupancy {
    /// Fraction of a period's time steps with at least one action.
    pub busy_fraction: f64,
    /// Actions per time step, largest.
    pub peak_actions: usize,
    /// Micro-batches whose activations the stage holds: largest, and mean
    /// over a period (N (2L - 2j) / P).
    pub peak_activations_held: usize,
    pub mean_activations_held: f64,
}

/// The shape of a stage-parallel schedule (`flatmem_cyclic_stages_schedule`):
/// L stages (= ranks), N micro-batches per step, S steps, the rule. Checked
/// by the library when made (L 1 .. 65535, N 1 .. 65535, S 1 .. 2^40);
/// every query is then a pure function of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StageSchedule {
    stages: usize,
    micro_batches: usize,
    steps: u64,
    rule: Rule,
    length: u64,
    period: u64,
}

impl StageSchedule {
    /// Fails with `InvalidArgument` naming the field
    /// (`schedule.micro_batches: 0; expected 1 .. 65535`).
    pub fn new(stages: usize, micro_batches: usize, steps: u64, rule: Rule) -> Result<StageSchedule> {
        check_version()?;
        let raw = sys::flatmem_cyclic_stages_schedule {
            stages: int32("schedule.stages", stages)?,
            micro_batches: int32("schedule.micro_batches", micro_batches)?,
            steps: int64("schedule.steps", steps)?,
            rule: rule.raw(),
            ..STAGES_SCHEDULE_INIT
        };
        let (mut length, mut period) = (0i64, 0i64);
        // SAFETY: a valid schedule struct and writable outputs.
        check(unsafe { sys::flatmem_cyclic_stages_schedule_length(&raw, &mut length) })?;
        // SAFETY: as above.
        check(unsafe { sys::flatmem_cyclic_stages_schedule_period(&raw, &mut period) })?;
        Ok(StageSchedule { stages, micro_batches, steps, rule, length: length as u64, period: period as u64 })
    }

    /// From the C struct (checked as [`new`](StageSchedule::new) checks).
    pub fn from_raw(raw: &sys::flatmem_cyclic_stages_schedule) -> Result<StageSchedule> {
        let rule = Rule::from_raw(raw.rule)
            .ok_or_else(|| Error::invalid(format!("schedule.rule: {} is not a flatmem_cyclic_rule", raw.rule)))?;
        let n = |v: i32| usize::try_from(v).unwrap_or(0);
        StageSchedule::new(n(raw.stages), n(raw.micro_batches), u64::try_from(raw.steps).unwrap_or(0), rule)
    }

    /// L.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// N.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// S.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// The C struct.
    pub fn to_raw(&self) -> sys::flatmem_cyclic_stages_schedule {
        // The fields fit: new() converted them.
        sys::flatmem_cyclic_stages_schedule {
            stages: self.stages as i32,
            micro_batches: self.micro_batches as i32,
            steps: self.steps as i64,
            rule: self.rule.raw(),
            ..STAGES_SCHEDULE_INIT
        }
    }

    /// Time steps of the whole run, `B(0, N-1, S-1) + 2`
    /// (`flatmem_cyclic_stages_schedule_length`): time steps `0 .. length()`.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// P: time steps per training step (`flatmem_cyclic_stages_schedule_period`).
    pub fn period(&self) -> u64 {
        self.period
    }

    /// offset(m) = floor(m 2L / N) time steps.
    pub fn offset(&self, micro_batch: usize) -> Result<u64> {
        let m = int32("micro_batch", micro_batch)?;
        let mut offset = 0i64;
        // SAFETY: a valid schedule and a writable output.
        check(unsafe { sys::flatmem_cyclic_stages_schedule_offset(&self.to_raw(), m, &mut offset) })?;
        Ok(offset as u64)
    }

    /// K: parameter versions `stage` keeps (slot v % K), 1 or 2.
    pub fn versions_kept(&self, stage: usize) -> Result<usize> {
        let stage = int32("stage", stage)?;
        let mut kept = 0i32;
        // SAFETY: a valid schedule and a writable output.
        check(unsafe { sys::flatmem_cyclic_stages_schedule_versions_kept(&self.to_raw(), stage, &mut kept) })?;
        Ok(kept as usize)
    }

    /// The actions of `stage` at `time_step`, in the order the runtime
    /// returns them (none for a time step without actions, and at and after
    /// [`length`](StageSchedule::length)).
    pub fn actions(&self, stage: usize, time_step: u64) -> Result<Vec<StageAction>> {
        let (stage, time_step) = (int32("stage", stage)?, int64("time_step", time_step)?);
        let raw = self.to_raw();
        let size = std::mem::size_of::<sys::flatmem_cyclic_stages_action>();
        let mut count = 0i32;
        // SAFETY: capacity 0 with no array asks for the count.
        check(unsafe {
            sys::flatmem_cyclic_stages_schedule_actions(
                &raw,
                stage,
                time_step,
                std::ptr::null_mut(),
                size,
                0,
                &mut count,
            )
        })?;
        let mut all = vec![sys::flatmem_cyclic_stages_action::default(); count.max(0) as usize];
        // SAFETY: room for `count` actions of `size` bytes.
        check(unsafe {
            sys::flatmem_cyclic_stages_schedule_actions(
                &raw,
                stage,
                time_step,
                all.as_mut_ptr(),
                size,
                count,
                &mut count,
            )
        })?;
        all.truncate(count.max(0) as usize);
        all.iter().map(StageAction::from_raw).collect()
    }

    /// Every action of `stage` over the run, time step after time step
    /// (what [`CyclicStages::next`] returns on that rank, Done excluded).
    pub fn timeline(&self, stage: usize) -> Result<Vec<StageAction>> {
        let mut all = Vec::new();
        for t in 0..self.length {
            all.extend(self.actions(stage, t)?);
        }
        Ok(all)
    }

    /// Steady-state occupancy of `stage`.
    pub fn occupancy(&self, stage: usize) -> Result<Occupancy> {
        let stage = int32("stage", stage)?;
        let mut o = sys::flatmem_cyclic_stages_occupancy::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_stages_occupancy>();
        // SAFETY: a valid schedule and a writable output of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_stages_schedule_occupancy(&self.to_raw(), stage, &mut o, size) })?;
        Ok(Occupancy {
            busy_fraction: o.busy_fraction,
            peak_actions: o.peak_actions.max(0) as usize,
            peak_activations_held: o.peak_activations_held.max(0) as usize,
            mean_activations_held: o.mean_activations_held,
        })
    }
}

/// Options of a [`CyclicStages`] runtime (`flatmem_cyclic_stages_options`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagesOptions {
    stages: usize,
    micro_batches: usize,
    steps: u64,
    rule: Rule,
    boundary_bytes: Vec<i64>,
    activation_bytes: Option<Vec<i64>>,
    timeout: Option<Duration>,
    history: usize,
    memory: Memory,
}

impl StagesOptions {
    /// L `stages` (= the communicator's size), N `micro_batches` per step,
    /// S `steps`, the rule, and `boundary_bytes` (L - 1 entries: [j] = the
    /// largest bytes crossing the boundary between stages j and j + 1, an
    /// activation or its gradient; staging is sized by it). The rest
    /// defaults (1 byte of activations per micro-batch, the communicator's
    /// timeout, 65536 time steps of statistics).
    pub fn new(stages: usize, micro_batches: usize, steps: u64, rule: Rule, boundary_bytes: Vec<i64>) -> StagesOptions {
        StagesOptions {
            stages,
            micro_batches,
            steps,
            rule,
            boundary_bytes,
            activation_bytes: None,
            timeout: None,
            history: 0,
            memory: Memory::Host,
        }
    }

    /// Where the tensors live: [`Memory::Host`] (default: slices) or
    /// [`Memory::Cuda`] ([`DeviceBuffer`]s through the `*_stream` calls,
    /// after [`Communicator::init_device`] on every rank; `Unsupported` from
    /// a flatmem built without NCCL). Every rank passes the same.
    pub fn memory(mut self, memory: Memory) -> StagesOptions {
        self.memory = memory;
        self
    }

    /// Bytes of activations stage j keeps per micro-batch (L entries, for
    /// the statistics only).
    pub fn activation_bytes(mut self, bytes: Vec<i64>) -> StagesOptions {
        self.activation_bytes = Some(bytes);
        self
    }

    /// The deadline of every wait (None = the communicator's default).
    pub fn timeout(mut self, timeout: Duration) -> StagesOptions {
        self.timeout = Some(timeout);
        self
    }

    /// Time steps of per-time-step statistics kept (0 = 65536).
    pub fn history(mut self, time_steps: usize) -> StagesOptions {
        self.history = time_steps;
        self
    }

    fn to_raw(&self) -> Result<sys::flatmem_cyclic_stages_options> {
        let mut raw = sys::flatmem_cyclic_stages_options::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_stages_options>();
        // SAFETY: a writable options struct of this declaration, of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_stages_options_init(&mut raw, size) })?;
        raw.stages = int32("options.stages", self.stages)?;
        raw.micro_batches = int32("options.micro_batches", self.micro_batches)?;
        raw.steps = int64("options.steps", self.steps)?;
        raw.rule = self.rule.raw();
        raw.boundary_bytes = entries(
            "options.boundary_bytes",
            &self.boundary_bytes,
            self.stages.saturating_sub(1),
            "one per boundary between stages, stages - 1",
        )?;
        if let Some(bytes) = &self.activation_bytes {
            raw.activation_bytes = entries("options.activation_bytes", bytes, self.stages, "one per stage")?;
        }
        raw.timeout_ms = timeout_ms("options.timeout", self.timeout)?;
        raw.history = int64("options.history", self.history as u64)?;
        raw.memory = self.memory.raw();
        Ok(raw)
    }
}

pub(crate) struct StagesKind;

impl HandleKind for StagesKind {
    type Raw = sys::flatmem_cyclic_stages_t;
    const NAME: &'static str = "flatmem_cyclic_stages";
    unsafe fn destroy(raw: *mut Self::Raw) -> sys::flatmem_status {
        // SAFETY: forwarded from the caller.
        unsafe { sys::flatmem_cyclic_stages_destroy(raw) }
    }
}

/// The stage-parallel runtime of this stage rank (`flatmem_cyclic_stages_t`;
/// rank j runs stage j) over a communicator it borrows, with stage
/// gradients of element type `T` (`f32` or `f64`). Drive it as the header
/// says:
///
/// ```no_run
/// # use flatmem::cyclic::{ActionKind, Rule};
/// # use flatmem::cyclic_stages::{CyclicStages, StagesOptions};
/// # fn f(comm: &flatmem::Communicator, mut slots: Vec<Vec<f32>>, lr: f32,
/// #      forward: impl Fn(&[f32], &[f32]) -> Vec<f32>,
/// #      backward: impl Fn(&[f32], &[f32]) -> (Vec<f32>, Vec<f32>)) -> flatmem::Result<()> {
/// let options = StagesOptions::new(comm.world_size(), 8, 100, Rule::Delay1, vec![4096; comm.world_size() - 1]);
/// let mut h = CyclicStages::<f32>::new(comm, &options)?;
/// let k = h.schedule().versions_kept(h.stage())?;
/// let (mut x, mut dy) = (vec![0f32; 1024], vec![0f32; 1024]);
/// loop {
///     let a = h.next()?;
///     if a.kind == ActionKind::Done { break; }
///     if let Some(v) = a.update_step {          // version v + 1 from version v
///         let average = h.average()?;
///         let next: Vec<f32> = slots[v as usize % k].iter().zip(&average).map(|(w, g)| w - lr * g).collect();
///         slots[(v as usize + 1) % k] = next;
///     }
///     let w = a.version.map(|v| &slots[v as usize % k]);
///     if a.kind == ActionKind::Forward {
///         if a.receives { h.receive(&mut x)?; }
///         let y = forward(w.unwrap(), &x);       // keep what the backward needs
///         if a.sends { h.send(&y)?; }
///     } else if a.kind == ActionKind::Backward {
///         if a.receives { h.receive(&mut dy)?; }
///         let (gradient, dx) = backward(w.unwrap(), &dy);
///         h.accumulate(&gradient)?;
///         if a.sends { h.send(&dx)?; }
///     }
/// }
/// # Ok(()) }
/// ```
///
/// Tensors are slices on the CPU: `send` and `accumulate` copy theirs,
/// `receive` and `average` write theirs before returning, so the runtime
/// keeps no caller memory (with [`Memory::Cuda`], device buffers through
/// the unsafe [`send_stream`](CyclicStages::send_stream),
/// [`receive_stream`](CyclicStages::receive_stream),
/// [`accumulate_stream`](CyclicStages::accumulate_stream) and
/// [`average_stream`](CyclicStages::average_stream), whose copies run on
/// the caller's stream). Calls out of order (a `next` while the current
/// action's receive, send or accumulate is missing, a second send, an
/// `average` outside an update) fail with `InvalidArgument` and change
/// nothing. It borrows the communicator, so it cannot outlive it, and like
/// the crate's other users of a communicator it is neither `Send` nor
/// `Sync` (the communicator is driven by one thread).
///
/// ```compile_fail
/// # use flatmem::{CommOptions, Communicator};
/// # use flatmem::cyclic::Rule;
/// # use flatmem::cyclic_stages::{CyclicStages, StagesOptions};
/// let h = {
///     let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
///     CyclicStages::<f32>::new(&comm, &StagesOptions::new(1, 1, 1, Rule::Sync, vec![])).unwrap()
/// }; // error: `comm` dropped while the runtime still borrows it
/// # drop(h);
/// ```
///
/// ```compile_fail
/// # use flatmem::{CommOptions, Communicator};
/// # use flatmem::cyclic::Rule;
/// # use flatmem::cyclic_stages::{CyclicStages, StagesOptions};
/// fn to_another_thread<T: Send>(_: T) {}
/// let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
/// let h = CyclicStages::<f32>::new(&comm, &StagesOptions::new(1, 1, 1, Rule::Sync, vec![])).unwrap();
/// to_another_thread(h); // error: not Send
/// ```
pub struct CyclicStages<'c, T: Element> {
    handle: OwnedHandle<StagesKind>,
    schedule: StageSchedule,
    stage: usize,
    /// Elements of the first accumulated gradient: `average()`'s length.
    gradient_len: Option<usize>,
    _comm: PhantomData<&'c Communicator>,
    _element: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for CyclicStages<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CyclicStages").field("schedule", &self.schedule).field("stage", &self.stage).finish()
    }
}

impl<'c, T: Element> CyclicStages<'c, T> {
    /// Creates this stage rank's runtime (collective over `comm`: every rank
    /// passes the same stages, micro-batches, steps, rule and boundary
    /// bytes, else `InvalidArgument` on every rank naming the first rank and
    /// field that differ). Allocates the staging and posts the first
    /// receives. One cyclic runtime per communicator at a time.
    pub fn new(comm: &'c Communicator, options: &StagesOptions) -> Result<CyclicStages<'c, T>> {
        let raw = options.to_raw()?;
        // SAFETY: a live communicator that outlives the handle ('c), valid
        // options (the arrays copied by create).
        let handle = OwnedHandle::create(|out| unsafe { sys::flatmem_cyclic_stages_create(out, comm.as_raw(), &raw) })?;
        let mut schedule = STAGES_SCHEDULE_INIT;
        let size = std::mem::size_of::<sys::flatmem_cyclic_stages_schedule>();
        // SAFETY: a live handle and a writable schedule of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_stages_get_schedule(handle.as_ptr(), &mut schedule, size) })?;
        Ok(CyclicStages {
            handle,
            schedule: StageSchedule::from_raw(&schedule)?,
            stage: comm.rank(),
            gradient_len: None,
            _comm: PhantomData,
            _element: PhantomData,
        })
    }

    /// The schedule with its pure queries.
    pub fn schedule(&self) -> &StageSchedule {
        &self.schedule
    }

    /// This rank's stage.
    pub fn stage(&self) -> usize {
        self.stage
    }

    /// The next action of this stage (`flatmem_cyclic_stages_next`; time
    /// steps without actions are skipped). `InvalidArgument`, without
    /// advancing, while the current action's receive, send or accumulate is
    /// missing. Before Done it waits (at most the timeout) until this rank's
    /// sends have left; Done again on every later call.
    #[allow(clippy::should_implement_trait)] // fallible, not an Iterator
    pub fn next(&mut self) -> Result<StageAction> {
        let mut raw = sys::flatmem_cyclic_stages_action::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_stages_action>();
        // SAFETY: a live handle and a writable action of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_stages_next(self.handle.as_mut_ptr(), &mut raw, size) })?;
        StageAction::from_raw(&raw)
    }

    /// Sends the current action's boundary tensor (its `sends`, once): at
    /// most the boundary's `boundary_bytes`. Copied; may wait (at most the
    /// timeout) only when every staging buffer is still in flight.
    pub fn send<U: Element>(&mut self, tensor: &[U]) -> Result<()> {
        let mut desc = Desc::elements(tensor, "tensor")?;
        let t = desc.dl();
        // SAFETY: a live handle; the tensor is read during the call only.
        check(unsafe { sys::flatmem_cyclic_stages_send(self.handle.as_mut_ptr(), t.ptr()) })
    }

    /// Receives the current action's boundary tensor (its `receives`, once)
    /// into `into`, which must have exactly the sent bytes (else
    /// `InvalidArgument` naming both sizes, and the handle and communicator
    /// are poisoned). Waits at most the timeout; nothing is written on error.
    pub fn receive<U: Element>(&mut self, into: &mut [U]) -> Result<()> {
        let mut desc = Desc::elements_mut(into, "into")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; `into` is written during the call only.
        check(unsafe { sys::flatmem_cyclic_stages_receive(self.handle.as_mut_ptr(), t.mut_ptr()) })
    }

    /// Adds the current backward's stage gradient (once) into its step's
    /// accumulator: at least one element, the same length every time. Copied.
    pub fn accumulate(&mut self, gradient: &[T]) -> Result<()> {
        let mut desc = Desc::elements(gradient, "gradient")?;
        let t = desc.dl();
        // SAFETY: a live handle; the gradient is read during the call only.
        check(unsafe { sys::flatmem_cyclic_stages_accumulate(self.handle.as_mut_ptr(), t.ptr()) })?;
        self.gradient_len.get_or_insert(gradient.len());
        Ok(())
    }

    /// Copies the average of the current action's `update_step` (only while
    /// it is `Some`) into `out` (the accumulated length):
    /// `((g_0 + g_1) + ... + g_{N-1}) * fl(1/N)`.
    pub fn average_into(&self, out: &mut [T]) -> Result<()> {
        let mut desc = Desc::elements_mut(out, "out")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; `out` is written during the call only.
        check(unsafe { sys::flatmem_cyclic_stages_average(self.handle.as_ptr(), t.mut_ptr()) })
    }

    // The device calls (Memory::Cuda). Each is its host twin on a
    // `cudaStream_t`: the copies are enqueued on `stream` (null = the legacy
    // default stream), so, as for any work of the caller's on that stream,
    // the runtime keeps no buffer past the call. On a Memory::Host runtime
    // the library refuses a device buffer (`InvalidArgument` naming
    // `options.memory`) and changes nothing.
    //
    // Safety, for all four: `data` points to `len` elements in memory of
    // CUDA device `cuda_device`, allocated (and, for the one written, not
    // read or written by other streams) until the work enqueued on `stream`
    // by the call has run; `stream` is a live `cudaStream_t` of that
    // device, or null.

    /// [`send`](CyclicStages::send) of a device buffer
    /// (`flatmem_cyclic_stages_send_stream`): the tensor is the caller's
    /// again for the work enqueued after the call on `stream`.
    ///
    /// # Safety
    ///
    /// See the device calls' rule above (the buffer is read on `stream`).
    pub unsafe fn send_stream<U: Element>(&mut self, tensor: DeviceBuffer<U>, stream: *mut c_void) -> Result<()> {
        let mut desc = Desc::cuda_elements(tensor, "tensor")?;
        let t = desc.dl();
        // SAFETY: a live handle; the caller vouches for the device memory and the stream.
        check(unsafe { sys::flatmem_cyclic_stages_send_stream(self.handle.as_mut_ptr(), t.ptr(), stream) })
    }

    /// [`receive`](CyclicStages::receive) into a device buffer
    /// (`flatmem_cyclic_stages_receive_stream`): waits on the host (at most
    /// the timeout) for the arrival, then enqueues the copy on `stream`.
    ///
    /// # Safety
    ///
    /// See the device calls' rule above (the buffer is written on `stream`).
    pub unsafe fn receive_stream<U: Element>(&mut self, into: DeviceBuffer<U>, stream: *mut c_void) -> Result<()> {
        let mut desc = Desc::cuda_elements(into, "into")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; the caller vouches for the device memory and the stream.
        check(unsafe { sys::flatmem_cyclic_stages_receive_stream(self.handle.as_mut_ptr(), t.mut_ptr(), stream) })
    }

    /// [`accumulate`](CyclicStages::accumulate) of a device gradient
    /// (`flatmem_cyclic_stages_accumulate_stream`), enqueued on `stream`.
    ///
    /// # Safety
    ///
    /// See the device calls' rule above (the buffer is read on `stream`).
    pub unsafe fn accumulate_stream(&mut self, gradient: DeviceBuffer<T>, stream: *mut c_void) -> Result<()> {
        let mut desc = Desc::cuda_elements(gradient, "gradient")?;
        let t = desc.dl();
        // SAFETY: a live handle; the caller vouches for the device memory and the stream.
        check(unsafe { sys::flatmem_cyclic_stages_accumulate_stream(self.handle.as_mut_ptr(), t.ptr(), stream) })?;
        self.gradient_len.get_or_insert(gradient.len);
        Ok(())
    }

    /// [`average_into`](CyclicStages::average_into) a device buffer
    /// (`flatmem_cyclic_stages_average_stream`), enqueued on `stream`: order
    /// it after the accumulates (the same stream, or the caller's own
    /// synchronisation).
    ///
    /// # Safety
    ///
    /// See the device calls' rule above (the buffer is written on `stream`).
    pub unsafe fn average_stream(&self, out: DeviceBuffer<T>, stream: *mut c_void) -> Result<()> {
        let mut desc = Desc::cuda_elements(out, "out")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; the caller vouches for the device memory and the stream.
        check(unsafe { sys::flatmem_cyclic_stages_average_stream(self.handle.as_ptr(), t.mut_ptr(), stream) })
    }

    /// [`average_into`](CyclicStages::average_into) a new vector.
    pub fn average(&self) -> Result<Vec<T>>
    where
        T: Default,
    {
        let len = self.gradient_len.ok_or_else(|| {
            Error::invalid("cyclic stages average: no gradient was accumulated yet, so there is no average")
        })?;
        let mut out = vec![T::default(); len];
        self.average_into(&mut out)?;
        Ok(out)
    }

    /// Statistics of the time steps still kept (the last `history` begun),
    /// oldest first (`flatmem_cyclic_stages_stats`).
    pub fn stats(&self) -> Result<Vec<sys::flatmem_cyclic_stages_time_step_stats>> {
        let count = self.summary()?.time_steps.max(0);
        let mut stats = vec![sys::flatmem_cyclic_stages_time_step_stats::default(); count as usize];
        let mut written = 0i64;
        let size = std::mem::size_of::<sys::flatmem_cyclic_stages_time_step_stats>();
        // SAFETY: room for `count` entries of `size` bytes.
        check(unsafe {
            sys::flatmem_cyclic_stages_stats(self.handle.as_ptr(), 0, count, stats.as_mut_ptr(), size, &mut written)
        })?;
        stats.truncate(written.max(0) as usize);
        Ok(stats)
    }

    /// Totals since create (`flatmem_cyclic_stages_summary_get`).
    pub fn summary(&self) -> Result<sys::flatmem_cyclic_stages_summary> {
        let mut summary = sys::flatmem_cyclic_stages_summary::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_stages_summary>();
        // SAFETY: a live handle and a writable summary of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_stages_summary_get(self.handle.as_ptr(), &mut summary, size) })?;
        Ok(summary)
    }
}
