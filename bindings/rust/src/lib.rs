#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! - [`sys`]: the raw `extern "C"` declarations of `flatmem.h` and the
//!   DLPack structs it takes: the `flatmem-sys` crate, bindgen's output for
//!   the installed header (checked in; `scripts/check-bindgen.sh`).
//! - [`contrastive`]: the tiled contrastive loss handle [`Contrastive`].
//! - [`sigmoid`]: the pairwise sigmoid (SigLIP) loss [`SigmoidLoss`] and its
//!   ring across ranks [`RingSigmoidLoss`].
//! - [`cpu_isa`](mod@cpu_isa): the instruction set of the CPU kernels
//!   ([`CpuIsa`], [`cpu_isa()`], [`set_cpu_isa`], [`cpu_engine`]).
//! - [`reversible`]: reversible segments [`Segment`] over built-in transformer
//!   [`Block`]s or Rust functions ([`ReversibleFunction`], closures).
//! - [`comm`]: communicators ([`Communicator`]: from a [`UniqueId`], from
//!   the environment, or an in-process group), non-blocking messages in a
//!   [`Transfers`] scope, all-reduce, ring shift, barrier, health, abort.
//! - [`RingContrastive`]: the contrastive loss of a global batch spread over
//!   the ranks of a communicator.
//! - [`cyclic`]: the cyclic data-parallel schedule of `flatmem/cyclic.h` as
//!   pure queries ([`cyclic::Schedule`]) and its runtime over a communicator
//!   ([`cyclic::Cyclic`]).
//! - [`cyclic_stages`]: stage-parallel cyclic training, one rank per stage
//!   serving N staggered micro-batches: the pure schedule
//!   ([`cyclic_stages::StageSchedule`]) and the runtime
//!   ([`cyclic_stages::CyclicStages`]).
//! - [`half`]: fp32 <-> bf16 / fp16 bit patterns.
//!
//! Every handle kind follows one pattern: an owned wrapper that creates in
//! its constructor (after [`check_version`]), destroys in `Drop`, takes an
//! options builder, borrows slices as DLPack tensors for one call and keeps
//! its workspace sized by the library's queries.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod comm;
pub mod contrastive;
mod convert;
pub mod cpu_isa;
pub mod cyclic;
pub mod cyclic_stages;
mod error;
pub mod half;
mod handle;
pub mod reversible;
pub mod sigmoid;
mod tensor;
mod version;

pub use flatmem_sys as sys;

pub use comm::{CommOptions, Communicator, Request, Transfers, UniqueId};
pub use contrastive::{
    Contrastive, ForwardOutput, Fp32Precision, Gradients, GradientsMut, Loss, NonFinite, Options, RingContrastive,
    Saved,
};
pub use cpu_isa::{cpu_engine, cpu_isa, set_cpu_isa, CpuIsa};
pub use error::{Error, Result, Status};
pub use handle::live_handles;
pub use reversible::{Block, BlockMath, BlockOptions, Layer, Parameters, ReversibleFunction, Segment, SegmentOptions};
pub use sigmoid::{RingSigmoidLoss, SigmoidGradients, SigmoidGradientsMut, SigmoidLoss, SigmoidValueAndGrad};
pub use tensor::{DeviceBuffer, Dtype, Element, Features, FeaturesMut};
pub use version::{check_version, version, version_string, Version, HEADER_VERSION};
