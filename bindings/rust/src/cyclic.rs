//! The schedule of cyclic data parallelism (`flatmem/cyclic.h`) as pure
//! queries: each rank's offset, the update delays, the length of a run and
//! what any rank does at any global time step, as the library computes them
//! (`flatmem_cyclic_schedule_*`: closed forms, thread-safe, no handle).
//!
//! N ranks train a model cut into L stages; one training step of a rank is
//! 2L time steps (forward of stages 0 .. L-1, then backward of L-1 .. 0), and
//! rank r starts `offset(r) = floor(r * 2L / N)` time steps after rank 0 (0
//! for every rank under [`Rule::Sync`]). The averaged gradient of step s is
//! applied to stage j before its forward in step `s + 1 + delay(r, j)`; see
//! the header for the rules and the activation accounting.
//!
//! The runtime, [`Cyclic`] (`flatmem_cyclic_create` / `next` / `reduce` /
//! `stats` / `summary_get`), drives one rank of such a run over a
//! [`Communicator`]: it says what to do in each time step and averages each
//! stage's gradient over the ranks in the background. Gradients are `Vec`s
//! on the host by default; with [`Memory::Cuda`] they are buffers of the
//! communicator's CUDA device ([`DeviceGradient`], handed over with the
//! unsafe [`Cyclic::reduce_stream`]) averaged over NCCL; relayed shards and
//! full stages are then device buffers too (the unsafe
//! [`Cyclic::set_shard_stream`] / [`Cyclic::parameters_stream`], N <= 2L).

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::time::Duration;

use crate::comm::Communicator;
use crate::contrastive::NonFinite;
use crate::convert::{entries, int32, int64, timeout_ms};
use crate::error::{check, Error, Result, Status};
use crate::handle::{HandleKind, OwnedHandle};
use crate::sys;
use crate::tensor::{Desc, DeviceBuffer, Element};
use crate::version::check_version;

/// `FLATMEM_CYCLIC_SCHEDULE_INIT` (the header's initialiser macro, which has
/// no `*_init` function and which bindgen does not translate; compared with
/// the compiler's expansion by `tests/header_macros.rs`).
pub const SCHEDULE_INIT: sys::flatmem_cyclic_schedule = sys::flatmem_cyclic_schedule {
    struct_size: std::mem::size_of::<sys::flatmem_cyclic_schedule>(),
    world_size: 0,
    stages: 0,
    steps: 0,
    rule: sys::FLATMEM_CYCLIC_DELAY1,
    reserved0: 0,
};

/// How the averaged gradients are applied (`flatmem_cyclic_rule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Rule {
    /// Staggered ranks; every stage applies the previous step's average
    /// (delay 1 everywhere, so every rank holds the same parameters). Default.
    #[default]
    Delay1,
    /// Staggered ranks; a stage applies this step's average where the
    /// schedule lets it arrive in time (delay 0), else the previous one's.
    Newest,
    /// No stagger, an all-reduce at the end of each step (delay 0): plain
    /// data parallelism, the baseline.
    Sync,
}

impl Rule {
    /// The C value.
    pub fn raw(self) -> sys::flatmem_cyclic_rule {
        match self {
            Rule::Delay1 => sys::FLATMEM_CYCLIC_DELAY1,
            Rule::Newest => sys::FLATMEM_CYCLIC_NEWEST,
            Rule::Sync => sys::FLATMEM_CYCLIC_SYNC,
        }
    }

    /// The rule of a C value; None for a value this crate does not know.
    pub fn from_raw(raw: sys::flatmem_cyclic_rule) -> Option<Rule> {
        match raw {
            sys::FLATMEM_CYCLIC_DELAY1 => Some(Rule::Delay1),
            sys::FLATMEM_CYCLIC_NEWEST => Some(Rule::Newest),
            sys::FLATMEM_CYCLIC_SYNC => Some(Rule::Sync),
            _ => None,
        }
    }
}

/// What a rank does in a time step (`flatmem_cyclic_action_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    /// Before the rank's offset, between its last step and its last update,
    /// or an update-only time step.
    Idle,
    Forward,
    Backward,
    /// At and after the schedule's length: nothing left to do.
    Done,
}

impl ActionKind {
    pub(crate) fn from_raw(raw: sys::flatmem_cyclic_action_kind) -> Option<ActionKind> {
        match raw {
            sys::FLATMEM_CYCLIC_IDLE => Some(ActionKind::Idle),
            sys::FLATMEM_CYCLIC_FORWARD => Some(ActionKind::Forward),
            sys::FLATMEM_CYCLIC_BACKWARD => Some(ActionKind::Backward),
            sys::FLATMEM_CYCLIC_DONE => Some(ActionKind::Done),
            _ => None,
        }
    }
}

/// An update to apply before a time step's action: the averaged gradient of
/// training step `step` to stage `stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Update {
    pub stage: usize,
    pub step: u64,
}

/// What one rank does in one time step (`flatmem_cyclic_action`; the C
/// side's -1 "none" values are `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Action {
    /// Global time step (all ranks count the same).
    pub time_step: u64,
    pub kind: ActionKind,
    /// Forward / backward: the stage, 0 .. L-1.
    pub stage: Option<usize>,
    /// Forward / backward: the training step (this rank's micro-batch).
    pub step: Option<u64>,
    /// Before the action, apply this averaged gradient (for a forward, to the
    /// stage it runs; idle time steps after the last step carry the rest).
    pub update: Option<Update>,
    /// Stage activations the rank holds during the time step (0 .. L).
    pub activations_held: usize,
    /// Local phase 0 .. 2L-1 within the step; None when idle or done.
    pub phase: Option<usize>,
}

impl Action {
    /// From the C struct; an action kind this crate does not know is an
    /// `Internal` error (the version check keeps a newer library out).
    pub fn from_raw(raw: &sys::flatmem_cyclic_action) -> Result<Action> {
        let kind = ActionKind::from_raw(raw.kind).ok_or_else(|| {
            Error::new(Status::Internal, format!("action.kind: {} is not a flatmem_cyclic_action_kind", raw.kind))
        })?;
        let index = |v: i32| usize::try_from(v).ok();
        let count = |v: i64| u64::try_from(v).ok();
        let update = match (index(raw.update_stage), count(raw.update_step)) {
            (Some(stage), Some(step)) => Some(Update { stage, step }),
            _ => None,
        };
        Ok(Action {
            time_step: count(raw.time_step).unwrap_or(0),
            kind,
            stage: index(raw.stage),
            step: count(raw.step),
            update,
            activations_held: index(raw.activations_held).unwrap_or(0),
            phase: index(raw.phase),
        })
    }
}

/// The shape of a cyclic schedule (`flatmem_cyclic_schedule`): N ranks, L
/// stages, the training steps each rank runs and the update rule. The
/// library checks the ranges (N 1 .. 2^20, L 1 .. 65535, steps 1 .. 2^40)
/// when it is made; every query is then a pure function of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Schedule {
    world_size: usize,
    stages: usize,
    steps: u64,
    rule: Rule,
    length: u64,
}

impl Schedule {
    /// A schedule of `world_size` ranks, `stages` stages and `steps`
    /// training steps. Fails with `InvalidArgument` naming the field
    /// (`schedule.world_size: 0; expected 1 .. 1048576`), or `Unsupported`
    /// when the loaded library is not the header version of this crate.
    pub fn new(world_size: usize, stages: usize, steps: u64, rule: Rule) -> Result<Schedule> {
        check_version()?;
        let raw = sys::flatmem_cyclic_schedule {
            world_size: int32("schedule.world_size", world_size)?,
            stages: int32("schedule.stages", stages)?,
            steps: int64("schedule.steps", steps)?,
            rule: rule.raw(),
            ..SCHEDULE_INIT
        };
        let mut length = 0i64;
        // SAFETY: a valid schedule struct and a writable output.
        check(unsafe { sys::flatmem_cyclic_schedule_length(&raw, &mut length) })?;
        Ok(Schedule { world_size, stages, steps, rule, length: length as u64 })
    }

    /// N.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// L.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// Training steps each rank runs.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// The C struct (`FLATMEM_CYCLIC_SCHEDULE_INIT` plus the fields).
    pub fn to_raw(&self) -> sys::flatmem_cyclic_schedule {
        // The fields fit: new() converted them.
        sys::flatmem_cyclic_schedule {
            world_size: self.world_size as i32,
            stages: self.stages as i32,
            steps: self.steps as i64,
            rule: self.rule.raw(),
            ..SCHEDULE_INIT
        }
    }

    /// Time steps until every rank is done, its last update included
    /// (`flatmem_cyclic_schedule_length`): global time steps
    /// `0 .. length()` are the whole run.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// offset(rank) in time steps (`flatmem_cyclic_schedule_offset`).
    pub fn offset(&self, rank: usize) -> Result<u64> {
        let rank = int32("rank", rank)?;
        let mut offset = 0i64;
        // SAFETY: a valid schedule and a writable output.
        check(unsafe { sys::flatmem_cyclic_schedule_offset(&self.to_raw(), rank, &mut offset) })?;
        Ok(offset as u64)
    }

    /// delay(rank, stage), 0 or 1: the average of step s is applied before
    /// the stage's forward in step s + 1 + delay (`flatmem_cyclic_schedule_delay`).
    pub fn delay(&self, rank: usize, stage: usize) -> Result<u32> {
        let (rank, stage) = (int32("rank", rank)?, int32("stage", stage)?);
        let mut delay = 0i32;
        // SAFETY: a valid schedule and a writable output.
        check(unsafe { sys::flatmem_cyclic_schedule_delay(&self.to_raw(), rank, stage, &mut delay) })?;
        Ok(delay as u32)
    }

    /// What `rank` does at global time step `time_step` (`Done` at and after
    /// [`length`](Schedule::length)); `flatmem_cyclic_schedule_action`.
    pub fn action(&self, rank: usize, time_step: u64) -> Result<Action> {
        let rank = int32("rank", rank)?;
        let time_step = int64("time_step", time_step)?;
        let mut raw = sys::flatmem_cyclic_action {
            time_step: 0,
            kind: sys::FLATMEM_CYCLIC_IDLE,
            stage: -1,
            step: -1,
            update_stage: -1,
            reserved0: 0,
            update_step: -1,
            activations_held: 0,
            phase: -1,
        };
        let size = std::mem::size_of::<sys::flatmem_cyclic_action>();
        // SAFETY: a valid schedule and a writable action struct of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_schedule_action(&self.to_raw(), rank, time_step, &mut raw, size) })?;
        Action::from_raw(&raw)
    }

    /// The actions of `rank` at every time step of the run (`0 .. length()`).
    pub fn actions(&self, rank: usize) -> Result<Vec<Action>> {
        (0..self.length).map(|t| self.action(rank, t)).collect()
    }
}

/// Where the gradients of a [`Cyclic`] runtime live (`flatmem_cyclic_memory`;
/// every rank passes the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Memory {
    /// `Vec`s on the host (kDLCPU), over the communicator's host transport.
    /// Default.
    #[default]
    Host,
    /// Buffers on the communicator's CUDA device (kDLCUDA), over NCCL: every
    /// rank's communicator needs its device transport
    /// ([`Communicator::init_device`]) before [`Cyclic::new`]; with
    /// [`relayed`](CyclicOptions::relayed) parameters N <= 2L ranks
    /// (`Unsupported` otherwise, and from a flatmem built without NCCL).
    /// Gradients go through [`Cyclic::reduce_stream`], relayed shards and
    /// full stages through [`Cyclic::set_shard_stream`] /
    /// [`Cyclic::parameters_stream`].
    Cuda,
}

impl Memory {
    /// The C value.
    pub fn raw(self) -> sys::flatmem_cyclic_memory {
        match self {
            Memory::Host => sys::FLATMEM_CYCLIC_MEMORY_HOST,
            Memory::Cuda => sys::FLATMEM_CYCLIC_MEMORY_CUDA,
        }
    }
}

/// A gradient in CUDA device memory for [`Cyclic::reduce_stream`] (a
/// [`DeviceBuffer`]): the library's chain threads read and overwrite it
/// (with the average) on that device.
pub type DeviceGradient<T> = DeviceBuffer<T>;

/// Options of a [`Cyclic`] runtime (`flatmem_cyclic_options`): the schedule
/// (same on every rank, checked at create) and the runtime's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CyclicOptions {
    stages: usize,
    steps: u64,
    rule: Rule,
    activation_bytes: Option<Vec<i64>>,
    timeout: Option<Duration>,
    nonfinite: NonFinite,
    history: usize,
    parameter_count: Option<Vec<i64>>,
    memory: Memory,
}

impl CyclicOptions {
    /// L `stages` (1 .. 65535), `steps` training steps per rank, the update
    /// rule; the rest defaults (1 byte of activations per stage, the
    /// communicator's timeout, NaN/Inf gradients are errors, 65536 time steps
    /// of statistics).
    pub fn new(stages: usize, steps: u64, rule: Rule) -> CyclicOptions {
        CyclicOptions {
            stages,
            steps,
            rule,
            activation_bytes: None,
            timeout: None,
            nonfinite: NonFinite::Error,
            history: 0,
            parameter_count: None,
            memory: Memory::Host,
        }
    }

    /// Where the gradients (and relayed shards and full stages) live:
    /// [`Memory::Host`] (default: [`Cyclic::reduce`] of `Vec`s) or
    /// [`Memory::Cuda`] ([`Cyclic::reduce_stream`] of device buffers, after
    /// [`Communicator::init_device`] on every rank).
    pub fn memory(mut self, memory: Memory) -> CyclicOptions {
        self.memory = memory;
        self
    }

    /// The ZeRO relay mode (`FLATMEM_CYCLIC_PARAMETERS_RELAYED`, `Delay1`
    /// only): rank k keeps shard k of every stage ([`Cyclic::set_shard`]),
    /// the full stage reaches each rank by a relay before its forward and
    /// backward ([`Cyclic::parameters`]). `parameter_count[j]` = n_j, the
    /// elements of stage j (L entries, the same on every rank).
    pub fn relayed(mut self, parameter_count: Vec<i64>) -> CyclicOptions {
        self.parameter_count = Some(parameter_count);
        self
    }

    /// Bytes of activations stage j keeps for its backward (L entries, for
    /// the statistics only).
    pub fn activation_bytes(mut self, bytes: Vec<i64>) -> CyclicOptions {
        self.activation_bytes = Some(bytes);
        self
    }

    /// The deadline of every wait (None = the communicator's default).
    pub fn timeout(mut self, timeout: Duration) -> CyclicOptions {
        self.timeout = Some(timeout);
        self
    }

    /// `Error` (default): a NaN/Inf gradient fails `reduce` with `NonFinite`
    /// and poisons the communicator; `Propagate`: no scan.
    pub fn nonfinite(mut self, policy: NonFinite) -> CyclicOptions {
        self.nonfinite = policy;
        self
    }

    /// Time steps of per-time-step statistics kept (0 = 65536).
    pub fn history(mut self, time_steps: usize) -> CyclicOptions {
        self.history = time_steps;
        self
    }

    fn to_raw(&self) -> Result<sys::flatmem_cyclic_options> {
        let mut raw = sys::flatmem_cyclic_options::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_options>();
        // SAFETY: a writable options struct of this declaration, of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_options_init(&mut raw, size) })?;
        raw.stages = int32("options.stages", self.stages)?;
        raw.steps = int64("options.steps", self.steps)?;
        raw.rule = self.rule.raw();
        if let Some(bytes) = &self.activation_bytes {
            raw.activation_bytes = entries("options.activation_bytes", bytes, self.stages, "one per stage")?;
        }
        raw.timeout_ms = timeout_ms("options.timeout", self.timeout)?;
        raw.nonfinite = self.nonfinite.raw();
        raw.history = int64("options.history", self.history as u64)?;
        if let Some(counts) = &self.parameter_count {
            raw.parameters = sys::FLATMEM_CYCLIC_PARAMETERS_RELAYED;
            raw.parameter_count = entries("options.parameter_count", counts, self.stages, "one per stage")?;
        }
        raw.memory = self.memory.raw();
        Ok(raw)
    }
}

pub(crate) struct CyclicKind;

impl HandleKind for CyclicKind {
    type Raw = sys::flatmem_cyclic_t;
    const NAME: &'static str = "flatmem_cyclic";
    unsafe fn destroy(raw: *mut Self::Raw) -> sys::flatmem_status {
        // SAFETY: forwarded from the caller.
        unsafe { sys::flatmem_cyclic_destroy(raw) }
    }
}

/// What [`Cyclic::next`] returns: the time step's action and, when the
/// action carries an update, the averaged gradient of
/// `(update.stage, update.step)` -- the buffer handed to
/// [`Cyclic::reduce`], given back holding the average over the ranks. For a
/// gradient handed over with [`Cyclic::reduce_stream`], `averaged` is None:
/// the device buffer itself holds the average (complete in device memory;
/// any stream may read it) and is the caller's again.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeStep<T> {
    pub action: Action,
    /// Apply this (to `action.update`'s stage) before the action.
    pub averaged: Option<Vec<T>>,
}

/// The cyclic data-parallel runtime of this rank (`flatmem_cyclic_t`) over a
/// communicator it borrows, with gradients of element type `T` (`f32` or
/// `f64`; kDLCPU). Drive it as the header says:
///
/// ```no_run
/// # use flatmem::cyclic::{ActionKind, Cyclic, CyclicOptions, Rule};
/// # fn f(comm: &flatmem::Communicator, mut apply: impl FnMut(usize, &[f32]),
/// #      mut backward: impl FnMut(usize, u64) -> Vec<f32>) -> flatmem::Result<()> {
/// let mut cyclic = Cyclic::<f32>::new(comm, &CyclicOptions::new(4, 100, Rule::Delay1))?;
/// loop {
///     let t = cyclic.next()?;
///     if let (Some(update), Some(average)) = (t.action.update, &t.averaged) {
///         apply(update.stage, average); // the optimizer is the caller's
///     }
///     match t.action.kind {
///         ActionKind::Done => break,
///         ActionKind::Backward => {
///             let (stage, step) = (t.action.stage.unwrap(), t.action.step.unwrap());
///             cyclic.reduce(stage, backward(stage, step))?;
///         }
///         _ => {} // forward of t.action.stage, or idle
///     }
/// }
/// # Ok(()) }
/// ```
///
/// Ownership follows the C rule that a gradient belongs to the handle from
/// `reduce` until the `next` that returns its update: [`reduce`](Cyclic::reduce)
/// takes the `Vec` and [`next`](Cyclic::next) gives it back, averaged; the
/// runtime keeps the buffers in flight and frees them only after the C
/// handle is destroyed. It borrows the communicator, so it cannot outlive
/// it, and like the communicator it is used by one thread.
///
/// ```compile_fail
/// # use flatmem::{CommOptions, Communicator};
/// # use flatmem::cyclic::{Cyclic, CyclicOptions, Rule};
/// let cyclic = {
///     let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
///     Cyclic::<f32>::new(&comm, &CyclicOptions::new(1, 1, Rule::Sync)).unwrap()
/// }; // error: `comm` dropped while the runtime still borrows it
/// # drop(cyclic);
/// ```
///
/// ```compile_fail
/// # use flatmem::{CommOptions, Communicator};
/// # use flatmem::cyclic::{Cyclic, CyclicOptions, Rule};
/// let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
/// let mut cyclic = Cyclic::<f32>::new(&comm, &CyclicOptions::new(1, 1, Rule::Sync)).unwrap();
/// cyclic.next().unwrap(); // forward
/// cyclic.next().unwrap(); // backward
/// let gradient = vec![1.0f32; 4];
/// cyclic.reduce(0, gradient).unwrap();
/// let _ = gradient[0]; // error: the gradient belongs to the runtime until next() returns it
/// ```
pub struct Cyclic<'c, T: Element> {
    // Dropped first: the C handle's threads stop before the buffers go.
    handle: OwnedHandle<CyclicKind>,
    /// Gradients handed over and not yet returned, by (stage, step).
    in_flight: Vec<((usize, u64), Vec<T>)>,
    /// Device gradients (reduce_stream) handed over and not yet returned, by (stage, step).
    device_in_flight: Vec<(usize, u64)>,
    /// Gradients whose reduce failed: kept, never read, until the handle is gone.
    refused: Vec<Vec<T>>,
    /// RELAYED: this rank's registered host shard of each stage (read by the
    /// C handle inside `next`, so owned here until the handle is gone); None
    /// for a device shard (set_shard_stream: its caller keeps it).
    shards: Vec<Option<Vec<T>>>,
    current: Option<Action>,
    schedule: Schedule,
    _comm: PhantomData<&'c Communicator>,
}

impl<T: Element> std::fmt::Debug for Cyclic<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cyclic")
            .field("schedule", &self.schedule)
            .field("current", &self.current)
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

impl<'c, T: Element> Cyclic<'c, T> {
    /// Creates this rank's runtime (collective over `comm`: every rank
    /// passes the same stages, steps and rule, else `InvalidArgument` on
    /// every rank naming the first rank that differs). One runtime per
    /// communicator at a time.
    pub fn new(comm: &'c Communicator, options: &CyclicOptions) -> Result<Cyclic<'c, T>> {
        let raw = options.to_raw()?;
        let schedule = Schedule::new(comm.world_size(), options.stages, options.steps, options.rule)?;
        // SAFETY: a live communicator that outlives the handle ('c), valid
        // options (activation_bytes copied by create).
        let handle = OwnedHandle::create(|out| unsafe { sys::flatmem_cyclic_create(out, comm.as_raw(), &raw) })?;
        Ok(Cyclic {
            handle,
            in_flight: Vec::new(),
            device_in_flight: Vec::new(),
            refused: Vec::new(),
            shards: Vec::new(),
            current: None,
            schedule,
            _comm: PhantomData,
        })
    }

    /// The schedule (world size, stages, steps, rule) with its pure queries.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Advances to the next time step (`flatmem_cyclic_next`), waiting at
    /// most the timeout for the start token and for the average the update
    /// needs. After the last time step the action is `Done` (again on every
    /// later call). Refuses (`InvalidArgument`, without advancing) when the
    /// previous action was a backward whose gradient was not reduced.
    #[allow(clippy::should_implement_trait)] // flatmem_cyclic_next; fallible, not an Iterator
    pub fn next(&mut self) -> Result<TimeStep<T>> {
        let mut raw = sys::flatmem_cyclic_action::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_action>();
        // SAFETY: a live handle and a writable action of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_next(self.handle.as_mut_ptr(), &mut raw, size) })?;
        let action = Action::from_raw(&raw)?;
        self.current = Some(action);
        let averaged = match action.update {
            None => None,
            Some(u) if self.device_in_flight.contains(&(u.stage, u.step)) => {
                self.device_in_flight.retain(|key| *key != (u.stage, u.step));
                None
            }
            Some(u) => {
                let at = self.in_flight.iter().position(|(key, _)| *key == (u.stage, u.step)).ok_or_else(|| {
                    Error::new(
                        Status::Internal,
                        format!("cyclic next: an update of stage {} step {} that was never reduced", u.stage, u.step),
                    )
                })?;
                Some(self.in_flight.swap_remove(at).1)
            }
        };
        Ok(TimeStep { action, averaged })
    }

    /// Hands over the gradient of `stage` computed in the current time step
    /// (which must be that stage's backward, once; `flatmem_cyclic_reduce`):
    /// the same length on every rank, at least one element. Returns at once;
    /// the average over the ranks comes back from the `next` whose action
    /// carries this (stage, step) as its update. On error (a NaN/Inf under
    /// `NonFinite::Error`, a wrong stage) the buffer stays with the runtime
    /// until it is dropped.
    pub fn reduce(&mut self, stage: usize, mut gradient: Vec<T>) -> Result<()> {
        let step = self.backward_step("cyclic reduce")?;
        let raw_stage = int32("stage", stage)?;
        let result = {
            let mut desc = Desc::elements_mut(&mut gradient, "gradient")?;
            let mut t = desc.dl();
            // SAFETY: a live handle; the gradient's heap buffer is kept in
            // in_flight (moving the Vec does not move it) until next()
            // returns it or the handle is destroyed.
            check(unsafe { sys::flatmem_cyclic_reduce(self.handle.as_mut_ptr(), raw_stage, t.mut_ptr()) })
        };
        match result {
            Ok(()) => self.in_flight.push(((stage, step), gradient)),
            Err(_) => self.refused.push(gradient),
        }
        result
    }

    /// [`Memory::Cuda`]: hands over the device gradient of `stage` computed
    /// in the current time step (that stage's backward, once) on `stream`
    /// (`flatmem_cyclic_reduce_stream`): the runtime records an event on the
    /// stream now and its chain reads the buffer after the work enqueued so
    /// far (no host wait here). The average comes back in the same buffer:
    /// the [`next`](Cyclic::next) whose action carries this (stage, step) as
    /// its update returns with it complete, `averaged` None. On a
    /// [`Memory::Host`] runtime the library refuses a device gradient
    /// (`InvalidArgument` naming `options.memory`); under `NonFinite::Error`
    /// a NaN/Inf is found by the chain, so the `NonFinite` error comes from
    /// the next `next`.
    ///
    /// # Safety
    ///
    /// `gradient.data` must point to `gradient.len` elements of `T` in
    /// memory of CUDA device `gradient.cuda_device`, which stay allocated and
    /// which nothing else reads or writes from this call until `next`
    /// returns the update or the runtime is dropped, whichever comes first
    /// (when this call fails the library has not taken it).
    /// `stream` is a live `cudaStream_t` of that device, or null (the legacy
    /// default stream).
    pub unsafe fn reduce_stream(
        &mut self,
        stage: usize,
        gradient: DeviceGradient<T>,
        stream: *mut c_void,
    ) -> Result<()> {
        let step = self.backward_step("cyclic reduce_stream")?;
        let raw_stage = int32("stage", stage)?;
        let mut desc = Desc::cuda_elements(gradient, "gradient")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; the tensor's metadata lives through the call
        // (the library copies what it keeps); the caller guarantees the
        // device memory and the stream (see above).
        check(unsafe { sys::flatmem_cyclic_reduce_stream(self.handle.as_mut_ptr(), raw_stage, t.mut_ptr(), stream) })?;
        self.device_in_flight.push((stage, step));
        Ok(())
    }

    /// The training step of the current backward, or `InvalidArgument`
    /// "<what>: the current time step is not a backward".
    fn backward_step(&self, what: &str) -> Result<u64> {
        match self.current {
            Some(Action { kind: ActionKind::Backward, step: Some(step), .. }) => Ok(step),
            _ => Err(Error::invalid(format!("{}: the current time step is not a backward", what))),
        }
    }

    /// Statistics of the time steps still kept (the last `history` begun),
    /// oldest first (`flatmem_cyclic_stats`).
    pub fn stats(&self) -> Result<Vec<sys::flatmem_cyclic_time_step_stats>> {
        let count = self.summary()?.time_steps.max(0);
        let mut stats = vec![sys::flatmem_cyclic_time_step_stats::default(); count as usize];
        let mut written = 0i64;
        let size = std::mem::size_of::<sys::flatmem_cyclic_time_step_stats>();
        // SAFETY: room for `count` entries of `size` bytes.
        check(unsafe {
            sys::flatmem_cyclic_stats(self.handle.as_ptr(), 0, count, stats.as_mut_ptr(), size, &mut written)
        })?;
        stats.truncate(written.max(0) as usize);
        Ok(stats)
    }

    /// Totals since create (`flatmem_cyclic_summary_get`).
    pub fn summary(&self) -> Result<sys::flatmem_cyclic_summary> {
        let mut summary = sys::flatmem_cyclic_summary::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_summary>();
        // SAFETY: a live handle and a writable summary of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_summary_get(self.handle.as_ptr(), &mut summary, size) })?;
        Ok(summary)
    }

    /// RELAYED: registers this rank's shard of `stage` (version 0: exactly
    /// the elements of [`shard_range`](Cyclic::shard_range)`(stage, rank)`,
    /// possibly none; `flatmem_cyclic_set_shard`). The runtime takes the
    /// buffer: the C handle reads it inside [`next`](Cyclic::next) (and sends
    /// copies), and the caller updates it in place through
    /// [`shard_mut`](Cyclic::shard_mut) at the stage's update actions, with
    /// the average the update brings in its shard range. Every stage must be
    /// registered before the first `next`. On error nothing is registered.
    pub fn set_shard(&mut self, stage: usize, mut shard: Vec<T>) -> Result<()> {
        let raw_stage = int32("stage", stage)?;
        {
            let mut desc = Desc::elements_mut(&mut shard, "shard")?;
            let mut t = desc.dl();
            // SAFETY: a live handle; the shard's heap buffer is kept in
            // `shards` (moving the Vec does not move it) until it is
            // registered again or the handle is destroyed.
            check(unsafe { sys::flatmem_cyclic_set_shard(self.handle.as_mut_ptr(), raw_stage, t.mut_ptr()) })?;
        }
        self.registered(stage, Some(shard));
        Ok(())
    }

    /// [`Memory::Cuda`]: registers this rank's device shard of `stage` as
    /// [`set_shard`](Cyclic::set_shard) does a host one, with the `stream`
    /// the caller updates it on (`flatmem_cyclic_set_shard_stream`; null =
    /// the legacy default stream): the runtime's copies of the shard (for
    /// rank 0's gathers) are enqueued on that stream inside
    /// [`next`](Cyclic::next), between the caller's updates. The caller
    /// keeps the buffer ([`shard`](Cyclic::shard) is None for it) and
    /// updates it in place on `stream` at the stage's update actions. On a
    /// [`Memory::Host`] runtime the library refuses it (`InvalidArgument`
    /// naming `options.memory`); on error nothing is registered.
    ///
    /// # Safety
    ///
    /// `shard.data` must point to `shard.len` elements of `T` in memory of
    /// CUDA device `shard.cuda_device` that stay allocated until the shard
    /// is registered again or the runtime is dropped, and that are written
    /// only by work ordered on `stream` meanwhile (the runtime reads them on
    /// it inside `next`). `stream` is a live `cudaStream_t` of that device
    /// (as long as the shard is registered), or null.
    pub unsafe fn set_shard_stream(&mut self, stage: usize, shard: DeviceBuffer<T>, stream: *mut c_void) -> Result<()> {
        let raw_stage = int32("stage", stage)?;
        let mut desc = Desc::cuda_elements(shard, "shard")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; the tensor's metadata lives through the call
        // (the library keeps the data pointer and the stream, for which the
        // caller vouches: see above).
        check(unsafe {
            sys::flatmem_cyclic_set_shard_stream(self.handle.as_mut_ptr(), raw_stage, t.mut_ptr(), stream)
        })?;
        self.registered(stage, None);
        Ok(())
    }

    /// Records the host shard registered for `stage` (None: a device one);
    /// a host buffer registered before is no longer read, so it is dropped.
    fn registered(&mut self, stage: usize, shard: Option<Vec<T>>) {
        if self.shards.len() <= stage {
            self.shards.resize_with(stage + 1, || None);
        }
        self.shards[stage] = shard;
    }

    /// RELAYED: this rank's host shard of `stage` (None before `set_shard`,
    /// and for a device shard).
    pub fn shard(&self, stage: usize) -> Option<&[T]> {
        self.shards.get(stage).and_then(|s| s.as_deref())
    }

    /// RELAYED: the shard to update at the stage's update action (the runtime
    /// reads it only inside `next`, which this borrow excludes).
    pub fn shard_mut(&mut self, stage: usize) -> Option<&mut [T]> {
        self.shards.get_mut(stage).and_then(|s| s.as_deref_mut())
    }

    /// RELAYED: the elements `begin .. end` of `stage` that `rank` owns
    /// (`flatmem_cyclic_shard_range`: c_j = ceil(n_j / N), rank k owns
    /// [min(k c_j, n_j), min((k + 1) c_j, n_j)), possibly empty).
    pub fn shard_range(&self, stage: usize, rank: usize) -> Result<std::ops::Range<usize>> {
        let (stage, rank) = (int32("stage", stage)?, int32("rank", rank)?);
        let (mut begin, mut end) = (0i64, 0i64);
        // SAFETY: a live handle and writable outputs.
        check(unsafe { sys::flatmem_cyclic_shard_range(self.handle.as_ptr(), stage, rank, &mut begin, &mut end) })?;
        Ok(begin as usize..end as usize)
    }

    /// RELAYED: during a forward or backward, once: waits (at most the
    /// timeout) for the relay of the action's stage and copies its full
    /// parameters (version max(0, step - 1), n_j elements) into `full`
    /// (`flatmem_cyclic_parameters`); then passes them on in the background.
    /// `full` is written only on success.
    pub fn parameters(&mut self, full: &mut [T]) -> Result<()> {
        let mut desc = Desc::elements_mut(full, "full")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; `full` is written during the call only.
        check(unsafe { sys::flatmem_cyclic_parameters(self.handle.as_mut_ptr(), t.mut_ptr()) })
    }

    /// [`Memory::Cuda`]: [`parameters`](Cyclic::parameters) into a device
    /// buffer (`flatmem_cyclic_parameters_stream`): waits on the host (at
    /// most the timeout) for the relay of the action's stage, then enqueues
    /// the copy into `full` on `stream` (null = the legacy default stream).
    /// On a [`Memory::Host`] runtime the library refuses it
    /// (`InvalidArgument` naming `options.memory`) and writes nothing.
    ///
    /// # Safety
    ///
    /// `full.data` must point to `full.len` elements of `T` in memory of
    /// CUDA device `full.cuda_device`, allocated, and neither read nor
    /// written by other streams, until the copy enqueued on `stream` has
    /// run; `stream` is a live `cudaStream_t` of that device, or null.
    pub unsafe fn parameters_stream(&mut self, full: DeviceBuffer<T>, stream: *mut c_void) -> Result<()> {
        let mut desc = Desc::cuda_elements(full, "full")?;
        let mut t = desc.dl();
        // SAFETY: a live handle; the caller vouches for the device memory and the stream.
        check(unsafe { sys::flatmem_cyclic_parameters_stream(self.handle.as_mut_ptr(), t.mut_ptr(), stream) })
    }

    /// RELAYED: the relay statistics of the time steps still kept
    /// (`flatmem_cyclic_relay_stats`).
    pub fn relay_stats(&self) -> Result<Vec<sys::flatmem_cyclic_relay_time_step>> {
        let count = self.summary()?.time_steps.max(0);
        let mut stats = vec![sys::flatmem_cyclic_relay_time_step::default(); count as usize];
        let mut written = 0i64;
        let size = std::mem::size_of::<sys::flatmem_cyclic_relay_time_step>();
        // SAFETY: room for `count` entries of `size` bytes.
        check(unsafe {
            sys::flatmem_cyclic_relay_stats(self.handle.as_ptr(), 0, count, stats.as_mut_ptr(), size, &mut written)
        })?;
        stats.truncate(written.max(0) as usize);
        Ok(stats)
    }

    /// RELAYED: shard, replica and staging sizes and the relay totals
    /// (`flatmem_cyclic_relay_summary_get`).
    pub fn relay_summary(&self) -> Result<sys::flatmem_cyclic_relay_summary> {
        let mut summary = sys::flatmem_cyclic_relay_summary::default();
        let size = std::mem::size_of::<sys::flatmem_cyclic_relay_summary>();
        // SAFETY: a live handle and a writable summary of `size` bytes.
        check(unsafe { sys::flatmem_cyclic_relay_summary_get(self.handle.as_ptr(), &mut summary, size) })?;
        Ok(summary)
    }
}
