//! The installed flatmem, as the `pkg-config` program describes it.

use crate::shell_words::split_shell_words;
use crate::{fail, Library, HINT};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Asks `program` (pkg-config) for flatmem. Err (the reason, for a message)
/// when the program cannot run or finds no flatmem; a flatmem.pc that is found
/// but unusable stops the build.
pub fn find(program: &str) -> Result<Library, String> {
    let mut flags = Flags::parse(&run(program, &["--cflags", "--libs", "flatmem"])?);
    if flags.has_relative_paths() {
        // A prefix given relative at install time (cmake --install --prefix
        // build/prefix) lands relative in flatmem.pc; --define-prefix derives
        // the prefix from where the .pc file lies instead.
        let retry = Flags::parse(&run_or_fail(
            program,
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
    // The installed files are inputs: a reinstall reruns this script.
    println!(
        "cargo:rerun-if-changed={}",
        include.join("flatmem/flatmem.h").display()
    );
    if let Some(dir) = flags.lib_dirs.first() {
        for name in ["libflatmem.so", "pkgconfig/flatmem.pc"] {
            if dir.join(name).exists() {
                println!("cargo:rerun-if-changed={}", dir.join(name).display());
            }
        }
    }
    let version = run_or_fail(program, &["--modversion", "flatmem"])
        .trim()
        .to_string();
    Ok(Library {
        include,
        lib_dirs: flags.lib_dirs,
        libs: flags.libs,
        version,
        origin: "pkg-config finds".to_string(),
    })
}

/// Runs `program args...` and returns its stdout, or what went wrong.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program).args(args).output().map_err(|e| {
        format!(
            "cannot run `{}` ({}): install pkg-config (Debian: pkgconf)",
            program, e
        )
    })?;
    if !output.status.success() {
        return Err(format!(
            "`{} {}` failed ({}): {}\nPKG_CONFIG_PATH={:?}",
            program,
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            env::var("PKG_CONFIG_PATH").unwrap_or_default()
        ));
    }
    String::from_utf8(output.stdout).map_err(|_| format!("`{}` printed non-UTF-8 output", program))
}

/// `run` where pkg-config has already found flatmem: a failure stops the build.
fn run_or_fail(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| fail(&format!("{}; {}", e, HINT)))
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
