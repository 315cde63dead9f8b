//! The `bundled` feature: libflatmem configured, built and installed into
//! OUT_DIR by the `cmake` crate, from this repository (the crate lives at
//! bindings/rust/flatmem-sys) or from FLATMEM_SOURCE_DIR.
//!
//! The library only (no tests, benchmarks or examples), Release. The backends
//! are the project's own choice (cmake/FlatmemOptions.cmake: FLATMEM_WITH_CUDA,
//! _NCCL and _UCX default to AUTO, used when found); FLATMEM_SYS_CMAKE_ARGS
//! adds -DNAME=VALUE definitions after these (a shell-quoted list, e.g.
//! "-DFLATMEM_WITH_CUDA=OFF"), so they win. The cmake crate runs the build
//! with cargo's jobs (its jobserver, or NUM_JOBS); CMAKE_BUILD_PARALLEL_LEVEL
//! is cmake's own, `CMAKE` names another cmake program.

use crate::shell_words::split_shell_words;
use crate::{fail, Library};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// What the bundled build defines before FLATMEM_SYS_CMAKE_ARGS.
const DEFINES: [(&str, &str); 4] = [
    ("FLATMEM_BUILD_TESTS", "OFF"),
    ("FLATMEM_BUILD_BENCH", "OFF"),
    ("FLATMEM_BUILD_EXAMPLES", "OFF"),
    // lib/, not lib64/ (GNUInstallDirs on some systems): where emit() looks.
    ("CMAKE_INSTALL_LIBDIR", "lib"),
];

/// Builds and installs the library into OUT_DIR; `why` says why (no flatmem
/// found by pkg-config, or FLATMEM_SYS_BUNDLED=always).
pub fn build(why: &str) -> Library {
    for var in ["FLATMEM_SOURCE_DIR", "FLATMEM_SYS_CMAKE_ARGS", "CMAKE"] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    let source = source_dir();
    // What the library's build reads (a changed source reruns this script;
    // cmake then rebuilds what changed).
    for input in ["CMakeLists.txt", "cmake", "src", "include", "pkgconfig"] {
        println!("cargo:rerun-if-changed={}", source.join(input).display());
    }
    let extra = extra_defines();
    println!(
        "cargo:warning=building flatmem from {} with cmake into OUT_DIR (the `bundled` feature; {}){}",
        source.display(),
        why.lines().next().unwrap_or_default(),
        if extra.is_empty() { String::new() } else { format!(" with {}", describe(&extra)) }
    );

    let mut config = cmake::Config::new(&source);
    config.profile("Release");
    for (name, value) in DEFINES
        .iter()
        .map(|&(n, v)| (n.to_string(), v.to_string()))
        .chain(extra.iter().cloned())
    {
        config.define(name, value);
    }
    let prefix = config.build();
    installed(&prefix, &source, &libdir(&extra))
}

/// The repository root: FLATMEM_SOURCE_DIR, else three levels above this
/// crate (bindings/rust/flatmem-sys).
fn source_dir() -> PathBuf {
    let (source, named_by) = match env::var_os("FLATMEM_SOURCE_DIR") {
        Some(dir) if !dir.is_empty() => (PathBuf::from(dir), "FLATMEM_SOURCE_DIR"),
        _ => {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
            (
                manifest.join("../../.."),
                "this crate's place in the repository (bindings/rust/flatmem-sys)",
            )
        }
    };
    if !source.join("CMakeLists.txt").is_file()
        || !source.join("include/flatmem/flatmem.h").is_file()
    {
        fail(&format!(
            "the `bundled` feature builds flatmem from its source, but {} (from {}) holds no \
             CMakeLists.txt and include/flatmem/flatmem.h: set FLATMEM_SOURCE_DIR to a flatmem \
             checkout, or install flatmem and let pkg-config find it",
            source.display(),
            named_by
        ));
    }
    source.canonicalize().unwrap_or(source)
}

/// FLATMEM_SYS_CMAKE_ARGS as (name, value) pairs: `-DNAME=VALUE`,
/// `-DNAME:TYPE=VALUE` or `-D NAME=VALUE` (the cmake crate passes only
/// definitions).
fn extra_defines() -> Vec<(String, String)> {
    let text = env::var("FLATMEM_SYS_CMAKE_ARGS").unwrap_or_default();
    let mut words = split_shell_words(&text).into_iter();
    let mut defines = Vec::new();
    while let Some(word) = words.next() {
        let definition = match word.strip_prefix("-D") {
            Some("") => words.next().unwrap_or_default(),
            Some(rest) => rest.to_string(),
            None => String::new(),
        };
        match definition.split_once('=') {
            Some((name, value)) if !name.is_empty() => {
                defines.push((name.to_string(), value.to_string()))
            }
            _ => fail(&format!(
                "FLATMEM_SYS_CMAKE_ARGS: `{}` is not a -DNAME=VALUE definition (the only kind of \
                 argument the bundled cmake build takes)",
                word
            )),
        }
    }
    defines
}

fn describe(defines: &[(String, String)]) -> String {
    defines
        .iter()
        .map(|(n, v)| format!("-D{}={}", n, v))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The installed library directory under `prefix`: CMAKE_INSTALL_LIBDIR, ours
/// unless FLATMEM_SYS_CMAKE_ARGS changed it.
fn libdir(extra: &[(String, String)]) -> PathBuf {
    let libdir = extra
        .iter()
        .rev()
        .find(|(n, _)| n.split(':').next() == Some("CMAKE_INSTALL_LIBDIR"));
    PathBuf::from(libdir.map_or("lib", |(_, v)| v.as_str()))
}

/// The library as `cmake --install` left it in `prefix`.
fn installed(prefix: &Path, source: &Path, libdir: &Path) -> Library {
    let lib = prefix.join(libdir);
    let include = prefix.join("include");
    let pc = lib.join("pkgconfig/flatmem.pc");
    for file in [
        include.join("flatmem/flatmem.h"),
        lib.join("libflatmem.so"),
        pc.clone(),
    ] {
        if !file.is_file() {
            fail(&format!(
                "the bundled build installed no {} (under {})",
                file.display(),
                prefix.display()
            ));
        }
    }
    let text = fs::read_to_string(&pc)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {}", pc.display(), e)));
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .map(str::trim);
    let version = version.unwrap_or_else(|| fail(&format!("{} has no Version line", pc.display())));
    Library {
        include,
        lib_dirs: vec![lib],
        libs: vec!["flatmem".to_string()],
        version: version.to_string(),
        origin: format!("the bundled build of {} gives", source.display()),
    }
}
