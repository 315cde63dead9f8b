//! Reversible segments through the safe API: Rust functions against a manual
//! f64 reference (values, input gradients, parameter gradients, residuals,
//! parallel_for), OVERLAPPED == VANILLA bitwise, built-in attention + MLP
//! blocks (rebuilt input, finite gradients, the same bits in every mode),
//! and errors (slice / shape mismatches naming the argument, failing and
//! panicking callbacks naming the block, blocks without parameters).
//!
//! Tolerances: formulas of the shape and the dtype (unit roundoff u = 2^-24
//! or 2^-53), bounding the largest error relative to the largest reference
//! entry (max_rel); the CPU instruction set (FLATMEM_CPU_ISA), the BLAS or
//! the thread count change only the order of sums, which they do not depend
//! on. FLATMEM_TEST_VERBOSE=1 (with -- --nocapture) prints error / tolerance.
//!   * Rust tanh functions (toy_tolerance), as tests/reversible/
//!     test_segment_values.cpp: one F or G adds at most (width + 8) u
//!     relative (here width 1: elementwise, computed in f64 and rounded to
//!     the state dtype, then the residual add), over the 2 depth blocks:
//!     2 depth (width + 8) u for the outputs, the rebuilt inputs and dx.
//!     The C++ toy's blocks have Jacobians of about 1.5; tanh(w x + b) with
//!     w up to 1.5 has up to 1 + w = 2.5, which carries the earlier errors
//!     further (the rebuild's most): a factor (1 + max w). Parameter
//!     gradients sum `rows` terms each carrying the states' error, relative
//!     to a sum that can cancel: (rows + width + 8) in place of (width + 8).
//!   * built-in blocks (builtin_tolerance), as tests/support/block_case.hpp:
//!     16 u sqrt(K) per fp32 block evaluation, K = max(3 width, hidden,
//!     tokens), times the evaluations a result depends on. The rebuilt
//!     input: the rebuild evaluates F and G on the forward's own bits (the
//!     blocks are deterministic), so their rounding cancels; what is left is
//!     the forward's residual add and the rebuild's subtraction, u |Y| each,
//!     carried through the blocks' Jacobians -- at most one block
//!     evaluation's 16 u sqrt(K) per block: 2 depth evaluations.
//! A real defect (a wrong sign, a missing block, a stale residual) is an
//! O(1e-1) relative error, >= 10^3 times these bounds. Where the header
//! promises the same bits (OVERLAPPED = VANILLA) the tests compare bits.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::Rng;
use flatmem::reversible::{
    block_seed, residuals_f64, residuals_f64_mut, Context, Element, Function, Mode, Part, Phase, Randomness,
};
use flatmem::{
    sys, Block, BlockMath, BlockOptions, Error, Layer, Parameters, ReversibleFunction, Segment, SegmentOptions, Status,
};

const MODES: [Mode; 4] = [Mode::Standard, Mode::Vanilla, Mode::Overlapped, Mode::Auto];

fn random<T: From<f32>>(rng: &mut Rng, n: usize, scale: f32) -> Vec<T> {
    (0..n).map(|_| T::from((rng.uniform() as f32 * 2.0 - 1.0) * scale)).collect()
}

// ---------------------------------------------------------------------------
// Elementwise tanh functions and their f64 reference
// ---------------------------------------------------------------------------

/// Conversions the generic test functions need.
trait Float: Element + Into<f64> {
    /// Unit roundoff: 2^-24 or 2^-53.
    const UNIT_ROUNDOFF: f64;
    fn of(v: f64) -> Self;
}
impl Float for f32 {
    const UNIT_ROUNDOFF: f64 = f32::EPSILON as f64 / 2.0;
    fn of(v: f64) -> f32 {
        v as f32
    }
}
impl Float for f64 {
    const UNIT_ROUNDOFF: f64 = f64::EPSILON / 2.0;
    fn of(v: f64) -> f64 {
        v
    }
}

/// `y = tanh(x w + b)` elementwise with scalar parameters; keeps t = y as
/// residuals (f64) and accumulates dL/dw, dL/db into a shared cell.
struct TanhResidual {
    w: f64,
    b: f64,
    grads: Arc<Mutex<[f64; 2]>>,
}

impl<T: Float> ReversibleFunction<T> for TanhResidual {
    fn forward(
        &mut self,
        ctx: &Context<'_>,
        x: &[T],
        y: &mut [T],
        residuals: Option<&mut [u8]>,
    ) -> flatmem::Result<()> {
        assert_eq!(ctx.part(), Part::F);
        assert_eq!(ctx.seed(), block_seed(7, ctx.block(), Part::F));
        assert_eq!(ctx.offset(), 11);
        match ctx.phase() {
            Phase::Forward => assert!(residuals.is_none()),
            Phase::Record | Phase::Rebuild => {}
            Phase::Gradient => panic!("a forward in the gradient phase"),
        }
        let mut res = residuals.map(residuals_f64_mut);
        for (i, (xi, yi)) in x.iter().zip(y.iter_mut()).enumerate() {
            let t = ((*xi).into() * self.w + self.b).tanh();
            *yi = T::of(t);
            if let Some(r) = res.as_mut() {
                r[i] = t;
            }
        }
        Ok(())
    }

    fn vjp(&mut self, ctx: &Context<'_>, x: &[T], residuals: &[u8], dy: &[T], dx: &mut [T]) -> flatmem::Result<()> {
        assert_eq!(ctx.phase(), Phase::Gradient);
        let t = residuals_f64(residuals);
        assert_eq!(t.len(), x.len());
        let (mut dw, mut db) = (0.0, 0.0);
        for i in 0..x.len() {
            let g = dy[i].into() * (1.0 - t[i] * t[i]);
            dx[i] = T::of(dx[i].into() + g * self.w);
            dw += g * x[i].into();
            db += g;
        }
        let mut grads = self.grads.lock().unwrap();
        grads[0] += dw;
        grads[1] += db;
        Ok(())
    }

    fn residual_size(&mut self, ctx: &Context<'_>) -> flatmem::Result<usize> {
        Ok(ctx.numel() * 8)
    }
}

/// The same map as closures (no residuals: the VJP recomputes tanh), the
/// forward split over the chain's threads with parallel_chunks_mut.
fn tanh_closures<'p, T: Float>(w: f64, b: f64, grads: Arc<Mutex<[f64; 2]>>) -> Function<'p, T> {
    Function::from_closures(
        move |ctx: &Context<'_>, x: &[T], y: &mut [T]| {
            assert_eq!(ctx.part(), Part::G);
            ctx.parallel_chunks_mut(y, 5, |chunk, ys| {
                for (j, yj) in ys.iter_mut().enumerate() {
                    *yj = T::of((x[chunk * 5 + j].into() * w + b).tanh());
                }
            });
            Ok(())
        },
        move |_ctx: &Context<'_>, x: &[T], dy: &[T], dx: &mut [T]| {
            let (mut dw, mut db) = (0.0, 0.0);
            for i in 0..x.len() {
                let t = (x[i].into() * w + b).tanh();
                let g = dy[i].into() * (1.0 - t * t);
                dx[i] = T::of(dx[i].into() + g * w);
                dw += g * x[i].into();
                db += g;
            }
            let mut grads = grads.lock().unwrap();
            grads[0] += dw;
            grads[1] += db;
            Ok(())
        },
    )
}

struct Reference {
    y: (Vec<f64>, Vec<f64>),
    dx: (Vec<f64>, Vec<f64>),
    /// per block: [dwF, dbF, dwG, dbG]
    dparams: Vec<[f64; 4]>,
}

/// Ordinary backprop in f64 with every block's input kept.
fn reference(params: &[[f64; 4]], x1: &[f64], x2: &[f64], dy1: &[f64], dy2: &[f64]) -> Reference {
    let n = x1.len();
    let act = |w: f64, b: f64, v: f64| (v * w + b).tanh();
    let mut inputs = Vec::new();
    let (mut a, mut c) = (x1.to_vec(), x2.to_vec());
    for p in params {
        inputs.push((a.clone(), c.clone()));
        let y1: Vec<f64> = (0..n).map(|i| a[i] + act(p[0], p[1], c[i])).collect();
        let y2: Vec<f64> = (0..n).map(|i| c[i] + act(p[2], p[3], y1[i])).collect();
        a = y1;
        c = y2;
    }
    let y = (a.clone(), c.clone());
    let (mut d1, mut d2) = (dy1.to_vec(), dy2.to_vec());
    let mut dparams = vec![[0.0; 4]; params.len()];
    for k in (0..params.len()).rev() {
        let p = params[k];
        let (xa, xc) = &inputs[k];
        let y1: Vec<f64> = (0..n).map(|i| xa[i] + act(p[0], p[1], xc[i])).collect();
        // dX1 = dY1 + J_G(Y1)^T dY2; dX2 = dY2 + J_F(X2)^T dX1
        for i in 0..n {
            let t = act(p[2], p[3], y1[i]);
            let g = d2[i] * (1.0 - t * t);
            d1[i] += g * p[2];
            dparams[k][2] += g * y1[i];
            dparams[k][3] += g;
        }
        for i in 0..n {
            let t = act(p[0], p[1], xc[i]);
            let g = d1[i] * (1.0 - t * t);
            d2[i] += g * p[0];
            dparams[k][0] += g * xc[i];
            dparams[k][1] += g;
        }
    }
    Reference { y, dx: (d1, d2), dparams }
}

type Grads = Vec<[Arc<Mutex<[f64; 2]>>; 2]>;

fn tanh_segment<'p, T: Float>(params: &[[f64; 4]], mode: Mode, threads: usize) -> (Segment<'p, T>, Grads) {
    let mut layers = Vec::new();
    let mut grads = Vec::new();
    for p in params {
        let (gf, gg) = (Arc::new(Mutex::new([0.0; 2])), Arc::new(Mutex::new([0.0; 2])));
        let f = Function::new(TanhResidual { w: p[0], b: p[1], grads: gf.clone() });
        layers.push(Layer::new(f, tanh_closures::<T>(p[2], p[3], gg.clone())));
        grads.push([gf, gg]);
    }
    let segment = Segment::new(layers, &SegmentOptions::new().mode(mode).threads(threads)).unwrap();
    (segment, grads)
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Relative bound for a segment of `depth` toy layers of `width` whose
/// functions have Lipschitz constants <= `lipschitz` (and, for a parameter
/// gradient, a sum over `rows`), states of unit roundoff u.
fn toy_tolerance(depth: usize, width: usize, rows: usize, lipschitz: f64, u: f64) -> f64 {
    2.0 * depth as f64 * (1.0 + lipschitz) * (rows + width + 8) as f64 * u
}

/// Relative bound for a result of `evaluations` chained fp32 built-in block
/// evaluations (block_case.hpp: c = 16, u = 2^-24).
fn builtin_tolerance(evaluations: usize, width: usize, hidden: usize, tokens: usize) -> f64 {
    let k = (3 * width).max(hidden).max(tokens) as f64;
    evaluations as f64 * 16.0 * (f32::EPSILON as f64 / 2.0) * k.sqrt()
}

/// Panics unless max_rel(got, want) <= tolerance; FLATMEM_TEST_VERBOSE
/// prints the ratio.
fn assert_within(what: &str, got: &[f64], want: &[f64], tolerance: f64) {
    let error = max_rel(got, want);
    if std::env::var_os("FLATMEM_TEST_VERBOSE").is_some() {
        eprintln!(
            "error/tolerance {:.3} (error {:.3e}, tolerance {:.3e}) {}",
            error / tolerance,
            error,
            tolerance,
            what
        );
    }
    assert!(error <= tolerance, "{}: relative error {:e} > tolerance {:e}", what, error, tolerance);
}

fn check_against_reference<T: Float>() {
    let shape = [3usize, 4, 5];
    let n = 60;
    let mut rng = Rng::new(42);
    let params: Vec<[f64; 4]> =
        (0..4).map(|_| [0.5 + rng.uniform(), rng.uniform() - 0.5, 0.5 + rng.uniform(), rng.uniform() - 0.5]).collect();
    let x1: Vec<T> = (0..n).map(|_| T::of(rng.uniform() * 2.0 - 1.0)).collect();
    let x2: Vec<T> = (0..n).map(|_| T::of(rng.uniform() * 2.0 - 1.0)).collect();
    let dy1: Vec<T> = (0..n).map(|_| T::of(rng.uniform() - 0.5)).collect();
    let dy2: Vec<T> = (0..n).map(|_| T::of(rng.uniform() - 0.5)).collect();
    let wide = |v: &[T]| v.iter().map(|&e| e.into()).collect::<Vec<f64>>();
    let r = reference(&params, &wide(&x1), &wide(&x2), &wide(&dy1), &wide(&dy2));
    let rng_call = Randomness::new(7, 11);
    let u = T::UNIT_ROUNDOFF;
    let lipschitz = params.iter().fold(0.0f64, |m, p| m.max(p[0].abs()).max(p[2].abs()));
    let tolerance = toy_tolerance(params.len(), 1, 0, lipschitz, u);
    let parameter_tolerance = toy_tolerance(params.len(), 1, n, lipschitz, u);
    let dtype = std::any::type_name::<T>();

    for mode in MODES {
        let (mut seg, grads) = tanh_segment::<T>(&params, mode, 3);
        let (mut y1, mut y2) = (vec![T::default(); n], vec![T::default(); n]);
        seg.forward(&shape, (&x1, &x2), (&mut y1, &mut y2), rng_call).unwrap();
        let what = |name: &str| format!("{} {:?} {}", dtype, mode, name);
        assert_within(&what("y1"), &wide(&y1), &r.y.0, tolerance);
        assert_within(&what("y2"), &wide(&y2), &r.y.1, tolerance);

        let (mut dx1, mut dx2) = (vec![T::default(); n], vec![T::default(); n]);
        let (mut rx1, mut rx2) = (vec![T::default(); n], vec![T::default(); n]);
        seg.backward(&shape, (&y1, &y2), (&dy1, &dy2), (&mut dx1, &mut dx2), Some((&mut rx1, &mut rx2)), rng_call)
            .unwrap();
        assert_within(&what("dx1"), &wide(&dx1), &r.dx.0, tolerance);
        assert_within(&what("dx2"), &wide(&dx2), &r.dx.1, tolerance);
        assert_within(&what("rebuilt x1"), &wide(&rx1), &wide(&x1), tolerance);
        assert_within(&what("rebuilt x2"), &wide(&rx2), &wide(&x2), tolerance);
        for (k, g) in grads.iter().enumerate() {
            let (gf, gg) = (*g[0].lock().unwrap(), *g[1].lock().unwrap());
            let got = [gf[0], gf[1], gg[0], gg[1]];
            let name = format!("block {} parameter gradients {:?} vs {:?}", k, got, r.dparams[k]);
            assert_within(&what(&name), &got, &r.dparams[k], parameter_tolerance);
        }
        let last = seg.last_mode().unwrap();
        match mode {
            Mode::Auto => assert!(last == Mode::Vanilla || last == Mode::Overlapped, "{:?}", last),
            m => assert_eq!(last, m),
        }
        let errors = seg.rebuild_error(&shape, (&x1, &x2), rng_call).unwrap();
        assert_eq!(errors.len(), 4);
        assert!(errors.iter().all(|e| *e <= tolerance), "{:?} > {:e}", errors, tolerance);
    }
}

#[test]
fn rust_functions_match_an_f64_reference_in_every_mode() {
    check_against_reference::<f64>();
    check_against_reference::<f32>();
}

#[test]
fn overlapped_is_bitwise_vanilla() {
    let shape = [64usize, 33];
    let n = 64 * 33;
    let mut rng = Rng::new(3);
    let params: Vec<[f64; 4]> =
        (0..6).map(|_| [0.5 + rng.uniform(), rng.uniform() - 0.5, 0.5 + rng.uniform(), rng.uniform() - 0.5]).collect();
    let x1: Vec<f32> = random(&mut rng, n, 1.0);
    let x2: Vec<f32> = random(&mut rng, n, 1.0);
    let dy1: Vec<f32> = random(&mut rng, n, 0.5);
    let dy2: Vec<f32> = random(&mut rng, n, 0.5);
    let run = |mode: Mode, threads: usize| {
        let (mut seg, grads) = tanh_segment::<f32>(&params, mode, threads);
        let (mut y1, mut y2) = (vec![0f32; n], vec![0f32; n]);
        let rng_call = Randomness::new(7, 11);
        seg.forward(&shape, (&x1, &x2), (&mut y1, &mut y2), rng_call).unwrap();
        let mut out = vec![vec![0f32; n]; 4];
        let (a, rest) = out.split_at_mut(1);
        let (b, rest) = rest.split_at_mut(1);
        let (c, d) = rest.split_at_mut(1);
        for _ in 0..2 {
            seg.backward(
                &shape,
                (&y1, &y2),
                (&dy1, &dy2),
                (&mut a[0], &mut b[0]),
                Some((&mut c[0], &mut d[0])),
                rng_call,
            )
            .unwrap();
        }
        assert_eq!(seg.last_mode().unwrap(), mode);
        let bits: Vec<Vec<u32>> = out.iter().map(|v| v.iter().map(|e| e.to_bits()).collect()).collect();
        let g: Vec<u64> =
            grads.iter().flat_map(|p| p.iter().flat_map(|c| c.lock().unwrap().map(f64::to_bits))).collect();
        (bits, g)
    };
    let vanilla = run(Mode::Vanilla, 3);
    assert_eq!(run(Mode::Overlapped, 3), vanilla, "OVERLAPPED (3 threads) differs from VANILLA");
    assert_eq!(run(Mode::Overlapped, 2), vanilla, "OVERLAPPED (2 threads) differs from VANILLA");
}

// ---------------------------------------------------------------------------
// Built-in blocks
// ---------------------------------------------------------------------------

fn slices(v: &[Vec<f32>; 6]) -> [&[f32]; 6] {
    let [a, b, c, d, e, f] = v;
    [a, b, c, d, e, f]
}

fn slices_mut(v: &mut [Vec<f32>; 6]) -> [&mut [f32]; 6] {
    let [a, b, c, d, e, f] = v;
    [a, b, c, d, e, f]
}

/// Parameters for `options`: LayerNorm weights near 1, small matrices.
fn block_parameters(options: &BlockOptions, rng: &mut Rng) -> [Vec<f32>; 6] {
    let shapes = options.parameter_shapes();
    let mut values: [Vec<f32>; 6] = Default::default();
    for (k, shape) in shapes.iter().enumerate() {
        let numel: usize = shape.iter().product();
        let fan_in = shape[0] as f32;
        values[k] = match k {
            0 => (0..numel).map(|_| 1.0 + 0.1 * (rng.uniform() as f32 - 0.5)).collect(),
            2 | 4 => random(rng, numel, 1.0 / fan_in.sqrt()),
            _ => random(rng, numel, 0.1),
        };
    }
    values
}

struct BuiltinRun {
    y: Vec<Vec<u32>>,
    dx_and_rebuilt: Vec<Vec<f32>>,
    parameter_gradients: Vec<Vec<u32>>,
    mode: Mode,
}

#[test]
fn builtin_blocks_rebuild_their_input_and_agree_across_modes() {
    let (width, heads, hidden, layers) = (8usize, 2usize, 16usize, 3usize);
    let shape = [2usize, 5, width];
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(11);
    let attention = BlockOptions::attention(width).heads(heads);
    let mlp = BlockOptions::mlp(width).hidden(hidden);
    let values: Vec<[[Vec<f32>; 6]; 2]> =
        (0..layers).map(|_| [block_parameters(&attention, &mut rng), block_parameters(&mlp, &mut rng)]).collect();
    let x1: Vec<f32> = random(&mut rng, n, 1.0);
    let x2: Vec<f32> = random(&mut rng, n, 1.0);
    let dy1: Vec<f32> = random(&mut rng, n, 0.5);
    let dy2: Vec<f32> = random(&mut rng, n, 0.5);
    // The rebuilt input: 2 layers evaluations' worth (see the top). dx:
    // STANDARD's within the 2 layers VJPs' rounding of the exact value,
    // VANILLA's within that and the rebuild's: 6 layers between them.
    let rebuilt_tolerance = builtin_tolerance(2 * layers, width, hidden, shape[1]);
    let standard_vs_vanilla_tolerance = builtin_tolerance(6 * layers, width, hidden, shape[1]);

    let run = |mode: Mode| -> BuiltinRun {
        // Gradient accumulators borrowed by the blocks for the segment's life.
        let mut gradients: Vec<[[Vec<f32>; 6]; 2]> = values
            .iter()
            .map(|l| [l[0].clone().map(|v| vec![7.0; v.len()]), l[1].clone().map(|v| vec![7.0; v.len()])])
            .collect();
        let mut segment_layers = Vec::new();
        for (value, grads) in values.iter().zip(gradients.iter_mut()) {
            let [gf, gg] = grads;
            let mut f = Block::new(&attention).unwrap();
            f.set_parameters(Parameters { values: slices(&value[0]), gradients: Some(slices_mut(gf)) }).unwrap();
            let mut g = mlp.build().unwrap();
            g.set_parameters(Parameters { values: slices(&value[1]), gradients: Some(slices_mut(gg)) }).unwrap();
            segment_layers.push(Layer::new(f, g));
        }
        let mut seg = Segment::new(segment_layers, &SegmentOptions::new().mode(mode).threads(3)).unwrap();
        seg.zero_gradients(); // they were 7.0: accumulation starts from zero
        let rng_call = Randomness::default();
        let (mut y1, mut y2) = (vec![0f32; n], vec![0f32; n]);
        seg.forward(&shape, (&x1, &x2), (&mut y1, &mut y2), rng_call).unwrap();
        let (mut dx1, mut dx2, mut r1, mut r2) = (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        seg.backward(&shape, (&y1, &y2), (&dy1, &dy2), (&mut dx1, &mut dx2), Some((&mut r1, &mut r2)), rng_call)
            .unwrap();
        let mode = seg.last_mode().unwrap();
        let mut parameter_gradients = Vec::new();
        for k in 0..layers {
            for part in [Part::F, Part::G] {
                for g in seg.block(k, part).unwrap().gradients().unwrap() {
                    assert!(g.iter().all(|v| v.is_finite()), "non-finite parameter gradient");
                    parameter_gradients.push(g.iter().map(|v| v.to_bits()).collect());
                }
            }
        }
        let errors = seg.rebuild_error(&shape, (&x1, &x2), rng_call).unwrap();
        assert!(
            errors.iter().all(|e| *e <= rebuilt_tolerance),
            "rebuild errors {:?} > {:e}",
            errors,
            rebuilt_tolerance
        );
        drop(seg);
        // The accumulators are the caller's again; they hold what the segment showed.
        let first: Vec<u32> = gradients[0][0][2].iter().map(|v| v.to_bits()).collect();
        assert_eq!(first, parameter_gradients[2]);
        BuiltinRun {
            y: vec![y1.iter().map(|v| v.to_bits()).collect(), y2.iter().map(|v| v.to_bits()).collect()],
            dx_and_rebuilt: vec![dx1, dx2, r1, r2],
            parameter_gradients,
            mode,
        }
    };

    let runs: Vec<BuiltinRun> = MODES.iter().map(|&m| run(m)).collect();
    for (r, mode) in runs.iter().zip(MODES) {
        // Rebuilt input = input (up to fp32 rounding of the residual streams).
        assert_within(
            &format!("{:?} rebuilt x1", mode),
            &wide32(&r.dx_and_rebuilt[2]),
            &wide32(&x1),
            rebuilt_tolerance,
        );
        assert_within(
            &format!("{:?} rebuilt x2", mode),
            &wide32(&r.dx_and_rebuilt[3]),
            &wide32(&x2),
            rebuilt_tolerance,
        );
        assert!(r.dx_and_rebuilt.iter().flatten().all(|v| v.is_finite()), "{:?}", mode);
        // dx is not just dy: the blocks contribute O(1) (1e-3 is far above
        // any rounding bound here).
        assert!(max_rel(&wide32(&r.dx_and_rebuilt[0]), &wide32(&dy1)) > 1e-3, "{:?}", mode);
        assert!(r.parameter_gradients.iter().flatten().any(|&b| f32::from_bits(b) != 0.0));
        assert_eq!(r.y, runs[0].y, "{:?}: forward differs", mode);
        if mode != Mode::Auto {
            assert_eq!(r.mode, mode);
        }
    }
    // VANILLA, OVERLAPPED and AUTO replay the same forwards: bitwise equal.
    // STANDARD records activations instead of rebuilding them, so its dx
    // uses the true (not rebuilt) inputs: equal to rounding.
    let bits = |r: &BuiltinRun| -> Vec<Vec<u32>> {
        r.dx_and_rebuilt.iter().map(|v| v.iter().map(|e| e.to_bits()).collect()).collect()
    };
    for r in &runs[2..] {
        assert_eq!(bits(r), bits(&runs[1]), "{:?} vs VANILLA: dx / rebuilt input differ", r.mode);
        assert_eq!(r.parameter_gradients, runs[1].parameter_gradients, "{:?} vs VANILLA: parameter gradients", r.mode);
    }
    for k in 0..2 {
        let (standard, vanilla) = (wide32(&runs[0].dx_and_rebuilt[k]), wide32(&runs[1].dx_and_rebuilt[k]));
        assert_within(&format!("STANDARD vs VANILLA dx{}", k + 1), &standard, &vanilla, standard_vs_vanilla_tolerance);
    }
}

fn wide32(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&e| e as f64).collect()
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

fn identity_segment<'p>(fail: Arc<AtomicBool>, mode: Mode) -> Segment<'p, f32> {
    let layers = (0..3)
        .map(|_| {
            let fail = fail.clone();
            let half = |_: &Context<'_>, x: &[f32], y: &mut [f32]| {
                for (a, b) in x.iter().zip(y.iter_mut()) {
                    *b = 0.5 * a;
                }
                Ok(())
            };
            let half_vjp = |_: &Context<'_>, _: &[f32], dy: &[f32], dx: &mut [f32]| {
                for (d, g) in dx.iter_mut().zip(dy) {
                    *d += 0.5 * g;
                }
                Ok(())
            };
            let g = Function::from_closures(
                move |ctx: &Context<'_>, x: &[f32], y: &mut [f32]| {
                    if ctx.block() == 1 && fail.load(Ordering::SeqCst) {
                        if ctx.phase() == Phase::Rebuild {
                            panic!("boom in the rebuild");
                        }
                        return Err(Error::new(Status::NonFinite, "the Rust G saw a NaN"));
                    }
                    half(ctx, x, y)
                },
                half_vjp,
            );
            Layer::new(Function::from_closures(half, half_vjp), g)
        })
        .collect();
    Segment::new(layers, &SegmentOptions::new().mode(mode).threads(2)).unwrap()
}

#[test]
fn slices_that_do_not_match_the_shape_are_refused_by_name() {
    let mut seg = identity_segment(Arc::new(AtomicBool::new(false)), Mode::Vanilla);
    let (x, short) = (vec![1f32; 12], vec![1f32; 11]);
    let (mut y1, mut y2) = (vec![0f32; 12], vec![0f32; 12]);
    let err = seg.forward(&[3, 4], (&x, &short), (&mut y1, &mut y2), Randomness::default()).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("x2") && err.message().contains("11"), "{}", err);
    let err = seg.forward(&[3, 5], (&x, &x), (&mut y1, &mut y2), Randomness::default()).unwrap_err();
    assert!(err.message().starts_with("x1:"), "{}", err);
    let err =
        seg.forward(&[1; 9], (&x[..1], &x[..1]), (&mut y1[..1], &mut y2[..1]), Randomness::default()).unwrap_err();
    assert!(err.message().contains("shape: 9 dimensions"), "{}", err);
    let (mut d1, mut d2) = (vec![0f32; 12], vec![0f32; 12]);
    let err =
        seg.backward(&[3, 4], (&x, &x), (&x, &x), (&mut d1, &mut d2[..5]), None, Randomness::default()).unwrap_err();
    assert!(err.message().starts_with("dx2:"), "{}", err);
    assert!(y1.iter().all(|v| *v == 0.0), "nothing written on error");

    // Found by the library: STANDARD needs its own forward first.
    let mut standard = identity_segment(Arc::new(AtomicBool::new(false)), Mode::Standard);
    let err =
        standard.backward(&[3, 4], (&x, &x), (&x, &x), (&mut d1, &mut d2), None, Randomness::default()).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("y1") && err.message().contains("STANDARD"), "{}", err);
}

#[test]
fn failing_and_panicking_functions_name_the_block() {
    let fail = Arc::new(AtomicBool::new(false));
    let mut seg = identity_segment(fail.clone(), Mode::Overlapped);
    let shape = [4usize, 3];
    let x = vec![1f32; 12];
    let (mut y1, mut y2) = (vec![0f32; 12], vec![0f32; 12]);
    seg.forward(&shape, (&x, &x), (&mut y1, &mut y2), Randomness::default()).unwrap();

    fail.store(true, Ordering::SeqCst);
    let (mut z1, mut z2) = (vec![-1f32; 12], vec![-1f32; 12]);
    let err = seg.forward(&shape, (&x, &x), (&mut z1, &mut z2), Randomness::default()).unwrap_err();
    assert_eq!(err.status(), Status::NonFinite);
    assert!(err.message().contains("block 1, G forward"), "{}", err);
    assert!(err.message().contains("the Rust G saw a NaN"), "{}", err);
    assert!(z1.iter().chain(&z2).all(|v| *v == -1.0), "outputs untouched on error");

    // The rebuild runs G of block 1 on the handle's thread in OVERLAPPED:
    // the panic is caught there and reported, nothing aborts or hangs.
    let (mut d1, mut d2) = (vec![0f32; 12], vec![0f32; 12]);
    let err = seg.backward(&shape, (&y1, &y2), (&x, &x), (&mut d1, &mut d2), None, Randomness::default()).unwrap_err();
    assert_eq!(err.status(), Status::Internal);
    assert!(err.message().contains("block 1, G forward (rebuild)"), "{}", err);
    assert!(err.message().contains("panicked: boom in the rebuild"), "{}", err);

    // The segment keeps working.
    fail.store(false, Ordering::SeqCst);
    seg.backward(&shape, (&y1, &y2), (&x, &x), (&mut d1, &mut d2), None, Randomness::default()).unwrap();
    assert!(d1.iter().all(|v| v.is_finite() && *v != 0.0));
}

#[test]
fn builtin_block_errors() {
    // A slice of the wrong length names the parameter.
    let width = 4;
    let options = BlockOptions::attention(width).heads(2);
    let mut rng = Rng::new(5);
    let mut values = block_parameters(&options, &mut rng);
    values[2].pop();
    let mut block = Block::new(&options).unwrap();
    let err = block.set_parameters(Parameters { values: slices(&values), gradients: None }).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("parameters[2] (qkv_weight)"), "{}", err);
    assert!(block.parameters().is_none());

    // Options the library refuses.
    let err = Block::new(&BlockOptions::attention(6).heads(4)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);

    // Without parameters the segment call fails naming the block; without
    // gradients only the backward does; a state of the wrong width too.
    let shape = [3usize, width];
    let x = vec![0.25f32; 12];
    let (mut y1, mut y2) = (vec![0f32; 12], vec![0f32; 12]);
    let mlp = BlockOptions::mlp(width);
    let unset =
        Segment::new(vec![Layer::new(Block::new(&options).unwrap(), mlp.build().unwrap())], &SegmentOptions::new());
    let err = unset.unwrap().forward(&shape, (&x, &x), (&mut y1, &mut y2), Randomness::default()).unwrap_err();
    assert!(err.message().contains("block 0, F forward") && err.message().contains("parameters not set"), "{}", err);

    let values = block_parameters(&options, &mut rng);
    let mlp_values = block_parameters(&mlp, &mut rng);
    // Declared before the segment: the blocks borrow it for the segment's life
    // (declared after it, this does not compile).
    let mut grads: [Vec<f32>; 6] = values.clone().map(|v| vec![1.0; v.len()]);
    let mut f = Block::new(&options).unwrap();
    f.set_parameters(Parameters { values: slices(&values), gradients: None }).unwrap();
    let mut g = Block::new(&mlp).unwrap();
    g.set_parameters(Parameters { values: slices(&mlp_values), gradients: None }).unwrap();
    let mut seg = Segment::new(vec![Layer::new(f, g)], &SegmentOptions::new().mode(Mode::Vanilla)).unwrap();
    seg.forward(&shape, (&x, &x), (&mut y1, &mut y2), Randomness::default()).unwrap();
    let (mut d1, mut d2) = (vec![0f32; 12], vec![0f32; 12]);
    let err = seg.backward(&shape, (&y1, &y2), (&x, &x), (&mut d1, &mut d2), None, Randomness::default()).unwrap_err();
    assert!(err.message().contains("gradients not set"), "{}", err);
    let wide = vec![0.25f32; 15];
    let (mut w1, mut w2) = (vec![0f32; 15], vec![0f32; 15]);
    let err = seg.forward(&[3, 5], (&wide, &wide), (&mut w1, &mut w2), Randomness::default()).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("block 0, F forward"), "{}", err);

    // New parameters (with gradients) between calls, through block_mut.
    seg.block_mut(0, Part::F)
        .unwrap()
        .set_parameters(Parameters { values: slices(&values), gradients: Some(slices_mut(&mut grads)) })
        .unwrap();
    seg.block_mut(0, Part::F).unwrap().zero_gradients();
    assert!(seg.block(0, Part::F).unwrap().gradients().unwrap().iter().all(|g| g.iter().all(|v| *v == 0.0)));
    assert!(seg.block_mut(0, Part::G).is_some() && seg.block(1, Part::F).is_none());
}

/// One forward and backward of a one-layer segment of built-in blocks made
/// with `math`: (y1, y2, dx1, dx2, parameter gradients) as bits.
fn builtin_run_bits(math: BlockMath) -> Vec<Vec<u32>> {
    let (width, shape) = (8usize, [2usize, 3, 8]);
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(21);
    let attention = BlockOptions::attention(width).heads(2).math(math);
    let mlp = BlockOptions::mlp(width).hidden(12).math(math);
    let (pf, pg) = (block_parameters(&attention, &mut rng), block_parameters(&mlp, &mut rng));
    let mut gf: [Vec<f32>; 6] = pf.clone().map(|v| vec![0.0; v.len()]);
    let mut gg: [Vec<f32>; 6] = pg.clone().map(|v| vec![0.0; v.len()]);
    let (x1, x2): (Vec<f32>, Vec<f32>) = (random(&mut rng, n, 1.0), random(&mut rng, n, 1.0));
    let (dy1, dy2): (Vec<f32>, Vec<f32>) = (random(&mut rng, n, 0.5), random(&mut rng, n, 0.5));
    let mut f = Block::new(&attention).unwrap();
    f.set_parameters(Parameters { values: slices(&pf), gradients: Some(slices_mut(&mut gf)) }).unwrap();
    let mut g = Block::new(&mlp).unwrap();
    g.set_parameters(Parameters { values: slices(&pg), gradients: Some(slices_mut(&mut gg)) }).unwrap();
    let mut seg = Segment::new(vec![Layer::new(f, g)], &SegmentOptions::new().mode(Mode::Vanilla)).unwrap();
    let rng_call = Randomness::default();
    let (mut y1, mut y2) = (vec![0f32; n], vec![0f32; n]);
    seg.forward(&shape, (&x1, &x2), (&mut y1, &mut y2), rng_call).unwrap();
    let (mut dx1, mut dx2) = (vec![0f32; n], vec![0f32; n]);
    seg.backward(&shape, (&y1, &y2), (&dy1, &dy2), (&mut dx1, &mut dx2), None, rng_call).unwrap();
    let mut out: Vec<Vec<u32>> =
        [&y1, &y2, &dx1, &dx2].iter().map(|v| v.iter().map(|e| e.to_bits()).collect()).collect();
    for part in [Part::F, Part::G] {
        for grad in seg.block(0, part).unwrap().gradients().unwrap() {
            out.push(grad.iter().map(|e| e.to_bits()).collect());
        }
    }
    out
}

#[test]
fn tf32_math_on_cpu_blocks_gives_the_fp32_bits() {
    // The CPU runs FP32 for either flatmem_block_math value.
    let (fp32, tf32) = (builtin_run_bits(BlockMath::Fp32), builtin_run_bits(BlockMath::Tf32));
    assert!(fp32.iter().flatten().any(|&b| f32::from_bits(b) != 0.0));
    assert_eq!(fp32, tf32);
    assert_eq!(BlockMath::default(), BlockMath::Fp32);
    assert_eq!(BlockMath::Tf32.to_raw(), sys::FLATMEM_BLOCK_MATH_TF32);
}

#[test]
fn a_math_value_outside_the_enum_is_refused() {
    // BlockMath cannot hold another value; the raw struct can, and the
    // library refuses it naming the field.
    for bad in [2, 7, sys::FLATMEM_BLOCK_MATH_MAX] {
        let mut raw = BlockOptions::mlp(4).to_raw().unwrap();
        raw.math = bad;
        let mut block: *mut sys::flatmem_block_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and options struct.
        let status = unsafe { sys::flatmem_block_create(&mut block, &raw) };
        assert_eq!(status, sys::FLATMEM_STATUS_INVALID_ARGUMENT, "math = {}", bad);
        assert!(block.is_null());
        // SAFETY: the library's NUL-terminated message of this thread's last call.
        let message = unsafe { std::ffi::CStr::from_ptr(sys::flatmem_last_error()) }.to_string_lossy().into_owned();
        assert!(message.contains("options.math"), "{}", message);
    }
}

#[test]
fn segments_and_blocks_are_send() {
    fn send<T: Send>() {}
    send::<Segment<'static, f32>>();
    send::<Segment<'static, f64>>();
    send::<Block<'static>>();
    // A segment moved to another thread and used there.
    let mut seg = identity_segment(Arc::new(AtomicBool::new(false)), Mode::Auto);
    let y = std::thread::spawn(move || {
        let x = vec![2f32; 6];
        let (mut y1, mut y2) = (vec![0f32; 6], vec![0f32; 6]);
        seg.forward(&[6], (&x, &x), (&mut y1, &mut y2), Randomness::default()).unwrap();
        y1
    })
    .join()
    .unwrap();
    assert!(y.iter().all(|v| v.is_finite() && *v > 2.0));
}
