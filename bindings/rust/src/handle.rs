//! The owned-handle pattern every flatmem handle kind follows.
//!
//! A handle kind (contrastive loss today; reversible segments and
//! communicators later) implements [`HandleKind`] with its opaque C type and
//! its `*_destroy`; its public wrapper holds an [`OwnedHandle`], which
//! creates through a closure calling the kind's `*_create(out, options)`,
//! destroys exactly once in `Drop`, and is never null.

use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{check, Error, Result, Status};
use crate::sys;
use crate::version;

/// One kind of flatmem handle.
pub(crate) trait HandleKind {
    /// The opaque C struct (`flatmem_x_t`).
    type Raw;
    /// The C prefix, for messages (`"flatmem_contrastive"`).
    const NAME: &'static str;
    /// `flatmem_x_destroy`.
    ///
    /// # Safety
    /// `raw` came from the kind's `*_create` and is destroyed only once.
    unsafe fn destroy(raw: *mut Self::Raw) -> sys::flatmem_status;
}

static LIVE_HANDLES: AtomicUsize = AtomicUsize::new(0);

/// Handles of any kind created through this crate and not yet destroyed
/// (a leak check for tests and long-running programs).
pub fn live_handles() -> usize {
    LIVE_HANDLES.load(Ordering::SeqCst)
}

/// A non-null handle of kind `K`, destroyed when dropped. Neither `Send`
/// nor `Sync` by itself: each wrapper states its kind's thread rule.
pub(crate) struct OwnedHandle<K: HandleKind> {
    raw: NonNull<K::Raw>,
    _kind: PhantomData<K>,
}

impl<K: HandleKind> OwnedHandle<K> {
    /// Checks that the loaded library is the version this crate was written
    /// for, then calls `create(out)` (the kind's `*_create` with its
    /// options) and takes ownership of what it stored in `out`.
    pub(crate) fn create(create: impl FnOnce(*mut *mut K::Raw) -> sys::flatmem_status) -> Result<Self> {
        version::check_version()?;
        let mut raw: *mut K::Raw = ptr::null_mut();
        check(create(&mut raw))?;
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::new(Status::Internal, format!("{}_create returned SUCCESS but no handle", K::NAME))
        })?;
        LIVE_HANDLES.fetch_add(1, Ordering::SeqCst);
        Ok(OwnedHandle { raw, _kind: PhantomData })
    }

    /// Takes ownership of a handle a `*_create` made for several handles at
    /// once (`flatmem_comm_create_local`).
    ///
    /// # Safety
    /// `raw` came from the kind's create function and has no other owner.
    pub(crate) unsafe fn from_raw(raw: NonNull<K::Raw>) -> Self {
        LIVE_HANDLES.fetch_add(1, Ordering::SeqCst);
        OwnedHandle { raw, _kind: PhantomData }
    }

    /// Gives up ownership without destroying (for a release function other
    /// than `*_destroy`, e.g. `flatmem_comm_abort`).
    pub(crate) fn into_raw(self) -> *mut K::Raw {
        let raw = self.raw.as_ptr();
        std::mem::forget(self);
        LIVE_HANDLES.fetch_sub(1, Ordering::SeqCst);
        raw
    }

    pub(crate) fn as_ptr(&self) -> *const K::Raw {
        self.raw.as_ptr()
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut K::Raw {
        self.raw.as_ptr()
    }
}

impl<K: HandleKind> Drop for OwnedHandle<K> {
    fn drop(&mut self) {
        // SAFETY: created by K's *_create, owned uniquely, destroyed once.
        // Destroying a valid handle cannot fail, and a drop has nobody to
        // tell (nor may it panic: it can run during unwinding).
        let _status = unsafe { K::destroy(self.raw.as_ptr()) };
        LIVE_HANDLES.fetch_sub(1, Ordering::SeqCst);
    }
}
