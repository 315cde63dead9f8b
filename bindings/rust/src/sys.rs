//! Raw declarations of `include/flatmem/flatmem.h`, written by hand.
//!
//! Everything keeps its C name. `tests/header_sync.rs` parses the installed
//! header and this file and fails on any difference: a function missing on
//! either side, a different argument count or type, a different return
//! type, an enum value, an option-struct field (name, type, order, offset)
//! or a version macro. Keep the layout of this file simple (one item per
//! declaration, no macros) so that the check can read it.
//!
//! The enums are integer aliases with constants, not Rust enums: the C side
//! may hand back any value, and a Rust enum holding an unlisted value is
//! undefined behaviour. Their type is what the C compiler gives an enum
//! without negative values on this platform (GCC, Clang: `unsigned int`,
//! as bindgen would declare it); the header check compares size and
//! signedness with the compiler's.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::marker::{PhantomData, PhantomPinned};
use std::os::raw::{c_char, c_int, c_uint, c_void};

pub use crate::dlpack::*;

// ---------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------

pub const FLATMEM_VERSION_MAJOR: c_int = 0;
pub const FLATMEM_VERSION_MINOR: c_int = 1;
pub const FLATMEM_VERSION_PATCH: c_int = 0;
/// Packed: major * 10000 + minor * 100 + patch (the header's macro).
pub const FLATMEM_VERSION: c_int = FLATMEM_VERSION_MAJOR * 10000 + FLATMEM_VERSION_MINOR * 100 + FLATMEM_VERSION_PATCH;

// ---------------------------------------------------------------------------
// Status and errors
// ---------------------------------------------------------------------------

pub type flatmem_status = c_uint;
pub const FLATMEM_STATUS_SUCCESS: flatmem_status = 0;
pub const FLATMEM_STATUS_INVALID_ARGUMENT: flatmem_status = 1;
pub const FLATMEM_STATUS_UNSUPPORTED: flatmem_status = 2;
pub const FLATMEM_STATUS_OUT_OF_MEMORY: flatmem_status = 3;
pub const FLATMEM_STATUS_WORKSPACE_TOO_SMALL: flatmem_status = 4;
pub const FLATMEM_STATUS_NON_FINITE: flatmem_status = 5;
pub const FLATMEM_STATUS_INTERNAL: flatmem_status = 6;
pub const FLATMEM_STATUS_MAX: flatmem_status = 0x7fffffff;

pub type flatmem_nonfinite_policy = c_uint;
pub const FLATMEM_NONFINITE_ERROR: flatmem_nonfinite_policy = 0;
pub const FLATMEM_NONFINITE_PROPAGATE: flatmem_nonfinite_policy = 1;
pub const FLATMEM_NONFINITE_MAX: flatmem_nonfinite_policy = 0x7fffffff;

pub type flatmem_fp32_precision = c_uint;
pub const FLATMEM_FP32_PRECISION_DEFAULT: flatmem_fp32_precision = 0;
pub const FLATMEM_FP32_PRECISION_TF32: flatmem_fp32_precision = 1;
pub const FLATMEM_FP32_PRECISION_FULL: flatmem_fp32_precision = 2;
pub const FLATMEM_FP32_PRECISION_MAX: flatmem_fp32_precision = 0x7fffffff;

// ---------------------------------------------------------------------------
// Tiled contrastive loss
// ---------------------------------------------------------------------------

/// Opaque handle (`typedef struct flatmem_contrastive_s flatmem_contrastive_t`).
#[repr(C)]
pub struct flatmem_contrastive_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

pub type flatmem_contrastive_loss = c_uint;
pub const FLATMEM_CONTRASTIVE_DEFAULT: flatmem_contrastive_loss = 0;
pub const FLATMEM_CONTRASTIVE_SYMMETRIC: flatmem_contrastive_loss = 1;
pub const FLATMEM_CONTRASTIVE_INFONCE: flatmem_contrastive_loss = 2;
pub const FLATMEM_CONTRASTIVE_LOSS_MAX: flatmem_contrastive_loss = 0x7fffffff;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct flatmem_contrastive_options {
    pub struct_size: usize,
    pub loss: flatmem_contrastive_loss,
    pub num_threads: i32,
    pub tile_rows: i32,
    pub tile_cols: i32,
    pub nonfinite: flatmem_nonfinite_policy,
    pub fp32_precision: i64,
}

extern "C" {
    pub fn flatmem_version() -> c_int;

    pub fn flatmem_version_string() -> *const c_char;

    pub fn flatmem_status_string(status: flatmem_status) -> *const c_char;

    pub fn flatmem_last_error() -> *const c_char;

    pub fn flatmem_contrastive_options_init(options: *mut flatmem_contrastive_options) -> flatmem_status;

    pub fn flatmem_contrastive_create(
        out: *mut *mut flatmem_contrastive_t,
        options: *const flatmem_contrastive_options,
    ) -> flatmem_status;

    pub fn flatmem_contrastive_destroy(handle: *mut flatmem_contrastive_t) -> flatmem_status;

    pub fn flatmem_contrastive_forward_workspace_size(
        handle: *const flatmem_contrastive_t,
        q: *const DLTensor,
        k: *const DLTensor,
        bytes: *mut usize,
    ) -> flatmem_status;

    pub fn flatmem_contrastive_backward_workspace_size(
        handle: *const flatmem_contrastive_t,
        q: *const DLTensor,
        k: *const DLTensor,
        dq: *const DLTensor,
        dk: *const DLTensor,
        bytes: *mut usize,
    ) -> flatmem_status;

    pub fn flatmem_contrastive_forward(
        handle: *mut flatmem_contrastive_t,
        q: *const DLTensor,
        k: *const DLTensor,
        labels: *const DLTensor,
        logit_scale: *const DLTensor,
        loss: *mut DLTensor,
        row_lse: *mut DLTensor,
        col_lse: *mut DLTensor,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_contrastive_backward(
        handle: *mut flatmem_contrastive_t,
        q: *const DLTensor,
        k: *const DLTensor,
        labels: *const DLTensor,
        logit_scale: *const DLTensor,
        row_lse: *const DLTensor,
        col_lse: *const DLTensor,
        dloss: *const DLTensor,
        dq: *mut DLTensor,
        dk: *mut DLTensor,
        dlogit_scale: *mut DLTensor,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> flatmem_status;
}
