//! The cyclic schedule queries (flatmem::cyclic) against the closed forms
//! of flatmem/cyclic.h: offsets, the action of every rank at every time
//! step, the delays of each rule, every average applied once and in order,
//! the activation sum, the length, and the errors.

use flatmem::cyclic::{ActionKind, Rule, Schedule, Update};
use flatmem::{sys, Status};

const RULES: [Rule; 3] = [Rule::Delay1, Rule::Newest, Rule::Sync];

/// (N, L, steps): 2L/N whole, not whole, N = 2L, N > 2L, one rank, one stage.
const SHAPES: [(usize, usize, u64); 8] =
    [(1, 1, 2), (2, 1, 3), (3, 2, 2), (4, 2, 3), (8, 4, 3), (5, 3, 2), (7, 2, 2), (6, 4, 1)];

fn expected_offset(n: usize, l: usize, rule: Rule, rank: usize) -> u64 {
    if rule == Rule::Sync {
        0
    } else {
        (rank * 2 * l / n) as u64
    }
}

#[test]
fn offsets_follow_the_header() {
    for (n, l, steps) in SHAPES {
        for rule in RULES {
            let s = Schedule::new(n, l, steps, rule).unwrap();
            assert_eq!((s.world_size(), s.stages(), s.steps(), s.rule()), (n, l, steps, rule));
            for r in 0..n {
                assert_eq!(
                    s.offset(r).unwrap(),
                    expected_offset(n, l, rule, r),
                    "N {} L {} {:?} rank {}",
                    n,
                    l,
                    rule,
                    r
                );
            }
        }
    }
}

#[test]
fn actions_follow_the_closed_form() {
    for (n, l, steps) in SHAPES {
        for rule in RULES {
            let s = Schedule::new(n, l, steps, rule).unwrap();
            let period = 2 * l as u64;
            let mut all_done_at = 0;
            for r in 0..n {
                let offset = s.offset(r).unwrap();
                for t in 0..s.length() + 3 {
                    let a = s.action(r, t).unwrap();
                    let what = format!("N {} L {} {:?} rank {} t {}: {:?}", n, l, rule, r, t, a);
                    assert_eq!(a.time_step, t, "{}", what);
                    let active = t >= offset && (t - offset) / period < steps;
                    if !active {
                        let kind = if t >= s.length() { ActionKind::Done } else { ActionKind::Idle };
                        assert_eq!(a.kind, kind, "{}", what);
                        assert_eq!((a.stage, a.step, a.phase, a.activations_held), (None, None, None, 0), "{}", what);
                        continue;
                    }
                    all_done_at = all_done_at.max(t + 1);
                    let (step, p) = ((t - offset) / period, ((t - offset) % period) as usize);
                    let (kind, stage) =
                        if p < l { (ActionKind::Forward, p) } else { (ActionKind::Backward, 2 * l - 1 - p) };
                    assert_eq!(
                        (a.kind, a.stage, a.step, a.phase),
                        (kind, Some(stage), Some(step), Some(p)),
                        "{}",
                        what
                    );
                    // forward of j holds stages 0 .. j; the backward of j still does
                    assert_eq!(a.activations_held, stage + 1, "{}", what);
                }
            }
            // The length covers the last backward of every rank (and the updates after it).
            assert!(s.length() >= all_done_at, "N {} L {} {:?}: length {} < {}", n, l, rule, s.length(), all_done_at);
            let last = s.length() - 1;
            assert!(
                (0..n).any(|r| s.action(r, last).unwrap().kind != ActionKind::Done),
                "N {} L {} {:?}: every rank done before the length",
                n,
                l,
                rule
            );
            assert_eq!(s.actions(0).unwrap().len() as u64, s.length());
        }
    }
}

#[test]
fn delays_follow_the_rules() {
    for (n, l, steps) in SHAPES {
        for rule in RULES {
            let s = Schedule::new(n, l, steps, rule).unwrap();
            let last_offset = s.offset(n - 1).unwrap();
            for r in 0..n {
                for j in 0..l {
                    let expected = match rule {
                        Rule::Delay1 => 1,
                        Rule::Sync => 0,
                        Rule::Newest => u32::from(last_offset - s.offset(r).unwrap() > 2 * j as u64),
                    };
                    assert_eq!(s.delay(r, j).unwrap(), expected, "N {} L {} {:?} rank {} stage {}", n, l, rule, r, j);
                }
            }
        }
    }
}

#[test]
fn every_average_is_applied_once_in_order_at_its_delay() {
    for (n, l, steps) in SHAPES {
        for rule in RULES {
            let s = Schedule::new(n, l, steps, rule).unwrap();
            let period = 2 * l as u64;
            for r in 0..n {
                let end = s.offset(r).unwrap() + steps * period; // after the rank's last backward
                let mut applied: Vec<Vec<u64>> = vec![Vec::new(); l];
                for a in s.actions(r).unwrap() {
                    let Update { stage, step } = match a.update {
                        Some(u) => u,
                        None => continue,
                    };
                    let what = format!("N {} L {} {:?} rank {}: {:?}", n, l, rule, r, a);
                    applied[stage].push(step);
                    let target = step + 1 + u64::from(s.delay(r, stage).unwrap());
                    if target < steps {
                        assert_eq!(
                            (a.kind, a.stage, a.step),
                            (ActionKind::Forward, Some(stage), Some(target)),
                            "{}",
                            what
                        );
                    } else {
                        assert!(a.kind == ActionKind::Idle && a.time_step >= end, "{}", what);
                    }
                }
                for (j, steps_applied) in applied.iter().enumerate() {
                    assert_eq!(
                        *steps_applied,
                        (0..steps).collect::<Vec<_>>(),
                        "N {} L {} {:?} rank {} stage {}",
                        n,
                        l,
                        rule,
                        r,
                        j
                    );
                }
            }
        }
    }
}

#[test]
fn activations_of_2l_cyclic_ranks_sum_to_a_constant() {
    // N = 2L: once every rank has started and until the first one stops, the
    // ranks together hold N (L + 1) / 2 stage-units; synchronous ranks peak at N L.
    let (l, steps) = (4usize, 3u64);
    let n = 2 * l;
    let sum = |s: &Schedule, t: u64| -> usize { (0..n).map(|r| s.action(r, t).unwrap().activations_held).sum() };
    let cyclic = Schedule::new(n, l, steps, Rule::Delay1).unwrap();
    let (first, stop) = (cyclic.offset(n - 1).unwrap(), steps * 2 * l as u64);
    assert!(first < stop);
    for t in first..stop {
        assert_eq!(sum(&cyclic, t), n * (l + 1) / 2, "time step {}", t);
    }
    let sync = Schedule::new(n, l, steps, Rule::Sync).unwrap();
    assert_eq!((0..sync.length()).map(|t| sum(&sync, t)).max(), Some(n * l));
}

#[test]
fn errors_name_the_argument() {
    let expect = |result: flatmem::Result<()>, text: &str| {
        let e = result.unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().contains(text), "{:?} does not name {:?}", e.message(), text);
    };
    expect(Schedule::new(0, 2, 1, Rule::Delay1).map(drop), "schedule.world_size: 0");
    expect(Schedule::new(2, 65536, 1, Rule::Delay1).map(drop), "schedule.stages: 65536");
    expect(Schedule::new(2, 2, 0, Rule::Newest).map(drop), "schedule.steps: 0");
    expect(Schedule::new(usize::MAX, 2, 1, Rule::Sync).map(drop), "schedule.world_size = ");
    expect(Schedule::new(2, 2, u64::MAX, Rule::Sync).map(drop), "does not fit int64_t");
    let s = Schedule::new(4, 2, 3, Rule::Delay1).unwrap();
    expect(s.offset(4).map(drop), "rank: 4; expected 0 .. 3");
    expect(s.delay(0, 2).map(drop), "stage: 2; expected 0 .. 1");
    expect(s.action(5, 0).map(drop), "rank: 5");
    expect(s.action(0, u64::MAX).map(drop), "time_step = ");
    expect(s.offset(usize::MAX).map(drop), "rank = ");
}

#[test]
fn raw_values_round_trip() {
    for rule in RULES {
        assert_eq!(Rule::from_raw(rule.raw()), Some(rule));
    }
    assert_eq!(Rule::from_raw(sys::FLATMEM_CYCLIC_SYNC + 1), None);
    assert_eq!(Rule::default(), Rule::Delay1);
    let s = Schedule::new(3, 2, 5, Rule::Sync).unwrap();
    let raw = s.to_raw();
    assert_eq!(raw.struct_size, std::mem::size_of::<sys::flatmem_cyclic_schedule>());
    assert_eq!((raw.world_size, raw.stages, raw.steps, raw.rule), (3, 2, 5, sys::FLATMEM_CYCLIC_SYNC));
    // The raw query gives what the safe one does.
    let mut length = 0i64;
    // SAFETY: a valid schedule struct and a writable output.
    assert_eq!(unsafe { sys::flatmem_cyclic_schedule_length(&raw, &mut length) }, sys::FLATMEM_STATUS_SUCCESS);
    assert_eq!(length as u64, s.length());
    // An unknown action kind from the C side is refused, not mapped.
    let mut a = sys::flatmem_cyclic_action {
        time_step: 0,
        kind: sys::FLATMEM_CYCLIC_DONE + 1,
        stage: -1,
        step: -1,
        update_stage: -1,
        reserved0: 0,
        update_step: -1,
        activations_held: 0,
        phase: -1,
    };
    assert_eq!(flatmem::cyclic::Action::from_raw(&a).unwrap_err().status(), Status::Internal);
    a.kind = sys::FLATMEM_CYCLIC_IDLE;
    let idle = flatmem::cyclic::Action::from_raw(&a).unwrap();
    assert_eq!((idle.kind, idle.stage, idle.update), (ActionKind::Idle, None, None));
}

#[test]
fn schedules_are_plain_send_sync_values() {
    fn send_sync<T: Send + Sync + Copy>() {}
    send_sync::<Schedule>();
    send_sync::<flatmem::cyclic::Action>();
    // Queries from several threads at once (the C functions are pure).
    let s = Schedule::new(8, 4, 3, Rule::Newest).unwrap();
    let expected = s.actions(5).unwrap();
    let threads: Vec<_> = (0..4).map(|_| std::thread::spawn(move || s.actions(5).unwrap())).collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), expected);
    }
}
