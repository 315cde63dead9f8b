//! Loss, saved log-sum-exp vectors and gradients against the f64 reference
//! of tests/common, for both losses, all three input dtypes, 16-bit
//! gradients, shapes including 1 and primes, several tilings and threads.

mod common;

use common::{
    assert_close, backward_tolerance, forward_tolerance, grad_out, reference, widen, widen16, Input, Problem, Rng,
};
use flatmem::{Contrastive, Dtype, Features, FeaturesMut, GradientsMut, Loss, Options};

#[derive(Clone, Copy)]
struct Case {
    loss: Loss,
    b: usize,
    c: usize,
    d: usize,
    dtype: Dtype,
    grad: Dtype,
    labels: bool,
    scale: f32,
    dloss: f32,
    tiles: (usize, usize),
    threads: usize,
    seed: u64,
}

fn case(loss: Loss, b: usize, c: usize, d: usize) -> Case {
    Case {
        loss,
        b,
        c,
        d,
        dtype: Dtype::F32,
        grad: Dtype::F32,
        labels: false,
        scale: 14.3,
        dloss: 1.0,
        tiles: (0, 0),
        threads: 2,
        seed: (b * 1_000_003 + c * 1009 + d) as u64,
    }
}

fn run(cs: Case) {
    let what = format!(
        "{:?} b={} c={} d={} {:?}->{:?} labels={} s={} g={} tiles={:?} threads={}",
        cs.loss, cs.b, cs.c, cs.d, cs.dtype, cs.grad, cs.labels, cs.scale, cs.dloss, cs.tiles, cs.threads
    );
    let (b, c, d) = (cs.b, cs.c, cs.d);
    let mut rng = Rng::new(cs.seed);
    let (qv, kv) = rng.batch(b, c, d);
    let labels: Option<Vec<i64>> = if cs.labels { Some((0..b).map(|_| rng.below(c) as i64).collect()) } else { None };

    let q = Input::new(&qv, cs.dtype, b, d);
    let k = Input::new(&kv, cs.dtype, c, d);
    let problem = Problem {
        symmetric: cs.loss == Loss::Symmetric,
        b,
        c,
        d,
        q: widen(&q.f32s),
        k: widen(&k.f32s),
        labels: labels.clone(),
        scale: cs.scale as f64,
        dloss: cs.dloss as f64,
    };
    let want = reference(&problem);
    let ft = forward_tolerance(&problem, &want);

    let mut h: Contrastive =
        Options::new().loss(cs.loss).threads(cs.threads).tiles(cs.tiles.0, cs.tiles.1).build().expect(&what);
    let labels = labels.as_deref();
    let out = h.forward(q.features(), k.features(), labels, cs.scale).unwrap_or_else(|e| panic!("{}: {}", what, e));
    assert_close(&format!("{}: loss", what), &[out.loss as f64], &[want.loss], &[ft.loss]);
    assert_close(&format!("{}: row_lse", what), &widen(&out.row_lse), &want.row_lse, &ft.row_lse);
    match (&out.col_lse, cs.loss) {
        (Some(col), Loss::Symmetric) => {
            assert_close(&format!("{}: col_lse", what), &widen(col), &want.col_lse, &ft.col_lse)
        }
        (None, Loss::InfoNce) => {}
        (col, loss) => panic!("{}: col_lse {:?} for {:?}", what, col.is_some(), loss),
    }
    let fwd_ws = h.forward_workspace_size(&q.features(), &k.features()).unwrap();
    assert!(h.workspace_bytes() >= fwd_ws, "{}: workspace {} < query {}", what, h.workspace_bytes(), fwd_ws);

    let bt = backward_tolerance(&problem, &want, &ft, cs.grad);
    let (dq, dk, ds) = if cs.grad == Dtype::F32 {
        let g = h
            .backward(q.features(), k.features(), labels, cs.scale, &out, cs.dloss)
            .unwrap_or_else(|e| panic!("{}: {}", what, e));
        (widen(&g.dq), widen(&g.dk), g.dlogit_scale as f64)
    } else {
        let (mut dq, mut dk, mut ds) = (vec![0u16; b * d], vec![0u16; c * d], 0.0f32);
        let grads = GradientsMut {
            dq: Some(grad_out(cs.grad, &mut dq, b, d)),
            dk: Some(grad_out(cs.grad, &mut dk, c, d)),
            dlogit_scale: Some(&mut ds),
        };
        h.backward_into(q.features(), k.features(), labels, cs.scale, out.saved(), cs.dloss, grads)
            .unwrap_or_else(|e| panic!("{}: {}", what, e));
        (widen16(&dq, cs.grad), widen16(&dk, cs.grad), ds as f64)
    };
    assert_close(&format!("{}: dq", what), &dq, &want.dq, &bt.dq);
    assert_close(&format!("{}: dk", what), &dk, &want.dk, &bt.dk);
    assert_close(&format!("{}: dlogit_scale", what), &[ds], &[want.ds], &[bt.ds]);
    let grad_dtype = Some(cs.grad);
    let bwd_ws = h.backward_workspace_size(&q.features(), &k.features(), grad_dtype, grad_dtype).unwrap();
    assert!(h.workspace_bytes() >= bwd_ws.max(fwd_ws), "{}: workspace below the backward query", what);
}

/// Shapes with 1 and primes; small tiles so that several tiles (and ragged
/// last ones) are walked.
const SHAPES: [(usize, usize); 8] = [(1, 1), (1, 7), (2, 3), (3, 1), (5, 13), (13, 31), (31, 17), (67, 5)];

#[test]
fn symmetric_fp32() {
    for &(b, d) in &SHAPES {
        run(case(Loss::Symmetric, b, b, d));
        run(Case { tiles: (4, 3), threads: 3, ..case(Loss::Symmetric, b, b, d) });
    }
}

#[test]
fn infonce_fp32_with_labels() {
    for &(b, c, d) in &[(1, 1, 1), (1, 5, 3), (3, 7, 5), (7, 7, 13), (13, 37, 8), (17, 17, 1), (29, 61, 7)] {
        run(Case { labels: true, ..case(Loss::InfoNce, b, c, d) });
        run(Case { labels: true, tiles: (2, 5), threads: 4, ..case(Loss::InfoNce, b, c, d) });
    }
}

#[test]
fn infonce_fp32_default_labels() {
    // y_i = i, with extra negative columns (c > b) and without (c = b)
    for &(b, c, d) in &[(1, 1, 2), (3, 3, 5), (5, 11, 7), (23, 41, 3)] {
        run(case(Loss::InfoNce, b, c, d));
        run(Case { tiles: (3, 7), threads: 1, ..case(Loss::InfoNce, b, c, d) });
    }
}

#[test]
fn half_precision_inputs_and_gradients() {
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for grad in [Dtype::F32, dtype] {
            run(Case { dtype, grad, ..case(Loss::Symmetric, 13, 13, 11) });
            run(Case { dtype, grad, labels: true, tiles: (4, 4), ..case(Loss::InfoNce, 7, 19, 5) });
            run(Case { dtype, grad, ..case(Loss::Symmetric, 1, 1, 3) });
        }
    }
}

#[test]
fn scale_and_upstream_gradient() {
    // s = 100 (max-shifted LSE), tiny s, and g != 1 (gradients scale by g).
    run(Case { scale: 100.0, ..case(Loss::Symmetric, 17, 17, 9) });
    run(Case { scale: 0.01, ..case(Loss::Symmetric, 17, 17, 9) });
    run(Case { dloss: -0.37, ..case(Loss::Symmetric, 11, 11, 4) });
    run(Case { dloss: 2.5, labels: true, scale: 50.0, ..case(Loss::InfoNce, 11, 23, 6) });
}

#[test]
fn results_do_not_depend_on_threads() {
    let mut rng = Rng::new(7);
    let (b, d) = (37, 19);
    let q = rng.unit_rows(b, d);
    let k = rng.noisy_copy(&q, d, 0.3);
    let run_with = |threads: usize| {
        let mut h = Options::new().threads(threads).tiles(5, 8).build().unwrap();
        let (qf, kf) = (Features::f32(&q, b, d), Features::f32(&k, b, d));
        let out = h.forward(qf, kf, None, 20.0).unwrap();
        let g = h.backward(qf, kf, None, 20.0, &out, 1.0).unwrap();
        (out, g)
    };
    let one = run_with(1);
    for threads in [2, 3, 8] {
        assert_eq!(run_with(threads), one, "threads = {} vs 1: not bitwise identical", threads);
    }
}

#[test]
fn into_variants_and_skipped_outputs() {
    let mut rng = Rng::new(11);
    let (b, c, d) = (6, 9, 4);
    let q = rng.unit_rows(b, d);
    let k = rng.unit_rows(c, d);
    let labels: Vec<i64> = vec![8, 0, 3, 3, 1, 7];
    let (qf, kf) = (Features::f32(&q, b, d), Features::f32(&k, c, d));
    let mut h = Options::new().loss(Loss::InfoNce).build().unwrap();
    let full = h.forward(qf, kf, Some(&labels), 5.0).unwrap();
    let grads = h.backward(qf, kf, Some(&labels), 5.0, &full, 1.0).unwrap();

    // forward_into writes the same into caller slices (prefilled with NaN).
    let mut row_lse = vec![f32::NAN; b];
    let loss = h.forward_into(qf, kf, Some(&labels), 5.0, &mut row_lse, None).unwrap();
    assert_eq!((loss, &row_lse), (full.loss, &full.row_lse));

    // Only dk requested; dq and ds skipped.
    let mut dk = vec![f32::NAN; c * d];
    let out = GradientsMut { dk: Some(FeaturesMut::f32(&mut dk, c, d)), ..GradientsMut::default() };
    h.backward_into(qf, kf, Some(&labels), 5.0, full.saved(), 1.0, out).unwrap();
    assert_eq!(dk, grads.dk);

    // Only ds.
    let mut ds = f32::NAN;
    let out = GradientsMut { dlogit_scale: Some(&mut ds), ..GradientsMut::default() };
    h.backward_into(qf, kf, Some(&labels), 5.0, &full, 1.0, out).unwrap();
    assert_eq!(ds, grads.dlogit_scale);

    // The workspace can be released and comes back on the next call.
    assert!(h.workspace_bytes() > 0);
    h.release_workspace();
    assert_eq!(h.workspace_bytes(), 0);
    assert_eq!(h.forward(qf, kf, Some(&labels), 5.0).unwrap(), full);
}

#[test]
fn handle_moves_to_another_thread() {
    let mut h = Options::new().threads(2).build().unwrap();
    let (q, k) = (vec![0.6f32, 0.8, 1.0, 0.0], vec![0.8f32, 0.6, 0.0, 1.0]);
    let here = h.forward(Features::f32(&q, 2, 2), Features::f32(&k, 2, 2), None, 3.0).unwrap();
    let there = std::thread::spawn(move || {
        let out = h.forward(Features::f32(&q, 2, 2), Features::f32(&k, 2, 2), None, 3.0).unwrap();
        drop(h);
        out
    })
    .join()
    .unwrap();
    assert_eq!(here, there);
}
