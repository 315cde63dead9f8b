//! Reversible segments (`flatmem_reversible_*`) and the built-in transformer
//! blocks (`flatmem_block_*`) of `flatmem/reversible.h`.
//!
//! A [`Segment`] is a stack of n reversible blocks; block k maps a state
//! `(X1, X2)` to `Y1 = X1 + F_k(X2)`, `Y2 = X2 + G_k(Y1)`. The forward keeps
//! only the output; the backward rebuilds every block's input from its output
//! and returns the gradients of the segment input. Each `F_k` / `G_k` is a
//! [`Function`]: a built-in [`Block`] (pre-LN attention or MLP, fp32) or any
//! Rust type implementing [`ReversibleFunction`] (closures through
//! [`Function::from_closures`]), called by the library through `extern "C"`
//! trampolines.
//!
//! # Lifetimes: who keeps what alive
//!
//! `flatmem_block_set_parameters` keeps *pointers* to the parameter and
//! gradient memory. [`Block::set_parameters`] therefore borrows the slices
//! for the block's lifetime parameter `'p` (`&'p [f32]` values, `&'p mut
//! [f32]` gradients, which the block's backward accumulates into), and a
//! [`Segment<'p, T>`] owns its functions: neither can outlive the memory,
//! and nothing else can write the gradients while a segment holds them. Read
//! them between calls with [`Segment::block`] + [`Block::gradients`]; zero
//! them or point the block at new memory with [`Segment::block_mut`] (a
//! [`BlockMut`], which cannot swap the block out from under the C handle).
//! Dropping a segment destroys the C handle (joining its thread) before the
//! functions it calls.
//!
//! # Threads
//!
//! The forward and the STANDARD / VANILLA backward call every callback on
//! the calling thread. In [`Mode::Overlapped`] (and [`Mode::Auto`], which
//! may choose it) the backward's rebuild runs the *forward* callbacks of
//! block k-1 on a thread owned by the handle while the *VJP* callbacks of
//! block k run on the calling thread. Each [`Function`] belongs to one
//! (block, part) and is never called twice at once, so `&mut self` is
//! exclusive, but a function object is used from more than one thread:
//! [`ReversibleFunction`] implementations must be `Send`, and state shared
//! between functions needs `Arc<Mutex<..>>` or atomics, not `Rc` / `Cell`.
//! [`Context::parallel_for`] runs a `Sync` body on the chain's threads.
//!
//! # Errors and panics
//!
//! A callback returning `Err(e)` aborts the segment call: the library
//! returns `e.status()` with the message "block k, F forward (phase): <e's
//! message>" (set through `flatmem_reversible_callback_error`). A panic in a
//! callback is caught at the FFI boundary (unwinding into C is undefined
//! behaviour) and reported the same way, with `Status::Internal` and
//! "panicked: <payload>". Outputs are written only when every callback
//! succeeded; the segment stays usable.

use std::any::Any;
use std::ffi::CString;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::convert::int32;
use crate::error::{check, Error, Result, Status};
use crate::handle::{HandleKind, OwnedHandle};
use crate::sys::{self, DLDataType, DLDevice, DLTensor};

/// Most dimensions a state may have (`reversible.h`: ndim 1..8).
pub const MAX_NDIM: usize = 8;

// ---------------------------------------------------------------------------
// Element types, modes, parts, phases
// ---------------------------------------------------------------------------

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A state element type: `f32` or `f64` (the two the segment accepts).
pub trait Element: Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// Bits of the DLPack `kDLFloat` type.
    const BITS: u8;
}

impl Element for f32 {
    const BITS: u8 = 32;
}

impl Element for f64 {
    const BITS: u8 = 64;
}

fn float_dtype(bits: u8) -> DLDataType {
    DLDataType { code: sys::kDLFloat as u8, bits, lanes: 1 }
}

/// How the backward runs (`flatmem_reversible_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Times VANILLA and OVERLAPPED per shape and keeps the faster (default).
    #[default]
    Auto,
    /// Ordinary backprop: the forward keeps every block's input and
    /// residuals (O(n) memory); the baseline.
    Standard,
    /// Rebuild then gradient, block by block, on one chain.
    Vanilla,
    /// The rebuild of block k-1 runs on a second thread while block k's
    /// gradients are computed; bitwise equal to `Vanilla` for deterministic
    /// callbacks.
    Overlapped,
}

impl Mode {
    fn raw(self) -> sys::flatmem_reversible_mode {
        match self {
            Mode::Auto => sys::FLATMEM_REVERSIBLE_AUTO,
            Mode::Standard => sys::FLATMEM_REVERSIBLE_STANDARD,
            Mode::Vanilla => sys::FLATMEM_REVERSIBLE_VANILLA,
            Mode::Overlapped => sys::FLATMEM_REVERSIBLE_OVERLAPPED,
        }
    }

    fn from_raw(raw: sys::flatmem_reversible_mode) -> Option<Mode> {
        match raw {
            sys::FLATMEM_REVERSIBLE_AUTO => Some(Mode::Auto),
            sys::FLATMEM_REVERSIBLE_STANDARD => Some(Mode::Standard),
            sys::FLATMEM_REVERSIBLE_VANILLA => Some(Mode::Vanilla),
            sys::FLATMEM_REVERSIBLE_OVERLAPPED => Some(Mode::Overlapped),
            _ => None,
        }
    }
}

/// Which sub-function of a block (`flatmem_reversible_part`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    F,
    G,
}

impl Part {
    fn raw(self) -> i32 {
        match self {
            Part::F => sys::FLATMEM_REVERSIBLE_F as i32,
            Part::G => sys::FLATMEM_REVERSIBLE_G as i32,
        }
    }
}

/// Why a callback is called (`flatmem_reversible_phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The segment forward: no residuals are kept.
    Forward,
    /// STANDARD mode's forward: residuals are kept for the backward.
    Record,
    /// The backward's rebuild: the residuals go to the VJP right after.
    Rebuild,
    /// The backward's gradient step (VJPs).
    Gradient,
}

/// The seed block `block`, part `part` receives for a call seed
/// (`flatmem_reversible_block_seed`).
pub fn block_seed(seed: u64, block: usize, part: Part) -> u64 {
    let block = i32::try_from(block).unwrap_or(i32::MAX);
    // SAFETY: a pure function of its arguments.
    unsafe { sys::flatmem_reversible_block_seed(seed, block, part.raw()) }
}

/// The randomness of one segment call: every callback of block k, part p
/// gets `seed = block_seed(seed, k, p)` and `offset`, in the forward and in
/// the rebuild alike. Pass the same value to a backward as to its forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Randomness {
    pub seed: u64,
    pub offset: u64,
}

impl Randomness {
    pub fn new(seed: u64, offset: u64) -> Randomness {
        Randomness { seed, offset }
    }
}

// ---------------------------------------------------------------------------
// States as DLTensors
// ---------------------------------------------------------------------------

/// A state shape (compact row-major, ndim 1..8) as the C side takes it.
#[derive(Clone, Copy)]
struct Shape {
    extents: [i64; MAX_NDIM],
    ndim: usize,
    numel: usize,
}

impl Shape {
    fn new(shape: &[usize]) -> Result<Shape> {
        if shape.is_empty() || shape.len() > MAX_NDIM {
            return Err(Error::invalid(format!(
                "shape: {} dimensions; a state has 1 to {} (row-major, compact)",
                shape.len(),
                MAX_NDIM
            )));
        }
        let mut extents = [0i64; MAX_NDIM];
        let mut numel = 1usize;
        for (k, &n) in shape.iter().enumerate() {
            extents[k] = i64::try_from(n)
                .map_err(|_| Error::invalid(format!("shape[{}]: extent {} does not fit int64_t", k, n)))?;
            numel = numel
                .checked_mul(n)
                .ok_or_else(|| Error::invalid(format!("shape {:?}: the element count overflows usize", shape)))?;
        }
        Ok(Shape { extents, ndim: shape.len(), numel })
    }

    fn check_len(&self, name: &str, len: usize) -> Result<()> {
        if len == self.numel {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{}: the slice holds {} elements but the state shape {:?} needs {}",
                name,
                len,
                &self.extents[..self.ndim],
                self.numel
            )))
        }
    }

    /// A CPU tensor of this shape over `data`; it points into `self`, so
    /// `self` must stay put while the tensor is used.
    fn tensor(&self, data: *mut c_void, dtype: DLDataType) -> DLTensor {
        DLTensor {
            data,
            device: DLDevice { device_type: sys::kDLCPU, device_id: 0 },
            ndim: self.ndim as i32,
            dtype,
            shape: self.extents.as_ptr() as *mut i64,
            strides: ptr::null_mut(),
            byte_offset: 0,
        }
    }
}

// ---------------------------------------------------------------------------
// The callback context
// ---------------------------------------------------------------------------

/// What a callback is told about the call it serves
/// (`flatmem_reversible_context` and the state shape). Valid only during
/// the callback.
pub struct Context<'c> {
    raw: &'c sys::flatmem_reversible_context,
    shape: [usize; MAX_NDIM],
    ndim: usize,
    numel: usize,
    part: Part,
    phase: Phase,
}

impl<'c> Context<'c> {
    /// Reads the context and the shape of `x` (metadata only).
    fn new(raw: &'c sys::flatmem_reversible_context, x: &DLTensor, bits: u8) -> Result<Context<'c>> {
        let part = match raw.part {
            p if p == sys::FLATMEM_REVERSIBLE_F as i32 => Part::F,
            p if p == sys::FLATMEM_REVERSIBLE_G as i32 => Part::G,
            p => return Err(Error::new(Status::Internal, format!("context.part: unknown value {}", p))),
        };
        let phase = match raw.phase {
            p if p == sys::FLATMEM_REVERSIBLE_PHASE_FORWARD as i32 => Phase::Forward,
            p if p == sys::FLATMEM_REVERSIBLE_PHASE_RECORD as i32 => Phase::Record,
            p if p == sys::FLATMEM_REVERSIBLE_PHASE_REBUILD as i32 => Phase::Rebuild,
            p if p == sys::FLATMEM_REVERSIBLE_PHASE_GRADIENT as i32 => Phase::Gradient,
            p => return Err(Error::new(Status::Internal, format!("context.phase: unknown value {}", p))),
        };
        let ndim = usize::try_from(x.ndim).unwrap_or(usize::MAX);
        if ndim == 0 || ndim > MAX_NDIM || x.shape.is_null() {
            return Err(Error::new(Status::Internal, format!("x: ndim {} (or no shape) in a callback", x.ndim)));
        }
        if x.device.device_type != sys::kDLCPU || x.dtype != float_dtype(bits) || !x.strides.is_null() {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "x: this Rust function takes compact CPU f{} states, got device {}, dtype (code {}, bits {})",
                    bits, x.device.device_type, x.dtype.code, x.dtype.bits
                ),
            ));
        }
        let mut shape = [0usize; MAX_NDIM];
        let mut numel = 1usize;
        for (k, slot) in shape.iter_mut().enumerate().take(ndim) {
            // SAFETY: the library passes `ndim` extents.
            let n = unsafe { *x.shape.add(k) };
            *slot = usize::try_from(n)
                .map_err(|_| Error::new(Status::Internal, format!("x: negative extent {} in a callback", n)))?;
            numel = numel.saturating_mul(*slot);
        }
        Ok(Context { raw, shape, ndim, numel, part, phase })
    }

    /// Block index k in `[0, n)`.
    pub fn block(&self) -> usize {
        self.raw.block.max(0) as usize
    }

    pub fn part(&self) -> Part {
        self.part
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// `block_seed(call seed, block, part)`: draw dropout masks from this and
    /// [`offset`](Self::offset) to replay them exactly in the rebuild.
    pub fn seed(&self) -> u64 {
        self.raw.seed
    }

    pub fn offset(&self) -> u64 {
        self.raw.offset
    }

    /// Threads [`parallel_for`](Self::parallel_for) runs on (>= 1).
    pub fn num_threads(&self) -> usize {
        self.raw.num_threads.max(1) as usize
    }

    /// The state shape (row-major).
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.ndim]
    }

    /// Elements of one state tensor.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The raw C context.
    pub fn raw(&self) -> &sys::flatmem_reversible_context {
        self.raw
    }

    /// Calls `body(item, thread)` for every item in `0..items` on this
    /// chain's [`num_threads`](Self::num_threads) threads (the calling one
    /// included; `thread < num_threads`) and returns when all are done.
    /// Items are claimed dynamically: results must not depend on which
    /// thread ran an item. A panic in `body` stops the remaining items from
    /// starting and is resumed here once every thread is done.
    pub fn parallel_for<B: Fn(usize, usize) + Sync>(&self, items: usize, body: B) {
        struct Job<'b, B> {
            body: &'b B,
            failed: AtomicBool,
            panic: Mutex<Option<Box<dyn Any + Send>>>,
        }
        unsafe extern "C" fn run<B: Fn(usize, usize) + Sync>(arg: *mut c_void, item: i64, thread: i32) {
            // SAFETY: `arg` is the Job below, alive until parallel_for returns.
            let job = unsafe { &*(arg as *const Job<'_, B>) };
            if job.failed.load(Ordering::Relaxed) {
                return;
            }
            let result = panic::catch_unwind(AssertUnwindSafe(|| (job.body)(item as usize, thread.max(0) as usize)));
            if let Err(payload) = result {
                job.failed.store(true, Ordering::Relaxed);
                let mut slot = job.panic.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_none() {
                    *slot = Some(payload);
                }
            }
        }
        let job = Job { body: &body, failed: AtomicBool::new(false), panic: Mutex::new(None) };
        match (self.raw.parallel_for, i64::try_from(items)) {
            (Some(parallel_for), Ok(n)) => {
                // SAFETY: the library's parallel_for with this context; `run`
                // never unwinds; `job` outlives the call.
                unsafe { parallel_for(self.raw, n, Some(run::<B>), &job as *const Job<'_, B> as *mut c_void) }
            }
            _ => (0..items).for_each(|i| body(i, 0)),
        }
        if let Some(payload) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            panic::resume_unwind(payload);
        }
    }

    /// [`parallel_for`](Self::parallel_for) over the chunks of `chunk_len`
    /// elements of `data` (the last may be shorter): `body(chunk_index,
    /// chunk)` with each chunk given to exactly one call.
    pub fn parallel_chunks_mut<E: Send, B: Fn(usize, &mut [E]) + Sync>(
        &self,
        data: &mut [E],
        chunk_len: usize,
        body: B,
    ) {
        struct Base<E>(*mut E);
        // SAFETY: each chunk is handed out once (claimed below), like
        // chunks_mut handed to threads.
        unsafe impl<E: Send> Sync for Base<E> {}
        let chunk_len = chunk_len.max(1);
        let len = data.len();
        let items = (len + chunk_len - 1) / chunk_len;
        let claimed: Vec<AtomicBool> = (0..items).map(|_| AtomicBool::new(false)).collect();
        let base = Base(data.as_mut_ptr());
        let base = &base;
        self.parallel_for(items, |item, _thread| {
            assert!(!claimed[item].swap(true, Ordering::AcqRel), "parallel_for gave item {} twice", item);
            let start = item * chunk_len;
            let n = chunk_len.min(len - start);
            // SAFETY: in bounds, and disjoint from every other chunk (claimed once).
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
            body(item, chunk)
        });
    }
}

// ---------------------------------------------------------------------------
// User functions and their trampolines
// ---------------------------------------------------------------------------

/// One sub-function `F_k` or `G_k` written in Rust, for states of `T`.
///
/// The library calls it from the segment's threads (see the module's
/// *Threads*): an implementation must be `Send` to be wrapped in a
/// [`Function`]. Return `Err` to abort the segment call (the library's error
/// names the block); panics are caught and reported the same way.
pub trait ReversibleFunction<T: Element> {
    /// `y = fn(x)`: overwrite `y` (same shape as `x`, see `ctx.shape()`).
    /// `residuals` is `None` in the plain forward ([`Phase::Forward`]) and
    /// when [`residual_size`](Self::residual_size) is 0; otherwise it holds
    /// `residual_size` bytes (64-byte aligned) for the VJP: store there what
    /// it needs. It must be deterministic in `(x, ctx.seed(), ctx.offset())`:
    /// the rebuild calls it again and subtracts.
    fn forward(&mut self, ctx: &Context<'_>, x: &[T], y: &mut [T], residuals: Option<&mut [u8]>) -> Result<()>;

    /// `dx += J(x)^T dy`: ADD the input gradient into `dx` (it holds the
    /// other path's gradient). `x` is bitwise the input the forward saw and
    /// `residuals` what it stored (empty when none). Parameter gradients are
    /// this function's own business; the library calls each block's VJP
    /// exactly once per backward.
    fn vjp(&mut self, ctx: &Context<'_>, x: &[T], residuals: &[u8], dy: &[T], dx: &mut [T]) -> Result<()>;

    /// Residual bytes the forward stores for states of `ctx.shape()` (the
    /// default: none). Must give the same answer for the same shape.
    fn residual_size(&mut self, ctx: &Context<'_>) -> Result<usize> {
        let _ = ctx;
        Ok(0)
    }
}

/// A [`ReversibleFunction`] made of two closures, without residuals (the
/// VJP recomputes what it needs from `x`).
pub struct Closures<Fw, Vj> {
    forward: Fw,
    vjp: Vj,
}

impl<T, Fw, Vj> ReversibleFunction<T> for Closures<Fw, Vj>
where
    T: Element,
    Fw: FnMut(&Context<'_>, &[T], &mut [T]) -> Result<()>,
    Vj: FnMut(&Context<'_>, &[T], &[T], &mut [T]) -> Result<()>,
{
    fn forward(&mut self, ctx: &Context<'_>, x: &[T], y: &mut [T], _residuals: Option<&mut [u8]>) -> Result<()> {
        (self.forward)(ctx, x, y)
    }

    fn vjp(&mut self, ctx: &Context<'_>, x: &[T], _residuals: &[u8], dy: &[T], dx: &mut [T]) -> Result<()> {
        (self.vjp)(ctx, x, dy, dx)
    }
}

/// A user function behind the C `user` pointer, with the residual size of
/// the last shape asked (so that forward / vjp know their buffer's length).
struct Custom<F> {
    f: F,
    residuals: Option<([usize; MAX_NDIM], usize, usize)>, // (shape, ndim, bytes)
}

impl<F> Custom<F> {
    fn residual_bytes<T: Element>(&mut self, ctx: &Context<'_>) -> Result<usize>
    where
        F: ReversibleFunction<T>,
    {
        if let Some((shape, ndim, bytes)) = self.residuals {
            if ndim == ctx.ndim && shape == ctx.shape {
                return Ok(bytes);
            }
        }
        let bytes = self.f.residual_size(ctx)?;
        self.residuals = Some((ctx.shape, ctx.ndim, bytes));
        Ok(bytes)
    }
}

/// Runs a callback body at the FFI boundary: Ok is SUCCESS; an Err or a
/// panic sets the callback message and returns a failure status.
fn guard(body: impl FnOnce() -> Result<()>) -> sys::flatmem_status {
    let (status, message) = match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return sys::FLATMEM_STATUS_SUCCESS,
        Ok(Err(e)) => (e.status().raw(), e.message().to_string()),
        Err(payload) => (sys::FLATMEM_STATUS_INTERNAL, format!("panicked: {}", panic_text(&*payload))),
    };
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: a NUL-terminated string; the library copies it.
    unsafe { sys::flatmem_reversible_callback_error(message.as_ptr() as *const c_char) };
    if status == sys::FLATMEM_STATUS_SUCCESS {
        sys::FLATMEM_STATUS_INTERNAL // an Error carrying "success" is still a failure
    } else {
        status
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a non-string payload)".to_string()
    }
}

fn data_of(t: &DLTensor) -> *mut u8 {
    (t.data as *mut u8).wrapping_add(t.byte_offset as usize)
}

unsafe extern "C" fn forward_trampoline<T: Element, F: ReversibleFunction<T>>(
    user: *mut c_void,
    context: *const sys::flatmem_reversible_context,
    x: *const DLTensor,
    y: *mut DLTensor,
    residuals: *mut c_void,
) -> sys::flatmem_status {
    guard(|| {
        // SAFETY (all of this function): `user` is the Custom<F> this
        // trampoline was registered with, alive while the segment is, and
        // never used by two callbacks at once (one (block, part) each); the
        // library passes a valid context and x, y of x's shape and dtype
        // (checked by Context::new) with distinct data, and `residuals` of
        // residual_size bytes or NULL.
        let custom = unsafe { &mut *(user as *mut Custom<F>) };
        let (x, y) = unsafe { (&*x, &*y) };
        let ctx = Context::new(unsafe { &*context }, x, T::BITS)?;
        let n = ctx.numel();
        let xs = unsafe { std::slice::from_raw_parts(data_of(x) as *const T, n) };
        let ys = unsafe { std::slice::from_raw_parts_mut(data_of(y) as *mut T, n) };
        let res = if residuals.is_null() {
            None
        } else {
            match custom.residual_bytes(&ctx)? {
                0 => None,
                bytes => Some(unsafe { std::slice::from_raw_parts_mut(residuals as *mut u8, bytes) }),
            }
        };
        custom.f.forward(&ctx, xs, ys, res)
    })
}

unsafe extern "C" fn vjp_trampoline<T: Element, F: ReversibleFunction<T>>(
    user: *mut c_void,
    context: *const sys::flatmem_reversible_context,
    x: *const DLTensor,
    residuals: *const c_void,
    dy: *const DLTensor,
    dx: *mut DLTensor,
) -> sys::flatmem_status {
    guard(|| {
        // SAFETY: as in forward_trampoline; dy and dx have x's shape.
        let custom = unsafe { &mut *(user as *mut Custom<F>) };
        let (x, dy, dx) = unsafe { (&*x, &*dy, &*dx) };
        let ctx = Context::new(unsafe { &*context }, x, T::BITS)?;
        let n = ctx.numel();
        let xs = unsafe { std::slice::from_raw_parts(data_of(x) as *const T, n) };
        let dys = unsafe { std::slice::from_raw_parts(data_of(dy) as *const T, n) };
        let dxs = unsafe { std::slice::from_raw_parts_mut(data_of(dx) as *mut T, n) };
        let res: &[u8] = if residuals.is_null() {
            &[]
        } else {
            let bytes = custom.residual_bytes(&ctx)?;
            unsafe { std::slice::from_raw_parts(residuals as *const u8, bytes) }
        };
        custom.f.vjp(&ctx, xs, res, dys, dxs)
    })
}

unsafe extern "C" fn residual_size_trampoline<T: Element, F: ReversibleFunction<T>>(
    user: *mut c_void,
    context: *const sys::flatmem_reversible_context,
    x: *const DLTensor,
    bytes: *mut usize,
) -> sys::flatmem_status {
    guard(|| {
        // SAFETY: as in forward_trampoline (x's data is NULL: metadata only).
        let custom = unsafe { &mut *(user as *mut Custom<F>) };
        let ctx = Context::new(unsafe { &*context }, unsafe { &*x }, T::BITS)?;
        custom.residuals = None; // ask again: this is the library's query
        let n = custom.residual_bytes(&ctx)?;
        if bytes.is_null() {
            return Err(Error::new(Status::Internal, "bytes: NULL"));
        }
        // SAFETY: checked non-NULL; the library's out-parameter.
        unsafe { *bytes = n };
        Ok(())
    })
}

unsafe fn drop_custom<F>(user: *mut c_void) {
    // SAFETY: `user` came from Box::into_raw(Box<Custom<F>>) and is dropped once.
    drop(unsafe { Box::from_raw(user as *mut Custom<F>) });
}

// ---------------------------------------------------------------------------
// Built-in blocks
// ---------------------------------------------------------------------------

/// Which built-in block (`flatmem_block_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// `F(x) = MHSA(LN(x))`: pre-LayerNorm multi-head self-attention.
    Attention,
    /// `G(x) = GELU(LN(x) W1 + b1) W2 + b2` (exact GELU).
    Mlp,
}

/// Precision of a built-in block's matrix products (`flatmem_block_math`).
/// States, LayerNorm, softmax, GELU and every accumulation stay fp32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BlockMath {
    /// fp32 inputs and products (the default).
    #[default]
    Fp32,
    /// CUDA: GEMM inputs rounded to TF32 on tensor cores, fp32 accumulation
    /// (~1e-3 relative error per product). The CPU runs FP32 for either value.
    Tf32,
}

impl BlockMath {
    /// The C value.
    pub fn to_raw(self) -> sys::flatmem_block_math {
        match self {
            BlockMath::Fp32 => sys::FLATMEM_BLOCK_MATH_FP32,
            BlockMath::Tf32 => sys::FLATMEM_BLOCK_MATH_TF32,
        }
    }
}

/// Options of a built-in [`Block`]; zero means the library's default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockOptions {
    kind: BlockKind,
    width: usize,
    heads: usize,
    hidden: usize,
    layer_norm_eps: f32,
    math: BlockMath,
}

impl BlockOptions {
    /// Attention over states `(batch, tokens, width)` (or `(tokens, width)`).
    pub fn attention(width: usize) -> BlockOptions {
        BlockOptions {
            kind: BlockKind::Attention,
            width,
            heads: 0,
            hidden: 0,
            layer_norm_eps: 0.0,
            math: BlockMath::Fp32,
        }
    }

    /// MLP over states `(batch, tokens, width)` (or `(tokens, width)`).
    pub fn mlp(width: usize) -> BlockOptions {
        BlockOptions { kind: BlockKind::Mlp, width, heads: 0, hidden: 0, layer_norm_eps: 0.0, math: BlockMath::Fp32 }
    }

    /// Attention heads (0 = 1); `width` must be a multiple.
    pub fn heads(mut self, heads: usize) -> BlockOptions {
        self.heads = heads;
        self
    }

    /// MLP hidden width (0 = 4 * width).
    pub fn hidden(mut self, hidden: usize) -> BlockOptions {
        self.hidden = hidden;
        self
    }

    /// LayerNorm epsilon (0 = 1e-6).
    pub fn layer_norm_eps(mut self, eps: f32) -> BlockOptions {
        self.layer_norm_eps = eps;
        self
    }

    /// Precision of the products (default FP32). The library checks it; the
    /// CPU runs FP32 for either value, and this crate's blocks point at CPU
    /// slices, so TF32 gives the FP32 results here.
    pub fn math(mut self, math: BlockMath) -> BlockOptions {
        self.math = math;
        self
    }

    pub fn kind(&self) -> BlockKind {
        self.kind
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// The C options struct (`flatmem_block_options_init` + fields).
    pub fn to_raw(&self) -> Result<sys::flatmem_block_options> {
        let mut raw = sys::flatmem_block_options {
            struct_size: 0,
            kind: 0,
            width: 0,
            heads: 0,
            hidden: 0,
            layer_norm_eps: 0.0,
            math: 0,
        };
        let size = std::mem::size_of::<sys::flatmem_block_options>();
        // SAFETY: a valid, writable options struct of this declaration, of `size` bytes.
        check(unsafe { sys::flatmem_block_options_init(&mut raw, size) })?;
        raw.kind = match self.kind {
            BlockKind::Attention => sys::FLATMEM_BLOCK_ATTENTION,
            BlockKind::Mlp => sys::FLATMEM_BLOCK_MLP,
        };
        raw.width = int32("options.width", self.width)?;
        raw.heads = int32("options.heads", self.heads)?;
        raw.hidden = int32("options.hidden", self.hidden)?;
        raw.layer_norm_eps = self.layer_norm_eps;
        raw.math = self.math.to_raw();
        Ok(raw)
    }

    /// The six parameter shapes, in the header's order (see
    /// [`Block::parameter_names`]).
    pub fn parameter_shapes(&self) -> [Vec<usize>; 6] {
        let w = self.width;
        match self.kind {
            BlockKind::Attention => [vec![w], vec![w], vec![w, 3 * w], vec![3 * w], vec![w, w], vec![w]],
            BlockKind::Mlp => {
                let h = if self.hidden == 0 { 4 * w } else { self.hidden };
                [vec![w], vec![w], vec![w, h], vec![h], vec![h, w], vec![w]]
            }
        }
    }

    /// Creates the block.
    pub fn build<'p>(&self) -> Result<Block<'p>> {
        Block::new(self)
    }
}

/// The parameters of a built-in block, borrowed for `'p`: `values` are
/// read, `gradients` (None for a forward-only block) are ACCUMULATED into
/// (`+=`) by every backward: zero them before one.
pub struct Parameters<'p> {
    pub values: [&'p [f32]; 6],
    pub gradients: Option<[&'p mut [f32]; 6]>,
}

pub(crate) struct BlockHandleKind;

impl HandleKind for BlockHandleKind {
    type Raw = sys::flatmem_block_t;
    const NAME: &'static str = "flatmem_block";
    unsafe fn destroy(raw: *mut Self::Raw) -> sys::flatmem_status {
        // SAFETY: forwarded from the caller.
        unsafe { sys::flatmem_block_destroy(raw) }
    }
}

/// A built-in block (`flatmem_block_t`), destroyed on drop, pointing at
/// parameter memory borrowed for `'p`.
pub struct Block<'p> {
    handle: OwnedHandle<BlockHandleKind>,
    options: BlockOptions,
    values: Option<[(*const f32, usize); 6]>,
    gradients: Option<[(*mut f32, usize); 6]>,
    _borrow: PhantomData<&'p mut [f32]>,
}

// SAFETY: the C block is used by one thread at a time (&mut for changes,
// the segment's &mut for calls); the pointers are those of the &'p [f32] /
// &'p mut [f32] it borrows, which are Send and Sync; through &self only
// reads happen.
unsafe impl Send for Block<'_> {}
unsafe impl Sync for Block<'_> {}

impl std::fmt::Debug for Block<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("options", &self.options)
            .field("has_parameters", &self.values.is_some())
            .field("has_gradients", &self.gradients.is_some())
            .finish()
    }
}

impl<'p> Block<'p> {
    /// Creates a block (after checking the library version). Set its
    /// parameters before a segment uses it.
    pub fn new(options: &BlockOptions) -> Result<Block<'p>> {
        let raw = options.to_raw()?;
        // SAFETY: a valid out-pointer and options struct.
        let handle = OwnedHandle::create(|out| unsafe { sys::flatmem_block_create(out, &raw) })?;
        Ok(Block { handle, options: *options, values: None, gradients: None, _borrow: PhantomData })
    }

    pub fn options(&self) -> &BlockOptions {
        &self.options
    }

    /// The parameter names in the header's order.
    pub fn parameter_names(&self) -> [&'static str; 6] {
        match self.options.kind {
            BlockKind::Attention => ["ln_weight", "ln_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias"],
            BlockKind::Mlp => ["ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"],
        }
    }

    /// The six parameter shapes (row-major).
    pub fn parameter_shapes(&self) -> [Vec<usize>; 6] {
        self.options.parameter_shapes()
    }

    /// Points the block at its parameters and gradient accumulators
    /// (`flatmem_block_set_parameters`; shapes are checked here). Replaces
    /// earlier ones; on error the block keeps what it had.
    pub fn set_parameters(&mut self, parameters: Parameters<'p>) -> Result<()> {
        let Parameters { values, gradients } = parameters;
        let mut gradients = gradients;
        let shapes = self.parameter_shapes();
        let names = self.parameter_names();
        let mut extents = [[0i64; 2]; 6];
        for (k, shape) in shapes.iter().enumerate() {
            let numel: usize = shape.iter().product();
            let check_len = |what: &str, len: usize| -> Result<()> {
                if len == numel {
                    return Ok(());
                }
                Err(Error::invalid(format!(
                    "{}[{}] ({}): the slice holds {} elements but its shape {:?} needs {}",
                    what, k, names[k], len, shape, numel
                )))
            };
            check_len("parameters", values[k].len())?;
            if let Some(g) = &gradients {
                check_len("gradients", g[k].len())?;
            }
            for (d, &n) in shape.iter().enumerate() {
                extents[k][d] = i64::try_from(n).map_err(|_| Error::invalid("parameter extent beyond int64_t"))?;
            }
        }
        let tensor = |k: usize, data: *mut c_void| DLTensor {
            data,
            device: DLDevice { device_type: sys::kDLCPU, device_id: 0 },
            ndim: shapes[k].len() as i32,
            dtype: float_dtype(32),
            shape: extents[k].as_ptr() as *mut i64,
            strides: ptr::null_mut(),
            byte_offset: 0,
        };
        let value_ptrs: [(*const f32, usize); 6] = std::array::from_fn(|k| (values[k].as_ptr(), values[k].len()));
        let grad_ptrs: Option<[(*mut f32, usize); 6]> =
            gradients.as_mut().map(|g| std::array::from_fn(|k| (g[k].as_mut_ptr(), g[k].len())));
        let value_t: [DLTensor; 6] = std::array::from_fn(|k| tensor(k, value_ptrs[k].0 as *mut c_void));
        let grad_t: Option<[DLTensor; 6]> = grad_ptrs.map(|g| std::array::from_fn(|k| tensor(k, g[k].0.cast())));
        // SAFETY: six tensors each (shapes in `extents`, alive for the call);
        // the library keeps only the data pointers, whose memory is borrowed
        // for 'p, as long as this block can be used.
        check(unsafe {
            sys::flatmem_block_set_parameters(
                self.handle.as_mut_ptr(),
                value_t.as_ptr(),
                grad_t.as_ref().map_or(ptr::null(), |g| g.as_ptr()),
            )
        })?;
        self.values = Some(value_ptrs);
        self.gradients = grad_ptrs;
        Ok(())
    }

    /// The parameter values, if set.
    pub fn parameters(&self) -> Option<[&[f32]; 6]> {
        // SAFETY: borrowed for 'p (outlives &self); only read through here.
        self.values.map(|v| std::array::from_fn(|k| unsafe { std::slice::from_raw_parts(v[k].0, v[k].1) }))
    }

    /// The gradient accumulators, if set.
    pub fn gradients(&self) -> Option<[&[f32]; 6]> {
        // SAFETY: exclusively borrowed for 'p by this block; the library
        // writes them only during a segment call, which needs &mut.
        self.gradients.map(|g| std::array::from_fn(|k| unsafe { std::slice::from_raw_parts(g[k].0, g[k].1) }))
    }

    /// Sets the gradient accumulators to zero (before a backward).
    pub fn zero_gradients(&mut self) {
        if let Some(g) = self.gradients {
            for (p, n) in g {
                // SAFETY: as in gradients(), with &mut self.
                unsafe { std::slice::from_raw_parts_mut(p, n) }.fill(0.0);
            }
        }
    }

    fn raw_function(&mut self) -> Result<sys::flatmem_reversible_function> {
        let mut f =
            sys::flatmem_reversible_function { forward: None, vjp: None, residual_size: None, user: ptr::null_mut() };
        // SAFETY: a valid block and out-parameter.
        check(unsafe { sys::flatmem_block_function(self.handle.as_mut_ptr(), &mut f) })?;
        Ok(f)
    }
}

/// Mutable access to a block inside a segment: new parameters or zeroed
/// gradients, but not the block itself (the segment's C handle points at it).
pub struct BlockMut<'s, 'p> {
    block: &'s mut Block<'p>,
}

impl<'s, 'p> BlockMut<'s, 'p> {
    /// [`Block::set_parameters`].
    pub fn set_parameters(&mut self, parameters: Parameters<'p>) -> Result<()> {
        self.block.set_parameters(parameters)
    }

    /// [`Block::zero_gradients`].
    pub fn zero_gradients(&mut self) {
        self.block.zero_gradients()
    }

    pub fn block(&self) -> &Block<'p> {
        self.block
    }
}

// ---------------------------------------------------------------------------
// Functions, layers, segments
// ---------------------------------------------------------------------------

#[allow(clippy::large_enum_variant)] // a handful per segment
enum Kind<'p> {
    Block(Block<'p>),
    Custom { raw: sys::flatmem_reversible_function, drop: unsafe fn(*mut c_void) },
}

/// One `F_k` or `G_k` of a segment with states of `T`: a built-in
/// [`Block`] (f32 only) or a [`ReversibleFunction`].
pub struct Function<'p, T: Element> {
    kind: Kind<'p>,
    _types: Marker<'p, T>,
}

/// `T` is an argument type of the callbacks; `'p` is borrowed.
type Marker<'p, T> = PhantomData<(fn(T), &'p ())>;

// SAFETY: a Block is Send, and custom functions are required to be Send.
unsafe impl<T: Element> Send for Function<'_, T> {}

impl<'p, T: Element> Function<'p, T> {
    /// A Rust function (see [`ReversibleFunction`] for the thread rules).
    pub fn new<F: ReversibleFunction<T> + Send + 'p>(f: F) -> Function<'p, T> {
        let user = Box::into_raw(Box::new(Custom { f, residuals: None })) as *mut c_void;
        let raw = sys::flatmem_reversible_function {
            forward: Some(forward_trampoline::<T, F>),
            vjp: Some(vjp_trampoline::<T, F>),
            residual_size: Some(residual_size_trampoline::<T, F>),
            user,
        };
        Function { kind: Kind::Custom { raw, drop: drop_custom::<F> }, _types: PhantomData }
    }

    /// A function from a forward closure `(ctx, x, y)` (overwrite `y`) and
    /// a VJP closure `(ctx, x, dy, dx)` (ADD into `dx`), without residuals.
    pub fn from_closures<Fw, Vj>(forward: Fw, vjp: Vj) -> Function<'p, T>
    where
        Fw: FnMut(&Context<'_>, &[T], &mut [T]) -> Result<()> + Send + 'p,
        Vj: FnMut(&Context<'_>, &[T], &[T], &mut [T]) -> Result<()> + Send + 'p,
    {
        Function::new(Closures { forward, vjp })
    }

    /// The built-in block, when this is one.
    pub fn as_block(&self) -> Option<&Block<'p>> {
        match &self.kind {
            Kind::Block(b) => Some(b),
            Kind::Custom { .. } => None,
        }
    }

    fn raw(&mut self) -> Result<sys::flatmem_reversible_function> {
        match &mut self.kind {
            Kind::Block(b) => b.raw_function(),
            Kind::Custom { raw, .. } => Ok(*raw),
        }
    }
}

impl<'p> Function<'p, f32> {
    /// A built-in block (fp32 states only).
    pub fn block(block: Block<'p>) -> Function<'p, f32> {
        Function { kind: Kind::Block(block), _types: PhantomData }
    }
}

impl<'p> From<Block<'p>> for Function<'p, f32> {
    fn from(block: Block<'p>) -> Function<'p, f32> {
        Function::block(block)
    }
}

impl<T: Element> Drop for Function<'_, T> {
    fn drop(&mut self) {
        if let Kind::Custom { raw, drop } = &self.kind {
            // SAFETY: the Box made in Function::new, dropped once; no C
            // handle uses it any more (a Segment destroys its handle first).
            unsafe { drop(raw.user) };
        }
    }
}

/// Block k of a segment: its `F` and `G`.
pub struct Layer<'p, T: Element> {
    pub f: Function<'p, T>,
    pub g: Function<'p, T>,
}

impl<'p, T: Element> Layer<'p, T> {
    pub fn new(f: impl Into<Function<'p, T>>, g: impl Into<Function<'p, T>>) -> Layer<'p, T> {
        Layer { f: f.into(), g: g.into() }
    }
}

/// Options of a [`Segment`]; unset values are the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentOptions {
    mode: Mode,
    threads: usize,
}

impl SegmentOptions {
    /// AUTO mode, all online processors.
    pub fn new() -> SegmentOptions {
        SegmentOptions::default()
    }

    pub fn mode(mut self, mode: Mode) -> SegmentOptions {
        self.mode = mode;
        self
    }

    /// CPU threads including the caller's (0 = all online processors, at
    /// most 256). OVERLAPPED gives the rebuild chain a third of them.
    pub fn threads(mut self, threads: usize) -> SegmentOptions {
        self.threads = threads;
        self
    }

    /// The C options struct (`flatmem_reversible_options_init` + fields).
    pub fn to_raw(&self) -> Result<sys::flatmem_reversible_options> {
        let mut raw = sys::flatmem_reversible_options { struct_size: 0, mode: 0, num_threads: 0 };
        let size = std::mem::size_of::<sys::flatmem_reversible_options>();
        // SAFETY: a valid, writable options struct of this declaration, of `size` bytes.
        check(unsafe { sys::flatmem_reversible_options_init(&mut raw, size) })?;
        raw.mode = self.mode.raw();
        raw.num_threads = int32("options.num_threads", self.threads)?;
        Ok(raw)
    }
}

pub(crate) struct SegmentHandleKind;

impl HandleKind for SegmentHandleKind {
    type Raw = sys::flatmem_reversible_t;
    const NAME: &'static str = "flatmem_reversible";
    unsafe fn destroy(raw: *mut Self::Raw) -> sys::flatmem_status {
        // SAFETY: forwarded from the caller.
        unsafe { sys::flatmem_reversible_destroy(raw) }
    }
}

/// A reversible segment (`flatmem_reversible_t`) over states of `T` (f32 or
/// f64; built-in blocks need f32), owning its functions, which may borrow
/// memory for `'p`. The handle keeps its own workspace (the library's,
/// grown on demand). `Send` (the functions are), not `Sync`: one thread at
/// a time, every call takes `&mut self`.
pub struct Segment<'p, T: Element> {
    // Field order is drop order: the handle (and its thread) goes before the
    // functions it calls.
    handle: OwnedHandle<SegmentHandleKind>,
    layers: Vec<Layer<'p, T>>,
    options: SegmentOptions,
}

// SAFETY: see the struct's documentation; Function<'p, T> is Send.
unsafe impl<T: Element> Send for Segment<'_, T> {}

impl<T: Element> std::fmt::Debug for Segment<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("blocks", &self.layers.len())
            .field("options", &self.options)
            .field("dtype", &format_args!("f{}", T::BITS))
            .finish()
    }
}

type Pair<'a, T> = (&'a [T], &'a [T]);
type PairMut<'a, T> = (&'a mut [T], &'a mut [T]);

impl<'p, T: Element> Segment<'p, T> {
    /// Creates a segment of `layers.len()` blocks (1..=65536) and starts
    /// its thread.
    pub fn new(layers: Vec<Layer<'p, T>>, options: &SegmentOptions) -> Result<Segment<'p, T>> {
        let mut layers = layers;
        let n = i32::try_from(layers.len())
            .map_err(|_| Error::invalid(format!("num_blocks: {} does not fit int32_t", layers.len())))?;
        let raw_options = options.to_raw()?;
        let mut blocks = Vec::with_capacity(layers.len());
        for layer in layers.iter_mut() {
            blocks.push(sys::flatmem_reversible_block { f: layer.f.raw()?, g: layer.g.raw()? });
        }
        // SAFETY: `blocks` holds n valid blocks (copied by the library);
        // their user pointers live in `layers`, which the segment owns and
        // drops after the handle.
        let handle = OwnedHandle::create(|out| unsafe {
            sys::flatmem_reversible_create(out, blocks.as_ptr(), n, &raw_options)
        })?;
        Ok(Segment { handle, layers, options: *options })
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    pub fn options(&self) -> &SegmentOptions {
        &self.options
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by
    /// `self`: do not destroy it.
    pub fn as_raw(&mut self) -> *mut sys::flatmem_reversible_t {
        self.handle.as_mut_ptr()
    }

    /// The built-in block at `(block, part)`, if that function is one.
    pub fn block(&self, block: usize, part: Part) -> Option<&Block<'p>> {
        let layer = self.layers.get(block)?;
        match part {
            Part::F => layer.f.as_block(),
            Part::G => layer.g.as_block(),
        }
    }

    /// Mutable access to the built-in block at `(block, part)` (new
    /// parameters, zeroed gradients) between calls.
    pub fn block_mut(&mut self, block: usize, part: Part) -> Option<BlockMut<'_, 'p>> {
        let layer = self.layers.get_mut(block)?;
        let function = match part {
            Part::F => &mut layer.f,
            Part::G => &mut layer.g,
        };
        match &mut function.kind {
            Kind::Block(b) => Some(BlockMut { block: b }),
            Kind::Custom { .. } => None,
        }
    }

    /// Zeroes the gradient accumulators of every built-in block.
    pub fn zero_gradients(&mut self) {
        for layer in &mut self.layers {
            for function in [&mut layer.f, &mut layer.g] {
                if let Kind::Block(b) = &mut function.kind {
                    b.zero_gradients();
                }
            }
        }
    }

    /// Workspace bytes of the forward for states of `shape` (informational:
    /// the handle allocates its own). Calls the residual_size callbacks.
    pub fn forward_workspace_size(&mut self, shape: &[usize]) -> Result<usize> {
        let s = Shape::new(shape)?;
        let x = s.tensor(ptr::null_mut(), float_dtype(T::BITS));
        let mut bytes = 0usize;
        // SAFETY: a valid handle and metadata-only tensor.
        check(unsafe { sys::flatmem_reversible_forward_workspace_size(self.handle.as_mut_ptr(), &x, &mut bytes) })?;
        Ok(bytes)
    }

    /// Workspace bytes of the backward for states of `shape` (the mode's;
    /// AUTO: the larger of VANILLA and OVERLAPPED).
    pub fn backward_workspace_size(&mut self, shape: &[usize]) -> Result<usize> {
        let s = Shape::new(shape)?;
        let x = s.tensor(ptr::null_mut(), float_dtype(T::BITS));
        let mut bytes = 0usize;
        // SAFETY: as above.
        check(unsafe { sys::flatmem_reversible_backward_workspace_size(self.handle.as_mut_ptr(), &x, &mut bytes) })?;
        Ok(bytes)
    }

    /// Segment forward: `y = block n-1( .. block 0(x) ..)` for states of
    /// `shape` (row-major; each slice holds its product). `y` is written only
    /// when every callback succeeded.
    pub fn forward(&mut self, shape: &[usize], x: Pair<'_, T>, y: PairMut<'_, T>, rng: Randomness) -> Result<()> {
        let s = Shape::new(shape)?;
        s.check_len("x1", x.0.len())?;
        s.check_len("x2", x.1.len())?;
        s.check_len("y1", y.0.len())?;
        s.check_len("y2", y.1.len())?;
        let dtype = float_dtype(T::BITS);
        let (x1, x2) = (s.tensor(x.0.as_ptr() as *mut c_void, dtype), s.tensor(x.1.as_ptr() as *mut c_void, dtype));
        let (mut y1, mut y2) = (s.tensor(y.0.as_mut_ptr().cast(), dtype), s.tensor(y.1.as_mut_ptr().cast(), dtype));
        // SAFETY: tensors over live slices of their shape (lengths checked),
        // outputs exclusively borrowed; the handle allocates its workspace.
        check(unsafe {
            sys::flatmem_reversible_forward(
                self.handle.as_mut_ptr(),
                &x1,
                &x2,
                rng.seed,
                rng.offset,
                &mut y1,
                &mut y2,
                ptr::null_mut(),
                0,
                ptr::null_mut(),
            )
        })
    }

    /// Segment backward from the forward's output `y` and the upstream
    /// gradients `dy`: writes `dx = dL/dx`, and the rebuilt segment input
    /// when `rebuilt` is given (compare it with the true input to see the
    /// rebuild error). Pass the forward's `rng`. STANDARD mode needs this
    /// handle's preceding forward of the same shape.
    pub fn backward(
        &mut self,
        shape: &[usize],
        y: Pair<'_, T>,
        dy: Pair<'_, T>,
        dx: PairMut<'_, T>,
        rebuilt: Option<PairMut<'_, T>>,
        rng: Randomness,
    ) -> Result<()> {
        let s = Shape::new(shape)?;
        s.check_len("y1", y.0.len())?;
        s.check_len("y2", y.1.len())?;
        s.check_len("dy1", dy.0.len())?;
        s.check_len("dy2", dy.1.len())?;
        s.check_len("dx1", dx.0.len())?;
        s.check_len("dx2", dx.1.len())?;
        if let Some(r) = &rebuilt {
            s.check_len("x1", r.0.len())?;
            s.check_len("x2", r.1.len())?;
        }
        let dtype = float_dtype(T::BITS);
        let input = |d: &[T]| s.tensor(d.as_ptr() as *mut c_void, dtype);
        let (y1, y2, dy1, dy2) = (input(y.0), input(y.1), input(dy.0), input(dy.1));
        let (mut dx1, mut dx2) = (s.tensor(dx.0.as_mut_ptr().cast(), dtype), s.tensor(dx.1.as_mut_ptr().cast(), dtype));
        let mut rebuilt =
            rebuilt.map(|r| (s.tensor(r.0.as_mut_ptr().cast(), dtype), s.tensor(r.1.as_mut_ptr().cast(), dtype)));
        let (x1, x2) = match &mut rebuilt {
            Some((a, b)) => (a as *mut DLTensor, b as *mut DLTensor),
            None => (ptr::null_mut(), ptr::null_mut()),
        };
        // SAFETY: as in forward; the outputs are distinct exclusive borrows.
        check(unsafe {
            sys::flatmem_reversible_backward(
                self.handle.as_mut_ptr(),
                &y1,
                &y2,
                &dy1,
                &dy2,
                rng.seed,
                rng.offset,
                &mut dx1,
                &mut dx2,
                x1,
                x2,
                ptr::null_mut(),
                0,
                ptr::null_mut(),
            )
        })
    }

    /// The mode the last successful backward ran (`Auto` before any).
    pub fn last_mode(&self) -> Result<Mode> {
        let mut raw: sys::flatmem_reversible_mode = sys::FLATMEM_REVERSIBLE_AUTO;
        // SAFETY: a valid handle and out-parameter.
        check(unsafe { sys::flatmem_reversible_last_mode(self.handle.as_ptr(), &mut raw) })?;
        Mode::from_raw(raw).ok_or_else(|| Error::new(Status::Internal, format!("last_mode: unknown mode {}", raw)))
    }

    /// Rebuild error over depth (a diagnostic; allocates O(n) states): for
    /// each block k, `max |rebuilt - true| / max |true|` over both streams
    /// of its input, after a forward from `x` and a rebuild from its output.
    pub fn rebuild_error(&mut self, shape: &[usize], x: Pair<'_, T>, rng: Randomness) -> Result<Vec<f64>> {
        let s = Shape::new(shape)?;
        s.check_len("x1", x.0.len())?;
        s.check_len("x2", x.1.len())?;
        let dtype = float_dtype(T::BITS);
        let (x1, x2) = (s.tensor(x.0.as_ptr() as *mut c_void, dtype), s.tensor(x.1.as_ptr() as *mut c_void, dtype));
        let mut errors = vec![0.0f64; self.layers.len()];
        let e = Shape::new(&[errors.len()])?;
        let mut errors_t = e.tensor(errors.as_mut_ptr().cast(), float_dtype(64));
        // SAFETY: as in forward; errors is an (n,) fp64 CPU vector.
        check(unsafe {
            sys::flatmem_reversible_rebuild_error(
                self.handle.as_mut_ptr(),
                &x1,
                &x2,
                rng.seed,
                rng.offset,
                &mut errors_t,
                ptr::null_mut(),
            )
        })?;
        Ok(errors)
    }
}

/// Reads `bytes` (a residual buffer) as f32 values (a prefix of whole
/// values; residual buffers are 64-byte aligned).
pub fn residuals_f32(bytes: &[u8]) -> &[f32] {
    // SAFETY: every bit pattern is an f32; align_to only hands out the
    // aligned middle part.
    let (head, body, _) = unsafe { bytes.align_to::<f32>() };
    assert!(head.is_empty(), "residual buffer not aligned for f32");
    body
}

/// [`residuals_f32`] for writing.
pub fn residuals_f32_mut(bytes: &mut [u8]) -> &mut [f32] {
    // SAFETY: as in residuals_f32.
    let (head, body, _) = unsafe { bytes.align_to_mut::<f32>() };
    assert!(head.is_empty(), "residual buffer not aligned for f32");
    body
}

/// Reads `bytes` as f64 values (see [`residuals_f32`]).
pub fn residuals_f64(bytes: &[u8]) -> &[f64] {
    // SAFETY: as in residuals_f32.
    let (head, body, _) = unsafe { bytes.align_to::<f64>() };
    assert!(head.is_empty(), "residual buffer not aligned for f64");
    body
}

/// [`residuals_f64`] for writing.
pub fn residuals_f64_mut(bytes: &mut [u8]) -> &mut [f64] {
    // SAFETY: as in residuals_f32.
    let (head, body, _) = unsafe { bytes.align_to_mut::<f64>() };
    assert!(head.is_empty(), "residual buffer not aligned for f64");
    body
}
