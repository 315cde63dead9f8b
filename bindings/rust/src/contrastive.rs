//! The tiled contrastive loss (`flatmem_contrastive_*`): symmetric CLIP and
//! InfoNCE without materialising the `b x c` logit matrix.
//!
//! Formulas, gradient convention, shapes and dtypes are those of
//! `flatmem.h`; in short, with `x_ij = s <q_i, k_j>`:
//! InfoNCE `L = mean_i [LSE_j x_ij - x_{i,y_i}]` (labels `y`, default `y_i = i`),
//! symmetric `L = (row loss + column loss) / 2` with `c = b`, no labels.

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

use crate::comm::Communicator;

use crate::convert::int32;
use crate::error::{check, Error, Result};
use crate::handle::{HandleKind, OwnedHandle};
use crate::sys;
use crate::tensor::{opt_mut_ptr, opt_ptr, Desc, Dtype, Features, FeaturesMut};

/// Which loss a handle computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Loss {
    /// Symmetric CLIP loss (the default): row `i` pairs with column `i`,
    /// `c = b`, no labels; the forward also returns `col_lse`.
    #[default]
    Symmetric,
    /// InfoNCE, rows -> columns: `c >= b` allowed, optional labels.
    InfoNce,
    /// The pairwise sigmoid (SigLIP) loss: computed by
    /// [`SigmoidLoss`](crate::SigmoidLoss) (which sets this kind), not by
    /// [`Contrastive::forward`] / [`Contrastive::backward`], which refuse it.
    Sigmoid,
}

impl Loss {
    fn raw(self) -> sys::flatmem_contrastive_loss {
        match self {
            Loss::Symmetric => sys::FLATMEM_CONTRASTIVE_SYMMETRIC,
            Loss::InfoNce => sys::FLATMEM_CONTRASTIVE_INFONCE,
            Loss::Sigmoid => sys::FLATMEM_CONTRASTIVE_SIGMOID,
        }
    }
}

/// What NaN / Inf in `q` or `k` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NonFinite {
    /// Scan the inputs first; a NaN or Inf is an error with
    /// [`Status::NonFinite`](crate::Status::NonFinite) naming tensor, row
    /// and column, and nothing is written (the default).
    #[default]
    Error,
    /// No scan: NaN / Inf propagate as IEEE arithmetic dictates.
    Propagate,
}

impl NonFinite {
    pub(crate) fn raw(self) -> sys::flatmem_nonfinite_policy {
        match self {
            NonFinite::Error => sys::FLATMEM_NONFINITE_ERROR,
            NonFinite::Propagate => sys::FLATMEM_NONFINITE_PROPAGATE,
        }
    }
}

/// How fp32 operands enter reduced-precision products
/// (`flatmem_fp32_precision`, the options' `fp32_precision`).
///
/// On CUDA tensor cores it picks how fp32 inputs multiply. On the CPU it
/// matters only at ISA levels [`CpuIsa::Avx512Bf16`](crate::CpuIsa::Avx512Bf16) and
/// [`CpuIsa::Amx`](crate::CpuIsa::Amx) with bf16 features, where it decides how the
/// fp32 gradient matrix `G` enters the backward's products `dq = s G k`,
/// `dk = s G^T q` (softmax and sigmoid losses alike); everywhere else the CPU
/// multiplies in full fp32 and the value has no effect. The loss, `row_lse` /
/// `col_lse` and the scale (and bias) gradients do not depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fp32Precision {
    /// The library's default: TF32 on CUDA, [`Full`](Fp32Precision::Full)
    /// on the CPU.
    #[default]
    Default,
    /// Rounded once (`FLATMEM_FP32_PRECISION_ROUND_ONCE`; also called
    /// [`Fp32Precision::Tf32`], its CUDA name). CUDA: TF32 products (10-bit
    /// mantissas, fp32 accumulation). CPU bf16 path: `G` rounded once to bf16
    /// (each entry off by up to `2^-8` of itself): bf16-accurate gradients,
    /// as the frameworks' bf16 autograd gives, and the fastest backward.
    RoundOnce,
    /// CUDA: about full fp32 ("3xTF32", about 3x the tensor-core time of
    /// TF32). CPU bf16 path: `G` split in two bf16 parts (residual at most
    /// `2^-16 |G|`): about fp32 gradients, about the time of fp32 FMAs.
    Full,
}

impl Fp32Precision {
    /// [`RoundOnce`](Fp32Precision::RoundOnce) by its CUDA name
    /// (`FLATMEM_FP32_PRECISION_TF32`, the same C value).
    #[allow(non_upper_case_globals)]
    pub const Tf32: Fp32Precision = Fp32Precision::RoundOnce;

    /// The C value (`FLATMEM_FP32_PRECISION_*`).
    pub fn to_raw(self) -> sys::flatmem_fp32_precision {
        match self {
            Fp32Precision::Default => sys::FLATMEM_FP32_PRECISION_DEFAULT,
            Fp32Precision::RoundOnce => sys::FLATMEM_FP32_PRECISION_ROUND_ONCE,
            Fp32Precision::Full => sys::FLATMEM_FP32_PRECISION_FULL,
        }
    }
}

/// Options of a [`Contrastive`] handle; every unset value is the library's
/// default. Builder style:
/// `Options::new().loss(Loss::InfoNce).threads(4).tiles(256, 256).build()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    loss: Loss,
    threads: usize,
    tile_rows: usize,
    tile_cols: usize,
    nonfinite: NonFinite,
    logit_cache_bytes: usize,
    precision: Fp32Precision,
}

impl Options {
    /// All defaults: symmetric loss, all online processors, 512 x 512
    /// tiles, NaN / Inf are errors, no logit cache, the default precision.
    pub fn new() -> Options {
        Options::default()
    }

    pub fn loss(mut self, loss: Loss) -> Options {
        self.loss = loss;
        self
    }

    /// CPU threads including the caller's (1..=256; 0 = all online
    /// processors). The handle starts `threads - 1` workers.
    pub fn threads(mut self, threads: usize) -> Options {
        self.threads = threads;
        self
    }

    /// Tile extents in rows of `q` and rows of `k` (1..=4096 each; 0 = 512).
    /// Results depend on the tiles (summation order), not on the threads.
    pub fn tiles(mut self, rows: usize, cols: usize) -> Options {
        self.tile_rows = rows;
        self.tile_cols = cols;
        self
    }

    pub fn nonfinite(mut self, policy: NonFinite) -> Options {
        self.nonfinite = policy;
        self
    }

    /// Bytes the handle may hold to keep logit tiles from the forward for
    /// the backward (0 = none, the default): a memory/compute dial. With
    /// `bytes >= 4 b c` every tile is kept and the backward skips their
    /// recompute (6 instead of 8 `b c d` FLOPs for forward + backward of the
    /// symmetric loss); a smaller budget keeps the tiles that fit. The
    /// handle allocates `min(bytes, 4 b c)` at its first forward and keeps
    /// it until dropped. Results are bitwise identical with and without the
    /// cache: a backward whose `q` or `k` differ from the last forward's
    /// recomputes.
    pub fn logit_cache_bytes(mut self, bytes: usize) -> Options {
        self.logit_cache_bytes = bytes;
        self
    }

    /// How fp32 operands enter reduced-precision products
    /// (`options.fp32_precision`; [`Fp32Precision::Default`] unless set; see
    /// [`Fp32Precision`] and `flatmem_fp32_precision` in flatmem.h).
    pub fn precision(mut self, precision: Fp32Precision) -> Options {
        self.precision = precision;
        self
    }

    /// The C options struct (`flatmem_contrastive_options_init` + fields).
    pub fn to_raw(&self) -> Result<sys::flatmem_contrastive_options> {
        let mut raw = sys::flatmem_contrastive_options {
            struct_size: 0,
            loss: 0,
            num_threads: 0,
            tile_rows: 0,
            tile_cols: 0,
            nonfinite: 0,
            reserved0: 0,
            fp32_precision: 0,
            comm: std::ptr::null_mut(),
            logit_cache_bytes: 0,
        };
        let size = std::mem::size_of::<sys::flatmem_contrastive_options>();
        // SAFETY: a valid, writable options struct of this declaration, of `size` bytes.
        check(unsafe { sys::flatmem_contrastive_options_init(&mut raw, size) })?;
        raw.loss = self.loss.raw();
        raw.num_threads = int32("options.num_threads", self.threads)?;
        raw.tile_rows = int32("options.tile_rows", self.tile_rows)?;
        raw.tile_cols = int32("options.tile_cols", self.tile_cols)?;
        raw.nonfinite = self.nonfinite.raw();
        raw.logit_cache_bytes = self.logit_cache_bytes;
        raw.fp32_precision = i64::from(self.precision.to_raw());
        Ok(raw)
    }

    /// Creates a handle with these options.
    pub fn build(&self) -> Result<Contrastive> {
        Contrastive::new(self)
    }
}

/// What the forward returns.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOutput {
    /// The mean loss `L`.
    pub loss: f32,
    /// `LSE_j x_ij` per row, shape `(b,)`: saved for the backward.
    pub row_lse: Vec<f32>,
    /// `LSE_i x_ij` per column, shape `(c,)`: symmetric loss only.
    pub col_lse: Option<Vec<f32>>,
}

impl ForwardOutput {
    /// The state the backward needs.
    pub fn saved(&self) -> Saved<'_> {
        Saved { row_lse: &self.row_lse, col_lse: self.col_lse.as_deref() }
    }
}

/// The forward's saved log-sum-exp vectors, as the backward reads them.
#[derive(Debug, Clone, Copy)]
pub struct Saved<'a> {
    pub row_lse: &'a [f32],
    /// `None` for InfoNCE.
    pub col_lse: Option<&'a [f32]>,
}

impl<'a> From<&'a ForwardOutput> for Saved<'a> {
    fn from(out: &'a ForwardOutput) -> Saved<'a> {
        out.saved()
    }
}

/// What the backward returns: fp32 gradients of `g * L`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    /// `g dL/dq`, row-major `(b, d)`.
    pub dq: Vec<f32>,
    /// `g dL/dk`, row-major `(c, d)`.
    pub dk: Vec<f32>,
    /// `g dL/ds` with respect to the scale `s` itself (times `s` for a
    /// learned `log s`).
    pub dlogit_scale: f32,
}

/// Where [`Contrastive::backward_into`] writes; `None` skips that output
/// (at least one must be requested). `dq` / `dk` may be fp32 or the input
/// dtype.
#[derive(Debug, Default)]
pub struct GradientsMut<'a> {
    pub dq: Option<FeaturesMut<'a>>,
    pub dk: Option<FeaturesMut<'a>>,
    pub dlogit_scale: Option<&'a mut f32>,
}

/// A workspace query taking q, k, dq, dk (`flatmem_contrastive_backward_workspace_size`,
/// `flatmem_contrastive_sigmoid_workspace_size`).
pub(crate) type WorkspaceQuery = unsafe extern "C" fn(
    *const sys::flatmem_contrastive_t,
    *const sys::DLTensor,
    *const sys::DLTensor,
    *const sys::DLTensor,
    *const sys::DLTensor,
    *mut usize,
) -> sys::flatmem_status;

pub(crate) struct ContrastiveKind;

impl HandleKind for ContrastiveKind {
    type Raw = sys::flatmem_contrastive_t;
    const NAME: &'static str = "flatmem_contrastive";
    unsafe fn destroy(raw: *mut Self::Raw) -> sys::flatmem_status {
        // SAFETY: forwarded from the caller.
        unsafe { sys::flatmem_contrastive_destroy(raw) }
    }
}

/// An owned `flatmem_contrastive_t`: worker threads and a workspace, freed on
/// drop. Use it from one thread at a time (it is `Send`, not `Sync`).
///
/// The workspace is a buffer the handle keeps, sized by the library's
/// `*_workspace_size` queries before every call and grown when needed
/// ([`Contrastive::workspace_bytes`], [`Contrastive::release_workspace`]).
pub struct Contrastive {
    pub(crate) handle: OwnedHandle<ContrastiveKind>,
    loss: Loss,
    workspace: Vec<u8>,
}

// SAFETY: flatmem.h: "a handle is used by one thread at a time; distinct
// handles are independent". Moving the owner to another thread keeps that
// (&mut self for every call); it is not Sync.
unsafe impl Send for Contrastive {}

impl std::fmt::Debug for Contrastive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contrastive")
            .field("handle", &self.handle.as_ptr())
            .field("loss", &self.loss)
            .field("workspace_bytes", &self.workspace.len())
            .finish()
    }
}

impl Contrastive {
    /// Creates a handle (after checking the library version, see
    /// [`crate::check_version`]).
    pub fn new(options: &Options) -> Result<Contrastive> {
        Contrastive::create(options, ptr::null_mut())
    }

    pub(crate) fn create(options: &Options, comm: *mut sys::flatmem_comm_t) -> Result<Contrastive> {
        let mut raw = options.to_raw()?;
        raw.comm = comm;
        // SAFETY: `out` is a valid out-pointer, `raw` a valid options struct.
        let handle = OwnedHandle::create(|out| unsafe { sys::flatmem_contrastive_create(out, &raw) })?;
        Ok(Contrastive { handle, loss: options.loss, workspace: Vec::new() })
    }

    /// The loss this handle computes.
    pub fn loss_kind(&self) -> Loss {
        self.loss
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by
    /// `self`: do not destroy it.
    pub fn as_raw(&mut self) -> *mut sys::flatmem_contrastive_t {
        self.handle.as_mut_ptr()
    }

    /// Bytes of the workspace the handle currently holds.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.len()
    }

    /// Frees the workspace (the next call allocates it again).
    pub fn release_workspace(&mut self) {
        self.workspace = Vec::new();
    }

    /// Workspace bytes the forward needs for these shapes and dtypes
    /// (`flatmem_contrastive_forward_workspace_size`; data not read).
    pub fn forward_workspace_size(&self, q: &Features<'_>, k: &Features<'_>) -> Result<usize> {
        let (mut qd, mut kd) = (q.shape_desc("q")?, k.shape_desc("k")?);
        let (qt, kt) = (qd.dl(), kd.dl());
        let mut bytes = 0usize;
        // SAFETY: valid handle and tensors; only shapes are read.
        check(unsafe {
            sys::flatmem_contrastive_forward_workspace_size(self.handle.as_ptr(), qt.ptr(), kt.ptr(), &mut bytes)
        })?;
        Ok(bytes)
    }

    /// Workspace bytes the backward needs when writing `dq` / `dk` in these
    /// dtypes (`None`: that gradient is not requested).
    pub fn backward_workspace_size(
        &self,
        q: &Features<'_>,
        k: &Features<'_>,
        dq: Option<Dtype>,
        dk: Option<Dtype>,
    ) -> Result<usize> {
        self.query_for_dtypes(sys::flatmem_contrastive_backward_workspace_size, q, k, dq, dk)
    }

    /// `query` for `q`, `k` and gradients of their shapes in these dtypes
    /// (`None`: not requested); only shapes are read.
    pub(crate) fn query_for_dtypes(
        &self,
        query: WorkspaceQuery,
        q: &Features<'_>,
        k: &Features<'_>,
        dq: Option<Dtype>,
        dk: Option<Dtype>,
    ) -> Result<usize> {
        let (mut qd, mut kd) = (q.shape_desc("q")?, k.shape_desc("k")?);
        let mut dqd = dq.map(|t| Features::shape_only(t, q.rows(), q.dim()).shape_desc("dq")).transpose()?;
        let mut dkd = dk.map(|t| Features::shape_only(t, k.rows(), k.dim()).shape_desc("dk")).transpose()?;
        self.query_workspace(query, &mut qd, &mut kd, dqd.as_mut(), dkd.as_mut())
    }

    /// `query` for these tensors (`None`: NULL); only shapes are read.
    pub(crate) fn query_workspace(
        &self,
        query: WorkspaceQuery,
        qd: &mut Desc<'_>,
        kd: &mut Desc<'_>,
        dqd: Option<&mut Desc<'_>>,
        dkd: Option<&mut Desc<'_>>,
    ) -> Result<usize> {
        let (qt, kt) = (qd.dl(), kd.dl());
        let (dqt, dkt) = (dqd.map(|d| d.dl()), dkd.map(|d| d.dl()));
        let mut bytes = 0usize;
        // SAFETY: valid handle and tensors (or NULL); only shapes are read.
        check(unsafe { query(self.handle.as_ptr(), qt.ptr(), kt.ptr(), opt_ptr(&dqt), opt_ptr(&dkt), &mut bytes) })?;
        Ok(bytes)
    }

    /// The handle's workspace grown to at least `bytes`: (pointer, length).
    pub(crate) fn workspace(&mut self, bytes: usize) -> Result<(*mut c_void, usize)> {
        if self.workspace.len() < bytes {
            let mut grown = Vec::new();
            grown.try_reserve_exact(bytes).map_err(|_| {
                Error::new(crate::Status::OutOfMemory, format!("workspace: cannot allocate {} bytes", bytes))
            })?;
            grown.resize(bytes, 0u8);
            self.workspace = grown;
        }
        if self.workspace.is_empty() {
            // NULL, not an empty Vec's dangling pointer: a ring handle
            // (options.comm) requires workspace NULL and 0 bytes.
            return Ok((ptr::null_mut(), 0));
        }
        Ok((self.workspace.as_mut_ptr().cast(), self.workspace.len()))
    }

    /// Forward pass: the mean loss and the saved log-sum-exp vectors.
    ///
    /// `q` is `(b, d)`, `k` is `(c, d)` of the same dtype; `labels` (InfoNCE
    /// only) holds `b` values in `[0, c)`; `logit_scale` is `s > 0`.
    pub fn forward(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
    ) -> Result<ForwardOutput> {
        // Validate before allocating the outputs from the shapes.
        q.desc("q")?;
        k.desc("k")?;
        self.forward_workspace_size(&q, &k)?;
        let mut row_lse = vec![0.0f32; q.rows()];
        let mut col_lse = match self.loss {
            Loss::Symmetric => Some(vec![0.0f32; k.rows()]),
            Loss::InfoNce | Loss::Sigmoid => None,
        };
        let loss = self.forward_into(q, k, labels, logit_scale, &mut row_lse, col_lse.as_deref_mut())?;
        Ok(ForwardOutput { loss, row_lse, col_lse })
    }

    /// [`forward`](Self::forward) into caller slices: `row_lse` of length
    /// `b`, `col_lse` of length `c` for the symmetric loss and `None` for
    /// InfoNCE. Returns the loss. On error nothing is written.
    pub fn forward_into(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        row_lse: &mut [f32],
        col_lse: Option<&mut [f32]>,
    ) -> Result<f32> {
        let bytes = self.forward_workspace_size(&q, &k)?;
        let (mut qd, mut kd) = (q.desc("q")?, k.desc("k")?);
        let mut labels_d = labels.map(|l| Desc::i64s(l, "labels")).transpose()?;
        let mut scale = logit_scale;
        let mut scale_d = Desc::scalar(&mut scale);
        let mut loss = 0.0f32;
        let mut loss_d = Desc::scalar(&mut loss);
        let mut row_d = Desc::f32s_mut(row_lse, "row_lse")?;
        let mut col_d = col_lse.map(|c| Desc::f32s_mut(c, "col_lse")).transpose()?;
        let (ws, ws_bytes) = self.workspace(bytes)?;

        let (qt, kt, labels_t, scale_t) = (qd.dl(), kd.dl(), labels_d.as_mut().map(Desc::dl), scale_d.dl());
        let (mut loss_t, mut row_t, mut col_t) = (loss_d.dl(), row_d.dl(), col_d.as_mut().map(Desc::dl));
        // SAFETY: every tensor describes live memory of its shape and dtype
        // (lengths checked or shapes taken from the slices), outputs are
        // exclusively borrowed, the workspace holds ws_bytes.
        check(unsafe {
            sys::flatmem_contrastive_forward(
                self.handle.as_mut_ptr(),
                qt.ptr(),
                kt.ptr(),
                opt_ptr(&labels_t),
                scale_t.ptr(),
                loss_t.mut_ptr(),
                row_t.mut_ptr(),
                opt_mut_ptr(&mut col_t),
                ws,
                ws_bytes,
                ptr::null_mut(),
            )
        })?;
        Ok(loss)
    }

    /// Backward pass: fp32 gradients of `dloss * L` for `q`, `k` and the
    /// scale, from the inputs of the forward and its saved state.
    pub fn backward<'s>(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        saved: impl Into<Saved<'s>>,
        dloss: f32,
    ) -> Result<Gradients> {
        // Validate before allocating the outputs from the shapes.
        q.desc("q")?;
        k.desc("k")?;
        self.backward_workspace_size(&q, &k, Some(Dtype::F32), Some(Dtype::F32))?;
        let mut dq = vec![0.0f32; q.rows() * q.dim()];
        let mut dk = vec![0.0f32; k.rows() * k.dim()];
        let mut dlogit_scale = 0.0f32;
        let out = GradientsMut {
            dq: Some(FeaturesMut::f32(&mut dq, q.rows(), q.dim())),
            dk: Some(FeaturesMut::f32(&mut dk, k.rows(), k.dim())),
            dlogit_scale: Some(&mut dlogit_scale),
        };
        self.backward_into(q, k, labels, logit_scale, saved, dloss, out)?;
        Ok(Gradients { dq, dk, dlogit_scale })
    }

    /// [`backward`](Self::backward) into caller buffers; `None` outputs are
    /// skipped. On error nothing is written.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into<'s>(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        saved: impl Into<Saved<'s>>,
        dloss: f32,
        out: GradientsMut<'_>,
    ) -> Result<()> {
        let saved = saved.into();
        let GradientsMut { dq, dk, dlogit_scale } = out;
        let (mut dq, mut dk) = (dq, dk);
        let (mut qd, mut kd) = (q.desc("q")?, k.desc("k")?);
        let bytes = {
            let mut dq_shape = dq.as_ref().map(|g| g.shape_desc("dq")).transpose()?;
            let mut dk_shape = dk.as_ref().map(|g| g.shape_desc("dk")).transpose()?;
            let query = sys::flatmem_contrastive_backward_workspace_size;
            self.query_workspace(query, &mut qd, &mut kd, dq_shape.as_mut(), dk_shape.as_mut())?
        };
        let mut labels_d = labels.map(|l| Desc::i64s(l, "labels")).transpose()?;
        let mut scale = logit_scale;
        let mut scale_d = Desc::scalar(&mut scale);
        let mut row_d = Desc::f32s(saved.row_lse, "row_lse")?;
        let mut col_d = saved.col_lse.map(|c| Desc::f32s(c, "col_lse")).transpose()?;
        let mut g = dloss;
        let mut dloss_d = Desc::scalar(&mut g);
        let mut dq_d = dq.as_mut().map(|t| t.desc("dq")).transpose()?;
        let mut dk_d = dk.as_mut().map(|t| t.desc("dk")).transpose()?;
        let mut ds_d = dlogit_scale.map(Desc::scalar);
        let (ws, ws_bytes) = self.workspace(bytes)?;

        let (qt, kt, labels_t, scale_t) = (qd.dl(), kd.dl(), labels_d.as_mut().map(Desc::dl), scale_d.dl());
        let (row_t, col_t, dloss_t) = (row_d.dl(), col_d.as_mut().map(Desc::dl), dloss_d.dl());
        let mut dq_t = dq_d.as_mut().map(Desc::dl);
        let mut dk_t = dk_d.as_mut().map(Desc::dl);
        let mut ds_t = ds_d.as_mut().map(Desc::dl);
        // SAFETY: as in forward_into.
        check(unsafe {
            sys::flatmem_contrastive_backward(
                self.handle.as_mut_ptr(),
                qt.ptr(),
                kt.ptr(),
                opt_ptr(&labels_t),
                scale_t.ptr(),
                row_t.ptr(),
                opt_ptr(&col_t),
                dloss_t.ptr(),
                opt_mut_ptr(&mut dq_t),
                opt_mut_ptr(&mut dk_t),
                opt_mut_ptr(&mut ds_t),
                ws,
                ws_bytes,
                ptr::null_mut(),
            )
        })
    }
}

/// The contrastive loss of one global batch spread over the ranks of a
/// [`Communicator`] (`options.comm`, "Ring across ranks" in flatmem.h; CPU
/// tensors). Rank r passes ITS rows `q_r` (`b_r x d`) and ITS columns `k_r`
/// (`c_r x d`); the loss is that of the concatenated batch
/// `q = [q_0; q_1; ...]`, `k = [k_0; k_1; ...]` (rows and columns numbered
/// globally in rank order), identical bits on every rank. InfoNCE labels are
/// GLOBAL column indices (a positive may live on any rank); the symmetric
/// loss needs `b_r = c_r` on every rank (they may differ between ranks).
/// `row_lse` / `col_lse` are the global log-sum-exps of this rank's rows
/// and columns. The backward returns `dloss` times the exact gradients of
/// the GLOBAL mean with respect to this rank's `q_r`, `k_r` and the scale:
/// nothing is summed over ranks (a wrapper that averages parameter
/// gradients over N ranks passes `dloss = N`).
///
/// Calls are collective: every rank calls forward (or backward) in the same
/// order with the same loss, d, dtype, logit scale and `dloss`; a mismatch
/// is `InvalidArgument` on every rank naming the ranks and values. A
/// transport failure (`Timeout`, `PeerFailure`, `CommPoisoned`) poisons the
/// communicator and writes nothing the caller owns.
///
/// It borrows the communicator (which must outlive it, as the C rule says)
/// and is neither `Send` nor `Sync` (the communicator is used by one thread).
///
/// ```compile_fail
/// # use flatmem::{CommOptions, Communicator, Options, RingContrastive};
/// let ring = {
///     let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
///     RingContrastive::new(&comm, &Options::new()).unwrap()
/// }; // error: `comm` dropped while the ring loss still borrows it
/// # drop(ring);
/// ```
pub struct RingContrastive<'c> {
    inner: Contrastive,
    _comm: PhantomData<&'c Communicator>,
}

impl std::fmt::Debug for RingContrastive<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingContrastive").field("inner", &self.inner).finish()
    }
}

impl<'c> RingContrastive<'c> {
    /// Creates this rank's handle over `comm` (not collective). `options`
    /// must not set a logit cache (`InvalidArgument`).
    pub fn new(comm: &'c Communicator, options: &Options) -> Result<RingContrastive<'c>> {
        Ok(RingContrastive { inner: Contrastive::create(options, comm.as_raw())?, _comm: PhantomData })
    }

    /// The loss this handle computes.
    pub fn loss_kind(&self) -> Loss {
        self.inner.loss_kind()
    }

    /// Forward of the global batch: this rank's `q_r` `(b_r, d)`, `k_r`
    /// `(c_r, d)`, InfoNCE labels `(b_r,)` as global column indices. The
    /// loss is the global one; `row_lse` has `b_r` and `col_lse` `c_r`
    /// entries (this rank's, global log-sum-exps). Collective.
    pub fn forward(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
    ) -> Result<ForwardOutput> {
        self.inner.forward(q, k, labels, logit_scale)
    }

    /// [`forward`](Self::forward) into caller slices (see
    /// [`Contrastive::forward_into`]).
    pub fn forward_into(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        row_lse: &mut [f32],
        col_lse: Option<&mut [f32]>,
    ) -> Result<f32> {
        self.inner.forward_into(q, k, labels, logit_scale, row_lse, col_lse)
    }

    /// Backward: `dloss` times the gradients of the GLOBAL mean loss with
    /// respect to this rank's rows, columns and the scale (identical
    /// `dlogit_scale` on every rank). Collective.
    pub fn backward<'s>(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        saved: impl Into<Saved<'s>>,
        dloss: f32,
    ) -> Result<Gradients> {
        self.inner.backward(q, k, labels, logit_scale, saved, dloss)
    }

    /// [`backward`](Self::backward) into caller buffers (see
    /// [`Contrastive::backward_into`]; every rank must request `dk` or none).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into<'s>(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        saved: impl Into<Saved<'s>>,
        dloss: f32,
        out: GradientsMut<'_>,
    ) -> Result<()> {
        self.inner.backward_into(q, k, labels, logit_scale, saved, dloss, out)
    }
}
