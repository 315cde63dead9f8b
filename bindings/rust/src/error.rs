//! `Error`: a flatmem status plus the thread's `flatmem_last_error()` text.

use std::ffi::CStr;
use std::fmt;

use crate::sys;

/// The `flatmem_status` of a failed call. Values this crate does not know
/// (a newer library) arrive as [`Status::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// `FLATMEM_STATUS_INVALID_ARGUMENT`: wrong dtype, shape, value, ...
    InvalidArgument,
    /// `FLATMEM_STATUS_UNSUPPORTED`: valid, but not served by this build.
    Unsupported,
    /// `FLATMEM_STATUS_OUT_OF_MEMORY`.
    OutOfMemory,
    /// `FLATMEM_STATUS_WORKSPACE_TOO_SMALL`.
    WorkspaceTooSmall,
    /// `FLATMEM_STATUS_NON_FINITE`: NaN or Inf in an input.
    NonFinite,
    /// `FLATMEM_STATUS_INTERNAL`: a bug in flatmem.
    Internal,
    /// `FLATMEM_STATUS_TIMEOUT`: a communicator wait passed its deadline (a
    /// peer is dead, wedged, slow or never arrived); the message names the
    /// operation, the peer and the step. The communicator is poisoned.
    Timeout,
    /// `FLATMEM_STATUS_PEER_FAILURE`: a peer of a communicator failed (its
    /// connection reset, it aborted, a transport error); the message names
    /// the peer. The communicator is poisoned.
    PeerFailure,
    /// `FLATMEM_STATUS_COMM_POISONED`: the communicator failed earlier (the
    /// message repeats its first error); every call fails fast. Release it
    /// with `flatmem_comm_abort`.
    CommPoisoned,
    /// A status this binding does not know.
    Unknown(u32),
}

impl Status {
    /// The status for a raw non-success code.
    #[allow(clippy::unnecessary_cast)] // flatmem_status is u32 here, may be i32 elsewhere
    pub fn from_raw(code: sys::flatmem_status) -> Status {
        match code {
            sys::FLATMEM_STATUS_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::FLATMEM_STATUS_UNSUPPORTED => Status::Unsupported,
            sys::FLATMEM_STATUS_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::FLATMEM_STATUS_WORKSPACE_TOO_SMALL => Status::WorkspaceTooSmall,
            sys::FLATMEM_STATUS_NON_FINITE => Status::NonFinite,
            sys::FLATMEM_STATUS_INTERNAL => Status::Internal,
            sys::FLATMEM_STATUS_TIMEOUT => Status::Timeout,
            sys::FLATMEM_STATUS_PEER_FAILURE => Status::PeerFailure,
            sys::FLATMEM_STATUS_COMM_POISONED => Status::CommPoisoned,
            other => Status::Unknown(other as u32),
        }
    }

    /// The raw `flatmem_status` value.
    #[allow(clippy::unnecessary_cast)]
    pub fn raw(self) -> sys::flatmem_status {
        match self {
            Status::InvalidArgument => sys::FLATMEM_STATUS_INVALID_ARGUMENT,
            Status::Unsupported => sys::FLATMEM_STATUS_UNSUPPORTED,
            Status::OutOfMemory => sys::FLATMEM_STATUS_OUT_OF_MEMORY,
            Status::WorkspaceTooSmall => sys::FLATMEM_STATUS_WORKSPACE_TOO_SMALL,
            Status::NonFinite => sys::FLATMEM_STATUS_NON_FINITE,
            Status::Internal => sys::FLATMEM_STATUS_INTERNAL,
            Status::Timeout => sys::FLATMEM_STATUS_TIMEOUT,
            Status::PeerFailure => sys::FLATMEM_STATUS_PEER_FAILURE,
            Status::CommPoisoned => sys::FLATMEM_STATUS_COMM_POISONED,
            Status::Unknown(code) => code as sys::flatmem_status,
        }
    }

    /// The library's name for it (`flatmem_status_string`), e.g.
    /// `"FLATMEM_STATUS_INVALID_ARGUMENT"`.
    pub fn name(self) -> &'static str {
        // SAFETY: flatmem_status_string returns a static NUL-terminated string
        // for every value, known or not.
        let text = unsafe { CStr::from_ptr(sys::flatmem_status_string(self.raw())) };
        text.to_str().unwrap_or("FLATMEM_STATUS_UNKNOWN")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed flatmem call: its status and the message naming the argument.
///
/// Errors found by this crate before calling the library (a slice shorter
/// than the shape it is given with, a count that does not fit the C type,
/// a library of another version) carry a status of the same meaning
/// (`InvalidArgument`, `Unsupported`) and a message in the library's style.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error of this status and message (e.g. for a
    /// [`ReversibleFunction`](crate::ReversibleFunction) to return: the
    /// segment call then fails with this status and message).
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }

    /// The status of the failed call.
    pub fn status(&self) -> Status {
        self.status
    }

    /// What went wrong: the argument, the value or shape it had and what was
    /// expected (`flatmem_last_error()` for errors from the library).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a status into a `Result`, copying the thread's last-error text at
/// once (it is only valid until the thread's next flatmem call).
pub(crate) fn check(code: sys::flatmem_status) -> Result<()> {
    if code == sys::FLATMEM_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: the text is copied before any other flatmem call on this
    // thread (it stays valid until then); NULL is not promised but handled.
    let message = unsafe {
        let text = sys::flatmem_last_error();
        if text.is_null() {
            String::new()
        } else {
            CStr::from_ptr(text).to_string_lossy().into_owned()
        }
    };
    Err(Error::new(Status::from_raw(code), message))
}
