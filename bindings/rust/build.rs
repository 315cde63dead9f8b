//! The library itself is found and linked by flatmem-sys's build script
//! (pkg-config, or with the `bundled` feature its own build of the library
//! when pkg-config finds none); this one only adds, for this crate's own tests, examples and
//! doctests, an rpath to the library directory it found (so they run without
//! LD_LIBRARY_PATH; FLATMEM_NO_RPATH=1 leaves it out), and passes its
//! findings on as compile-time variables for the tests:
//! FLATMEM_INCLUDE_DIR, FLATMEM_LIB_DIR, FLATMEM_PC_VERSION.

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FLATMEM_NO_RPATH");
    // Metadata of the `links = "flatmem"` dependency (flatmem-sys/build.rs).
    let get = |key: &str| env::var(format!("DEP_FLATMEM_{}", key)).unwrap_or_default();
    let (include, libdir, version) = (get("INCLUDE"), get("LIBDIR"), get("VERSION"));
    println!("cargo:rustc-env=FLATMEM_INCLUDE_DIR={}", include);
    println!("cargo:rustc-env=FLATMEM_LIB_DIR={}", libdir);
    println!("cargo:rustc-env=FLATMEM_PC_VERSION={}", version);
    let rpath = env::var_os("FLATMEM_NO_RPATH").map_or(true, |v| v.is_empty() || v == "0");
    if rpath && !libdir.is_empty() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", libdir);
    }
}
