//! The header version this crate was written for and the loaded library's.

use std::ffi::CStr;
use std::fmt;

use crate::error::{Error, Result, Status};
use crate::sys;

/// A flatmem version, `MAJOR.MINOR.PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// From the packed form `major * 10000 + minor * 100 + patch`.
    pub fn from_packed(packed: i32) -> Version {
        let packed = packed.max(0) as u32;
        Version { major: packed / 10000, minor: packed / 100 % 100, patch: packed % 100 }
    }

    /// The packed form (`FLATMEM_VERSION`, `flatmem_version()`).
    pub fn packed(self) -> i32 {
        (self.major * 10000 + self.minor * 100 + self.patch) as i32
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of `flatmem.h` that `sys` was generated from (its version
/// macros, which bindgen declares as `u32`).
pub const HEADER_VERSION: Version =
    Version { major: sys::FLATMEM_VERSION_MAJOR, minor: sys::FLATMEM_VERSION_MINOR, patch: sys::FLATMEM_VERSION_PATCH };

/// The version of the library actually loaded (`flatmem_version()`).
pub fn version() -> Version {
    // SAFETY: no arguments, thread-safe.
    Version::from_packed(unsafe { sys::flatmem_version() })
}

/// The loaded library's `flatmem_version_string()`, e.g. `"0.2.0"`.
pub fn version_string() -> &'static str {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::flatmem_version_string()) }.to_str().unwrap_or("")
}

/// Ok with the version when the loaded library is exactly the version of the
/// header this crate declares ([`HEADER_VERSION`]); otherwise an
/// `Unsupported` error saying both. Every handle constructor calls it.
pub fn check_version() -> Result<Version> {
    let loaded = version();
    if loaded == HEADER_VERSION {
        Ok(loaded)
    } else {
        Err(Error::new(
            Status::Unsupported,
            format!(
                "the loaded libflatmem is version {} but this crate was written for flatmem.h {}: \
                 build against the matching library (PKG_CONFIG_PATH) or update the crate",
                loaded, HEADER_VERSION
            ),
        ))
    }
}
