//! The DLPack 0.6 structures flatmem's ABI takes (`<dlpack/dlpack.h>`,
//! `DLPACK_VERSION 60`): only the plain-C tensor view, not the managed
//! tensor. The layout of every struct here is checked against the C
//! compiler's by `tests/header_sync.rs`.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::os::raw::{c_int, c_uint, c_void};

/// The DLPack version these declarations follow (`DLPACK_VERSION`).
pub const DLPACK_VERSION: c_int = 60;

/// `DLDeviceType` (a C enum: an integer alias, not a Rust enum, so that any
/// value the C side holds is representable; `unsigned int` as GCC makes it).
pub type DLDeviceType = c_uint;
pub const kDLCPU: DLDeviceType = 1;
pub const kDLCUDA: DLDeviceType = 2;
pub const kDLCUDAHost: DLDeviceType = 3;
pub const kDLOpenCL: DLDeviceType = 4;
pub const kDLVulkan: DLDeviceType = 7;
pub const kDLMetal: DLDeviceType = 8;
pub const kDLVPI: DLDeviceType = 9;
pub const kDLROCM: DLDeviceType = 10;
pub const kDLROCMHost: DLDeviceType = 11;
pub const kDLExtDev: DLDeviceType = 12;
pub const kDLCUDAManaged: DLDeviceType = 13;

/// `DLDataTypeCode` values (stored as `u8` in [`DLDataType::code`]).
pub type DLDataTypeCode = c_uint;
pub const kDLInt: DLDataTypeCode = 0;
pub const kDLUInt: DLDataTypeCode = 1;
pub const kDLFloat: DLDataTypeCode = 2;
pub const kDLOpaqueHandle: DLDataTypeCode = 3;
pub const kDLBfloat: DLDataTypeCode = 4;
pub const kDLComplex: DLDataTypeCode = 5;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: DLDeviceType,
    pub device_id: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// A borrowed, non-owning tensor view. `shape` (and `strides` when not
/// null) must point at `ndim` extents that outlive every use of the view.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: c_int,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}
