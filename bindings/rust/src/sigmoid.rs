//! The pairwise sigmoid (SigLIP) loss (`flatmem_contrastive_sigmoid_*`):
//! a contrastive handle of kind [`Loss::Sigmoid`], tiled, never holding the
//! `b x c` logit matrix.
//!
//! With row features `q` `(b, d)`, column features `k` `(c, d)`, logit scale
//! `s` (finite, `> 0`) and logit bias `t` (finite), logits
//! `x_ij = s <q_i, k_j> + t` and `z_ij = +1` for row `i`'s positive column
//! `y_i`, `-1` for every other column:
//!
//! ```text
//! L = -(1/b) sum_i sum_j log sigmoid(z_ij x_ij)
//! ```
//!
//! the sum over all `c` columns of a row, the MEAN over the `b` rows (SigLIP
//! normalises by the batch). `y_i = i` without labels (needs `c >= b`), else
//! `labels[i]` in `[0, c)`. Gradients are those of this `L` with respect to
//! `q`, `k` and to `s` and `t` THEMSELVES (`dlogit_scale = dL/ds`,
//! `dlogit_bias = dL/dt`); a framework learning `log s` multiplies
//! `dlogit_scale` by `s`. Inputs are fp32, bf16 or fp16 (both the same;
//! 16-bit ones as bit patterns, see [`crate::half`]), accumulated in fp32;
//! the loss and the scalar gradients are fp32. Results are bitwise identical
//! whatever the thread count.
//!
//! Three paths, as in `flatmem.h` (FLOPs of the tile products):
//! [`SigmoidLoss::value_and_grad`] (`6 b c d`: the loss and every gradient
//! from one tile walk; frameworks call it in their forward and scale the
//! gradients by the upstream gradient in their backward),
//! [`SigmoidLoss::forward`] (`2 b c d`, the loss alone) and
//! [`SigmoidLoss::backward`] (`6 b c d`, `dloss` times the gradients,
//! recomputing the logits).

use std::marker::PhantomData;
use std::ptr;

use crate::comm::Communicator;
use crate::contrastive::{Contrastive, Loss, Options};
use crate::error::{check, Result};
use crate::sys;
use crate::tensor::{opt_mut_ptr, opt_ptr, Desc, Dtype, Features, FeaturesMut};

/// fp32 gradients of the sigmoid loss (times `dloss` for
/// [`SigmoidLoss::backward`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SigmoidGradients {
    /// `dL/dq`, row-major `(b, d)`.
    pub dq: Vec<f32>,
    /// `dL/dk`, row-major `(c, d)`.
    pub dk: Vec<f32>,
    /// `dL/ds` with respect to the scale `s` itself (times `s` for a learned
    /// `log s`).
    pub dlogit_scale: f32,
    /// `dL/dt` with respect to the bias `t`.
    pub dlogit_bias: f32,
}

/// What [`SigmoidLoss::value_and_grad`] returns: the loss and its gradients
/// from one tile walk.
#[derive(Debug, Clone, PartialEq)]
pub struct SigmoidValueAndGrad {
    /// The mean loss `L`.
    pub loss: f32,
    pub grads: SigmoidGradients,
}

/// Where the `*_into` calls write; `None` skips that output. `dq` `(b, d)`
/// and `dk` `(c, d)` may be fp32 or the input dtype (16-bit gradients are
/// accumulated in fp32 and rounded once). `dq` and `dk` are overwritten.
#[derive(Debug, Default)]
pub struct SigmoidGradientsMut<'a> {
    pub dq: Option<FeaturesMut<'a>>,
    pub dk: Option<FeaturesMut<'a>>,
    pub dlogit_scale: Option<&'a mut f32>,
    pub dlogit_bias: Option<&'a mut f32>,
}

/// The scalar inputs of every call: the logit scale `s` and bias `t`, and
/// the upstream gradient `g` of the backward. One fp32 element each, kept
/// here so that the DLPack views of them can point somewhere.
struct Scalars {
    scale: f32,
    bias: f32,
    dloss: f32,
}

/// Which C function a call ends in; the tensors are the same for all three.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    Forward,
    ValueAndGrad,
    Backward,
}

/// An owned contrastive handle of kind [`Loss::Sigmoid`]: worker threads
/// and a workspace, freed on drop. Use it from one thread at a time (it is
/// `Send`, not `Sync`). The workspace is kept and sized by
/// `flatmem_contrastive_sigmoid_workspace_size` before every call.
///
/// ```
/// # use flatmem::{Features, Options, SigmoidLoss};
/// let (q, k) = ([0.6f32, 0.8, 1.0, 0.0], [0.8f32, 0.6, 0.0, 1.0]);
/// let (q, k) = (Features::f32(&q, 2, 2), Features::f32(&k, 2, 2));
/// let mut loss = SigmoidLoss::new(&Options::new().threads(1)).unwrap();
/// let out = loss.value_and_grad(q, k, None, 10.0, -10.0).unwrap();
/// assert_eq!(out.loss, loss.forward(q, k, None, 10.0, -10.0).unwrap());
/// ```
#[derive(Debug)]
pub struct SigmoidLoss {
    inner: Contrastive,
}

impl SigmoidLoss {
    /// Creates a handle with these options and the loss kind set to
    /// [`Loss::Sigmoid`] (whatever `options` named). A logit cache is
    /// refused (`Unsupported`: the sigmoid loss saves nothing between calls).
    pub fn new(options: &Options) -> Result<SigmoidLoss> {
        SigmoidLoss::create(options, ptr::null_mut())
    }

    fn create(options: &Options, comm: *mut sys::flatmem_comm_t) -> Result<SigmoidLoss> {
        Ok(SigmoidLoss { inner: Contrastive::create(&options.loss(Loss::Sigmoid), comm)? })
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by
    /// `self`: do not destroy it.
    pub fn as_raw(&mut self) -> *mut sys::flatmem_contrastive_t {
        self.inner.as_raw()
    }

    /// Bytes of the workspace the handle currently holds.
    pub fn workspace_bytes(&self) -> usize {
        self.inner.workspace_bytes()
    }

    /// Frees the workspace (the next call allocates it again).
    pub fn release_workspace(&mut self) {
        self.inner.release_workspace()
    }

    /// Workspace bytes of a call writing `dq` / `dk` in these dtypes (`None`:
    /// not requested; both `None` for the forward). Only shapes are read.
    pub fn workspace_size(
        &self,
        q: &Features<'_>,
        k: &Features<'_>,
        dq: Option<Dtype>,
        dk: Option<Dtype>,
    ) -> Result<usize> {
        self.inner.query_for_dtypes(sys::flatmem_contrastive_sigmoid_workspace_size, q, k, dq, dk)
    }

    /// The loss `L` alone (`2 b c d` FLOPs).
    ///
    /// `q` `(b, d)`, `k` `(c, d)` of one dtype; `labels` `b` global column
    /// indices in `[0, c)` or `None` (`y_i = i`, needs `c >= b`);
    /// `logit_scale` `s > 0` and `logit_bias` `t`, both finite.
    pub fn forward(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
    ) -> Result<f32> {
        let mut loss = 0.0f32;
        let scalars = Scalars { scale: logit_scale, bias: logit_bias, dloss: 1.0 };
        self.call(Path::Forward, q, k, labels, scalars, Some(&mut loss), SigmoidGradientsMut::default())?;
        Ok(loss)
    }

    /// The loss and all its fp32 gradients in one tile walk (`6 b c d`
    /// FLOPs); arguments as in [`forward`](Self::forward).
    pub fn value_and_grad(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
    ) -> Result<SigmoidValueAndGrad> {
        let mut grads = self.gradients_for(&q, &k)?;
        let out = grads.outputs(&q, &k);
        let loss = self.value_and_grad_into(q, k, labels, logit_scale, logit_bias, out)?;
        Ok(SigmoidValueAndGrad { loss, grads })
    }

    /// [`value_and_grad`](Self::value_and_grad) into caller buffers; `None`
    /// outputs are skipped. Returns the loss. On error nothing is written.
    pub fn value_and_grad_into(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
        out: SigmoidGradientsMut<'_>,
    ) -> Result<f32> {
        let mut loss = 0.0f32;
        let scalars = Scalars { scale: logit_scale, bias: logit_bias, dloss: 1.0 };
        self.call(Path::ValueAndGrad, q, k, labels, scalars, Some(&mut loss), out)?;
        Ok(loss)
    }

    /// `dloss` times the fp32 gradients of `L`, recomputing the logits
    /// (`6 b c d` FLOPs): for callers that do not keep the gradients of
    /// [`value_and_grad`](Self::value_and_grad) until their backward.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
        dloss: f32,
    ) -> Result<SigmoidGradients> {
        let mut grads = self.gradients_for(&q, &k)?;
        let out = grads.outputs(&q, &k);
        self.backward_into(q, k, labels, logit_scale, logit_bias, dloss, out)?;
        Ok(grads)
    }

    /// [`backward`](Self::backward) into caller buffers; `None` outputs are
    /// skipped (at least one must be requested). On error nothing is written.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
        dloss: f32,
        out: SigmoidGradientsMut<'_>,
    ) -> Result<()> {
        let scalars = Scalars { scale: logit_scale, bias: logit_bias, dloss };
        self.call(Path::Backward, q, k, labels, scalars, None, out)
    }

    /// Zeroed fp32 gradients for these inputs, after the library validated
    /// them (so that a bad shape is its error, not an allocation of it).
    fn gradients_for(&self, q: &Features<'_>, k: &Features<'_>) -> Result<SigmoidGradients> {
        q.desc("q")?;
        k.desc("k")?;
        self.workspace_size(q, k, Some(Dtype::F32), Some(Dtype::F32))?;
        Ok(SigmoidGradients {
            dq: vec![0.0; q.rows() * q.dim()],
            dk: vec![0.0; k.rows() * k.dim()],
            dlogit_scale: 0.0,
            dlogit_bias: 0.0,
        })
    }

    /// The one place the three C functions are called: every tensor built
    /// the same way, the workspace sized by the query for these outputs.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        path: Path,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        mut scalars: Scalars,
        loss: Option<&mut f32>,
        out: SigmoidGradientsMut<'_>,
    ) -> Result<()> {
        let SigmoidGradientsMut { mut dq, mut dk, dlogit_scale, dlogit_bias } = out;
        let (mut qd, mut kd) = (q.desc("q")?, k.desc("k")?);
        let bytes = {
            let mut dq_shape = dq.as_ref().map(|g| g.shape_desc("dq")).transpose()?;
            let mut dk_shape = dk.as_ref().map(|g| g.shape_desc("dk")).transpose()?;
            let query = sys::flatmem_contrastive_sigmoid_workspace_size;
            self.inner.query_workspace(query, &mut qd, &mut kd, dq_shape.as_mut(), dk_shape.as_mut())?
        };
        let mut labels_d = labels.map(|l| Desc::i64s(l, "labels")).transpose()?;
        let mut scale_d = Desc::scalar(&mut scalars.scale);
        let mut bias_d = Desc::scalar(&mut scalars.bias);
        let mut dloss_d = Desc::scalar(&mut scalars.dloss);
        let mut loss_d = loss.map(Desc::scalar);
        let mut dq_d = dq.as_mut().map(|t| t.desc("dq")).transpose()?;
        let mut dk_d = dk.as_mut().map(|t| t.desc("dk")).transpose()?;
        let mut ds_d = dlogit_scale.map(Desc::scalar);
        let mut dt_d = dlogit_bias.map(Desc::scalar);
        let (ws, ws_bytes) = self.inner.workspace(bytes)?;

        let (qt, kt, labels_t) = (qd.dl(), kd.dl(), labels_d.as_mut().map(Desc::dl));
        let (scale_t, bias_t, dloss_t) = (scale_d.dl(), bias_d.dl(), dloss_d.dl());
        let mut loss_t = loss_d.as_mut().map(Desc::dl);
        let (mut dq_t, mut dk_t) = (dq_d.as_mut().map(Desc::dl), dk_d.as_mut().map(Desc::dl));
        let (mut ds_t, mut dt_t) = (ds_d.as_mut().map(Desc::dl), dt_d.as_mut().map(Desc::dl));
        let handle = self.inner.handle.as_mut_ptr();
        let stream = ptr::null_mut();
        // SAFETY: every tensor describes live memory of its shape and dtype
        // (lengths checked or shapes taken from the slices) or is NULL,
        // outputs are exclusively borrowed, the workspace holds ws_bytes.
        check(unsafe {
            match path {
                Path::Forward => sys::flatmem_contrastive_sigmoid_forward(
                    handle,
                    qt.ptr(),
                    kt.ptr(),
                    opt_ptr(&labels_t),
                    scale_t.ptr(),
                    bias_t.ptr(),
                    opt_mut_ptr(&mut loss_t),
                    ws,
                    ws_bytes,
                    stream,
                ),
                Path::ValueAndGrad => sys::flatmem_contrastive_sigmoid_value_and_grad(
                    handle,
                    qt.ptr(),
                    kt.ptr(),
                    opt_ptr(&labels_t),
                    scale_t.ptr(),
                    bias_t.ptr(),
                    opt_mut_ptr(&mut loss_t),
                    opt_mut_ptr(&mut dq_t),
                    opt_mut_ptr(&mut dk_t),
                    opt_mut_ptr(&mut ds_t),
                    opt_mut_ptr(&mut dt_t),
                    ws,
                    ws_bytes,
                    stream,
                ),
                Path::Backward => sys::flatmem_contrastive_sigmoid_backward(
                    handle,
                    qt.ptr(),
                    kt.ptr(),
                    opt_ptr(&labels_t),
                    scale_t.ptr(),
                    bias_t.ptr(),
                    dloss_t.ptr(),
                    opt_mut_ptr(&mut dq_t),
                    opt_mut_ptr(&mut dk_t),
                    opt_mut_ptr(&mut ds_t),
                    opt_mut_ptr(&mut dt_t),
                    ws,
                    ws_bytes,
                    stream,
                ),
            }
        })
    }
}

impl SigmoidGradients {
    /// Every output, into these buffers of `q`'s and `k`'s shapes.
    fn outputs<'a>(&'a mut self, q: &Features<'_>, k: &Features<'_>) -> SigmoidGradientsMut<'a> {
        SigmoidGradientsMut {
            dq: Some(FeaturesMut::f32(&mut self.dq, q.rows(), q.dim())),
            dk: Some(FeaturesMut::f32(&mut self.dk, k.rows(), k.dim())),
            dlogit_scale: Some(&mut self.dlogit_scale),
            dlogit_bias: Some(&mut self.dlogit_bias),
        }
    }
}

/// The sigmoid loss of one global batch spread over the ranks of a
/// [`Communicator`] (`options.comm`; CPU tensors). Rank r passes ITS rows
/// `q_r` `(b_r, d)` and ITS columns `k_r` `(c_r, d)`; the loss is that of
/// the concatenated batch `q = [q_0; q_1; ...]`, `k = [k_0; k_1; ...]`
/// (rows and columns numbered globally in rank order):
/// `L = -(1/B) sum over all global pairs`, `B` the global row count,
/// identical on every rank. Labels are GLOBAL column indices; without them
/// global row `g`'s positive is global column `g`. `dq` / `dk` are this
/// rank's rows / columns of the gradient of that global mean (nothing summed
/// over ranks: a wrapper averaging parameter gradients over N ranks passes
/// `dloss = N`); `dlogit_scale` and `dlogit_bias` are identical on every
/// rank.
///
/// Without labels global row `g`'s positive is global column `g` (so every
/// rank needs `R_r + b_r <= C`, `R_r` its first global row).
///
/// Calls are collective: every rank calls the same function in the same
/// order with the same d, dtype, `s`, `t` (bitwise) and `dloss`, and the
/// `*_into` calls request the same of `dk`, `dlogit_scale` and `dlogit_bias`
/// on every rank (`dq` may differ); a mismatch is `InvalidArgument` on every
/// rank naming it. A transport failure
/// (`Timeout`, `PeerFailure`, `CommPoisoned`) poisons the communicator and
/// writes nothing the caller owns. It borrows the communicator (which must
/// outlive it) and is neither `Send` nor `Sync`.
///
/// ```compile_fail
/// # use flatmem::{CommOptions, Communicator, Options, RingSigmoidLoss};
/// let ring = {
///     let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
///     RingSigmoidLoss::new(&comm, &Options::new()).unwrap()
/// }; // error: `comm` dropped while the ring loss still borrows it
/// # drop(ring);
/// ```
#[derive(Debug)]
pub struct RingSigmoidLoss<'c> {
    inner: SigmoidLoss,
    _comm: PhantomData<&'c Communicator>,
}

impl<'c> RingSigmoidLoss<'c> {
    /// Creates this rank's handle over `comm` (not collective); the loss
    /// kind is set to [`Loss::Sigmoid`].
    pub fn new(comm: &'c Communicator, options: &Options) -> Result<RingSigmoidLoss<'c>> {
        Ok(RingSigmoidLoss { inner: SigmoidLoss::create(options, comm.as_raw())?, _comm: PhantomData })
    }

    /// The global loss (see [`SigmoidLoss::forward`]). Collective.
    pub fn forward(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
    ) -> Result<f32> {
        self.inner.forward(q, k, labels, logit_scale, logit_bias)
    }

    /// The global loss and this rank's gradients (see
    /// [`SigmoidLoss::value_and_grad`]). Collective.
    pub fn value_and_grad(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
    ) -> Result<SigmoidValueAndGrad> {
        self.inner.value_and_grad(q, k, labels, logit_scale, logit_bias)
    }

    /// [`value_and_grad`](Self::value_and_grad) into caller buffers.
    /// Collective.
    pub fn value_and_grad_into(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
        out: SigmoidGradientsMut<'_>,
    ) -> Result<f32> {
        self.inner.value_and_grad_into(q, k, labels, logit_scale, logit_bias, out)
    }

    /// `dloss` times this rank's gradients (see [`SigmoidLoss::backward`]).
    /// Collective.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
        dloss: f32,
    ) -> Result<SigmoidGradients> {
        self.inner.backward(q, k, labels, logit_scale, logit_bias, dloss)
    }

    /// [`backward`](Self::backward) into caller buffers. Collective.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into(
        &mut self,
        q: Features<'_>,
        k: Features<'_>,
        labels: Option<&[i64]>,
        logit_scale: f32,
        logit_bias: f32,
        dloss: f32,
        out: SigmoidGradientsMut<'_>,
    ) -> Result<()> {
        self.inner.backward_into(q, k, labels, logit_scale, logit_bias, dloss, out)
    }
}
