//! flatmem::cyclic_stages: the pure schedule against the header's closed
//! forms, and stage-parallel training of an L-stage MLP (common/stage_mlp.rs)
//! over threads of an in-process group and 2 processes over UCX, bitwise
//! against a Rust simulation of the schedule's math and against the
//! data-parallel `Cyclic` on N ranks; calls out of order, bad options and a
//! stage that stops.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::ranks;
use common::stage_mlp::{assert_bitwise, delay, simulate, train_data_parallel, train_stage, train_stages, Mlp, Real};
use flatmem::cyclic::{ActionKind, Rule};
use flatmem::cyclic_stages::{CyclicStages, StageSchedule, StagesOptions};
use flatmem::{Communicator, Status};

const LR: f64 = 0.25;
const RULES: [Rule; 3] = [Rule::Delay1, Rule::Newest, Rule::Sync];

/// (L, N, S): N = L, N = 2L, N not dividing 2L, N prime, N = 1, L = 1, N > 2L.
const SHAPES: [(usize, usize, u64); 7] = [(2, 2, 3), (2, 4, 2), (3, 5, 3), (4, 1, 3), (1, 3, 3), (2, 9, 2), (4, 6, 3)];

#[test]
fn schedule_follows_the_closed_forms() {
    for (l, n, s) in SHAPES {
        for rule in RULES {
            let sched = StageSchedule::new(l, n, s, rule).unwrap();
            let offset: Vec<u64> = (0..n).map(|m| (m * 2 * l / n) as u64).collect();
            assert_eq!((0..n).map(|m| sched.offset(m).unwrap()).collect::<Vec<_>>(), offset);
            let period = 2 * l as u64 + if rule == Rule::Sync { offset[n - 1] } else { 0 };
            assert_eq!(sched.period(), period);
            assert_eq!(sched.length(), offset[n - 1] + period * (s - 1) + 2 * l as u64 + 1);
            for j in 0..l {
                // (time step, backward first, micro-batch, kind, step, version)
                let mut want = Vec::new();
                for step in 0..s {
                    for m in 0..n {
                        let version = step.saturating_sub(delay(rule, n, l, m, j));
                        let base = offset[m] + period * step;
                        want.push((base + j as u64, 1, m, ActionKind::Forward, step, version));
                        want.push((base + (2 * l - 1 - j) as u64, 0, m, ActionKind::Backward, step, version));
                    }
                }
                want.sort_by_key(|e| (e.0, e.1, e.2));
                let timeline = sched.timeline(j).unwrap();
                let work: Vec<_> = timeline
                    .iter()
                    .filter(|a| a.kind != ActionKind::Idle)
                    .map(|a| {
                        let back = (a.kind == ActionKind::Forward) as i32;
                        (a.time_step, back, a.micro_batch.unwrap(), a.kind, a.step.unwrap(), a.version.unwrap())
                    })
                    .collect();
                assert_eq!(work, want, "L {} N {} S {} {:?} stage {}", l, n, s, rule, j);
                let k = sched.versions_kept(j).unwrap();
                let (mut formed, mut updates) = (0u64, Vec::new());
                for a in &timeline {
                    assert_eq!(a.stage, Some(j));
                    if let Some(v) = a.update_step {
                        updates.push(v);
                        formed = v + 1;
                    }
                    if let Some(v) = a.version {
                        // slot v % K still holds version v
                        assert!(v <= formed && v + k as u64 > formed, "{:?} K {} formed {}", a, k, formed);
                        let forward = a.kind == ActionKind::Forward;
                        assert_eq!(a.receives, if forward { j > 0 } else { j + 1 < l }, "{:?}", a);
                        assert_eq!(a.sends, if forward { j + 1 < l } else { j > 0 }, "{:?}", a);
                        assert_eq!(a.accumulates, a.kind == ActionKind::Backward);
                    }
                }
                assert_eq!(updates, (0..s).collect::<Vec<_>>(), "every version formed once, in order");
                assert!(sched.actions(j, sched.length()).unwrap().is_empty());
            }
        }
    }
}

#[test]
fn schedule_errors_name_the_field() {
    let e = StageSchedule::new(2, 0, 1, Rule::Delay1).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("schedule.micro_batches: 0"), "{}", e);
    let sched = StageSchedule::new(2, 3, 2, Rule::Newest).unwrap();
    assert!(sched.offset(3).unwrap_err().message().contains("micro_batch: 3"));
    assert!(sched.versions_kept(2).unwrap_err().message().contains("stage: 2"));
    let occupancy = StageSchedule::new(4, 4, 6, Rule::Delay1).unwrap().occupancy(1).unwrap();
    assert_eq!((occupancy.busy_fraction, occupancy.peak_actions), (1.0, 1), "N = L: one action per time step");
}

fn mlp3() -> Mlp {
    Mlp { widths: vec![3, 5, 4, 2], rows: 3, seed: 11 }
}

fn mlp2() -> Mlp {
    Mlp { widths: vec![4, 3, 2], rows: 2, seed: 5 }
}

/// Each stage rank's trained parameters, collected from `world` threads.
fn on_threads_collect<R: Send + 'static>(
    world: usize,
    body: impl Fn(&Communicator) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let out: Arc<Mutex<Vec<Option<R>>>> = Arc::new(Mutex::new((0..world).map(|_| None).collect()));
    let sink = out.clone();
    ranks::on_threads(world, move |comm| {
        let r = body(&comm);
        sink.lock().unwrap()[comm.rank()] = Some(r);
    });
    let mut guard = out.lock().unwrap();
    guard.iter_mut().map(|r| r.take().expect("every rank reported")).collect()
}

fn check_threads<T: Real>(mlp: Mlp, n: usize, steps: u64, rule: Rule, against_data_parallel: bool) {
    let m = mlp.clone();
    let stages = on_threads_collect(mlp.stages(), move |comm| train_stages::<T>(comm, &m, n, steps, rule, LR));
    let want = simulate::<T>(&mlp, n, steps, rule, LR);
    assert_bitwise(&format!("stage-parallel {:?} vs the simulation", rule), &stages, &want);
    if against_data_parallel {
        let m = mlp.clone();
        let replicas = on_threads_collect(n, move |comm| train_data_parallel::<T>(comm, &m, steps, rule, LR));
        for w in &replicas {
            assert_bitwise(&format!("stage-parallel vs data-parallel {:?} on {} ranks", rule, n), &stages, w);
        }
    }
}

#[test]
fn threads_newest_3_stages_5_micro_batches_equal_simulation_and_data_parallel_f64() {
    check_threads::<f64>(mlp3(), 5, 3, Rule::Newest, true);
}

#[test]
fn threads_delay1_2_stages_4_micro_batches_equal_simulation_and_data_parallel_f32() {
    check_threads::<f32>(mlp2(), 4, 3, Rule::Delay1, true);
}

#[test]
fn threads_sync_and_one_stage_equal_the_simulation() {
    check_threads::<f64>(mlp3(), 3, 3, Rule::Sync, false);
    check_threads::<f32>(Mlp { widths: vec![3, 2], rows: 1, seed: 3 }, 3, 2, Rule::Newest, false);
}

#[test]
fn the_simulation_tells_the_rules_apart() {
    // The comparisons above can fail: another rule gives other parameters.
    let (a, b) = (simulate::<f64>(&mlp3(), 5, 3, Rule::Newest, LR), simulate::<f64>(&mlp3(), 5, 3, Rule::Delay1, LR));
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
}

#[test]
fn two_processes_newest_equal_the_simulation() {
    const TEST: &str = "two_processes_newest_equal_the_simulation";
    ranks::on_processes(TEST, 2, |comm| {
        let mlp = mlp2();
        let got = train_stages::<f32>(comm, &mlp, 3, 3, Rule::Newest, LR);
        let want = simulate::<f32>(&mlp, 3, 3, Rule::Newest, LR);
        assert_bitwise("process stage-parallel vs the simulation", &[got], &want[comm.rank()..comm.rank() + 1]);
    });
}

#[test]
fn calls_out_of_order_are_refused_and_change_nothing() {
    ranks::on_threads(2, |comm| {
        let mlp = mlp2();
        let bytes = mlp.boundary_bytes::<f32>();
        let mut h = CyclicStages::<f32>::new(&comm, &StagesOptions::new(2, 1, 1, Rule::Delay1, bytes.clone())).unwrap();
        if comm.rank() == 1 {
            train_stage(&mut h, &mlp, LR).unwrap();
            return;
        }
        let y = vec![1f32; bytes[0] as usize / 4];
        let invalid = |r: flatmem::Result<()>, fragment: &str| {
            let e = r.unwrap_err();
            assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
            assert!(e.message().contains(fragment), "{} lacks {:?}", e, fragment);
        };
        invalid(h.send(&y), "tensor: the current action");
        let a = h.next().unwrap();
        assert_eq!((a.kind, a.sends, a.receives, a.update_step), (ActionKind::Forward, true, false, None));
        invalid(h.next().map(|_| ()), "needs flatmem_cyclic_stages_send first");
        invalid(h.receive(&mut vec![0f32; y.len()]), "receives nothing");
        invalid(h.average().map(|_| ()), "no gradient was accumulated yet");
        invalid(h.send(&vec![0u8; bytes[0] as usize + 1]), "more than");
        h.send(&y).unwrap();
        invalid(h.send(&y), "already sent");
        let b = h.next().unwrap();
        assert_eq!((b.kind, b.receives, b.accumulates), (ActionKind::Backward, true, true));
        let mut dy = vec![0f32; y.len()];
        h.receive(&mut dy).unwrap();
        invalid(h.next().map(|_| ()), "needs flatmem_cyclic_stages_accumulate first");
        let g = vec![0.5f32; mlp.count(0)];
        invalid(h.accumulate(&g[1..]).and_then(|_| h.accumulate(&g)), "already accumulated");
        let u = h.next().unwrap();
        assert_eq!((u.kind, u.update_step), (ActionKind::Idle, Some(0)));
        assert_eq!(h.average().unwrap().len(), mlp.count(0) - 1, "the first accumulate fixed the length");
        assert_eq!(h.next().unwrap().kind, ActionKind::Done);
        assert_eq!(h.next().unwrap().kind, ActionKind::Done);
    });
}

#[test]
fn bad_options_name_the_field() {
    ranks::on_threads(1, |comm| {
        let e = CyclicStages::<f32>::new(&comm, &StagesOptions::new(1, 0, 1, Rule::Delay1, vec![])).unwrap_err();
        assert!(e.message().contains("options.micro_batches: 0"), "{}", e);
        let e = CyclicStages::<f32>::new(&comm, &StagesOptions::new(2, 1, 1, Rule::Delay1, vec![8])).unwrap_err();
        assert!(e.message().contains("options.stages: 2 but the communicator has 1 ranks"), "{}", e);
        let e = CyclicStages::<f32>::new(&comm, &StagesOptions::new(1, 1, 1, Rule::Delay1, vec![8])).unwrap_err();
        assert!(e.message().contains("options.boundary_bytes: 1 entries"), "{}", e);
        let e = CyclicStages::<f32>::new(
            &comm,
            &StagesOptions::new(1, 1, 1, Rule::Delay1, vec![]).timeout(Duration::from_micros(10)),
        )
        .unwrap_err();
        assert!(e.message().contains("options.timeout"), "{}", e);
    });
}

#[test]
fn a_stage_that_stops_times_out_the_other_naming_what_it_waited_for() {
    const TIMEOUT: Duration = Duration::from_millis(1500);
    ranks::on_threads(2, |comm| {
        let mlp = mlp2();
        let options = StagesOptions::new(2, 2, 2, Rule::Delay1, mlp.boundary_bytes::<f32>()).timeout(TIMEOUT);
        let mut h = CyclicStages::<f32>::new(&comm, &options).unwrap();
        if comm.rank() == 1 {
            h.next().unwrap();
            std::thread::sleep(TIMEOUT + Duration::from_secs(1)); // stopped, the handle still open
            return;
        }
        let start = Instant::now();
        let e = train_stage(&mut h, &mlp, LR).unwrap_err();
        assert_eq!(e.status(), Status::Timeout, "{}", e);
        assert!(start.elapsed() < TIMEOUT + Duration::from_secs(1), "{:?}", start.elapsed());
        assert!(e.message().contains("cyclic stages, stage 0, micro-batch 0, step 0"), "{}", e);
        assert!(e.message().contains("stage 1 (rank 1)"), "{}", e);
        assert_eq!(h.next().unwrap_err().status(), Status::CommPoisoned);
    });
}
