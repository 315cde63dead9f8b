//! Rust values to the C types of flatmem's arguments, with the library's
//! style of message when one does not fit (shared by every wrapper).

use std::time::Duration;

use crate::error::{Error, Result};

/// `value` as an `int32_t` argument named `name`.
pub(crate) fn int32(name: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::invalid(format!("{} = {} does not fit int32_t", name, value)))
}

/// `value` as an `int64_t` argument named `name`.
pub(crate) fn int64(name: &str, value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::invalid(format!("{} = {} does not fit int64_t", name, value)))
}

/// A deadline as the `timeout_ms` arguments take it: `None` is 0 (the
/// default); a duration below 1 ms would also read as "the default", so it
/// is refused.
pub(crate) fn timeout_ms(name: &str, timeout: Option<Duration>) -> Result<i64> {
    match timeout {
        None => Ok(0),
        Some(t) => match i64::try_from(t.as_millis()) {
            Ok(ms) if ms >= 1 => Ok(ms),
            _ => Err(Error::invalid(format!("{}: {:?}; expected 1 ms .. 2^63 ms (None = the default)", name, t))),
        },
    }
}

/// An options array of exactly `expected` entries, as the pointer the C
/// options take (copied by the create call; NULL when `values` is empty), or
/// `InvalidArgument` "<name>: <n> entries; expected <meaning> (<expected>)".
pub(crate) fn entries(name: &str, values: &[i64], expected: usize, meaning: &str) -> Result<*const i64> {
    if values.len() != expected {
        return Err(Error::invalid(format!("{}: {} entries; expected {} ({})", name, values.len(), meaning, expected)));
    }
    Ok(if values.is_empty() { std::ptr::null() } else { values.as_ptr() })
}
