//! The instruction set of the CPU kernels (`flatmem_cpu_isa_*`).
//!
//! The CPU backend's kernels (the matrix products, the exponentials and
//! reductions of the contrastive loss, the built-in blocks' LayerNorm,
//! softmax and GELU) are compiled once per instruction set, and one of them
//! runs for the whole process: by default the best this processor supports,
//! capped by the environment variable `FLATMEM_CPU_ISA` (`amx`,
//! `avx512bf16`, `avx512`, `avx2`, `baseline`, any case; empty or `auto` =
//! the best) when the process first asks, unless [`set_cpu_isa`] chose one
//! since. The matrix products are flatmem's own kernels for that level, no
//! BLAS's. `avx512bf16` adds the contrastive tile products of bf16 inputs on
//! `vdpbf16ps`, `amx` on AMX tiles (bf16 products, fp32 accumulation); below
//! them bf16 inputs are widened to fp32. [`cpu_engine`] names the kernels.
//!
//! Results are bitwise reproducible for one instruction set; different ones
//! round differently, within the error bounds of each function. Select the
//! instruction set before computing when the bits matter: a call already
//! running may finish with the previous one.

use std::ffi::CStr;
use std::fmt;

use crate::error::{check, Error, Result, Status};
use crate::sys;

/// An instruction set of the CPU kernels, ordered from the least to the
/// most capable (`Baseline < Avx2 < Avx512 < Avx512Bf16 < Amx`), so that `isa <= best`
/// says whether this processor can run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuIsa {
    /// Any x86-64 (SSE2), and the only one on other processors.
    Baseline,
    /// x86-64-v3: AVX2 with FMA (BMI1/2, F16C).
    Avx2,
    /// x86-64-v4: AVX-512 F, BW, DQ and VL, 512-bit vectors.
    Avx512,
    /// `Avx512` plus AVX512_BF16 (Cooper Lake, Sapphire Rapids and later
    /// Xeons; AMD Zen 4 and later): the element-wise kernels of `Avx512`,
    /// and the contrastive tile products of bf16 inputs on `vdpbf16ps` (bf16
    /// products, fp32 accumulation) instead of widening them to fp32.
    Avx512Bf16,
    /// `Avx512Bf16` plus AMX-TILE and AMX-BF16 (Sapphire Rapids, Emerald
    /// Rapids, Granite Rapids Xeons), with the OS's tile state enabled and
    /// the process's permission for it (the library asks Linux once): the
    /// contrastive tile products of bf16 inputs on AMX tiles (bf16 products,
    /// fp32 sums, the numerics of `Avx512Bf16`); everything else as
    /// `Avx512Bf16`.
    Amx,
}

impl CpuIsa {
    /// Every instruction set, least capable first.
    pub const ALL: [CpuIsa; 5] = [CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx];

    /// The raw `flatmem_cpu_isa` value.
    pub fn raw(self) -> sys::flatmem_cpu_isa {
        match self {
            CpuIsa::Baseline => sys::FLATMEM_CPU_ISA_BASELINE,
            CpuIsa::Avx2 => sys::FLATMEM_CPU_ISA_AVX2,
            CpuIsa::Avx512 => sys::FLATMEM_CPU_ISA_AVX512,
            CpuIsa::Avx512Bf16 => sys::FLATMEM_CPU_ISA_AVX512BF16,
            CpuIsa::Amx => sys::FLATMEM_CPU_ISA_AMX,
        }
    }

    /// The instruction set of a raw value the library returned; an
    /// `Unsupported` error for a value this crate does not know.
    fn from_raw(raw: sys::flatmem_cpu_isa, what: &str) -> Result<CpuIsa> {
        CpuIsa::ALL.iter().copied().find(|isa| isa.raw() == raw).ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                format!(
                    "flatmem_cpu_isa_get: *{} = {} ({:?}), an instruction set this crate does not know",
                    what,
                    raw,
                    raw_name(raw)
                ),
            )
        })
    }

    /// The library's name for it (`flatmem_cpu_isa_name`): `"baseline"`,
    /// `"avx2"`, `"avx512"`, `"avx512bf16"` or `"amx"`, the words
    /// `FLATMEM_CPU_ISA` accepts.
    pub fn name(self) -> &'static str {
        raw_name(self.raw())
    }
}

impl fmt::Display for CpuIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn raw_name(raw: sys::flatmem_cpu_isa) -> &'static str {
    // SAFETY: flatmem_cpu_isa_name returns a static NUL-terminated string for
    // every value, known or not.
    unsafe { CStr::from_ptr(sys::flatmem_cpu_isa_name(raw)) }.to_str().unwrap_or("unknown")
}

/// The kernels behind the CPU products at `isa` (`None`: the instruction set
/// in use now), in words (`flatmem_cpu_isa_engine`): library, version and
/// the kernel for each input dtype, e.g. `"flatmem 0.2.0 own kernels at amx:
/// fp32 ...; bf16 AMX tiles ...; fp16 widened to fp32"`. An instruction set
/// above the best is described too (what would run there). For logs and
/// benchmark rows; the text is not a stable format.
pub fn cpu_engine(isa: Option<CpuIsa>) -> &'static str {
    let raw = isa.map_or(sys::FLATMEM_CPU_ISA_DEFAULT, CpuIsa::raw);
    // SAFETY: flatmem_cpu_isa_engine returns a static NUL-terminated string
    // for every value ("unknown" for a non-value); thread-safe.
    unsafe { CStr::from_ptr(sys::flatmem_cpu_isa_engine(raw)) }.to_str().unwrap_or("unknown")
}

/// `(in_use, best)`: the instruction set the kernels run with now, and the
/// best this processor supports among those compiled in
/// (`flatmem_cpu_isa_get`). Fails when `FLATMEM_CPU_ISA` is malformed
/// (`InvalidArgument`) or asks for more than `best` (`Unsupported`), the
/// message naming the variable, unless [`set_cpu_isa`] chose one since.
pub fn cpu_isa() -> Result<(CpuIsa, CpuIsa)> {
    let (mut in_use, mut best) = (sys::FLATMEM_CPU_ISA_DEFAULT, sys::FLATMEM_CPU_ISA_DEFAULT);
    // SAFETY: two valid out-pointers; thread-safe.
    check(unsafe { sys::flatmem_cpu_isa_get(&mut in_use, &mut best) })?;
    Ok((CpuIsa::from_raw(in_use, "in_use")?, CpuIsa::from_raw(best, "best")?))
}

/// Selects the instruction set for the whole process
/// (`flatmem_cpu_isa_set`); `None` goes back to the default (the
/// environment's choice, else the best). An instruction set above the best
/// this processor supports is refused with `Unsupported`, and nothing
/// changes.
pub fn set_cpu_isa(isa: Option<CpuIsa>) -> Result<()> {
    let raw = isa.map_or(sys::FLATMEM_CPU_ISA_DEFAULT, CpuIsa::raw);
    // SAFETY: a plain value; thread-safe.
    check(unsafe { sys::flatmem_cpu_isa_set(raw) })
}
