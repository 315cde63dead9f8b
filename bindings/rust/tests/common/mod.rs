//! Test support: random features, the contrastive loss materialised in f64
//! (every formula of flatmem.h in its most literal form) and error bounds
//! for the library's fp32 arithmetic against it.
//!
//! The bounds are the worst-case first-order error analysis of the C tests
//! (tests/support/tolerance.hpp), not fitted constants: fp32 dot products
//! over d terms err by at most gamma_d = d u / (1 - d u) times the sum of
//! absolute products (u = 2^-24), log-sum-exp adds O(n u), gradients carry
//! the relative error of P = exp(x - lse) times their weights, a factor 2
//! covers second-order terms, and 16-bit outputs add half an ulp.
#![allow(dead_code)]

pub mod device;
pub mod ranks;
pub mod sigmoid;
pub mod stage_mlp;

use flatmem::half::{bf16_from_f32, bf16_to_f32, f16_from_f32, f16_to_f32};
use flatmem::{Dtype, Features, FeaturesMut};

pub const U32: f64 = 1.0 / 16_777_216.0; // 2^-24
pub const SLACK: f64 = 2.0;

pub fn gamma(n: f64) -> f64 {
    n * U32 / (1.0 - n * U32)
}

/// splitmix64: reproducible pseudo-random numbers without a crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / 9_007_199_254_740_992.0
    }

    /// Roughly standard normal (sum of 12 uniforms minus 6).
    pub fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.uniform()).sum::<f64>() - 6.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `rows x dim` features with unit-norm rows.
    pub fn unit_rows(&mut self, rows: usize, dim: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows * dim);
        for _ in 0..rows {
            let row: Vec<f64> = (0..dim).map(|_| self.normal()).collect();
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            out.extend(row.iter().map(|x| (x / norm) as f32));
        }
        out
    }

    /// A batch: `q` `(b, d)` with unit-norm rows, `k` `(c, d)` whose first
    /// `min(b, c)` rows are noisy copies of `q`'s (the diagonal positives)
    /// and the rest unrelated.
    pub fn batch(&mut self, b: usize, c: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
        let q = self.unit_rows(b, d);
        let paired = b.min(c);
        let mut k = self.noisy_copy(&q[..paired * d], d, 0.5);
        k.extend(self.unit_rows(c - paired, d));
        (q, k)
    }

    /// `base` plus noise of this size, rows renormalised: the positive
    /// partner of each row.
    pub fn noisy_copy(&mut self, base: &[f32], dim: usize, noise: f64) -> Vec<f32> {
        let mut out = Vec::with_capacity(base.len());
        for row in base.chunks(dim) {
            let r: Vec<f64> = row.iter().map(|&x| x as f64 + noise * self.normal()).collect();
            let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            out.extend(r.iter().map(|x| (x / norm) as f32));
        }
        out
    }
}

/// The problem as the library receives it (features already in their
/// dtype, widened exactly to f64).
pub struct Problem {
    pub symmetric: bool,
    pub b: usize,
    pub c: usize,
    pub d: usize,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub labels: Option<Vec<i64>>,
    pub scale: f64,
    pub dloss: f64,
}

#[derive(Default)]
pub struct Reference {
    pub loss: f64,
    pub row_lse: Vec<f64>,
    pub col_lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub ds: f64,
    // magnitudes for the error bounds (see tests/support/reference.hpp)
    pub max_abs_dot: f64,
    pub dq_weighted: Vec<f64>,
    pub dq_count: Vec<f64>,
    pub dq_abs: Vec<f64>,
    pub dk_weighted: Vec<f64>,
    pub dk_count: Vec<f64>,
    pub dk_abs: Vec<f64>,
    pub ds_weighted: f64,
    pub ds_count: f64,
    pub ds_abs: f64,
}

fn lse(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let m = values.clone().fold(f64::NEG_INFINITY, f64::max);
    m + values.map(|v| (v - m).exp()).sum::<f64>().ln()
}

pub fn reference(p: &Problem) -> Reference {
    let (b, c, d) = (p.b, p.c, p.d);
    let mut dot = vec![0.0; b * c];
    let mut abs_dot = vec![0.0; b * c];
    let mut r = Reference::default();
    for i in 0..b {
        for j in 0..c {
            let (qi, kj) = (&p.q[i * d..(i + 1) * d], &p.k[j * d..(j + 1) * d]);
            dot[i * c + j] = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
            abs_dot[i * c + j] = qi.iter().zip(kj).map(|(a, b)| (a * b).abs()).sum();
            r.max_abs_dot = r.max_abs_dot.max(abs_dot[i * c + j]);
        }
    }
    let x: Vec<f64> = dot.iter().map(|v| p.scale * v).collect();
    let positive = |i: usize| p.labels.as_ref().map_or(i, |l| l[i] as usize);
    r.row_lse = (0..b).map(|i| lse((0..c).map(|j| x[i * c + j]))).collect();
    let row_loss = (0..b).map(|i| r.row_lse[i] - x[i * c + positive(i)]).sum::<f64>() / b as f64;
    if p.symmetric {
        r.col_lse = (0..c).map(|j| lse((0..b).map(|i| x[i * c + j]))).collect();
        let col_loss = (0..c).map(|j| r.col_lse[j] - x[j * c + j]).sum::<f64>() / b as f64;
        r.loss = 0.5 * (row_loss + col_loss);
    } else {
        r.loss = row_loss;
    }

    let norm = if p.symmetric { 2.0 * b as f64 } else { b as f64 };
    let g = p.dloss;
    let unit = g.abs() / norm;
    for v in [&mut r.dq, &mut r.dq_weighted, &mut r.dq_count, &mut r.dq_abs] {
        *v = vec![0.0; b * d];
    }
    for v in [&mut r.dk, &mut r.dk_weighted, &mut r.dk_count, &mut r.dk_abs] {
        *v = vec![0.0; c * d];
    }
    for i in 0..b {
        let y = positive(i);
        for j in 0..c {
            let xij = x[i * c + j];
            let pij = (xij - r.row_lse[i]).exp();
            let qij = if p.symmetric { (xij - r.col_lse[j]).exp() } else { 0.0 };
            let hit = if j == y { 1.0 } else { 0.0 };
            let gij = if p.symmetric { g * (pij + qij - 2.0 * hit) / norm } else { g * (pij - hit) / norm };
            let wij = unit * (pij + qij + 2.0 * hit);
            for t in 0..d {
                let (qv, kv) = (p.q[i * d + t], p.k[j * d + t]);
                r.dq[i * d + t] += gij * kv;
                r.dk[j * d + t] += gij * qv;
                r.dq_weighted[i * d + t] += wij * kv.abs();
                r.dq_count[i * d + t] += unit * kv.abs();
                r.dq_abs[i * d + t] += gij.abs() * kv.abs();
                r.dk_weighted[j * d + t] += wij * qv.abs();
                r.dk_count[j * d + t] += unit * qv.abs();
                r.dk_abs[j * d + t] += gij.abs() * qv.abs();
            }
            r.ds += gij * dot[i * c + j];
            r.ds_weighted += wij * abs_dot[i * c + j];
            r.ds_count += unit * abs_dot[i * c + j];
            r.ds_abs += gij.abs() * abs_dot[i * c + j];
        }
    }
    for v in [
        &mut r.dq,
        &mut r.dk,
        &mut r.dq_weighted,
        &mut r.dq_count,
        &mut r.dq_abs,
        &mut r.dk_weighted,
        &mut r.dk_count,
        &mut r.dk_abs,
    ] {
        v.iter_mut().for_each(|e| *e *= p.scale);
    }
    r
}

pub struct ForwardTolerance {
    pub logit: f64,
    pub loss: f64,
    pub row_lse: Vec<f64>,
    pub col_lse: Vec<f64>,
    pub max_lse: f64,
}

pub fn forward_tolerance(p: &Problem, r: &Reference) -> ForwardTolerance {
    let logit = p.scale * gamma(p.d as f64 + 1.0) * r.max_abs_dot;
    let lse_tol = |n: usize, v: f64| SLACK * (logit + (2.0 * n as f64 + 8.0) * U32 + 2.0 * U32 * v.abs());
    let row_lse: Vec<f64> = r.row_lse.iter().map(|&v| lse_tol(p.c, v)).collect();
    let col_lse: Vec<f64> = r.col_lse.iter().map(|&v| lse_tol(p.b, v)).collect();
    let max_lse = row_lse.iter().chain(&col_lse).cloned().fold(0.0, f64::max);
    let loss = SLACK * (logit + (2.0 * p.b.max(p.c) as f64 + 8.0) * U32 + 2.0 * U32 * r.loss.abs());
    ForwardTolerance { logit, loss, row_lse, col_lse, max_lse }
}

/// Half an ulp of an output format (relative) and its subnormal floor.
pub fn rounding(out: Dtype) -> (f64, f64) {
    match out {
        Dtype::F32 => (0.0, 0.0),
        Dtype::Bf16 => (1.0 / 256.0, 0.0),
        Dtype::F16 => (1.0 / 2048.0, 1.0 / 33_554_432.0),
    }
}

pub struct BackwardTolerance {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub ds: f64,
}

pub fn backward_tolerance(p: &Problem, r: &Reference, f: &ForwardTolerance, out: Dtype) -> BackwardTolerance {
    let eps_g = f.logit + f.max_lse + 8.0 * U32;
    let (rel, floor) = rounding(out);
    let matrix = |weighted: &[f64], count: &[f64], abs: &[f64], value: &[f64], terms: usize| -> Vec<f64> {
        (0..value.len())
            .map(|n| {
                let fp32 =
                    SLACK * (eps_g * weighted[n] + 2.0 * U32 * count[n] + (gamma(terms as f64) + 3.0 * U32) * abs[n]);
                fp32 * (1.0 + rel) + rel * value[n].abs() + floor
            })
            .collect()
    };
    BackwardTolerance {
        dq: matrix(&r.dq_weighted, &r.dq_count, &r.dq_abs, &r.dq, p.c),
        dk: matrix(&r.dk_weighted, &r.dk_count, &r.dk_abs, &r.dk, p.b),
        ds: SLACK
            * (eps_g * r.ds_weighted
                + 2.0 * U32 * r.ds_count
                + (gamma(p.d as f64) + gamma(p.c as f64 + 1.0) + 3.0 * U32) * r.ds_abs)
            + 2.0 * U32 * r.ds.abs(),
    }
}

/// Asserts |got - want| <= tol elementwise (NaN fails), naming the worst.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: &[f64]) {
    assert_eq!(got.len(), want.len(), "{}: length", what);
    let mut worst = (0usize, -1.0f64);
    let mut failures = 0;
    for n in 0..want.len() {
        let diff = (got[n] - want[n]).abs();
        let ok = diff <= tol[n]; // false for NaN
        failures += usize::from(!ok);
        let ratio = if ok { diff / tol[n].max(f64::MIN_POSITIVE) } else { f64::INFINITY };
        if ratio > worst.1 {
            worst = (n, ratio);
        }
    }
    if failures > 0 {
        let n = worst.0;
        panic!(
            "{}: {} of {} elements outside tolerance; e.g. [{}]: got {:e}, reference {:e}, tolerance {:e}",
            what,
            failures,
            want.len(),
            n,
            got[n],
            want[n],
            tol[n]
        );
    }
}

pub fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Features in one dtype: the bits the library gets and their exact values.
pub struct Input {
    pub f32s: Vec<f32>,
    pub bits: Vec<u16>,
    pub dtype: Dtype,
    pub rows: usize,
    pub dim: usize,
}

impl Input {
    pub fn new(values: &[f32], dtype: Dtype, rows: usize, dim: usize) -> Input {
        let (bits, f32s): (Vec<u16>, Vec<f32>) = match dtype {
            Dtype::F32 => (Vec::new(), values.to_vec()),
            Dtype::Bf16 => {
                let bits: Vec<u16> = values.iter().map(|&x| bf16_from_f32(x)).collect();
                let f = bits.iter().map(|&h| bf16_to_f32(h)).collect();
                (bits, f)
            }
            Dtype::F16 => {
                let bits: Vec<u16> = values.iter().map(|&x| f16_from_f32(x)).collect();
                let f = bits.iter().map(|&h| f16_to_f32(h)).collect();
                (bits, f)
            }
        };
        Input { f32s, bits, dtype, rows, dim }
    }

    pub fn features(&self) -> Features<'_> {
        match self.dtype {
            Dtype::F32 => Features::f32(&self.f32s, self.rows, self.dim),
            Dtype::Bf16 => Features::bf16(&self.bits, self.rows, self.dim),
            Dtype::F16 => Features::f16(&self.bits, self.rows, self.dim),
        }
    }
}

/// 16-bit outputs widened exactly.
pub fn widen16(bits: &[u16], dtype: Dtype) -> Vec<f64> {
    match dtype {
        Dtype::Bf16 => bits.iter().map(|&h| bf16_to_f32(h) as f64).collect(),
        Dtype::F16 => bits.iter().map(|&h| f16_to_f32(h) as f64).collect(),
        Dtype::F32 => unreachable!(),
    }
}

/// A 16-bit gradient output over `data`.
pub fn grad_out(dtype: Dtype, data: &mut [u16], rows: usize, dim: usize) -> FeaturesMut<'_> {
    match dtype {
        Dtype::Bf16 => FeaturesMut::bf16(data, rows, dim),
        Dtype::F16 => FeaturesMut::f16(data, rows, dim),
        Dtype::F32 => unreachable!(),
    }
}

/// Rows (or columns) of the shards before rank `rank`'s: where its shard
/// starts in the global batch.
pub fn prefix(counts: &[usize], rank: usize) -> usize {
    counts[..rank].iter().sum()
}

/// Global labels of a batch cut into shards (`rows[r]` rows and `cols[r]`
/// columns on rank r): row g of rank r gets a column of rank r + 1's shard
/// (mod n), so that with several ranks every positive lives on another rank.
pub fn labels_on_next_rank(rng: &mut Rng, rows: &[usize], cols: &[usize]) -> Vec<i64> {
    let n = rows.len();
    let owner = |g: usize| (0..n).find(|&r| g < prefix(rows, r + 1)).unwrap();
    (0..rows.iter().sum::<usize>())
        .map(|g| {
            let next = (owner(g) + 1) % n;
            (prefix(cols, next) + (g + rng.below(7)) % cols[next]) as i64
        })
        .collect()
}
