//! The CPU instruction set (`flatmem::cpu_isa`): the library's names, get /
//! set round trips, refusal of an instruction set above the processor's
//! best, the contrastive loss under each one (within the f64 reference's
//! bounds, bitwise reproducible), `cpu_engine` naming the kernels of each,
//! and the environment variable `FLATMEM_CPU_ISA`, which the library reads
//! once per process and is therefore tried in child processes.
//! Expectations follow the processor's best, so the tests pass on AVX2,
//! AVX-512, AVX512_BF16 and AMX machines alike.
//!
//! The selection is process-wide: the tests that change it hold
//! `SELECTION` and put the default back when they end, panicking or not.
//! No other test binary changes it.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use common::{assert_close, backward_tolerance, forward_tolerance, reference, widen, Problem, Rng};
use flatmem::{cpu_engine, cpu_isa, set_cpu_isa, sys, CpuIsa, Dtype, Features, Loss, Options, Status};

static SELECTION: Mutex<()> = Mutex::new(());

/// Holds the selection for one test; puts the default back on drop.
struct Selecting(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Selecting {
    fn start() -> Selecting {
        // A test that panicked while holding it has restored the default.
        Selecting(SELECTION.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }
}

impl Drop for Selecting {
    fn drop(&mut self) {
        set_cpu_isa(None).expect("back to the default instruction set");
    }
}

fn best() -> CpuIsa {
    cpu_isa().expect("flatmem_cpu_isa_get").1
}

#[test]
fn names_and_order() {
    let names: Vec<&str> = CpuIsa::ALL.iter().map(|isa| isa.name()).collect();
    assert_eq!(names, ["baseline", "avx2", "avx512", "avx512bf16", "amx"]);
    assert_eq!(CpuIsa::Avx512.to_string(), "avx512");
    assert_eq!(CpuIsa::Avx512Bf16.to_string(), "avx512bf16");
    assert_eq!(CpuIsa::Amx.to_string(), "amx");
    assert!(CpuIsa::ALL.windows(2).all(|pair| pair[0] < pair[1]), "{:?} not least capable first", CpuIsa::ALL);
    assert_eq!(CpuIsa::ALL.iter().max(), Some(&CpuIsa::Amx));
    let raw: Vec<sys::flatmem_cpu_isa> = CpuIsa::ALL.iter().map(|isa| isa.raw()).collect();
    assert_eq!(
        raw,
        [
            sys::FLATMEM_CPU_ISA_BASELINE,
            sys::FLATMEM_CPU_ISA_AVX2,
            sys::FLATMEM_CPU_ISA_AVX512,
            sys::FLATMEM_CPU_ISA_AVX512BF16,
            sys::FLATMEM_CPU_ISA_AMX
        ]
    );
    assert_eq!(raw, [1, 2, 3, 4, 5]);
}

/// The levels machines answer differently, each selected exactly where the
/// processor has it: AVX2-only and AVX-512 processors without BF16 refuse
/// `Avx512Bf16` and `Amx`, AVX512_BF16 ones without AMX tiles refuse `Amx`
/// (nothing changes), AMX ones select both.
#[test]
fn bf16_levels_exactly_where_the_processor_has_them() {
    let _selecting = Selecting::start();
    let (in_use, best) = cpu_isa().unwrap();
    for isa in [CpuIsa::Avx512Bf16, CpuIsa::Amx] {
        match set_cpu_isa(Some(isa)) {
            Ok(()) => {
                assert!(isa <= best, "{} selected but the best is {}", isa, best);
                assert_eq!(cpu_isa().unwrap(), (isa, best));
                set_cpu_isa(None).unwrap();
            }
            Err(err) => {
                assert!(best < isa, "best {} but {} refused: {}", best, isa, err);
                assert_eq!(err.status(), Status::Unsupported, "{}", err);
                assert!(err.message().contains(isa.name()) && err.message().contains(best.name()), "{}", err);
            }
        }
        assert_eq!(cpu_isa().unwrap(), (in_use, best));
    }
}

#[test]
fn set_and_get_round_trip() {
    let _selecting = Selecting::start();
    let (initial, best) = cpu_isa().unwrap();
    assert!(initial <= best, "in use {} above the best {}", initial, best);
    for &isa in CpuIsa::ALL.iter().filter(|&&isa| isa <= best) {
        set_cpu_isa(Some(isa)).unwrap_or_else(|e| panic!("{} (best {}): {}", isa, best, e));
        assert_eq!(cpu_isa().unwrap(), (isa, best));
    }
    // Above the best (none when the processor has AMX tiles; Amx alone on an
    // AVX512_BF16 one): refused, and the one in use stays.
    let in_use = cpu_isa().unwrap().0;
    for &isa in CpuIsa::ALL.iter().filter(|&&isa| isa > best) {
        let err = set_cpu_isa(Some(isa)).unwrap_err();
        assert_eq!(err.status(), Status::Unsupported, "{}", err);
        assert!(err.message().contains(isa.name()) && err.message().contains(best.name()), "{}", err);
        assert_eq!(cpu_isa().unwrap(), (in_use, best));
    }
    // None: back to the environment's choice (FLATMEM_CPU_ISA, else the best).
    set_cpu_isa(None).unwrap();
    assert_eq!(cpu_isa().unwrap(), (initial, best));
}

/// The symmetric loss and its gradients of one fixed problem under the
/// instruction set in use, checked against the f64 reference: (loss,
/// row_lse, col_lse, dq, dk, ds) as bits.
fn symmetric_bits(what: &str) -> Vec<u32> {
    let (b, d, scale) = (37, 19, 20.0f32);
    let mut rng = Rng::new(5);
    let q = rng.unit_rows(b, d);
    let k = rng.noisy_copy(&q, d, 0.3);
    let problem = Problem {
        symmetric: true,
        b,
        c: b,
        d,
        q: widen(&q),
        k: widen(&k),
        labels: None,
        scale: scale as f64,
        dloss: 1.0,
    };
    let want = reference(&problem);
    let ft = forward_tolerance(&problem, &want);
    let bt = backward_tolerance(&problem, &want, &ft, Dtype::F32);

    let mut h = Options::new().loss(Loss::Symmetric).threads(2).tiles(5, 8).build().unwrap();
    let (qf, kf) = (Features::f32(&q, b, d), Features::f32(&k, b, d));
    let out = h.forward(qf, kf, None, scale).unwrap();
    let g = h.backward(qf, kf, None, scale, &out, 1.0).unwrap();
    let col_lse = out.col_lse.clone().unwrap();
    assert_close(&format!("{}: loss", what), &[out.loss as f64], &[want.loss], &[ft.loss]);
    assert_close(&format!("{}: row_lse", what), &widen(&out.row_lse), &want.row_lse, &ft.row_lse);
    assert_close(&format!("{}: col_lse", what), &widen(&col_lse), &want.col_lse, &ft.col_lse);
    assert_close(&format!("{}: dq", what), &widen(&g.dq), &want.dq, &bt.dq);
    assert_close(&format!("{}: dk", what), &widen(&g.dk), &want.dk, &bt.dk);
    assert_close(&format!("{}: dlogit_scale", what), &[g.dlogit_scale as f64], &[want.ds], &[bt.ds]);

    let values = [&[out.loss][..], &out.row_lse, &col_lse, &g.dq, &g.dk, &[g.dlogit_scale]];
    values.iter().flat_map(|v| v.iter().map(|x| x.to_bits())).collect()
}

#[test]
fn every_instruction_set_computes_the_loss() {
    let _selecting = Selecting::start();
    for &isa in CpuIsa::ALL.iter().filter(|&&isa| isa <= best()) {
        set_cpu_isa(Some(isa)).unwrap();
        let what = format!("cpu isa {}", isa);
        let first = symmetric_bits(&what);
        assert!(symmetric_bits(&what) == first, "{}: not bitwise reproducible", what);
    }
}

// ---------------------------------------------------------------------------
// FLATMEM_CPU_ISA, in child processes
// ---------------------------------------------------------------------------

fn outcome<T: std::fmt::Debug>(result: flatmem::Result<T>) -> String {
    match result {
        Ok(value) => format!("Ok {:?}", value),
        Err(e) => format!("Err {:?} {}", e.status(), e.message()),
    }
}

/// Run by `environment_variable` in a child process with FLATMEM_CPU_ISA
/// set: writes `child <step>: <outcome>` lines to stderr (stdout is the
/// test harness's) for the parent to check.
#[test]
#[ignore = "run by environment_variable in a child process"]
fn child_reports_the_environment() {
    let _selecting = Selecting::start(); // in case it is run with the others (--include-ignored)
    let report = |step: &str, outcome: String| eprintln!("child {}: {}", step, outcome);
    let create = || outcome(Options::new().threads(1).build().map(|_| ()));
    report("get", outcome(cpu_isa()));
    report("create", create());
    report("set baseline", outcome(set_cpu_isa(Some(CpuIsa::Baseline))));
    report("get after set", outcome(cpu_isa()));
    report("create after set", create());
    report("reset", outcome(set_cpu_isa(None)));
    report("get after reset", outcome(cpu_isa()));
}

/// The child's report under `FLATMEM_CPU_ISA=value`: step -> outcome.
fn child(value: &str) -> BTreeMap<String, String> {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(&exe)
        .args(["--exact", "child_reports_the_environment", "--ignored", "--nocapture", "--test-threads=1"])
        .env("FLATMEM_CPU_ISA", value)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {}", exe.display(), e));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child with FLATMEM_CPU_ISA={:?} failed: {}{}", value, stdout, stderr);
    let report: BTreeMap<String, String> = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("child ")?.split_once(": "))
        .map(|(step, outcome)| (step.to_string(), outcome.to_string()))
        .collect();
    assert_eq!(report.len(), 7, "child with FLATMEM_CPU_ISA={:?} reported {:?}", value, stderr);
    report
}

/// Asserts that an outcome is an error of this status naming the variable.
fn assert_refused(report: &BTreeMap<String, String>, step: &str, status: Status, value: &str) {
    let got = &report[step];
    assert!(
        got.starts_with(&format!("Err {:?} ", status)) && got.contains("FLATMEM_CPU_ISA") && got.contains(value),
        "FLATMEM_CPU_ISA={:?}, {}: expected {:?} naming the variable, got {:?}",
        value,
        step,
        status,
        got
    );
}

#[test]
fn environment_variable() {
    let best = best();
    let ok = |in_use: CpuIsa| format!("Ok {:?}", (in_use, best));
    // It caps the default; set_cpu_isa overrides it; None goes back to it.
    let mut values: Vec<(String, CpuIsa)> = vec![(String::new(), best), ("auto".to_string(), best)];
    values.extend(CpuIsa::ALL.iter().filter(|&&isa| isa <= best).map(|&isa| (isa.name().to_string(), isa)));
    for (value, in_use) in &values {
        let report = child(value);
        assert_eq!(report["get"], ok(*in_use), "FLATMEM_CPU_ISA={:?}", value);
        assert_eq!(report["create"], "Ok ()", "FLATMEM_CPU_ISA={:?}", value);
        assert_eq!(report["get after set"], ok(CpuIsa::Baseline), "FLATMEM_CPU_ISA={:?}", value);
        assert_eq!(report["get after reset"], ok(*in_use), "FLATMEM_CPU_ISA={:?}", value);
    }
    // An unknown word: every query and handle creation fails naming it,
    // until set_cpu_isa chooses; None brings the error back.
    let report = child("avx-512");
    for step in ["get", "create", "get after reset"] {
        assert_refused(&report, step, Status::InvalidArgument, "avx-512");
    }
    assert_eq!(report["get after set"], ok(CpuIsa::Baseline));
    assert_eq!(report["create after set"], "Ok ()");
    // More than this processor has (nothing above AMX exists).
    for &isa in CpuIsa::ALL.iter().filter(|&&isa| isa > best) {
        let report = child(isa.name());
        assert_refused(&report, "get", Status::Unsupported, isa.name());
        assert_refused(&report, "create", Status::Unsupported, isa.name());
        assert_eq!(report["get after set"], ok(CpuIsa::Baseline));
    }
    // The words in any case: selected, or refused as above the best.
    for (value, isa) in [
        ("AVX512BF16", CpuIsa::Avx512Bf16),
        ("Avx512Bf16", CpuIsa::Avx512Bf16),
        ("AMX", CpuIsa::Amx),
        ("Amx", CpuIsa::Amx),
    ] {
        let report = child(value);
        if isa <= best {
            assert_eq!(report["get"], ok(isa), "FLATMEM_CPU_ISA={:?}", value);
        } else {
            assert_refused(&report, "get", Status::Unsupported, value);
            assert!(report["get"].contains(isa.name()), "{:?}", report["get"]);
        }
        assert_eq!(report["get after set"], ok(CpuIsa::Baseline));
    }
}

// ---------------------------------------------------------------------------
// cpu_engine
// ---------------------------------------------------------------------------

/// `cpu_engine`: library, version and the instruction set's name lead, then
/// a kernel per input dtype; `None` is the level in use; levels above the
/// best are described too (what would run there). Only the prefix and the
/// dtype sections are asserted: the kernel words are not a stable format.
/// At avx512bf16 and amx bf16 inputs are no longer widened to fp32.
#[test]
fn engine_names_the_kernels_of_every_level() {
    let _selecting = Selecting::start();
    let in_use = cpu_isa().unwrap().0;
    assert_eq!(cpu_engine(None), cpu_engine(Some(in_use)));
    for &isa in CpuIsa::ALL.iter() {
        let text = cpu_engine(Some(isa));
        let prefix = format!("flatmem {} own kernels at {}: fp32 ", flatmem::version_string(), isa.name());
        assert!(text.starts_with(&prefix), "{:?} does not start with {:?}", text, prefix);
        assert!(text.contains("; bf16 "), "{}: {:?}", isa, text);
        if isa >= CpuIsa::Avx512Bf16 {
            let bf16 = text.split("; bf16 ").nth(1).unwrap().split(';').next().unwrap();
            assert!(!bf16.contains("widened to fp32"), "{}: bf16 {:?} in {:?}", isa, bf16, text);
        }
    }
    // The selection moves None's answer with it.
    set_cpu_isa(Some(CpuIsa::Baseline)).unwrap();
    assert_eq!(cpu_engine(None), cpu_engine(Some(CpuIsa::Baseline)));
    // Not a flatmem_cpu_isa value: the library's "unknown" (the raw call; the
    // safe one takes only CpuIsa).
    // SAFETY: a plain value; the result is a static NUL-terminated string.
    let unknown = unsafe { std::ffi::CStr::from_ptr(sys::flatmem_cpu_isa_engine(99)) };
    assert_eq!(unknown.to_str(), Ok("unknown"));
}
