//! The sigmoid (SigLIP) loss (SigmoidLoss) against the f64 reference of
//! tests/common/sigmoid.rs with its derived bounds: value_and_grad, forward
//! and backward (upstream gradient g) over shapes with 1 and primes, c > b
//! and c < b with labels, c > b without, s = 100 with t = -10, bf16 / fp16
//! inputs with fp32 and 16-bit gradients, several tilings and threads; ds and
//! dt also by central finite differences of the library's own loss;
//! backward(g) exactly g times value_and_grad for a power-of-two g; outputs
//! skipped; bitwise the same across thread counts.

mod common;

use common::sigmoid::{sigmoid_reference, sigmoid_tolerance, SigmoidProblem, SigmoidReference, SigmoidTolerance};
use common::{assert_close, grad_out, widen, widen16, Input, Rng};
use flatmem::{Dtype, Features, FeaturesMut, Options, SigmoidGradients, SigmoidGradientsMut, SigmoidLoss};

#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    c: usize,
    d: usize,
    dtype: Dtype,
    grad: Dtype,
    labels: bool,
    scale: f32,
    bias: f32,
    dloss: f32,
    tiles: (usize, usize),
    threads: usize,
    seed: u64,
}

fn case(b: usize, c: usize, d: usize) -> Case {
    Case {
        b,
        c,
        d,
        dtype: Dtype::F32,
        grad: Dtype::F32,
        labels: false,
        scale: 10.0,
        bias: -10.0,
        dloss: 0.75,
        tiles: (0, 0),
        threads: 2,
        seed: (b * 1_000_003 + c * 1009 + d) as u64,
    }
}

/// A case's inputs as the library gets them and the problem the reference
/// solves (for an upstream gradient g).
struct Setup {
    q: Input,
    k: Input,
    labels: Option<Vec<i64>>,
}

impl Setup {
    fn new(cs: &Case) -> Setup {
        let mut rng = Rng::new(cs.seed);
        let (qv, kv) = rng.batch(cs.b, cs.c, cs.d);
        let labels = if cs.labels { Some((0..cs.b).map(|_| rng.below(cs.c) as i64).collect()) } else { None };
        Setup { q: Input::new(&qv, cs.dtype, cs.b, cs.d), k: Input::new(&kv, cs.dtype, cs.c, cs.d), labels }
    }

    fn problem(&self, cs: &Case, scale: f32, bias: f32, dloss: f32) -> SigmoidProblem {
        SigmoidProblem {
            b: cs.b,
            c: cs.c,
            d: cs.d,
            q: widen(&self.q.f32s),
            k: widen(&self.k.f32s),
            labels: self.labels.clone(),
            scale: scale as f64,
            bias: bias as f64,
            dloss: dloss as f64,
        }
    }

    /// The reference and its bounds for g.
    fn expect(&self, cs: &Case, dloss: f32) -> (SigmoidReference, SigmoidTolerance) {
        let p = self.problem(cs, cs.scale, cs.bias, dloss);
        let r = sigmoid_reference(&p);
        let t = sigmoid_tolerance(&p, &r, cs.grad);
        (r, t)
    }
}

/// The gradients of one call, widened, whatever the output dtype.
struct Got {
    dq: Vec<f64>,
    dk: Vec<f64>,
    ds: f64,
    dt: f64,
}

fn check_grads(what: &str, got: &Got, want: &SigmoidReference, tol: &SigmoidTolerance) {
    assert_close(&format!("{}: dq", what), &got.dq, &want.dq, &tol.dq);
    assert_close(&format!("{}: dk", what), &got.dk, &want.dk, &tol.dk);
    assert_close(&format!("{}: dlogit_scale", what), &[got.ds], &[want.ds], &[tol.ds]);
    assert_close(&format!("{}: dlogit_bias", what), &[got.dt], &[want.dt], &[tol.dt]);
}

/// value_and_grad (Some(loss)) or backward with g (None) into gradients of
/// the case's output dtype.
fn gradients(h: &mut SigmoidLoss, cs: &Case, s: &Setup, dloss: Option<f32>) -> (Option<f32>, Got) {
    let (q, k, labels) = (s.q.features(), s.k.features(), s.labels.as_deref());
    if cs.grad == Dtype::F32 {
        return match dloss {
            None => {
                let out = h.value_and_grad(q, k, labels, cs.scale, cs.bias).unwrap();
                (Some(out.loss), got_f32(&out.grads))
            }
            Some(g) => (None, got_f32(&h.backward(q, k, labels, cs.scale, cs.bias, g).unwrap())),
        };
    }
    let (mut dq, mut dk, mut ds, mut dt) = (vec![0u16; cs.b * cs.d], vec![0u16; cs.c * cs.d], 0.0f32, 0.0f32);
    let out = SigmoidGradientsMut {
        dq: Some(grad_out(cs.grad, &mut dq, cs.b, cs.d)),
        dk: Some(grad_out(cs.grad, &mut dk, cs.c, cs.d)),
        dlogit_scale: Some(&mut ds),
        dlogit_bias: Some(&mut dt),
    };
    let loss = match dloss {
        None => Some(h.value_and_grad_into(q, k, labels, cs.scale, cs.bias, out).unwrap()),
        Some(g) => {
            h.backward_into(q, k, labels, cs.scale, cs.bias, g, out).unwrap();
            None
        }
    };
    (loss, Got { dq: widen16(&dq, cs.grad), dk: widen16(&dk, cs.grad), ds: ds as f64, dt: dt as f64 })
}

fn got_f32(g: &SigmoidGradients) -> Got {
    Got { dq: widen(&g.dq), dk: widen(&g.dk), ds: g.dlogit_scale as f64, dt: g.dlogit_bias as f64 }
}

/// value_and_grad, forward and backward(g) of one case against the
/// reference; forward's loss is the very value value_and_grad returns.
fn run(cs: Case) {
    let what = format!("{:?}", cs);
    let s = Setup::new(&cs);
    let mut h = SigmoidLoss::new(&Options::new().threads(cs.threads).tiles(cs.tiles.0, cs.tiles.1)).expect(&what);

    let (want, tol) = s.expect(&cs, 1.0);
    let (loss, got) = gradients(&mut h, &cs, &s, None);
    let loss = loss.unwrap();
    assert_close(&format!("{}: value_and_grad loss", what), &[loss as f64], &[want.loss], &[tol.loss]);
    check_grads(&format!("{}: value_and_grad", what), &got, &want, &tol);

    let forward = h.forward(s.q.features(), s.k.features(), s.labels.as_deref(), cs.scale, cs.bias).unwrap();
    assert_eq!(forward.to_bits(), loss.to_bits(), "{}: forward {} vs value_and_grad {}", what, forward, loss);

    let (want_g, tol_g) = s.expect(&cs, cs.dloss);
    let (_, got_g) = gradients(&mut h, &cs, &s, Some(cs.dloss));
    check_grads(&format!("{}: backward g={}", what, cs.dloss), &got_g, &want_g, &tol_g);

    let grad = Some(cs.grad);
    let ws = h.workspace_size(&s.q.features(), &s.k.features(), grad, grad).unwrap();
    assert!(h.workspace_bytes() >= ws, "{}: workspace {} below the query {}", what, h.workspace_bytes(), ws);
}

/// Shapes with 1 and primes (b = c, y_i = i); small tiles walk several
/// tiles and ragged last ones.
const SQUARE: [(usize, usize); 7] = [(1, 1), (1, 97), (2, 3), (5, 13), (13, 7), (31, 17), (67, 5)];

#[test]
fn fp32_diagonal_positives() {
    for &(b, d) in &SQUARE {
        run(case(b, b, d));
        run(Case { tiles: (4, 3), threads: 3, ..case(b, b, d) });
    }
}

#[test]
fn fp32_more_columns_than_rows() {
    // without labels y_i = i and the extra columns are all negatives
    for &(b, c, d) in &[(1, 2, 3), (5, 11, 7), (29, 53, 11)] {
        run(case(b, c, d));
        run(Case { tiles: (3, 7), threads: 1, ..case(b, c, d) });
    }
}

#[test]
fn fp32_with_labels() {
    // c > b, c = b and c < b (allowed with labels), positives anywhere
    for &(b, c, d) in &[(1, 1, 1), (1, 5, 3), (3, 7, 5), (7, 3, 4), (13, 37, 8), (17, 17, 1), (37, 101, 19)] {
        run(Case { labels: true, ..case(b, c, d) });
        run(Case { labels: true, tiles: (17, 5), threads: 4, ..case(b, c, d) });
    }
}

#[test]
fn large_scale_and_bias() {
    // s = 100, t = -10: |x| up to 110 (exp(-|v|) near underflow), and the
    // positive bias side.
    run(Case { scale: 100.0, bias: -10.0, tiles: (16, 24), ..case(97, 97, 7) });
    run(Case { scale: 100.0, bias: -10.0, labels: true, ..case(31, 67, 33) });
    run(Case { scale: 100.0, bias: -10.0, ..case(1, 1, 4) });
    run(Case { scale: 3.0, bias: 5.0, ..case(41, 41, 9) });
    run(Case { scale: 1.0, bias: 0.0, dloss: -2.5, ..case(2, 2, 3) });
}

#[test]
fn half_precision_inputs_and_gradients() {
    for dtype in [Dtype::Bf16, Dtype::F16] {
        for grad in [Dtype::F32, dtype] {
            run(Case { dtype, grad, ..case(13, 13, 11) });
            run(Case { dtype, grad, labels: true, tiles: (4, 4), ..case(7, 19, 5) });
            run(Case { dtype, grad, scale: 100.0, bias: -10.0, ..case(29, 29, 33) });
            run(Case { dtype, grad, ..case(1, 1, 3) });
        }
    }
}

/// `(L(p + h) - L(p - h)) / 2h` of the library's forward for the parameter
/// `which` picks (scale or bias) and its error budget: each loss within its
/// own bound of the reference, plus the truncation `h^2 / 6 max |L'''|`.
/// For the bias `|d^3 softplus / dt^3| = |sigma (1 - sigma)(1 - 2 sigma)|
/// <= 1 / (6 sqrt 3)` per term, `c` terms per row over the mean of `b` rows:
/// `|L'''| <= c / (6 sqrt 3)`; for the scale each term also carries
/// `<q_i, k_j>^3`: `|L'''| <= c A^3 / (6 sqrt 3)`.
fn central_difference(h: &mut SigmoidLoss, cs: &Case, s: &Setup, scale_step: f32, bias_step: f32) -> (f64, f64) {
    let (mut loss, mut at, mut budget) = ([0.0f64; 2], [(0.0f32, 0.0f32); 2], 0.0);
    for side in 0..2 {
        let sign = if side == 0 { -1.0 } else { 1.0 };
        let (scale, bias) = (cs.scale + sign * scale_step, cs.bias + sign * bias_step);
        at[side] = (scale, bias);
        loss[side] = h.forward(s.q.features(), s.k.features(), s.labels.as_deref(), scale, bias).unwrap() as f64;
        let p = s.problem(cs, scale, bias, 1.0);
        budget += sigmoid_tolerance(&p, &sigmoid_reference(&p), Dtype::F32).loss;
    }
    // the steps as the library saw them (the fp32 values taken)
    let width = if scale_step != 0.0 { at[1].0 - at[0].0 } else { at[1].1 - at[0].1 } as f64;
    let p = s.problem(cs, cs.scale, cs.bias, 1.0);
    let a = sigmoid_reference(&p).max_abs_dot;
    let third = cs.c as f64 / (6.0 * 3f64.sqrt()) * if scale_step != 0.0 { a.powi(3) } else { 1.0 };
    ((loss[1] - loss[0]) / width, budget / width + width * width / 24.0 * third)
}

#[test]
fn dlogit_scale_and_bias_by_finite_differences() {
    let cases = [
        case(17, 17, 6),
        Case { scale: 4.0, bias: 2.0, labels: true, ..case(13, 29, 5) },
        Case { scale: 100.0, ..case(11, 11, 4) },
    ];
    for cs in cases {
        let s = Setup::new(&cs);
        let mut h = SigmoidLoss::new(&Options::new().threads(2).tiles(8, 8)).unwrap();
        let out = h.value_and_grad(s.q.features(), s.k.features(), s.labels.as_deref(), cs.scale, cs.bias).unwrap();
        let (_, tol) = s.expect(&cs, 1.0);
        let a = sigmoid_reference(&s.problem(&cs, cs.scale, cs.bias, 1.0)).max_abs_dot;

        let check = |name: &str, got: f32, (fd, budget): (f64, f64), tol: f64| {
            let diff = (got as f64 - fd).abs();
            assert!(
                diff <= budget + tol,
                "{:?}: {} {} vs finite difference {} (budget {})",
                cs,
                name,
                got,
                fd,
                budget + tol
            );
        };
        check("dlogit_bias", out.grads.dlogit_bias, central_difference(&mut h, &cs, &s, 0.0, 1e-2), tol.dt);
        let step = (1e-2 / a.max(1.0)) as f32;
        check("dlogit_scale", out.grads.dlogit_scale, central_difference(&mut h, &cs, &s, step, 0.0), tol.ds);
    }
}

#[test]
fn backward_is_exactly_g_times_value_and_grad() {
    // g a power of two: g * G_ij is exact in fp32, so backward(g) and g times
    // the gradients of value_and_grad agree bit for bit (flatmem.h: "as
    // value_and_grad without the loss, every gradient times g").
    for cs in [case(13, 13, 7), Case { labels: true, tiles: (5, 4), ..case(9, 23, 6) }] {
        let s = Setup::new(&cs);
        let (q, k, labels) = (s.q.features(), s.k.features(), s.labels.as_deref());
        let mut h = SigmoidLoss::new(&Options::new().threads(2)).unwrap();
        let vg = h.value_and_grad(q, k, labels, cs.scale, cs.bias).unwrap().grads;
        for g in [1.0f32, -2.0, 0.25] {
            let bwd = h.backward(q, k, labels, cs.scale, cs.bias, g).unwrap();
            let times = |v: &[f32]| v.iter().map(|x| x * g).collect::<Vec<f32>>();
            let want = SigmoidGradients {
                dq: times(&vg.dq),
                dk: times(&vg.dk),
                dlogit_scale: vg.dlogit_scale * g,
                dlogit_bias: vg.dlogit_bias * g,
            };
            assert_eq!(bwd, want, "{:?}: backward(g = {}) is not g times value_and_grad", cs, g);
        }
    }
}

#[test]
fn skipped_outputs_and_workspace() {
    let cs = Case { labels: true, ..case(6, 9, 4) };
    let s = Setup::new(&cs);
    let (q, k, labels) = (s.q.features(), s.k.features(), s.labels.as_deref());
    let mut h = SigmoidLoss::new(&Options::new()).unwrap();
    let full = h.value_and_grad(q, k, labels, cs.scale, cs.bias).unwrap();

    // Only dk: the same bits as the full call.
    let mut dk = vec![f32::NAN; cs.c * cs.d];
    let out = SigmoidGradientsMut { dk: Some(FeaturesMut::f32(&mut dk, cs.c, cs.d)), ..Default::default() };
    let loss = h.value_and_grad_into(q, k, labels, cs.scale, cs.bias, out).unwrap();
    assert_eq!((loss, &dk), (full.loss, &full.grads.dk));

    // Only dt, then only ds, from the backward.
    let mut dt = f32::NAN;
    let out = SigmoidGradientsMut { dlogit_bias: Some(&mut dt), ..Default::default() };
    h.backward_into(q, k, labels, cs.scale, cs.bias, 1.0, out).unwrap();
    assert_eq!(dt, full.grads.dlogit_bias);
    let mut ds = f32::NAN;
    let out = SigmoidGradientsMut { dlogit_scale: Some(&mut ds), ..Default::default() };
    h.backward_into(q, k, labels, cs.scale, cs.bias, 1.0, out).unwrap();
    assert_eq!(ds, full.grads.dlogit_scale);

    // The workspace can be released and comes back on the next call.
    assert!(h.workspace_bytes() > 0);
    h.release_workspace();
    assert_eq!(h.workspace_bytes(), 0);
    assert_eq!(h.value_and_grad(q, k, labels, cs.scale, cs.bias).unwrap(), full);
}

#[test]
fn results_do_not_depend_on_threads() {
    let mut rng = Rng::new(7);
    let (b, d) = (37, 19);
    let (q, k) = rng.batch(b, b, d);
    let run_with = |threads: usize| {
        let mut h = SigmoidLoss::new(&Options::new().threads(threads).tiles(5, 8)).unwrap();
        h.value_and_grad(Features::f32(&q, b, d), Features::f32(&k, b, d), None, 20.0, -5.0).unwrap()
    };
    let one = run_with(1);
    for threads in [2, 3, 8] {
        assert_eq!(run_with(threads), one, "threads = {} vs 1: not bitwise identical", threads);
    }
}
