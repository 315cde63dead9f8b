//! The logit cache (`Options::logit_cache_bytes`): the loss, the saved
//! log-sum-exp vectors and the gradients are bitwise those of a handle
//! without it, whatever the budget (less than a tile, part of the tiles,
//! all of them, far more), for both losses, shapes with 1 and primes,
//! several tilings and thread counts, fp32 and bf16 inputs; also when the
//! backward's inputs are not the last forward's, after a forward of other
//! inputs or a failed one (the cache must not be read then). A budget with
//! a communicator is refused.

mod common;

use common::Rng;
use flatmem::half::bf16_from_f32;
use flatmem::{
    CommOptions, Communicator, Contrastive, Features, ForwardOutput, Gradients, Loss, Options, RingContrastive, Saved,
    Status,
};

/// The features of one problem, in fp32 or as bf16 bit patterns, and its
/// labels.
#[derive(Clone)]
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    bf16: Option<(Vec<u16>, Vec<u16>)>,
    b: usize,
    c: usize,
    d: usize,
    labels: Option<Vec<i64>>,
}

impl Inputs {
    /// Unit rows; the first `min(b, c)` rows of `k` are noisy copies of
    /// `q`'s, the rest unrelated. `labels`: random positives (InfoNCE).
    fn new(b: usize, c: usize, d: usize, labels: bool, seed: u64) -> Inputs {
        let mut rng = Rng::new(seed);
        let q = rng.unit_rows(b, d);
        let paired = b.min(c);
        let mut k = rng.noisy_copy(&q[..paired * d], d, 0.5);
        k.extend(rng.unit_rows(c - paired, d));
        let labels = if labels { Some((0..b).map(|_| rng.below(c) as i64).collect()) } else { None };
        Inputs { q, k, bf16: None, b, c, d, labels }
    }

    /// The same features rounded to bf16.
    fn rounded_to_bf16(mut self) -> Inputs {
        let round = |x: &[f32]| x.iter().map(|&v| bf16_from_f32(v)).collect::<Vec<u16>>();
        self.bf16 = Some((round(&self.q), round(&self.k)));
        self
    }

    fn q(&self) -> Features<'_> {
        match &self.bf16 {
            Some((q, _)) => Features::bf16(q, self.b, self.d),
            None => Features::f32(&self.q, self.b, self.d),
        }
    }

    fn k(&self) -> Features<'_> {
        match &self.bf16 {
            Some((_, k)) => Features::bf16(k, self.c, self.d),
            None => Features::f32(&self.k, self.c, self.d),
        }
    }

    fn labels(&self) -> Option<&[i64]> {
        self.labels.as_deref()
    }

    /// A copy with `edit` applied to the fp32 features `(q, k)`.
    fn edited(&self, edit: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>)) -> Inputs {
        assert!(self.bf16.is_none(), "edits are for fp32 inputs");
        let mut copy = self.clone();
        edit(&mut copy.q, &mut copy.k);
        copy
    }
}

const SCALE: f32 = 14.3;
const DLOSS: f32 = 0.7;

fn forward(h: &mut Contrastive, x: &Inputs) -> ForwardOutput {
    h.forward(x.q(), x.k(), x.labels(), SCALE).unwrap()
}

fn backward<'s>(h: &mut Contrastive, x: &Inputs, saved: impl Into<Saved<'s>>) -> Gradients {
    h.backward(x.q(), x.k(), x.labels(), SCALE, saved, DLOSS).unwrap()
}

fn as_bits(values: &[&[f32]]) -> Vec<u32> {
    values.iter().flat_map(|v| v.iter().map(|x| x.to_bits())).collect()
}

/// The forward's outputs as bits: loss, row_lse, col_lse.
fn forward_bits(out: &ForwardOutput) -> Vec<u32> {
    as_bits(&[&[out.loss], &out.row_lse, out.col_lse.as_deref().unwrap_or(&[])])
}

/// The backward's outputs as bits: dq, dk, dlogit_scale.
fn gradient_bits(g: &Gradients) -> Vec<u32> {
    as_bits(&[&g.dq, &g.dk, &[g.dlogit_scale]])
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    loss: Loss,
    tiles: (usize, usize),
    threads: usize,
}

fn options(setup: Setup) -> Options {
    Options::new().loss(setup.loss).tiles(setup.tiles.0, setup.tiles.1).threads(setup.threads)
}

/// Forward + backward of `x` with every budget against no budget: the same
/// bits. The budgets: less than one tile (nothing kept), about half the
/// tiles, exactly all of them (4 b c bytes), far more.
fn assert_budgets_change_nothing(setup: Setup, x: &Inputs) {
    let run = |budget: usize| {
        let mut h = options(setup).logit_cache_bytes(budget).build().unwrap();
        let out = forward(&mut h, x);
        let g = backward(&mut h, x, &out);
        (forward_bits(&out), gradient_bits(&g))
    };
    let want = run(0);
    let all = 4 * x.b * x.c;
    for budget in [4, all / 2, all, 1 << 40] {
        assert!(
            run(budget) == want,
            "{:?} b={} c={} d={} bf16={} budget={}: not bitwise the results without the cache",
            setup,
            x.b,
            x.c,
            x.d,
            x.bf16.is_some(),
            budget
        );
    }
}

/// Shapes with 1 and primes; small tiles so that several tiles (and ragged
/// last ones) are walked, and the default tiles (one tile).
const SQUARE: [(usize, usize); 6] = [(1, 1), (2, 3), (13, 7), (31, 17), (37, 19), (67, 5)];
const TILINGS: [((usize, usize), usize); 3] = [((0, 0), 2), ((4, 3), 3), ((5, 8), 1)];

#[test]
fn symmetric_results_do_not_depend_on_the_budget() {
    for &(b, d) in &SQUARE {
        for &(tiles, threads) in &TILINGS {
            let x = Inputs::new(b, b, d, false, (b * 1009 + d) as u64);
            assert_budgets_change_nothing(Setup { loss: Loss::Symmetric, tiles, threads }, &x);
        }
    }
}

#[test]
fn infonce_results_do_not_depend_on_the_budget() {
    for &(b, c, d, labels) in
        &[(1, 1, 1, false), (1, 5, 3, true), (5, 11, 7, false), (13, 37, 8, true), (29, 61, 7, true)]
    {
        for &(tiles, threads) in &TILINGS {
            let x = Inputs::new(b, c, d, labels, (b * 1_000_003 + c * 1009 + d) as u64);
            assert_budgets_change_nothing(Setup { loss: Loss::InfoNce, tiles, threads }, &x);
        }
    }
}

#[test]
fn bf16_results_do_not_depend_on_the_budget() {
    let setup = |loss| Setup { loss, tiles: (4, 5), threads: 2 };
    assert_budgets_change_nothing(setup(Loss::Symmetric), &Inputs::new(23, 23, 11, false, 3).rounded_to_bf16());
    assert_budgets_change_nothing(setup(Loss::InfoNce), &Inputs::new(7, 19, 5, true, 4).rounded_to_bf16());
}

/// The same calls on a handle without the cache and on one with a budget
/// for every tile: each gives the same bits on both.
struct Pair {
    plain: Contrastive,
    cached: Contrastive,
}

impl Pair {
    fn new(setup: Setup, x: &Inputs) -> Pair {
        let all = 4 * x.b * x.c;
        Pair { plain: options(setup).build().unwrap(), cached: options(setup).logit_cache_bytes(all).build().unwrap() }
    }

    fn forward(&mut self, x: &Inputs, what: &str) -> ForwardOutput {
        let (plain, cached) = (forward(&mut self.plain, x), forward(&mut self.cached, x));
        assert!(forward_bits(&plain) == forward_bits(&cached), "{}: the forward differs with the cache", what);
        plain
    }

    fn backward(&mut self, x: &Inputs, saved: Saved<'_>, what: &str) -> Gradients {
        let (plain, cached) = (backward(&mut self.plain, x, saved), backward(&mut self.cached, x, saved));
        assert!(gradient_bits(&plain) == gradient_bits(&cached), "{}: the backward differs with the cache", what);
        plain
    }
}

#[test]
fn a_backward_of_other_inputs_recomputes() {
    let problems =
        [(Loss::Symmetric, Inputs::new(17, 17, 6, false, 8)), (Loss::InfoNce, Inputs::new(9, 23, 5, true, 9))];
    for (loss, x) in &problems {
        let mut pair = Pair::new(Setup { loss: *loss, tiles: (4, 6), threads: 2 }, x);
        let out = pair.forward(x, "forward");
        let want = pair.backward(x, out.saved(), "the backward of the forward's inputs");

        // q or k changed after the forward (same shapes): the cached tiles
        // are not theirs, and reading them would give other gradients.
        let new_q = x.edited(|q, _| q[7] += 0.25);
        let new_k = x.edited(|_, k| k[1] = -k[1]);
        for (changed, what) in [(&new_q, "q changed after the forward"), (&new_k, "k changed after the forward")] {
            let out = pair.forward(x, what);
            let g = pair.backward(changed, out.saved(), what);
            assert!(gradient_bits(&g) != gradient_bits(&want), "{}: the change does not show", what);
        }

        // A forward of other inputs in between: the cache holds those.
        let other = Inputs::new(x.b, x.c, x.d, x.labels.is_some(), 99);
        let out = pair.forward(x, "forward");
        pair.forward(&other, "forward of other inputs");
        pair.backward(x, out.saved(), "backward after a forward of other inputs");

        // A failed forward in between leaves no tiles to trust.
        let out = pair.forward(x, "forward");
        let with_nan = x.edited(|q, _| q[0] = f32::NAN);
        for h in [&mut pair.plain, &mut pair.cached] {
            let err = h.forward(with_nan.q(), with_nan.k(), with_nan.labels(), SCALE).unwrap_err();
            assert_eq!(err.status(), flatmem::Status::NonFinite, "{}", err);
        }
        pair.backward(x, out.saved(), "backward after a failed forward");
    }
}

#[test]
fn refused_with_a_communicator() {
    // A one-rank in-process communicator is enough: the budget is refused
    // at create, naming the option.
    let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
    let e = RingContrastive::new(&comm, &Options::new().logit_cache_bytes(1 << 20)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    assert!(e.message().contains("logit_cache_bytes"), "{}", e);
    // The same communicator without a budget is accepted.
    RingContrastive::new(&comm, &Options::new()).unwrap();
}
