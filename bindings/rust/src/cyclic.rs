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
//! The runtime (`flatmem_cyclic_create` / `next` / `reduce` / `stats`) runs
//! over a communicator (`flatmem/comm.h`), which this crate does not wrap
//! yet: its raw declarations are in [`sys`](crate::sys).

use crate::error::{check, Error, Result, Status};
use crate::sys;
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
    fn from_raw(raw: sys::flatmem_cyclic_action_kind) -> Option<ActionKind> {
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
            steps: i64::try_from(steps)
                .map_err(|_| Error::invalid(format!("schedule.steps = {} does not fit int64_t", steps)))?,
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
        let time_step = i64::try_from(time_step)
            .map_err(|_| Error::invalid(format!("time_step = {} does not fit int64_t", time_step)))?;
        let mut raw = sys::flatmem_cyclic_action {
            time_step: 0,
            kind: sys::FLATMEM_CYCLIC_IDLE,
            stage: -1,
            step: -1,
            update_stage: -1,
            update_step: -1,
            activations_held: 0,
            phase: -1,
        };
        // SAFETY: a valid schedule and a writable action struct.
        check(unsafe { sys::flatmem_cyclic_schedule_action(&self.to_raw(), rank, time_step, &mut raw) })?;
        Action::from_raw(&raw)
    }

    /// The actions of `rank` at every time step of the run (`0 .. length()`).
    pub fn actions(&self, rank: usize) -> Result<Vec<Action>> {
        (0..self.length).map(|t| self.action(rank, t)).collect()
    }
}

fn int32(name: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::invalid(format!("{} = {} does not fit int32_t", name, value)))
}
