//! Finds libflatmem and tells cargo how to link it:
//!
//! - `pkg_config.rs`: the installed flatmem, found with the `pkg-config`
//!   program (honouring PKG_CONFIG_PATH; `PKG_CONFIG` names another program);
//! - `bundled.rs`, with the `bundled` feature only: when pkg-config finds none
//!   (or FLATMEM_SYS_BUNDLED=always), the library of this repository (or of
//!   FLATMEM_SOURCE_DIR), configured, built and installed into OUT_DIR with the
//!   `cmake` crate.
//!
//! Either way cargo gets link-search and link-lib, plus an rpath to the library
//! directory so that this crate's tests, examples and doctests run without
//! LD_LIBRARY_PATH (set FLATMEM_NO_RPATH=1 to leave it out). Dependent build
//! scripts (`links = "flatmem"`) get the metadata DEP_FLATMEM_INCLUDE /
//! DEP_FLATMEM_LIBDIR / DEP_FLATMEM_VERSION (flatmem.pc's Version). Dependent
//! crates get link-search and link-lib, not the rpath: their own build script
//! can add `-Wl,-rpath,$DEP_FLATMEM_LIBDIR` (the `flatmem` crate's does).

#[cfg(feature = "bundled")]
mod bundled;
mod pkg_config;
mod shell_words;

use std::env;
use std::path::PathBuf;
use std::process;

/// A libflatmem to link, wherever it came from.
pub struct Library {
    /// The directory holding `flatmem/flatmem.h`.
    pub include: PathBuf,
    pub lib_dirs: Vec<PathBuf>,
    pub libs: Vec<String>,
    /// flatmem.pc's Version.
    pub version: String,
    /// Where it came from, as the start of a sentence ("pkg-config finds").
    pub origin: String,
}

/// Added to the messages about a missing or broken installed flatmem.
#[cfg(not(feature = "bundled"))]
const HINT: &str = "install flatmem (cmake --install build --prefix PREFIX) and set \
                    PKG_CONFIG_PATH=PREFIX/lib/pkgconfig, or let this crate build it from the \
                    repository with cmake: the `bundled` feature (cargo build --features bundled)";
#[cfg(feature = "bundled")]
const HINT: &str = "FLATMEM_SYS_BUNDLED=always builds the bundled source instead";

fn main() {
    println!("cargo:rerun-if-changed=build");
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
        "FLATMEM_NO_RPATH",
        "FLATMEM_SYS_BUNDLED",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    let always_bundled = match env::var("FLATMEM_SYS_BUNDLED").as_deref() {
        Err(_) | Ok("") | Ok("auto") => false,
        Ok("always") => true,
        Ok(other) => fail(&format!(
            "FLATMEM_SYS_BUNDLED={:?}: the values are `auto` (the default) and `always`",
            other
        )),
    };
    let library = if always_bundled {
        build_bundled("FLATMEM_SYS_BUNDLED=always")
    } else {
        let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
        pkg_config::find(&program).unwrap_or_else(|not_found| build_bundled(&not_found))
    };
    library.emit();
}

#[cfg(feature = "bundled")]
fn build_bundled(why: &str) -> Library {
    bundled::build(why)
}

#[cfg(not(feature = "bundled"))]
fn build_bundled(why: &str) -> Library {
    if why.starts_with("FLATMEM_SYS_BUNDLED") {
        fail(&format!(
            "{} needs the `bundled` feature (cargo build --features bundled)",
            why
        ));
    }
    fail(&format!("{}; {}", why, HINT))
}

impl Library {
    /// Tells cargo how to link the library and dependent build scripts where
    /// it is.
    fn emit(&self) {
        for dir in &self.lib_dirs {
            println!("cargo:rustc-link-search=native={}", dir.display());
        }
        for lib in &self.libs {
            println!("cargo:rustc-link-lib=dylib={}", lib);
        }
        if env::var_os("FLATMEM_NO_RPATH").map_or(true, |v| v.is_empty() || v == "0") {
            for dir in &self.lib_dirs {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            }
        }
        println!("cargo:include={}", self.include.display());
        if let Some(dir) = self.lib_dirs.first() {
            println!("cargo:libdir={}", dir.display());
        }
        println!("cargo:version={}", self.version);
        let crate_version = env::var("CARGO_PKG_VERSION").unwrap_or_default();
        if self.version != crate_version {
            println!(
                "cargo:warning={} flatmem {} but this crate declares flatmem.h {}: \
                 handles will refuse to be created (check_version)",
                self.origin, self.version, crate_version
            );
        }
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: flatmem build script: {}", message);
    process::exit(1);
}
