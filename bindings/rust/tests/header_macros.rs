//! What bindgen does not translate: the header's initialiser macros
//! (`FLATMEM_*_INIT`, `{ ... }` struct initialisers) and the version the
//! library reports. The raw declarations themselves are bindgen's output
//! (flatmem-sys/src/bindings.rs, kept equal to the installed header by
//! scripts/check-bindgen.sh; their layouts by bindgen's own layout tests).
//!
//! The header is the one build.rs found with pkg-config
//! (`$FLATMEM_INCLUDE_DIR/flatmem/flatmem.h`, overridable at run time with
//! the same variable); the C compiler (`$CC`, default `cc`) expands each
//! macro in a small program, and the test compares it with the
//! `*_options_init` function the crate calls (or, for
//! `FLATMEM_CYCLIC_SCHEDULE_INIT` / `FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT`,
//! which have none, with the crate's `cyclic::SCHEDULE_INIT` /
//! `cyclic_stages::STAGES_SCHEDULE_INIT`) field by field.

use std::mem::size_of_val;
use std::path::{Path, PathBuf};
use std::process::Command;

use flatmem::sys;

fn include_dir() -> PathBuf {
    let dir = std::env::var_os("FLATMEM_INCLUDE_DIR")
        .map_or_else(|| PathBuf::from(env!("FLATMEM_INCLUDE_DIR")), PathBuf::from);
    assert!(dir.join("flatmem/flatmem.h").is_file(), "no flatmem/flatmem.h under {}", dir.display());
    dir
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {:?}: {} (a C compiler is needed: set CC)", cmd, e));
    assert!(out.status.success(), "{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn tmp_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flatmem-header-macros");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles and runs `main_body` with the header included; returns stdout.
fn c_program(main_body: &str) -> String {
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = tmp_dir();
    let stem = format!("program-{}-{}", std::process::id(), n); // tests run in parallel
    let src = dir.join(format!("{}.c", stem));
    let exe = dir.join(stem);
    let code = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include <flatmem/flatmem.h>\nint main(void) {{\n{}  return 0;\n}}\n",
        main_body
    );
    std::fs::write(&src, code).unwrap();
    run(Command::new(cc())
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(include_dir()));
    run(&mut Command::new(&exe))
}

#[test]
fn options_init_matches_macro() {
    // FLATMEM_CONTRASTIVE_OPTIONS_INIT as the compiler expands it, against
    // the function the crate calls.
    let out = c_program(
        "  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;\n  printf(\"%zu %d %d %d %d %d %lld %d %zu\\n\", \
         o.struct_size, (int)o.loss, (int)o.num_threads, (int)o.tile_rows, (int)o.tile_cols, (int)o.nonfinite, \
         (long long)o.fp32_precision, o.comm == NULL, o.logit_cache_bytes);\n",
    );
    let mut raw = sys::flatmem_contrastive_options {
        struct_size: 0,
        loss: 9,
        num_threads: 9,
        tile_rows: 9,
        tile_cols: 9,
        nonfinite: 9,
        reserved0: 9,
        fp32_precision: 9,
        comm: std::ptr::NonNull::dangling().as_ptr(),
        logit_cache_bytes: 9,
    };
    // SAFETY: a valid options struct.
    assert_eq!(
        unsafe { sys::flatmem_contrastive_options_init(&mut raw, size_of_val(&raw)) },
        sys::FLATMEM_STATUS_SUCCESS
    );
    let rust = format!(
        "{} {} {} {} {} {} {} {} {}",
        raw.struct_size,
        raw.loss,
        raw.num_threads,
        raw.tile_rows,
        raw.tile_cols,
        raw.nonfinite,
        raw.fp32_precision,
        raw.comm.is_null() as i32,
        raw.logit_cache_bytes
    );
    assert_eq!(out.trim(), rust);
    // The crate's own options start from the same defaults, without a
    // communicator; the builder sets the logit cache budget and nothing else.
    let built = flatmem::Options::new().to_raw().unwrap();
    assert!(built.comm.is_null());
    assert_eq!(built.logit_cache_bytes, raw.logit_cache_bytes);
    let cached = flatmem::Options::new().logit_cache_bytes(4096).to_raw().unwrap();
    assert_eq!(cached, sys::flatmem_contrastive_options { logit_cache_bytes: 4096, ..built });
}

#[test]
fn comm_options_init_matches_macro() {
    let out = c_program(
        "  flatmem_comm_options o = FLATMEM_COMM_OPTIONS_INIT;\n  printf(\"%zu %lld %lld\\n\", o.struct_size, \
         (long long)o.timeout_ms, (long long)o.connect_timeout_ms);\n",
    );
    let mut raw = sys::flatmem_comm_options { struct_size: 0, timeout_ms: 9, connect_timeout_ms: 9 };
    // SAFETY: a valid options struct of this declaration.
    assert_eq!(unsafe { sys::flatmem_comm_options_init(&mut raw, size_of_val(&raw)) }, sys::FLATMEM_STATUS_SUCCESS);
    assert_eq!(out.trim(), format!("{} {} {}", raw.struct_size, raw.timeout_ms, raw.connect_timeout_ms));
}

#[test]
fn cyclic_options_init_matches_macro() {
    let out = c_program(
        "  flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;\n  printf(\"%zu %d %lld %d %d %lld %d %lld %d %d %d\\n\", \
         o.struct_size, (int)o.stages, (long long)o.steps, (int)o.rule, o.activation_bytes == NULL, \
         (long long)o.timeout_ms, (int)o.nonfinite, (long long)o.history, (int)o.parameters, \
         o.parameter_count == NULL, (int)o.memory);\n",
    );
    let mut raw = sys::flatmem_cyclic_options {
        struct_size: 0,
        stages: 9,
        reserved0: 9,
        steps: 9,
        rule: 9,
        reserved1: 9,
        activation_bytes: std::ptr::NonNull::dangling().as_ptr(),
        timeout_ms: 9,
        nonfinite: 9,
        reserved2: 9,
        history: 9,
        parameters: 9,
        reserved3: 9,
        parameter_count: std::ptr::NonNull::dangling().as_ptr(),
        memory: 9,
        reserved4: 9,
    };
    // SAFETY: a valid options struct of this declaration.
    assert_eq!(unsafe { sys::flatmem_cyclic_options_init(&mut raw, size_of_val(&raw)) }, sys::FLATMEM_STATUS_SUCCESS);
    let rust = format!(
        "{} {} {} {} {} {} {} {} {} {} {}",
        raw.struct_size,
        raw.stages,
        raw.steps,
        raw.rule,
        raw.activation_bytes.is_null() as i32,
        raw.timeout_ms,
        raw.nonfinite,
        raw.history,
        raw.parameters,
        raw.parameter_count.is_null() as i32,
        raw.memory
    );
    assert_eq!(out.trim(), rust);
}

#[test]
fn schedule_init_matches_macro() {
    // FLATMEM_CYCLIC_SCHEDULE_INIT has no *_init function: the crate mirrors it as
    // a const, compared here with the compiler's expansion field by field.
    let out = c_program(
        "  flatmem_cyclic_schedule s = FLATMEM_CYCLIC_SCHEDULE_INIT;\n  printf(\"%zu %d %d %lld %d\\n\", \
         s.struct_size, (int)s.world_size, (int)s.stages, (long long)s.steps, (int)s.rule);\n",
    );
    let s = flatmem::cyclic::SCHEDULE_INIT;
    assert_eq!(out.trim(), format!("{} {} {} {} {}", s.struct_size, s.world_size, s.stages, s.steps, s.rule));
    // The crate's Schedule starts from it.
    let raw = flatmem::cyclic::Schedule::new(4, 2, 3, flatmem::cyclic::Rule::Newest).unwrap().to_raw();
    assert_eq!(
        raw,
        sys::flatmem_cyclic_schedule { world_size: 4, stages: 2, steps: 3, rule: sys::FLATMEM_CYCLIC_NEWEST, ..s }
    );
}

#[test]
fn stages_schedule_init_and_options_init_match_macros() {
    // FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT has no *_init function: the crate
    // mirrors it as a const; FLATMEM_CYCLIC_STAGES_OPTIONS_INIT against
    // flatmem_cyclic_stages_options_init, which the crate calls.
    let out = c_program(
        "  flatmem_cyclic_stages_schedule s = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;\n  \
         flatmem_cyclic_stages_options o = FLATMEM_CYCLIC_STAGES_OPTIONS_INIT;\n  \
         printf(\"%zu %d %d %lld %d\\n\", s.struct_size, (int)s.stages, (int)s.micro_batches, \
         (long long)s.steps, (int)s.rule);\n  \
         printf(\"%zu %d %d %lld %d %d %d %lld %lld %d\\n\", o.struct_size, (int)o.stages, (int)o.micro_batches, \
         (long long)o.steps, (int)o.rule, o.boundary_bytes == NULL, o.activation_bytes == NULL, \
         (long long)o.timeout_ms, (long long)o.history, (int)o.memory);\n",
    );
    let s = flatmem::cyclic_stages::STAGES_SCHEDULE_INIT;
    let mut o = sys::flatmem_cyclic_stages_options {
        struct_size: 0,
        stages: 9,
        micro_batches: 9,
        steps: 9,
        rule: 9,
        reserved0: 9,
        boundary_bytes: std::ptr::NonNull::dangling().as_ptr(),
        activation_bytes: std::ptr::NonNull::dangling().as_ptr(),
        timeout_ms: 9,
        history: 9,
        memory: 9,
        reserved1: 9,
    };
    // SAFETY: a valid options struct of this declaration.
    assert_eq!(
        unsafe { sys::flatmem_cyclic_stages_options_init(&mut o, size_of_val(&o)) },
        sys::FLATMEM_STATUS_SUCCESS
    );
    let rust = format!(
        "{} {} {} {} {}\n{} {} {} {} {} {} {} {} {} {}",
        s.struct_size,
        s.stages,
        s.micro_batches,
        s.steps,
        s.rule,
        o.struct_size,
        o.stages,
        o.micro_batches,
        o.steps,
        o.rule,
        o.boundary_bytes.is_null() as i32,
        o.activation_bytes.is_null() as i32,
        o.timeout_ms,
        o.history,
        o.memory
    );
    assert_eq!(out.trim(), rust);
}

#[test]
fn reversible_options_init_matches_macros() {
    let out = c_program(
        "  flatmem_reversible_options r = FLATMEM_REVERSIBLE_OPTIONS_INIT;\n  flatmem_block_options b = \
         FLATMEM_BLOCK_OPTIONS_INIT;\n  printf(\"%zu %d %d | %zu %d %d %d %d %a %d\\n\", r.struct_size, (int)r.mode, \
         (int)r.num_threads, b.struct_size, (int)b.kind, (int)b.width, (int)b.heads, (int)b.hidden, \
         (double)b.layer_norm_eps, (int)b.math);\n",
    );
    let mut r = sys::flatmem_reversible_options { struct_size: 0, mode: 9, num_threads: 9 };
    let mut b = sys::flatmem_block_options {
        struct_size: 0,
        kind: 9,
        width: 9,
        heads: 9,
        hidden: 9,
        layer_norm_eps: 9.0,
        math: 9,
    };
    // SAFETY: valid options structs of these declarations.
    unsafe {
        assert_eq!(sys::flatmem_reversible_options_init(&mut r, size_of_val(&r)), sys::FLATMEM_STATUS_SUCCESS);
        assert_eq!(sys::flatmem_block_options_init(&mut b, size_of_val(&b)), sys::FLATMEM_STATUS_SUCCESS);
    }
    // %a of 0.0 is "0x0p+0"; the library's default eps is exactly the macro's 0.0f.
    assert_eq!(b.layer_norm_eps, 0.0);
    let rust = format!(
        "{} {} {} | {} {} {} {} {} 0x0p+0 {}",
        r.struct_size, r.mode, r.num_threads, b.struct_size, b.kind, b.width, b.heads, b.hidden, b.math
    );
    assert_eq!(out.trim(), rust);
    assert_eq!(b.math, sys::FLATMEM_BLOCK_MATH_FP32);
    // The crate's BlockOptions start from the same defaults.
    let built = flatmem::BlockOptions::mlp(4).to_raw().unwrap();
    assert_eq!(built.math, sys::FLATMEM_BLOCK_MATH_FP32);
    assert_eq!(built.struct_size, b.struct_size);
    let tf32 = flatmem::BlockOptions::mlp(4).math(flatmem::BlockMath::Tf32).to_raw().unwrap();
    assert_eq!(tf32, sys::flatmem_block_options { math: sys::FLATMEM_BLOCK_MATH_TF32, ..built });
}

#[test]
fn linked_library_is_the_header_version() {
    assert_eq!(flatmem::HEADER_VERSION.packed() as i64, sys::FLATMEM_VERSION as i64);
    assert_eq!(flatmem::version(), flatmem::HEADER_VERSION);
    assert_eq!(flatmem::check_version().unwrap(), flatmem::HEADER_VERSION);
    assert_eq!(flatmem::version_string(), flatmem::HEADER_VERSION.to_string());
    assert_eq!(env!("FLATMEM_PC_VERSION"), flatmem::HEADER_VERSION.to_string(), "flatmem.pc's Version");
}
