//! Slices as DLPack tensors: the public [`Features`] / [`FeaturesMut`]
//! matrices and the crate-internal [`Desc`] that turns a slice into a
//! `DLTensor` on the CPU for the duration of one call.

use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::ptr;

use crate::error::{Error, Result};
use crate::sys::{self, DLDataType, DLDevice, DLTensor};

/// A vector in CUDA device memory: `len` elements of `T` at `data` on CUDA
/// device `cuda_device` (the communicator's), for the calls of the cyclic
/// runtimes that take device tensors (their `Memory::Cuda`). The crate never
/// dereferences it: it only describes it to the library, whose unsafe
/// callers vouch for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer<T> {
    pub data: *mut T,
    pub len: usize,
    pub cuda_device: i32,
}

/// Element type of a feature or gradient matrix. 16-bit formats are passed as
/// their `u16` bit patterns (see [`crate::half`] for conversions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary32 (`kDLFloat`, 32).
    F32,
    /// bfloat16 (`kDLBfloat`, 16).
    Bf16,
    /// IEEE binary16 (`kDLFloat`, 16).
    F16,
}

impl Dtype {
    pub(crate) fn dl(self) -> DLDataType {
        let (code, bits) = match self {
            Dtype::F32 => (sys::kDLFloat, 32),
            Dtype::Bf16 => (sys::kDLBfloat, 16),
            Dtype::F16 => (sys::kDLFloat, 16),
        };
        DLDataType { code: code as u8, bits, lanes: 1 }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An element type of a communicator message, an all-reduce or a cyclic
/// gradient: `f32`, `f64`, `i32`, `i64`, `u8` (the DLPack dtype it travels
/// as). Which operations accept which dtype is the library's rule (the
/// all-reduce sums fp32, fp64, int32 and int64; cyclic gradients are fp32 or
/// fp64; a message may be any of them); others fail with `InvalidArgument`.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The DLPack dtype.
    const DTYPE: DLDataType;
}

macro_rules! element {
    ($($t:ty => $code:ident, $bits:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DLDataType = DLDataType { code: sys::$code as u8, bits: $bits, lanes: 1 };
        }
    )*};
}

element! {
    f32 => kDLFloat, 32;
    f64 => kDLFloat, 64;
    i32 => kDLInt, 32;
    i64 => kDLInt, 64;
    u8 => kDLUInt, 8;
}

/// A read-only row-major matrix of `rows x dim` features borrowed from a
/// slice of exactly `rows * dim` elements (checked at the call).
#[derive(Debug, Clone, Copy)]
pub struct Features<'a> {
    data: *const c_void,
    len: usize,
    dtype: Dtype,
    rows: usize,
    dim: usize,
    _borrow: PhantomData<&'a [u8]>,
}

// SAFETY: a Features is a shared borrow of plain numbers (like &[T]).
unsafe impl Send for Features<'_> {}
unsafe impl Sync for Features<'_> {}

impl<'a> Features<'a> {
    fn new(data: *const c_void, len: usize, dtype: Dtype, rows: usize, dim: usize) -> Self {
        Features { data, len, dtype, rows, dim, _borrow: PhantomData }
    }

    /// fp32 features.
    pub fn f32(data: &'a [f32], rows: usize, dim: usize) -> Self {
        Self::new(data.as_ptr().cast(), data.len(), Dtype::F32, rows, dim)
    }

    /// bf16 features as bit patterns.
    pub fn bf16(data: &'a [u16], rows: usize, dim: usize) -> Self {
        Self::new(data.as_ptr().cast(), data.len(), Dtype::Bf16, rows, dim)
    }

    /// fp16 features as bit patterns.
    pub fn f16(data: &'a [u16], rows: usize, dim: usize) -> Self {
        Self::new(data.as_ptr().cast(), data.len(), Dtype::F16, rows, dim)
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The DLTensor description; `name` is the argument's name for errors.
    pub(crate) fn desc(&self, name: &str) -> Result<Desc<'a>> {
        check_len(name, self.len, self.rows, self.dim)?;
        Desc::matrix(self.data as *mut c_void, self.dtype, self.rows, self.dim, name)
    }

    /// A matrix of this dtype and shape without data (workspace queries).
    pub(crate) fn shape_only(dtype: Dtype, rows: usize, dim: usize) -> Features<'static> {
        Features::new(ptr::null(), 0, dtype, rows, dim)
    }

    /// Shape and dtype only (data NULL), for the workspace queries.
    pub(crate) fn shape_desc(&self, name: &str) -> Result<Desc<'static>> {
        Desc::matrix(ptr::null_mut(), self.dtype, self.rows, self.dim, name)
    }
}

/// A writable row-major `rows x dim` matrix borrowed from a slice of exactly
/// `rows * dim` elements: where a gradient is written.
#[derive(Debug)]
pub struct FeaturesMut<'a> {
    data: *mut c_void,
    len: usize,
    dtype: Dtype,
    rows: usize,
    dim: usize,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: a FeaturesMut is an exclusive borrow of plain numbers (like &mut [T]).
unsafe impl Send for FeaturesMut<'_> {}
unsafe impl Sync for FeaturesMut<'_> {}

impl<'a> FeaturesMut<'a> {
    fn new(data: *mut c_void, len: usize, dtype: Dtype, rows: usize, dim: usize) -> Self {
        FeaturesMut { data, len, dtype, rows, dim, _borrow: PhantomData }
    }

    pub fn f32(data: &'a mut [f32], rows: usize, dim: usize) -> Self {
        Self::new(data.as_mut_ptr().cast(), data.len(), Dtype::F32, rows, dim)
    }

    pub fn bf16(data: &'a mut [u16], rows: usize, dim: usize) -> Self {
        Self::new(data.as_mut_ptr().cast(), data.len(), Dtype::Bf16, rows, dim)
    }

    pub fn f16(data: &'a mut [u16], rows: usize, dim: usize) -> Self {
        Self::new(data.as_mut_ptr().cast(), data.len(), Dtype::F16, rows, dim)
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub(crate) fn desc(&mut self, name: &str) -> Result<Desc<'_>> {
        check_len(name, self.len, self.rows, self.dim)?;
        Desc::matrix(self.data, self.dtype, self.rows, self.dim, name)
    }

    pub(crate) fn shape_desc(&self, name: &str) -> Result<Desc<'static>> {
        Desc::matrix(ptr::null_mut(), self.dtype, self.rows, self.dim, name)
    }
}

fn check_len(name: &str, len: usize, rows: usize, dim: usize) -> Result<()> {
    match rows.checked_mul(dim) {
        Some(n) if n == len => Ok(()),
        Some(n) => Err(Error::invalid(format!(
            "{}: the slice holds {} elements but its shape ({}, {}) needs {}",
            name, len, rows, dim, n
        ))),
        None => Err(Error::invalid(format!("{}: shape ({}, {}) overflows usize", name, rows, dim))),
    }
}

const CPU: DLDevice = DLDevice { device_type: sys::kDLCPU, device_id: 0 };

fn extent(name: &str, n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::invalid(format!("{}: extent {} does not fit int64_t", name, n)))
}

/// A CPU tensor of ndim 1 or 2 over memory borrowed for `'a` (or a CUDA
/// vector the caller vouches for, [`Desc::cuda_elements`]), holding its own
/// shape. [`Desc::dl`] gives the `DLTensor`, which points into the `Desc`
/// and so borrows it.
pub(crate) struct Desc<'a> {
    data: *mut c_void,
    device: DLDevice,
    dtype: DLDataType,
    ndim: c_int,
    shape: [i64; 2],
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Desc<'a> {
    fn matrix(data: *mut c_void, dtype: Dtype, rows: usize, dim: usize, name: &str) -> Result<Desc<'a>> {
        Ok(Desc {
            data,
            device: CPU,
            dtype: dtype.dl(),
            ndim: 2,
            shape: [extent(name, rows)?, extent(name, dim)?],
            _borrow: PhantomData,
        })
    }

    fn vector(data: *mut c_void, dtype: DLDataType, len: usize, name: &str) -> Result<Desc<'a>> {
        Ok(Desc { data, device: CPU, dtype, ndim: 1, shape: [extent(name, len)?, 0], _borrow: PhantomData })
    }

    /// A vector of any [`Element`] in the memory of CUDA device
    /// `cuda_device`, described only (the crate never touches it; whoever
    /// hands it to the library vouches for it).
    pub(crate) fn cuda_elements<T: Element>(buffer: DeviceBuffer<T>, name: &str) -> Result<Desc<'a>> {
        let device = DLDevice { device_type: sys::kDLCUDA, device_id: buffer.cuda_device };
        Ok(Desc { device, ..Self::vector(buffer.data.cast(), T::DTYPE, buffer.len, name)? })
    }

    /// An fp32 vector read by the library.
    pub(crate) fn f32s(data: &'a [f32], name: &str) -> Result<Desc<'a>> {
        Self::vector(data.as_ptr() as *mut c_void, Dtype::F32.dl(), data.len(), name)
    }

    /// An fp32 vector written by the library.
    pub(crate) fn f32s_mut(data: &'a mut [f32], name: &str) -> Result<Desc<'a>> {
        Self::vector(data.as_mut_ptr().cast(), Dtype::F32.dl(), data.len(), name)
    }

    /// An int64 vector read by the library.
    pub(crate) fn i64s(data: &'a [i64], name: &str) -> Result<Desc<'a>> {
        let dtype = DLDataType { code: sys::kDLInt as u8, bits: 64, lanes: 1 };
        Self::vector(data.as_ptr() as *mut c_void, dtype, data.len(), name)
    }

    /// A vector of any [`Element`] read by the library.
    pub(crate) fn elements<T: Element>(data: &'a [T], name: &str) -> Result<Desc<'a>> {
        Self::vector(data.as_ptr() as *mut c_void, T::DTYPE, data.len(), name)
    }

    /// A vector of any [`Element`] written by the library.
    pub(crate) fn elements_mut<T: Element>(data: &'a mut [T], name: &str) -> Result<Desc<'a>> {
        Self::vector(data.as_mut_ptr().cast(), T::DTYPE, data.len(), name)
    }

    /// One fp32 element (shape (1,)), read or written.
    pub(crate) fn scalar(value: &'a mut f32) -> Desc<'a> {
        let data = (value as *mut f32).cast();
        Desc { data, device: CPU, dtype: Dtype::F32.dl(), ndim: 1, shape: [1, 0], _borrow: PhantomData }
    }

    /// The DLTensor view; valid while this `Desc` is neither moved nor
    /// dropped, which the borrow enforces.
    pub(crate) fn dl(&mut self) -> Dl<'_> {
        Dl {
            tensor: DLTensor {
                data: self.data,
                device: self.device,
                ndim: self.ndim,
                dtype: self.dtype,
                shape: self.shape.as_mut_ptr(),
                strides: ptr::null_mut(), // compact row-major
                byte_offset: 0,
            },
            _desc: PhantomData,
        }
    }
}

/// A `DLTensor` pointing into a [`Desc`] it borrows.
pub(crate) struct Dl<'d> {
    tensor: DLTensor,
    _desc: PhantomData<&'d mut ()>,
}

impl Dl<'_> {
    pub(crate) fn ptr(&self) -> *const DLTensor {
        &self.tensor
    }

    pub(crate) fn mut_ptr(&mut self) -> *mut DLTensor {
        &mut self.tensor
    }
}

/// `ptr()` of an optional tensor, NULL for `None`.
pub(crate) fn opt_ptr(t: &Option<Dl<'_>>) -> *const DLTensor {
    t.as_ref().map_or(ptr::null(), Dl::ptr)
}

/// `mut_ptr()` of an optional tensor, NULL for `None`.
pub(crate) fn opt_mut_ptr(t: &mut Option<Dl<'_>>) -> *mut DLTensor {
    t.as_mut().map_or(ptr::null_mut(), Dl::mut_ptr)
}
