//! The sigmoid (SigLIP) loss materialised in f64 and the error bounds of the
//! library's fp32 computation against it: tests/contrastive/sigmoid_reference
//! of the C tests, in Rust.
//!
//! Reference (flatmem.h, "Sigmoid (SigLIP) loss"), literally: every
//! `x_ij = s <q_i, k_j> + t`, `v_ij = -z_ij x_ij` (`z = +1` at `(i, y_i)`,
//! `-1` elsewhere), `L = (1/b) sum_ij softplus(v_ij)`,
//! `G_ij = g (-z_ij) sigmoid(v_ij) / b`, `dq = s G k`, `dk = s G^T q`,
//! `ds = sum G_ij <q_i, k_j>`, `dt = sum G_ij`, softplus and sigmoid in their
//! stable forms. It reads the values the library receives (features rounded
//! to their dtype, fp32 s, t and g).
//!
//! Bounds (u = 2^-24, gamma_n = n u / (1 - n u), first order, times SLACK =
//! 2; derived in the C header, summarised here):
//! 1. every logit is within `dx = s gamma_{d+2} A + u |t|` (A = max_ij
//!    sum_t |q_it k_jt|): the fp32 dot product, the product by s, the sum
//!    with t;
//! 2. `|L - L_ref| <= dx sum|G| + 4u c + 2u |L_ref|`: softplus' slope is
//!    sigmoid in [0, 1], each term is evaluated within 4u, the double sums
//!    are exact to far below, the final rounding adds 2u |L|;
//! 3. each `s G_ij` errs by `s |G_ij| eps_G`, `eps_G = dx + 10u` (fp32 exp,
//!    1 + e, division, g / b, products), plus `s |g| / b 2^-125` where
//!    exp(-|v|) underflows; dq sums c terms in fp32 (gamma_c), dk b terms
//!    (gamma_b); ds sums `G_ij raw_ij` in double (`(eps_G + gamma_d) |G| R`),
//!    dt `eps_G sum|G|`, each rounded to fp32 (2u allowed);
//! 4. 16-bit outputs add their rounding (`rounding` of this module's parent).
//! Worst-case bounds, not fitted constants: a wrong sign of z, a dropped
//! tile or a missing bias moves results by far more.
#![allow(dead_code)]

use flatmem::Dtype;

use super::{gamma, rounding, SLACK, U32};

pub struct SigmoidProblem {
    pub b: usize,
    pub c: usize,
    pub d: usize,
    /// `(b, d)`, `(c, d)` row-major, the exact values the library receives.
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    /// `(b,)` or `None`: `y_i = i`.
    pub labels: Option<Vec<i64>>,
    pub scale: f64,
    pub bias: f64,
    /// The upstream gradient g the gradients are multiplied by.
    pub dloss: f64,
}

#[derive(Default)]
pub struct SigmoidReference {
    pub loss: f64,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub ds: f64,
    pub dt: f64,
    // magnitudes for the bounds
    pub max_abs_dot: f64,   // A = max_ij R_ij, R_ij = sum_t |q_it k_jt|
    pub sum_abs_g: f64,     // sum_ij |G_ij|
    pub sum_abs_g_r: f64,   // sum_ij |G_ij| R_ij
    pub dq_abs: Vec<f64>,   // sum_j |G_ij| |k_jt|
    pub dq_count: Vec<f64>, // sum_j |k_jt|
    pub dk_abs: Vec<f64>,
    pub dk_count: Vec<f64>,
}

fn softplus(v: f64) -> f64 {
    v.max(0.0) + (-v.abs()).exp().ln_1p()
}

fn sigmoid(v: f64) -> f64 {
    let e = (-v.abs()).exp();
    if v >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

pub fn sigmoid_reference(p: &SigmoidProblem) -> SigmoidReference {
    let (b, c, d) = (p.b, p.c, p.d);
    let mut r = SigmoidReference {
        dq: vec![0.0; b * d],
        dq_abs: vec![0.0; b * d],
        dq_count: vec![0.0; b * d],
        dk: vec![0.0; c * d],
        dk_abs: vec![0.0; c * d],
        dk_count: vec![0.0; c * d],
        ..SigmoidReference::default()
    };
    let mut loss = 0.0;
    for i in 0..b {
        let y = p.labels.as_ref().map_or(i, |l| l[i] as usize);
        let qi = &p.q[i * d..(i + 1) * d];
        for j in 0..c {
            let kj = &p.k[j * d..(j + 1) * d];
            let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
            let mag: f64 = qi.iter().zip(kj).map(|(a, b)| (a * b).abs()).sum();
            let z = if j == y { 1.0 } else { -1.0 };
            let v = -z * (p.scale * dot + p.bias);
            loss += softplus(v);
            let g = p.dloss * -z * sigmoid(v) / b as f64;
            r.ds += g * dot;
            r.dt += g;
            r.max_abs_dot = r.max_abs_dot.max(mag);
            r.sum_abs_g += g.abs();
            r.sum_abs_g_r += g.abs() * mag;
            for t in 0..d {
                let (iq, ik) = (i * d + t, j * d + t);
                r.dq[iq] += p.scale * g * kj[t];
                r.dk[ik] += p.scale * g * qi[t];
                r.dq_abs[iq] += (g * kj[t]).abs();
                r.dk_abs[ik] += (g * qi[t]).abs();
                r.dq_count[iq] += kj[t].abs();
                r.dk_count[ik] += qi[t].abs();
            }
        }
    }
    r.loss = loss / b as f64;
    r
}

pub struct SigmoidTolerance {
    pub loss: f64,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub ds: f64,
    pub dt: f64,
}

/// The bounds of points 1-4 above; `out`: the gradient outputs' dtype.
pub fn sigmoid_tolerance(p: &SigmoidProblem, r: &SigmoidReference, out: Dtype) -> SigmoidTolerance {
    let dx = p.scale * gamma(p.d as f64 + 2.0) * r.max_abs_dot + U32 * p.bias.abs();
    let g = p.dloss.abs();
    // sum |G| for g = 1 (r holds |g| times it)
    let sum_abs_g1 = if g > 0.0 { r.sum_abs_g / g } else { p.c as f64 };
    let loss = SLACK * (dx * sum_abs_g1 + 4.0 * U32 * p.c as f64 + 2.0 * U32 * r.loss.abs());
    let eps_g = dx + 10.0 * U32;
    let underflow = g / p.b as f64 * 2f64.powi(-125);
    let (rel, floor) = rounding(out);
    let matrix = |abs: &[f64], count: &[f64], value: &[f64], terms: usize| -> Vec<f64> {
        (0..value.len())
            .map(|n| {
                let fp32 = SLACK * p.scale * ((eps_g + gamma(terms as f64)) * abs[n] + underflow * count[n]);
                fp32 * (1.0 + rel) + rel * value[n].abs() + floor
            })
            .collect()
    };
    let cells = p.b as f64 * p.c as f64;
    SigmoidTolerance {
        loss,
        dq: matrix(&r.dq_abs, &r.dq_count, &r.dq, p.c),
        dk: matrix(&r.dk_abs, &r.dk_count, &r.dk, p.b),
        ds: SLACK * ((eps_g + gamma(p.d as f64)) * r.sum_abs_g_r + underflow * cells * r.max_abs_dot)
            + 2.0 * U32 * r.ds.abs(),
        dt: SLACK * (eps_g * r.sum_abs_g + underflow * cells) + 2.0 * U32 * r.dt.abs(),
    }
}
