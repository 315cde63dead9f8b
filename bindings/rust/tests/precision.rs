//! `Options::precision` (`options.fp32_precision`, `flatmem_fp32_precision`):
//! the C value each variant sets, handles of every precision for both softmax
//! losses and the sigmoid loss, bitwise the default's results where the CPU
//! has no bf16 products (the baseline level: no effect there), and `RoundOnce` on
//! bf16 features within the bf16-gradient bound of flatmem.h's "bf16
//! products on the CPU" at the process's own level (G rounded once to bf16
//! at avx512bf16 and amx).

mod common;

use common::{assert_close, backward_tolerance, forward_tolerance, reference, widen, Input, Problem, Rng, SLACK};
use flatmem::{set_cpu_isa, sys, Contrastive, CpuIsa, Dtype, Fp32Precision, Loss, Options, SigmoidLoss};

const ALL: [Fp32Precision; 3] = [Fp32Precision::Default, Fp32Precision::RoundOnce, Fp32Precision::Full];

#[test]
fn each_variant_sets_its_c_value_and_nothing_else() {
    assert_eq!(Fp32Precision::default(), Fp32Precision::Default);
    assert_eq!(Fp32Precision::Default.to_raw(), sys::FLATMEM_FP32_PRECISION_DEFAULT);
    assert_eq!(Fp32Precision::RoundOnce.to_raw(), sys::FLATMEM_FP32_PRECISION_ROUND_ONCE);
    assert_eq!(Fp32Precision::Tf32, Fp32Precision::RoundOnce);
    assert_eq!(Fp32Precision::Tf32.to_raw(), sys::FLATMEM_FP32_PRECISION_TF32);
    assert_eq!(Fp32Precision::Full.to_raw(), sys::FLATMEM_FP32_PRECISION_FULL);
    let base = Options::new().loss(Loss::InfoNce).threads(2).tiles(7, 5).logit_cache_bytes(64);
    let built = base.to_raw().unwrap();
    assert_eq!(built.fp32_precision, 0);
    assert_eq!(base.precision(Fp32Precision::Default), base);
    for (p, want) in [(Fp32Precision::Default, 0i64), (Fp32Precision::RoundOnce, 1), (Fp32Precision::Full, 2)] {
        let raw = base.precision(p).to_raw().unwrap();
        assert_eq!(raw, sys::flatmem_contrastive_options { fp32_precision: want, ..built }, "{:?}", p);
    }
    // the last call wins, as for the other setters
    let raw = base.precision(Fp32Precision::RoundOnce).precision(Fp32Precision::Full).to_raw().unwrap();
    assert_eq!(raw.fp32_precision, 2);
}

struct Run {
    loss: f32,
    row_lse: Vec<f32>,
    col_lse: Option<Vec<f32>>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    ds: f32,
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn softmax(loss: Loss, precision: Fp32Precision, q: &Input, k: &Input, labels: Option<&[i64]>, s: f32) -> Run {
    let mut h: Contrastive =
        Options::new().loss(loss).threads(2).tiles(4, 3).precision(precision).build().expect("create");
    let out = h.forward(q.features(), k.features(), labels, s).expect("forward");
    let g = h.backward(q.features(), k.features(), labels, s, &out, 0.5).expect("backward");
    Run { loss: out.loss, row_lse: out.row_lse, col_lse: out.col_lse, dq: g.dq, dk: g.dk, ds: g.dlogit_scale }
}

fn assert_same(what: &str, a: &Run, b: &Run) {
    assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "{}: loss", what);
    assert_eq!(bits(&a.row_lse), bits(&b.row_lse), "{}: row_lse", what);
    assert_eq!(a.col_lse.as_deref().map(bits), b.col_lse.as_deref().map(bits), "{}: col_lse", what);
    assert_eq!(bits(&a.dq), bits(&b.dq), "{}: dq", what);
    assert_eq!(bits(&a.dk), bits(&b.dk), "{}: dk", what);
    assert_eq!(a.ds.to_bits(), b.ds.to_bits(), "{}: ds", what);
}

/// The baseline level has no bf16 products: every precision gives the
/// default's bits, for fp32 and bf16 features, softmax and sigmoid losses.
/// (The only test here that moves the process's ISA level; the others hold
/// at any level.)
#[test]
fn no_effect_without_bf16_products() {
    set_cpu_isa(Some(CpuIsa::Baseline)).unwrap();
    let mut rng = Rng::new(17);
    let (b, c, d) = (11, 13, 21);
    let (qv, kv) = rng.batch(b, c, d);
    let labels: Vec<i64> = (0..b).map(|i| ((i * 5) % c) as i64).collect();
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let q = Input::new(&qv, dtype, b, d);
        let k = Input::new(&kv, dtype, c, d);
        let k_sym = Input::new(&kv[..b * d], dtype, b, d);
        let want_sym = softmax(Loss::Symmetric, Fp32Precision::Default, &q, &k_sym, None, 12.0);
        let want_nce = softmax(Loss::InfoNce, Fp32Precision::Default, &q, &k, Some(&labels), 12.0);
        let sigmoid = |p: Fp32Precision| {
            let mut h = SigmoidLoss::new(&Options::new().threads(2).tiles(4, 3).precision(p)).unwrap();
            h.value_and_grad(q.features(), k.features(), None, 12.0, -2.0).unwrap()
        };
        let want_sig = sigmoid(Fp32Precision::Default);
        for p in ALL {
            let what = format!("{:?} {:?}", dtype, p);
            assert_same(&what, &softmax(Loss::Symmetric, p, &q, &k_sym, None, 12.0), &want_sym);
            assert_same(&what, &softmax(Loss::InfoNce, p, &q, &k, Some(&labels), 12.0), &want_nce);
            let got = sigmoid(p);
            assert_eq!(got.loss.to_bits(), want_sig.loss.to_bits(), "{}: sigmoid loss", what);
            assert_eq!(bits(&got.grads.dq), bits(&want_sig.grads.dq), "{}: sigmoid dq", what);
            assert_eq!(bits(&got.grads.dk), bits(&want_sig.grads.dk), "{}: sigmoid dk", what);
            assert_eq!(got.grads.dlogit_scale.to_bits(), want_sig.grads.dlogit_scale.to_bits(), "{}", what);
            assert_eq!(got.grads.dlogit_bias.to_bits(), want_sig.grads.dlogit_bias.to_bits(), "{}", what);
        }
    }
    set_cpu_isa(None).unwrap();
}

/// RoundOnce on bf16 features against the f64 reference: the loss and log-sum-exps
/// keep their fp32 bounds, ds too (formed from fp32 G), and dq / dk stay
/// within the fp32 bound plus flatmem.h's 2^-8 s sum |G| |k| (|G|^T |q|) for
/// G rounded once to bf16 (the reference's weighted sums bound |G|).
#[test]
fn tf32_on_bf16_within_the_bf16_gradient_bound() {
    for (loss, b, c, d) in [(Loss::Symmetric, 61, 61, 80), (Loss::InfoNce, 47, 71, 96)] {
        let mut rng = Rng::new(b as u64 * 31 + d as u64);
        let (qv, kv) = rng.batch(b, c, d);
        let labels: Option<Vec<i64>> =
            if loss == Loss::InfoNce { Some((0..b).map(|_| rng.below(c) as i64).collect()) } else { None };
        let q = Input::new(&qv, Dtype::Bf16, b, d);
        let k = Input::new(&kv, Dtype::Bf16, c, d);
        let (s, g) = (12.0f32, 0.5f32);
        let problem = Problem {
            symmetric: loss == Loss::Symmetric,
            b,
            c,
            d,
            q: widen(&q.f32s),
            k: widen(&k.f32s),
            labels: labels.clone(),
            scale: s as f64,
            dloss: g as f64,
        };
        let want = reference(&problem);
        let ft = forward_tolerance(&problem, &want);
        let bt = backward_tolerance(&problem, &want, &ft, Dtype::F32);
        let got = softmax(loss, Fp32Precision::RoundOnce, &q, &k, labels.as_deref(), s);
        let what = format!("{:?} tf32 bf16", loss);
        assert_close(&format!("{}: loss", what), &[got.loss as f64], &[want.loss], &[ft.loss]);
        assert_close(&format!("{}: row_lse", what), &widen(&got.row_lse), &want.row_lse, &ft.row_lse);
        let extra = 2.0f64.powi(-8) * SLACK;
        let tol_dq: Vec<f64> = bt.dq.iter().zip(&want.dq_weighted).map(|(t, w)| t + extra * w).collect();
        let tol_dk: Vec<f64> = bt.dk.iter().zip(&want.dk_weighted).map(|(t, w)| t + extra * w).collect();
        assert_close(&format!("{}: dq", what), &widen(&got.dq), &want.dq, &tol_dq);
        assert_close(&format!("{}: dk", what), &widen(&got.dk), &want.dk, &tol_dk);
        assert_close(&format!("{}: ds", what), &[got.ds as f64], &[want.ds], &[bt.ds]);
    }
}
