//! Finds the installed flatmem with the `pkg-config` program (honouring
//! PKG_CONFIG_PATH; `PKG_CONFIG` names another program) and tells cargo how
//! to link it: link-search and link-lib from `--libs`, plus an rpath to the
//! library directory so that this crate's tests, examples and doctests run
//! without LD_LIBRARY_PATH (set FLATMEM_NO_RPATH=1 to leave it out).
//!
//! Also passes on, for dependent build scripts (`links = "flatmem"`), the
//! metadata DEP_FLATMEM_INCLUDE / DEP_FLATMEM_LIBDIR / DEP_FLATMEM_VERSION
//! (flatmem.pc's Version). Dependent crates get link-search and link-lib, not
//! the rpath: their own build script can add `-Wl,-rpath,$DEP_FLATMEM_LIBDIR`
//! (the `flatmem` crate's does).

use std::env;
use std::path::{Path, PathBuf};
use std::process::{self, Command};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
        "FLATMEM_NO_RPATH",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());

    let mut flags = Flags::parse(&pkg_config(&program, &["--cflags", "--libs", "flatmem"]));
    if flags.has_relative_paths() {
        // A prefix given relative at install time (cmake --install --prefix
        // build/prefix) lands relative in flatmem.pc; --define-prefix derives
        // the prefix from where the .pc file lies instead.
        let retry = Flags::parse(&pkg_config(
            &program,
            &["--define-prefix", "--cflags", "--libs", "flatmem"],
        ));
        println!(
            "cargo:warning=flatmem.pc has relative paths ({}); using --define-prefix: {}",
            flags.describe(),
            retry.describe()
        );
        flags = retry;
    }
    if flags.has_relative_paths() {
        fail(&format!(
            "flatmem.pc gives relative paths ({}): install flatmem with an absolute \
             --prefix and point PKG_CONFIG_PATH at an absolute PREFIX/lib/pkgconfig",
            flags.describe()
        ));
    }
    if flags.libs.iter().all(|l| l != "flatmem") {
        fail(&format!(
            "`{} --libs flatmem` names no -lflatmem ({})",
            program,
            flags.describe()
        ));
    }

    for dir in &flags.lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for lib in &flags.libs {
        println!("cargo:rustc-link-lib=dylib={}", lib);
    }
    if env::var_os("FLATMEM_NO_RPATH").map_or(true, |v| v.is_empty() || v == "0") {
        for dir in &flags.lib_dirs {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
    for other in &flags.other {
        println!(
            "cargo:warning=ignoring `{}` from `pkg-config --cflags --libs flatmem`",
            other
        );
    }

    let include = flags
        .include_dirs
        .iter()
        .find(|d| d.join("flatmem/flatmem.h").is_file())
        .cloned();
    let include = include.unwrap_or_else(|| {
        fail(&format!(
            "no flatmem/flatmem.h under the -I directories of flatmem.pc ({})",
            flags.describe()
        ))
    });
    let header = include.join("flatmem/flatmem.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:include={}", include.display());
    if let Some(dir) = flags.lib_dirs.first() {
        println!("cargo:libdir={}", dir.display());
        for name in ["libflatmem.so", "pkgconfig/flatmem.pc"] {
            if dir.join(name).exists() {
                println!("cargo:rerun-if-changed={}", dir.join(name).display());
            }
        }
    }
    let version = pkg_config(&program, &["--modversion", "flatmem"]);
    let version = version.trim();
    println!("cargo:version={}", version);
    let crate_version = env::var("CARGO_PKG_VERSION").unwrap_or_default();
    if version != crate_version {
        println!(
            "cargo:warning=pkg-config finds flatmem {} but this crate declares flatmem.h {}: \
             handles will refuse to be created (check_version)",
            version, crate_version
        );
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: flatmem build script: {}", message);
    process::exit(1);
}

/// Runs `program args...` and returns its stdout, or stops the build with
/// what went wrong.
fn pkg_config(program: &str, args: &[&str]) -> String {
    let hint = "install flatmem (cmake --install build --prefix PREFIX) and set \
                PKG_CONFIG_PATH=PREFIX/lib/pkgconfig";
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            fail(&format!(
                "cannot run `{}` ({}): install pkg-config (Debian: pkgconf); {}",
                program, e, hint
            ))
        });
    if !output.status.success() {
        fail(&format!(
            "`{} {}` failed ({}): {}\nPKG_CONFIG_PATH={:?}; {}",
            program,
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            env::var("PKG_CONFIG_PATH").unwrap_or_default(),
            hint
        ));
    }
    String::from_utf8(output.stdout).unwrap_or_else(|_| fail("pkg-config printed non-UTF-8 output"))
}

#[derive(Default)]
struct Flags {
    include_dirs: Vec<PathBuf>,
    lib_dirs: Vec<PathBuf>,
    libs: Vec<String>,
    other: Vec<String>,
}

impl Flags {
    fn parse(text: &str) -> Flags {
        let mut flags = Flags::default();
        for token in split_shell_words(text) {
            if let Some(dir) = token.strip_prefix("-I") {
                flags.include_dirs.push(PathBuf::from(dir));
            } else if let Some(dir) = token.strip_prefix("-L") {
                flags.lib_dirs.push(PathBuf::from(dir));
            } else if let Some(lib) = token.strip_prefix("-l") {
                flags.libs.push(lib.to_string());
            } else {
                flags.other.push(token);
            }
        }
        flags
    }

    fn has_relative_paths(&self) -> bool {
        self.include_dirs
            .iter()
            .chain(&self.lib_dirs)
            .any(|p| !Path::is_absolute(p))
    }

    fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        parts.extend(
            self.include_dirs
                .iter()
                .map(|d| format!("-I{}", d.display())),
        );
        parts.extend(self.lib_dirs.iter().map(|d| format!("-L{}", d.display())));
        parts.extend(self.libs.iter().map(|l| format!("-l{}", l)));
        parts.extend(self.other.iter().cloned());
        parts.join(" ")
    }
}

/// Splits pkg-config output at unescaped whitespace (it escapes spaces in
/// paths with a backslash).
fn split_shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}
