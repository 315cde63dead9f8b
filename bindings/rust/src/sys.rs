//! Raw declarations of `include/flatmem/flatmem.h` (and the `flatmem/reversible.h`,
//! `flatmem/comm.h` and `flatmem/cyclic.h` it includes), written by hand. What the header keeps
//! behind `FLATMEM_EXPERIMENTAL` (`flatmem_contrastive_ring_stats_get`) is not
//! declared here.
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
use std::os::raw::{c_char, c_int, c_uchar, c_uint, c_void};

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
pub const FLATMEM_STATUS_TIMEOUT: flatmem_status = 7;
pub const FLATMEM_STATUS_PEER_FAILURE: flatmem_status = 8;
pub const FLATMEM_STATUS_COMM_POISONED: flatmem_status = 9;
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
// CPU instruction set
// ---------------------------------------------------------------------------

/// The instruction set the CPU kernels run with, for the whole process
/// (`flatmem_cpu_isa_get` / `_set`; the environment variable
/// `FLATMEM_CPU_ISA` caps the default).
pub type flatmem_cpu_isa = c_uint;
pub const FLATMEM_CPU_ISA_DEFAULT: flatmem_cpu_isa = 0;
pub const FLATMEM_CPU_ISA_BASELINE: flatmem_cpu_isa = 1;
pub const FLATMEM_CPU_ISA_AVX2: flatmem_cpu_isa = 2;
pub const FLATMEM_CPU_ISA_AVX512: flatmem_cpu_isa = 3;
pub const FLATMEM_CPU_ISA_MAX: flatmem_cpu_isa = 0x7fffffff;

/// Opaque communicator (`typedef struct flatmem_comm_s flatmem_comm_t`;
/// its functions are declared under "Communicators" below).
#[repr(C)]
pub struct flatmem_comm_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

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
    /// NULL: this process alone; else the ring across the communicator's ranks.
    pub comm: *mut flatmem_comm_t,
    /// Appended after `comm`: bytes of logit tiles the forward may keep for
    /// the backward (0 = none; CPU only; must be 0 with a communicator).
    pub logit_cache_bytes: usize,
}

// ---------------------------------------------------------------------------
// Reversible segments (flatmem/reversible.h)
// ---------------------------------------------------------------------------

/// Opaque handle (`typedef struct flatmem_reversible_s flatmem_reversible_t`).
#[repr(C)]
pub struct flatmem_reversible_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

pub type flatmem_reversible_mode = c_uint;
pub const FLATMEM_REVERSIBLE_AUTO: flatmem_reversible_mode = 0;
pub const FLATMEM_REVERSIBLE_STANDARD: flatmem_reversible_mode = 1;
pub const FLATMEM_REVERSIBLE_VANILLA: flatmem_reversible_mode = 2;
pub const FLATMEM_REVERSIBLE_OVERLAPPED: flatmem_reversible_mode = 3;
pub const FLATMEM_REVERSIBLE_MODE_MAX: flatmem_reversible_mode = 0x7fffffff;

pub type flatmem_reversible_part = c_uint;
pub const FLATMEM_REVERSIBLE_F: flatmem_reversible_part = 0;
pub const FLATMEM_REVERSIBLE_G: flatmem_reversible_part = 1;
pub const FLATMEM_REVERSIBLE_PART_MAX: flatmem_reversible_part = 0x7fffffff;

pub type flatmem_reversible_phase = c_uint;
pub const FLATMEM_REVERSIBLE_PHASE_FORWARD: flatmem_reversible_phase = 0;
pub const FLATMEM_REVERSIBLE_PHASE_RECORD: flatmem_reversible_phase = 1;
pub const FLATMEM_REVERSIBLE_PHASE_REBUILD: flatmem_reversible_phase = 2;
pub const FLATMEM_REVERSIBLE_PHASE_GRADIENT: flatmem_reversible_phase = 3;
pub const FLATMEM_REVERSIBLE_PHASE_MAX: flatmem_reversible_phase = 0x7fffffff;

/// What a callback is told about the call it serves (valid during the
/// callback only). C function pointers are `Option<unsafe extern "C" fn>`:
/// NULL is `None`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flatmem_reversible_context {
    pub struct_size: usize,
    pub block: i32,
    pub part: i32,
    pub phase: i32,
    pub num_threads: i32,
    pub seed: u64,
    pub offset: u64,
    pub stream: *mut c_void,
    pub parallel_for: Option<
        unsafe extern "C" fn(
            context: *const flatmem_reversible_context,
            items: i64,
            body: Option<unsafe extern "C" fn(arg: *mut c_void, item: i64, thread: i32)>,
            arg: *mut c_void,
        ),
    >,
    pub internal: *mut c_void,
}

pub type flatmem_reversible_forward_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        context: *const flatmem_reversible_context,
        x: *const DLTensor,
        y: *mut DLTensor,
        residuals: *mut c_void,
    ) -> flatmem_status,
>;

pub type flatmem_reversible_vjp_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        context: *const flatmem_reversible_context,
        x: *const DLTensor,
        residuals: *const c_void,
        dy: *const DLTensor,
        dx: *mut DLTensor,
    ) -> flatmem_status,
>;

pub type flatmem_reversible_residual_size_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        context: *const flatmem_reversible_context,
        x: *const DLTensor,
        bytes: *mut usize,
    ) -> flatmem_status,
>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flatmem_reversible_function {
    pub forward: flatmem_reversible_forward_fn,
    pub vjp: flatmem_reversible_vjp_fn,
    pub residual_size: flatmem_reversible_residual_size_fn,
    pub user: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flatmem_reversible_block {
    pub f: flatmem_reversible_function,
    pub g: flatmem_reversible_function,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct flatmem_reversible_options {
    pub struct_size: usize,
    pub mode: flatmem_reversible_mode,
    pub num_threads: i32,
}

// ---------------------------------------------------------------------------
// Built-in blocks (flatmem/reversible.h)
// ---------------------------------------------------------------------------

/// Opaque handle (`typedef struct flatmem_block_s flatmem_block_t`).
#[repr(C)]
pub struct flatmem_block_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// Precision of the built-in blocks' matrix products (CUDA; the CPU runs
/// FP32 for either value).
pub type flatmem_block_math = c_uint;
pub const FLATMEM_BLOCK_MATH_FP32: flatmem_block_math = 0;
pub const FLATMEM_BLOCK_MATH_TF32: flatmem_block_math = 1;
pub const FLATMEM_BLOCK_MATH_MAX: flatmem_block_math = 0x7fffffff;

pub type flatmem_block_kind = c_uint;
pub const FLATMEM_BLOCK_ATTENTION: flatmem_block_kind = 1;
pub const FLATMEM_BLOCK_MLP: flatmem_block_kind = 2;
pub const FLATMEM_BLOCK_KIND_MAX: flatmem_block_kind = 0x7fffffff;

/// Number of parameter tensors of every built-in block.
pub const FLATMEM_BLOCK_NUM_PARAMETERS: c_int = 6;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct flatmem_block_options {
    pub struct_size: usize,
    pub kind: flatmem_block_kind,
    pub width: i32,
    pub heads: i32,
    pub hidden: i32,
    pub layer_norm_eps: f32,
    /// Appended after 0.1.0: a caller with a smaller struct_size gets FP32.
    pub math: flatmem_block_math,
}

// ---------------------------------------------------------------------------
// Communicators (flatmem/comm.h)
// ---------------------------------------------------------------------------

/// Bytes of a unique id.
pub const FLATMEM_COMM_UNIQUE_ID_BYTES: usize = 128;

/// What rank 0 makes and every rank passes to `flatmem_comm_create`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct flatmem_comm_unique_id {
    pub internal: [c_uchar; FLATMEM_COMM_UNIQUE_ID_BYTES],
}

/// Opaque outstanding request (`typedef struct flatmem_comm_request_s flatmem_comm_request_t`).
#[repr(C)]
pub struct flatmem_comm_request_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct flatmem_comm_options {
    pub struct_size: usize,
    pub timeout_ms: i64,
    pub connect_timeout_ms: i64,
}

// ---------------------------------------------------------------------------
// Cyclic data parallelism (flatmem/cyclic.h)
// ---------------------------------------------------------------------------

pub type flatmem_cyclic_rule = c_uint;
pub const FLATMEM_CYCLIC_DELAY1: flatmem_cyclic_rule = 0;
pub const FLATMEM_CYCLIC_NEWEST: flatmem_cyclic_rule = 1;
pub const FLATMEM_CYCLIC_SYNC: flatmem_cyclic_rule = 2;
pub const FLATMEM_CYCLIC_RULE_MAX: flatmem_cyclic_rule = 0x7fffffff;

/// The shape of a schedule: what `flatmem_cyclic_schedule_*` compute from.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct flatmem_cyclic_schedule {
    pub struct_size: usize,
    pub world_size: i32,
    pub stages: i32,
    pub steps: i64,
    pub rule: flatmem_cyclic_rule,
}

/// `FLATMEM_CYCLIC_SCHEDULE_INIT` (there is no `*_init` function for a
/// schedule): struct_size, then zeros and `FLATMEM_CYCLIC_DELAY1`.
/// `tests/header_sync.rs` compares it with the macro as the compiler expands it.
pub const FLATMEM_CYCLIC_SCHEDULE_INIT: flatmem_cyclic_schedule = flatmem_cyclic_schedule {
    struct_size: std::mem::size_of::<flatmem_cyclic_schedule>(),
    world_size: 0,
    stages: 0,
    steps: 0,
    rule: FLATMEM_CYCLIC_DELAY1,
};

pub type flatmem_cyclic_action_kind = c_uint;
pub const FLATMEM_CYCLIC_IDLE: flatmem_cyclic_action_kind = 0;
pub const FLATMEM_CYCLIC_FORWARD: flatmem_cyclic_action_kind = 1;
pub const FLATMEM_CYCLIC_BACKWARD: flatmem_cyclic_action_kind = 2;
pub const FLATMEM_CYCLIC_DONE: flatmem_cyclic_action_kind = 3;
pub const FLATMEM_CYCLIC_ACTION_KIND_MAX: flatmem_cyclic_action_kind = 0x7fffffff;

/// What one rank does in one time step (-1: no stage / step / update / phase).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct flatmem_cyclic_action {
    pub time_step: i64,
    pub kind: flatmem_cyclic_action_kind,
    pub stage: i32,
    pub step: i64,
    pub update_stage: i32,
    pub update_step: i64,
    pub activations_held: i32,
    pub phase: i32,
}

/// Opaque cyclic runtime (`typedef struct flatmem_cyclic_s flatmem_cyclic_t`).
#[repr(C)]
pub struct flatmem_cyclic_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct flatmem_cyclic_options {
    pub struct_size: usize,
    pub stages: i32,
    pub steps: i64,
    pub rule: flatmem_cyclic_rule,
    /// NULL, or `stages` entries (copied at create).
    pub activation_bytes: *const i64,
    pub timeout_ms: i64,
    pub nonfinite: flatmem_nonfinite_policy,
    pub history: i64,
}

/// What happened in one time step of this rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct flatmem_cyclic_time_step_stats {
    pub time_step: i64,
    pub kind: flatmem_cyclic_action_kind,
    pub stage: i32,
    pub step: i64,
    pub activations_held: i32,
    pub activation_bytes: i64,
    pub bytes_sent: i64,
    pub seconds: f64,
    pub wait_seconds: f64,
    pub bytes_scheduled: i64,
}

/// Totals since create.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct flatmem_cyclic_summary {
    pub time_steps: i64,
    pub bytes_sent: i64,
    pub messages_sent: i64,
    pub max_bytes_sent_per_time_step: i64,
    pub peak_activation_bytes: i64,
    pub wait_seconds: f64,
    pub seconds: f64,
}

extern "C" {
    pub fn flatmem_version() -> c_int;

    pub fn flatmem_version_string() -> *const c_char;

    pub fn flatmem_status_string(status: flatmem_status) -> *const c_char;

    pub fn flatmem_last_error() -> *const c_char;

    // CPU instruction set

    pub fn flatmem_cpu_isa_get(in_use: *mut flatmem_cpu_isa, best: *mut flatmem_cpu_isa) -> flatmem_status;

    pub fn flatmem_cpu_isa_set(isa: flatmem_cpu_isa) -> flatmem_status;

    pub fn flatmem_cpu_isa_name(isa: flatmem_cpu_isa) -> *const c_char;

    // Tiled contrastive loss

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

    // Reversible segments

    pub fn flatmem_reversible_options_init(options: *mut flatmem_reversible_options) -> flatmem_status;

    pub fn flatmem_reversible_block_seed(seed: u64, block: i32, part: i32) -> u64;

    pub fn flatmem_reversible_create(
        out: *mut *mut flatmem_reversible_t,
        blocks: *const flatmem_reversible_block,
        num_blocks: i32,
        options: *const flatmem_reversible_options,
    ) -> flatmem_status;

    pub fn flatmem_reversible_destroy(handle: *mut flatmem_reversible_t) -> flatmem_status;

    pub fn flatmem_reversible_forward_workspace_size(
        handle: *mut flatmem_reversible_t,
        x: *const DLTensor,
        bytes: *mut usize,
    ) -> flatmem_status;

    pub fn flatmem_reversible_backward_workspace_size(
        handle: *mut flatmem_reversible_t,
        x: *const DLTensor,
        bytes: *mut usize,
    ) -> flatmem_status;

    pub fn flatmem_reversible_forward(
        handle: *mut flatmem_reversible_t,
        x1: *const DLTensor,
        x2: *const DLTensor,
        seed: u64,
        offset: u64,
        y1: *mut DLTensor,
        y2: *mut DLTensor,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_reversible_backward(
        handle: *mut flatmem_reversible_t,
        y1: *const DLTensor,
        y2: *const DLTensor,
        dy1: *const DLTensor,
        dy2: *const DLTensor,
        seed: u64,
        offset: u64,
        dx1: *mut DLTensor,
        dx2: *mut DLTensor,
        x1: *mut DLTensor,
        x2: *mut DLTensor,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_reversible_last_mode(
        handle: *const flatmem_reversible_t,
        mode: *mut flatmem_reversible_mode,
    ) -> flatmem_status;

    pub fn flatmem_reversible_rebuild_error(
        handle: *mut flatmem_reversible_t,
        x1: *const DLTensor,
        x2: *const DLTensor,
        seed: u64,
        offset: u64,
        errors: *mut DLTensor,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_reversible_callback_error(message: *const c_char);

    // Built-in blocks

    pub fn flatmem_block_options_init(options: *mut flatmem_block_options) -> flatmem_status;

    pub fn flatmem_block_create(
        out: *mut *mut flatmem_block_t,
        options: *const flatmem_block_options,
    ) -> flatmem_status;

    pub fn flatmem_block_destroy(block: *mut flatmem_block_t) -> flatmem_status;

    pub fn flatmem_block_set_parameters(
        block: *mut flatmem_block_t,
        parameters: *const DLTensor,
        gradients: *const DLTensor,
    ) -> flatmem_status;

    pub fn flatmem_block_function(
        block: *mut flatmem_block_t,
        function: *mut flatmem_reversible_function,
    ) -> flatmem_status;

    // Communicators

    pub fn flatmem_comm_options_init(options: *mut flatmem_comm_options) -> flatmem_status;

    pub fn flatmem_comm_unique_id_create(address: *const c_char, id: *mut flatmem_comm_unique_id) -> flatmem_status;

    pub fn flatmem_comm_create(
        out: *mut *mut flatmem_comm_t,
        rank: i32,
        world_size: i32,
        id: *const flatmem_comm_unique_id,
        options: *const flatmem_comm_options,
    ) -> flatmem_status;

    pub fn flatmem_comm_create_from_env(
        out: *mut *mut flatmem_comm_t,
        options: *const flatmem_comm_options,
    ) -> flatmem_status;

    pub fn flatmem_comm_create_local(
        comms: *mut *mut flatmem_comm_t,
        world_size: i32,
        options: *const flatmem_comm_options,
    ) -> flatmem_status;

    pub fn flatmem_comm_destroy(comm: *mut flatmem_comm_t) -> flatmem_status;

    pub fn flatmem_comm_abort(comm: *mut flatmem_comm_t) -> flatmem_status;

    pub fn flatmem_comm_rank(comm: *const flatmem_comm_t, rank: *mut i32) -> flatmem_status;

    pub fn flatmem_comm_world_size(comm: *const flatmem_comm_t, world_size: *mut i32) -> flatmem_status;

    pub fn flatmem_comm_health(comm: *const flatmem_comm_t) -> flatmem_status;

    pub fn flatmem_comm_isend(
        comm: *mut flatmem_comm_t,
        buffer: *const DLTensor,
        peer: i32,
        tag: u32,
        request: *mut *mut flatmem_comm_request_t,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_comm_irecv(
        comm: *mut flatmem_comm_t,
        buffer: *mut DLTensor,
        peer: i32,
        tag: u32,
        request: *mut *mut flatmem_comm_request_t,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_comm_wait(
        comm: *mut flatmem_comm_t,
        request: *mut flatmem_comm_request_t,
        timeout_ms: i64,
    ) -> flatmem_status;

    pub fn flatmem_comm_test(
        comm: *mut flatmem_comm_t,
        request: *mut flatmem_comm_request_t,
        done: *mut i32,
    ) -> flatmem_status;

    pub fn flatmem_comm_ring_shift(
        comm: *mut flatmem_comm_t,
        send: *const DLTensor,
        recv: *mut DLTensor,
        timeout_ms: i64,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_comm_all_reduce(
        comm: *mut flatmem_comm_t,
        send: *const DLTensor,
        recv: *mut DLTensor,
        timeout_ms: i64,
        stream: *mut c_void,
    ) -> flatmem_status;

    pub fn flatmem_comm_barrier(comm: *mut flatmem_comm_t, timeout_ms: i64) -> flatmem_status;

    pub fn flatmem_comm_init_device(comm: *mut flatmem_comm_t, cuda_device: i32, timeout_ms: i64) -> flatmem_status;

    pub fn flatmem_comm_group_start(comm: *mut flatmem_comm_t) -> flatmem_status;

    pub fn flatmem_comm_group_end(comm: *mut flatmem_comm_t, timeout_ms: i64) -> flatmem_status;

    pub fn flatmem_comm_synchronize(comm: *mut flatmem_comm_t, stream: *mut c_void, timeout_ms: i64) -> flatmem_status;

    // Cyclic data parallelism: the schedule (pure) and the runtime

    pub fn flatmem_cyclic_schedule_offset(
        schedule: *const flatmem_cyclic_schedule,
        rank: i32,
        offset: *mut i64,
    ) -> flatmem_status;

    pub fn flatmem_cyclic_schedule_delay(
        schedule: *const flatmem_cyclic_schedule,
        rank: i32,
        stage: i32,
        delay: *mut i32,
    ) -> flatmem_status;

    pub fn flatmem_cyclic_schedule_length(
        schedule: *const flatmem_cyclic_schedule,
        time_steps: *mut i64,
    ) -> flatmem_status;

    pub fn flatmem_cyclic_schedule_action(
        schedule: *const flatmem_cyclic_schedule,
        rank: i32,
        time_step: i64,
        action: *mut flatmem_cyclic_action,
    ) -> flatmem_status;

    pub fn flatmem_cyclic_options_init(options: *mut flatmem_cyclic_options) -> flatmem_status;

    pub fn flatmem_cyclic_create(
        out: *mut *mut flatmem_cyclic_t,
        comm: *mut flatmem_comm_t,
        options: *const flatmem_cyclic_options,
    ) -> flatmem_status;

    pub fn flatmem_cyclic_destroy(handle: *mut flatmem_cyclic_t) -> flatmem_status;

    pub fn flatmem_cyclic_get_schedule(
        handle: *const flatmem_cyclic_t,
        schedule: *mut flatmem_cyclic_schedule,
    ) -> flatmem_status;

    pub fn flatmem_cyclic_next(handle: *mut flatmem_cyclic_t, action: *mut flatmem_cyclic_action) -> flatmem_status;

    pub fn flatmem_cyclic_reduce(handle: *mut flatmem_cyclic_t, stage: i32, gradient: *mut DLTensor) -> flatmem_status;

    pub fn flatmem_cyclic_stats(
        handle: *const flatmem_cyclic_t,
        first: i64,
        count: i64,
        stats: *mut flatmem_cyclic_time_step_stats,
        written: *mut i64,
    ) -> flatmem_status;

    pub fn flatmem_cyclic_summary_get(
        handle: *const flatmem_cyclic_t,
        summary: *mut flatmem_cyclic_summary,
    ) -> flatmem_status;
}
