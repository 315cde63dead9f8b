//! The cyclic runtime (flatmem::cyclic::Cyclic over a Communicator) under
//! the SYNC rule is plain data-parallel SGD: driven through a toy model whose
//! gradients depend on the current parameters (so an update applied at the
//! wrong time step, twice, or with another rank's gradient changes the
//! result), every rank ends with the parameters of SGD on the global batch
//! computed here in f64. Two processes over UCX, and 1 / 3 threads of an
//! in-process group. Also: DELAY1 against SGD with one step of delay, the
//! statistics, and a reduce outside a backward.

mod common;

use common::ranks;
use flatmem::cyclic::{ActionKind, Cyclic, CyclicOptions, Rule};
use flatmem::{Communicator, Status};

const STAGES: usize = 3;
const STEPS: u64 = 4;
const LR: f64 = 0.125;
const A: f64 = 0.5;

/// Parameters of stage j: a vector of j + 2 values (stages of different sizes).
fn initial(stage: usize) -> Vec<f64> {
    (0..stage + 2).map(|i| 1.0 + 0.5 * i as f64 - 0.25 * stage as f64).collect()
}

/// The data term of rank r's gradient of stage j in step s (distinct for
/// every rank, step and stage).
fn data(rank: usize, step: u64, stage: usize, i: usize) -> f64 {
    ((rank * 31 + step as usize * 7 + stage * 3 + i) % 11) as f64 * 0.1 - 0.4
}

/// g(r, s, j) = A * w_j + x(r, s, j): the gradient of 0.5 A |w|^2 + <x, w>.
fn gradient(w: &[f64], rank: usize, step: u64, stage: usize) -> Vec<f64> {
    w.iter().enumerate().map(|(i, &v)| A * v + data(rank, step, stage, i)).collect()
}

/// SGD on the global batch in f64: w_j(s + 1) = w_j(s) - LR * mean_r g(r, s, j)
/// with the gradient of step s taken at the parameters of step s - delay.
fn reference(world_size: usize, delay: u64) -> Vec<Vec<f64>> {
    let mut history: Vec<Vec<Vec<f64>>> = vec![(0..STAGES).map(initial).collect()];
    for s in 0..STEPS {
        let at = &history[s.saturating_sub(delay) as usize];
        let now = history.last().unwrap().clone();
        let next: Vec<Vec<f64>> = (0..STAGES)
            .map(|j| {
                let grads: Vec<Vec<f64>> = (0..world_size).map(|r| gradient(&at[j], r, s, j)).collect();
                (0..now[j].len())
                    .map(|i| now[j][i] - LR * grads.iter().map(|g| g[i]).sum::<f64>() / world_size as f64)
                    .collect()
            })
            .collect();
        history.push(next);
    }
    history.pop().unwrap()
}

/// Drives this rank's runtime to DONE with the toy model and returns its
/// final parameters and the number of updates applied.
fn train(comm: &Communicator, rule: Rule) -> (Vec<Vec<f64>>, usize) {
    let mut cyclic = Cyclic::<f64>::new(comm, &CyclicOptions::new(STAGES, STEPS, rule)).unwrap();
    let mut w: Vec<Vec<f64>> = (0..STAGES).map(initial).collect();
    let mut updates = 0;
    loop {
        let t = cyclic.next().unwrap();
        if let Some(update) = t.action.update {
            let average = t.averaged.expect("an update comes with its averaged gradient");
            assert_eq!(average.len(), w[update.stage].len());
            for (v, g) in w[update.stage].iter_mut().zip(&average) {
                *v -= LR * g;
            }
            updates += 1;
        } else {
            assert!(t.averaged.is_none());
        }
        match t.action.kind {
            ActionKind::Done => break,
            ActionKind::Backward => {
                let (stage, step) = (t.action.stage.unwrap(), t.action.step.unwrap());
                cyclic.reduce(stage, gradient(&w[stage], comm.rank(), step, stage)).unwrap();
            }
            _ => {}
        }
    }
    let summary = cyclic.summary().unwrap();
    assert_eq!(summary.time_steps as u64, cyclic.schedule().length(), "time steps run");
    if comm.world_size() > 1 {
        assert!(summary.bytes_sent > 0 && summary.messages_sent > 0, "{:?}", summary);
    }
    let stats = cyclic.stats().unwrap();
    assert_eq!(stats.len() as u64, cyclic.schedule().length());
    assert!(stats.iter().enumerate().all(|(n, s)| s.time_step == n as i64));
    (w, updates)
}

/// f64 throughout, so the only difference from the reference is the
/// library's average: ((g_0 + g_1) + ...) * fl(1/N), against the reference's
/// sum / N in the same order. fl(1/N) errs by at most u = 2^-53 relative and
/// the product adds another u, so each average is within 2u |average|; the
/// update w - LR avg (|avg| <= 2, LR = 1/8) shifts w by at most 4u per step,
/// and the contraction 1 - LR A < 1 keeps earlier errors from growing: over
/// 4 steps, |dw| <= 16u < 2e-15. 1e-13 leaves room while a misapplied
/// gradient (>= LR * 0.05) is 10^10 times larger.
const TOLERANCE: f64 = 1e-13;

fn check(comm: &Communicator, rule: Rule, delay: u64) {
    let (w, updates) = train(comm, rule);
    assert_eq!(updates, STAGES * STEPS as usize, "every average applied exactly once");
    let want = reference(comm.world_size(), delay);
    for j in 0..STAGES {
        for (i, (&got, &want)) in w[j].iter().zip(&want[j]).enumerate() {
            assert!(
                (got - want).abs() <= TOLERANCE,
                "{:?} rank {} of {}: stage {} [{}]: got {}, SGD gives {}",
                rule,
                comm.rank(),
                comm.world_size(),
                j,
                i,
                got,
                want
            );
        }
    }
}

#[test]
fn sync_over_two_processes_is_plain_sgd() {
    const TEST: &str = "sync_over_two_processes_is_plain_sgd";
    ranks::on_processes(TEST, 2, |comm| check(comm, Rule::Sync, 0));
}

#[test]
fn sync_on_threads_is_plain_sgd() {
    for world_size in [1usize, 3] {
        ranks::on_threads(world_size, |comm| check(&comm, Rule::Sync, 0));
    }
}

#[test]
fn delay1_on_threads_is_sgd_one_step_late() {
    // DELAY1: the average of step s is applied before step s + 2, so step
    // s's gradient is taken at the parameters of step s - 1.
    ranks::on_threads(2, |comm| check(&comm, Rule::Delay1, 1));
}

#[test]
fn reduce_outside_a_backward_is_refused() {
    ranks::on_threads(1, |comm| {
        let mut cyclic = Cyclic::<f32>::new(&comm, &CyclicOptions::new(1, 1, Rule::Sync)).unwrap();
        let e = cyclic.reduce(0, vec![1.0]).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("backward"), "{}", e);
        assert_eq!(cyclic.next().unwrap().action.kind, ActionKind::Forward);
        assert_eq!(cyclic.next().unwrap().action.kind, ActionKind::Backward);
        // The library names a NaN gradient (and poisons the group).
        let e = cyclic.reduce(0, vec![f32::NAN]).unwrap_err();
        assert_eq!(e.status(), Status::NonFinite, "{}", e);
    });
}
