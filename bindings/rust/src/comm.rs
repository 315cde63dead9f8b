//! Communicators (`flatmem/comm.h`): `world_size` ranks joined over UCX (one
//! per process) or in one process ([`Communicator::create_local`], one per
//! thread), with point-to-point messages, an all-reduce, a ring shift and a
//! barrier between host buffers.
//!
//! Every wait has a deadline (`timeout: None` = the handle's default,
//! [`CommOptions::timeout`], else `FLATMEM_COMM_TIMEOUT_MS`, else 60 s). A
//! wait that passes it fails with [`Status::Timeout`]; a dead, aborting or
//! unreachable peer with [`Status::PeerFailure`] (the message names the
//! operation, the peer and the step). The communicator is then poisoned:
//! every later call fails at once with [`Status::CommPoisoned`] repeating
//! the first error, the other ranks are told, and the caller should
//! [`abort`](Communicator::abort) it.
//!
//! Thread rule (the C one, enforced by the types): one thread at a time per
//! communicator. A [`Communicator`] is `Send` (move it to the thread that
//! drives it) but not `Sync`; everything that borrows it (requests, a ring
//! loss, a cyclic runtime) is therefore neither `Send` nor `Sync`.
//!
//! Non-blocking messages live in a [`Transfers`] scope
//! ([`Communicator::transfers`]), like threads in `std::thread::scope`: a
//! buffer handed to [`Transfers::isend`] / [`Transfers::irecv`] stays
//! borrowed (shared for a send, exclusive for a receive) until the scope
//! ends, and the scope completes every request before it returns, so no
//! buffer can be dropped, read or written while a transfer is in flight,
//! even when a [`Request`] is leaked. [`Request::wait`] hands the buffer back
//! inside the scope.
//!
//! ```compile_fail
//! # use flatmem::{CommOptions, Communicator};
//! let comms = Communicator::create_local(1, &CommOptions::new()).unwrap();
//! let mut buf = vec![0.0f32; 4];
//! comms[0].transfers(|t| {
//!     let request = t.irecv(&mut buf, 0, 7).unwrap();
//!     buf[0] = 1.0; // error: `buf` is borrowed by the receive in flight
//!     request.wait().map(|_| ())
//! });
//! ```
//!
//! ```compile_fail
//! # use flatmem::{CommOptions, Communicator};
//! let comms = Communicator::create_local(1, &CommOptions::new()).unwrap();
//! comms[0].transfers(|t| {
//!     let buf = vec![0.0f32; 4]; // error: dropped while the scope still borrows it
//!     t.isend(&buf, 0, 7).map(|_| ())
//! });
//! ```
//!
//! ```compile_fail
//! # use flatmem::{CommOptions, Communicator};
//! let comms = Communicator::create_local(1, &CommOptions::new()).unwrap();
//! let buf = vec![0.0f32; 4];
//! comms[0].transfers(|t| {
//!     let request = t.isend(&buf, 0, 7).unwrap();
//!     std::thread::scope(|s| {
//!         s.spawn(move || request.wait()); // error: a request stays on its communicator's thread
//!     });
//! });
//! ```
//!
//! ```compile_fail
//! # use flatmem::{CommOptions, Communicator};
//! fn shared_between_threads<T: Sync>() {}
//! shared_between_threads::<Communicator>(); // error: a communicator is not Sync
//! ```

use std::cell::RefCell;
use std::ffi::CString;
use std::fmt;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::time::Duration;

use crate::convert::{int32, timeout_ms};
use crate::error::{check, Error, Result, Status};
use crate::handle::{HandleKind, OwnedHandle};
use crate::sys;
use crate::tensor::{Desc, Element};
use crate::version::check_version;

/// Bytes of a [`UniqueId`] (`FLATMEM_COMM_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = sys::FLATMEM_COMM_UNIQUE_ID_BYTES as usize;

/// What rank 0 makes ([`UniqueId::new`]) and every rank passes to
/// [`Communicator::new`]: rank 0's listening address and a random session
/// number, as 128 plain bytes. Send it to the other ranks by any means, e.g.
/// as hex ([`to_hex`](UniqueId::to_hex) / [`from_hex`](UniqueId::from_hex)).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// Rank 0: opens a UCX listener on `address` (`"host:port"`, `"host"`,
    /// `":port"`, `"[ipv6]:port"`; port 0 = any free port; `None` = the
    /// environment's `FLATMEM_COMM_ADDRESS`, else all interfaces) and
    /// describes it (`flatmem_comm_unique_id_create`). The listener lives
    /// until rank 0's [`Communicator::new`] with this id returns, so rank 0
    /// must create its communicator in this process. Thread-safe.
    pub fn new(address: Option<&str>) -> Result<UniqueId> {
        check_version()?;
        let address = address
            .map(|a| CString::new(a).map_err(|_| Error::invalid(format!("address: {:?} contains a NUL byte", a))))
            .transpose()?;
        let mut id = sys::flatmem_comm_unique_id { internal: [0; UNIQUE_ID_BYTES] };
        // SAFETY: a NUL-terminated address or NULL, and a writable id.
        check(unsafe {
            sys::flatmem_comm_unique_id_create(address.as_ref().map_or(ptr::null(), |a| a.as_ptr()), &mut id)
        })?;
        Ok(UniqueId(id.internal))
    }

    /// The 128 bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// From 128 bytes (of [`as_bytes`](UniqueId::as_bytes) on rank 0).
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let array = <[u8; UNIQUE_ID_BYTES]>::try_from(bytes)
            .map_err(|_| Error::invalid(format!("unique id: {} bytes; expected {}", bytes.len(), UNIQUE_ID_BYTES)))?;
        Ok(UniqueId(array))
    }

    /// 256 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{:02x}", b)).collect()
    }

    /// From the 256 hex digits of [`to_hex`](UniqueId::to_hex) (either case).
    pub fn from_hex(hex: &str) -> Result<UniqueId> {
        let hex = hex.trim();
        let bad = || Error::invalid(format!("unique id: expected {} hex digits, got {:?}", 2 * UNIQUE_ID_BYTES, hex));
        if hex.len() != 2 * UNIQUE_ID_BYTES || !hex.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (n, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * n..2 * n + 2], 16).map_err(|_| bad())?;
        }
        Ok(UniqueId(bytes))
    }

    fn raw(&self) -> sys::flatmem_comm_unique_id {
        sys::flatmem_comm_unique_id { internal: self.0 }
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({})", self.to_hex())
    }
}

/// Options of a communicator; unset values are the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommOptions {
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
}

impl CommOptions {
    /// Defaults: waits time out after `FLATMEM_COMM_TIMEOUT_MS` (else 60 s),
    /// creation after 120 s.
    pub fn new() -> CommOptions {
        CommOptions::default()
    }

    /// The default deadline of every wait (`options.timeout_ms`; at least
    /// 1 ms, rounded down to whole milliseconds).
    pub fn timeout(mut self, timeout: Duration) -> CommOptions {
        self.timeout = Some(timeout);
        self
    }

    /// How long creation waits for every rank to join
    /// (`options.connect_timeout_ms`).
    pub fn connect_timeout(mut self, timeout: Duration) -> CommOptions {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The C options struct (`flatmem_comm_options_init` + fields).
    pub fn to_raw(&self) -> Result<sys::flatmem_comm_options> {
        let mut raw = sys::flatmem_comm_options::default();
        let size = std::mem::size_of::<sys::flatmem_comm_options>();
        // SAFETY: a writable options struct of this declaration, of `size` bytes.
        check(unsafe { sys::flatmem_comm_options_init(&mut raw, size) })?;
        raw.timeout_ms = timeout_ms("options.timeout", self.timeout)?;
        raw.connect_timeout_ms = timeout_ms("options.connect_timeout", self.connect_timeout)?;
        Ok(raw)
    }
}

pub(crate) struct CommKind;

impl HandleKind for CommKind {
    type Raw = sys::flatmem_comm_t;
    const NAME: &'static str = "flatmem_comm";
    unsafe fn destroy(raw: *mut Self::Raw) -> sys::flatmem_status {
        // SAFETY: forwarded from the caller.
        unsafe { sys::flatmem_comm_destroy(raw) }
    }
}

/// One rank's handle of a group of `world_size` ranks (`flatmem_comm_t`).
/// Dropping it leaves in order (`flatmem_comm_destroy`: what this rank sent
/// is flushed and the peers are told); [`abort`](Communicator::abort) gives
/// up instead. `Send`, not `Sync`: one thread at a time.
pub struct Communicator {
    handle: OwnedHandle<CommKind>,
    rank: usize,
    world_size: usize,
}

// SAFETY: comm.h: one thread at a time per handle, distinct handles are
// independent; the progress thread is internal. Moving the owner to another
// thread keeps that; it is not Sync, so only one thread can reach it.
unsafe impl Send for Communicator {}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator").field("rank", &self.rank).field("world_size", &self.world_size).finish()
    }
}

impl Communicator {
    fn wrap(handle: OwnedHandle<CommKind>) -> Result<Communicator> {
        let (mut rank, mut world_size) = (0i32, 0i32);
        // SAFETY: a live handle and writable outputs.
        check(unsafe { sys::flatmem_comm_rank(handle.as_ptr(), &mut rank) })?;
        check(unsafe { sys::flatmem_comm_world_size(handle.as_ptr(), &mut world_size) })?;
        Ok(Communicator { handle, rank: rank as usize, world_size: world_size as usize })
    }

    /// Joins rank `rank` of `world_size` (collective: returns when every
    /// rank has joined, or fails after the connect timeout naming the ranks
    /// that never arrived). `id` is rank 0's [`UniqueId::new`]; rank 0 must
    /// call this in the process that made it (`flatmem_comm_create`).
    pub fn new(rank: usize, world_size: usize, id: &UniqueId, options: &CommOptions) -> Result<Communicator> {
        let (rank, world_size) = (int32("rank", rank)?, int32("world_size", world_size)?);
        let (raw_id, raw_options) = (id.raw(), options.to_raw()?);
        // SAFETY: a valid out-pointer, id and options.
        let handle = OwnedHandle::create(|out| unsafe {
            sys::flatmem_comm_create(out, rank, world_size, &raw_id, &raw_options)
        })?;
        Communicator::wrap(handle)
    }

    /// Joins the group the environment describes (`flatmem_comm_create_from_env`):
    /// `FLATMEM_COORDINATOR=host:port` (rank 0 listens there, required), the
    /// rank and size from `FLATMEM_RANK` / `FLATMEM_WORLD_SIZE` or a
    /// launcher's variables (Open MPI, PMI, Slurm, torchrun). A missing or
    /// malformed variable is `InvalidArgument` naming it.
    pub fn from_env(options: &CommOptions) -> Result<Communicator> {
        let raw_options = options.to_raw()?;
        // SAFETY: a valid out-pointer and options.
        let handle = OwnedHandle::create(|out| unsafe { sys::flatmem_comm_create_from_env(out, &raw_options) })?;
        Communicator::wrap(handle)
    }

    /// The `world_size` ranks (1 .. 4096) of one group inside this process
    /// (`flatmem_comm_create_local`; messages are copied in memory, no UCX):
    /// element `r` is rank `r`. Move each to its own thread: a collective
    /// returns when every rank's thread has called it.
    pub fn create_local(world_size: usize, options: &CommOptions) -> Result<Vec<Communicator>> {
        check_version()?;
        let n = int32("world_size", world_size)?;
        let raw_options = options.to_raw()?;
        let mut raw: Vec<*mut sys::flatmem_comm_t> = vec![ptr::null_mut(); world_size];
        // SAFETY: room for world_size handles (set on success only).
        check(unsafe { sys::flatmem_comm_create_local(raw.as_mut_ptr(), n, &raw_options) })?;
        // Own every handle before anything can fail, so that none leaks.
        let handles: Vec<Option<OwnedHandle<CommKind>>> =
            // SAFETY: each pointer came from create_local and is owned once.
            raw.into_iter().map(|p| NonNull::new(p).map(|p| unsafe { OwnedHandle::from_raw(p) })).collect();
        if handles.iter().any(Option::is_none) {
            return Err(Error::new(Status::Internal, "flatmem_comm_create_local returned SUCCESS but a NULL handle"));
        }
        handles.into_iter().flatten().map(Communicator::wrap).collect()
    }

    /// This rank, `0 .. world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// `Ok` while the handle is healthy; otherwise the error that poisoned
    /// it (`Timeout`, `PeerFailure`, ...), with its message.
    pub fn health(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::flatmem_comm_health(self.handle.as_ptr()) })
    }

    /// Tells the peers this rank gives up (they fail with `PeerFailure`
    /// naming it) and releases the handle (`flatmem_comm_abort`). Use it
    /// after an error, or to make the other ranks stop waiting.
    pub fn abort(self) -> Result<()> {
        // SAFETY: the handle is ours; abort releases it (so no destroy).
        check(unsafe { sys::flatmem_comm_abort(self.handle.into_raw()) })
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by
    /// `self`: do not destroy it, and keep to the thread rule.
    pub fn as_raw(&self) -> *mut sys::flatmem_comm_t {
        self.handle.as_ptr() as *mut _
    }

    /// A scope for non-blocking messages (see [`Transfers`]); every request
    /// started in it is complete when it returns.
    pub fn transfers<'c, F, R>(&'c self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope Transfers<'scope, 'c>) -> R,
    {
        let transfers = Transfers { comm: self, pending: RefCell::new(Vec::new()), _scope: PhantomData };
        // As std::thread::scope: run f, complete what it left in flight
        // (also when it panics), then return or resume the panic.
        let result = panic::catch_unwind(AssertUnwindSafe(|| f(&transfers)));
        transfers.complete_all();
        match result {
            Ok(value) => value,
            Err(payload) => panic::resume_unwind(payload),
        }
    }

    /// Sends `buffer` to `peer` with `tag` and waits until it has left
    /// (a [`transfers`](Communicator::transfers) scope of one send).
    pub fn send<T: Element>(&self, buffer: &[T], peer: usize, tag: u32, timeout: Option<Duration>) -> Result<()> {
        self.transfers(|t| t.isend(buffer, peer, tag)?.wait_for(timeout).map(|_| ()))
    }

    /// Receives the message `peer` sent with `tag` into `buffer`, which must
    /// have exactly its size (else `InvalidArgument` naming both sizes; the
    /// communicator stays usable, the buffer's contents are unspecified).
    pub fn recv<T: Element>(&self, buffer: &mut [T], peer: usize, tag: u32, timeout: Option<Duration>) -> Result<()> {
        self.transfers(|t| t.irecv(buffer, peer, tag)?.wait_for(timeout).map(|_| ()))
    }

    /// `recv = sum over ranks of send`, on every rank (collective;
    /// `f32`, `f64`, `i32`, `i64`). Each element's sum is formed in a fixed
    /// order, so every rank gets the same bits. `send` and `recv` have the
    /// same length. At most `timeout` per step.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], timeout: Option<Duration>) -> Result<()> {
        let timeout_ms = timeout_ms("timeout", timeout)?;
        let (mut send_d, mut recv_d) = (Desc::elements(send, "send")?, Desc::elements_mut(recv, "recv")?);
        let (send_t, mut recv_t) = (send_d.dl(), recv_d.dl());
        // SAFETY: a live handle; both tensors describe live slices (recv
        // exclusively borrowed, so they cannot overlap).
        check(unsafe {
            sys::flatmem_comm_all_reduce(self.as_raw(), send_t.ptr(), recv_t.mut_ptr(), timeout_ms, ptr::null_mut())
        })
    }

    /// [`all_reduce`](Communicator::all_reduce) in place: `buffer` becomes
    /// the sum over ranks.
    pub fn all_reduce_in_place<T: Element>(&self, buffer: &mut [T], timeout: Option<Duration>) -> Result<()> {
        let timeout_ms = timeout_ms("timeout", timeout)?;
        let mut desc = Desc::elements_mut(buffer, "buffer")?;
        let mut t = desc.dl();
        let p = t.mut_ptr();
        // SAFETY: a live handle; send = recv is allowed (in place).
        check(unsafe { sys::flatmem_comm_all_reduce(self.as_raw(), p, p, timeout_ms, ptr::null_mut()) })
    }

    /// Ring shift (collective): sends `send` to rank + 1 and receives into
    /// `recv` from rank - 1 (mod world_size); the same length on every rank.
    pub fn ring_shift<T: Element>(&self, send: &[T], recv: &mut [T], timeout: Option<Duration>) -> Result<()> {
        let timeout_ms = timeout_ms("timeout", timeout)?;
        let (mut send_d, mut recv_d) = (Desc::elements(send, "send")?, Desc::elements_mut(recv, "recv")?);
        let (send_t, mut recv_t) = (send_d.dl(), recv_d.dl());
        // SAFETY: as in all_reduce.
        check(unsafe {
            sys::flatmem_comm_ring_shift(self.as_raw(), send_t.ptr(), recv_t.mut_ptr(), timeout_ms, ptr::null_mut())
        })
    }

    /// All ranks reach this call before any returns (collective).
    pub fn barrier(&self, timeout: Option<Duration>) -> Result<()> {
        let timeout_ms = timeout_ms("timeout", timeout)?;
        // SAFETY: a live handle.
        check(unsafe { sys::flatmem_comm_barrier(self.as_raw(), timeout_ms) })
    }

    /// Brings up the NCCL device transport of these ranks on CUDA device
    /// `cuda_device` (collective; `flatmem_comm_init_device`), which a
    /// [`Cyclic`](crate::cyclic::Cyclic) with
    /// [`Memory::Cuda`](crate::cyclic::Memory::Cuda) needs on every rank.
    /// `Unsupported` without NCCL or a usable CUDA driver, `InvalidArgument`
    /// for a device that does not exist (the communicator stays healthy and
    /// the call may be retried); later failures poison it.
    pub fn init_device(&self, cuda_device: usize, timeout: Option<Duration>) -> Result<()> {
        let cuda_device = int32("cuda_device", cuda_device)?;
        let timeout_ms = timeout_ms("timeout", timeout)?;
        // SAFETY: a live handle.
        check(unsafe { sys::flatmem_comm_init_device(self.as_raw(), cuda_device, timeout_ms) })
    }

    fn check_peer(&self, peer: usize) -> Result<i32> {
        if peer >= self.world_size {
            return Err(Error::invalid(format!("peer: {}; expected 0 .. {}", peer, self.world_size.saturating_sub(1))));
        }
        int32("peer", peer)
    }
}

/// The scope of non-blocking messages of one communicator
/// ([`Communicator::transfers`]). Buffers handed to it stay borrowed for the
/// whole scope (`'scope`), and it waits for every request still in flight
/// when it ends (errors then are dropped: [`Request::wait`] on each request
/// to see its outcome). Buffers therefore live outside the closure:
///
/// ```no_run
/// # use flatmem::{CommOptions, Communicator};
/// # fn f(comm: &Communicator) -> flatmem::Result<()> {
/// let (out, mut back) = (vec![1.0f64; 8], vec![0.0f64; 8]);
/// let peer = (comm.rank() + 1) % comm.world_size();
/// let from = (comm.rank() + comm.world_size() - 1) % comm.world_size();
/// comm.transfers(|t| {
///     let receive = t.irecv(&mut back, from, 0)?;
///     let send = t.isend(&out, peer, 0)?;
///     send.wait()?;
///     let back = receive.wait()?; // the buffer, handed back
///     println!("{}", back[0]);
///     Ok(())
/// })
/// # }
/// ```
pub struct Transfers<'scope, 'c> {
    comm: &'c Communicator,
    /// Requests not yet waited for (None once waited).
    pending: RefCell<Vec<Option<NonNull<sys::flatmem_comm_request_t>>>>,
    /// Invariant in 'scope, as std::thread::Scope.
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl<'scope, 'c> Transfers<'scope, 'c> {
    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// Starts sending `buffer` to `peer` (may be this rank) with `tag`
    /// (`flatmem_comm_isend`); `buffer` stays borrowed until the scope ends
    /// (or [`Request::wait`] hands it back).
    pub fn isend<T: Element>(
        &'scope self,
        buffer: &'scope [T],
        peer: usize,
        tag: u32,
    ) -> Result<Request<'scope, 'c, &'scope [T]>> {
        let peer = self.comm.check_peer(peer)?;
        let mut desc = Desc::elements(buffer, "buffer")?;
        let t = desc.dl();
        let mut raw = ptr::null_mut();
        // SAFETY: a live handle; the tensor describes a slice borrowed for
        // 'scope, and the scope completes the request before 'scope ends.
        check(unsafe { sys::flatmem_comm_isend(self.comm.as_raw(), t.ptr(), peer, tag, &mut raw, ptr::null_mut()) })?;
        Ok(self.track(raw, buffer))
    }

    /// Starts receiving the message `peer` sends with `tag` into `buffer`
    /// (exactly its size; `flatmem_comm_irecv`). Messages between a pair of
    /// ranks with the same tag arrive in the order they were sent.
    pub fn irecv<T: Element>(
        &'scope self,
        buffer: &'scope mut [T],
        peer: usize,
        tag: u32,
    ) -> Result<Request<'scope, 'c, &'scope mut [T]>> {
        let peer = self.comm.check_peer(peer)?;
        let mut raw = ptr::null_mut();
        {
            let mut desc = Desc::elements_mut(buffer, "buffer")?;
            let mut t = desc.dl();
            // SAFETY: as in isend, the slice exclusively borrowed for 'scope.
            check(unsafe {
                sys::flatmem_comm_irecv(self.comm.as_raw(), t.mut_ptr(), peer, tag, &mut raw, ptr::null_mut())
            })?;
        }
        Ok(self.track(raw, buffer))
    }

    fn track<B>(&'scope self, raw: *mut sys::flatmem_comm_request_t, buffer: B) -> Request<'scope, 'c, B> {
        let mut pending = self.pending.borrow_mut();
        pending.push(NonNull::new(raw));
        Request { scope: self, slot: pending.len() - 1, buffer: Some(buffer) }
    }

    /// Completes leaked or unwaited requests before their buffers' borrows
    /// end (errors dropped: after a failure the communicator is poisoned and
    /// the library writes no buffer after a failed wait).
    fn complete_all(&self) {
        let slots = self.pending.borrow().len();
        for slot in 0..slots {
            let _ = self.complete(slot, 0);
        }
    }

    /// Waits for the request in `slot` if it is still pending (at most
    /// `timeout_ms`; 0 = the handle's default) and forgets it.
    fn complete(&self, slot: usize, timeout_ms: i64) -> Result<()> {
        let raw = self.pending.borrow_mut()[slot].take();
        match raw {
            // SAFETY: a request of this communicator, waited for once (the
            // wait releases it whatever the outcome).
            Some(raw) => check(unsafe { sys::flatmem_comm_wait(self.comm.as_raw(), raw.as_ptr(), timeout_ms) }),
            None => Ok(()),
        }
    }
}

/// A send or receive in flight in a [`Transfers`] scope, holding the borrow
/// `B` of its buffer (`&[T]` for a send, `&mut [T]` for a receive).
/// Dropping it waits for it (the error, if any, is dropped).
pub struct Request<'scope, 'c, B> {
    scope: &'scope Transfers<'scope, 'c>,
    slot: usize,
    buffer: Option<B>,
}

impl<'scope, 'c, B> Request<'scope, 'c, B> {
    /// Waits for completion (at most the communicator's default timeout)
    /// and hands the buffer back (`flatmem_comm_wait`); for a receive it
    /// then holds the message. On error the transfer is cancelled (the
    /// buffer is not written afterwards) and the communicator, unless the
    /// error was a size mismatch, is poisoned.
    pub fn wait(self) -> Result<B> {
        self.wait_for(None)
    }

    /// [`wait`](Request::wait) with a deadline (`None` = the default).
    pub fn wait_for(mut self, timeout: Option<Duration>) -> Result<B> {
        let timeout_ms = timeout_ms("timeout", timeout)?;
        self.scope.complete(self.slot, timeout_ms)?;
        Ok(self.buffer.take().expect("a request's buffer is taken once"))
    }

    /// Whether the transfer has completed, without waiting
    /// (`flatmem_comm_test`); finish it with [`wait`](Request::wait), which
    /// then returns at once.
    pub fn test(&self) -> Result<bool> {
        let raw = self.scope.pending.borrow()[self.slot];
        let raw = raw.ok_or_else(|| Error::new(Status::Internal, "request: already completed"))?;
        let mut done = 0i32;
        // SAFETY: a pending request of this communicator.
        check(unsafe { sys::flatmem_comm_test(self.scope.comm.as_raw(), raw.as_ptr(), &mut done) })?;
        Ok(done != 0)
    }
}

impl<B> Drop for Request<'_, '_, B> {
    fn drop(&mut self) {
        let _ = self.scope.complete(self.slot, 0);
    }
}
