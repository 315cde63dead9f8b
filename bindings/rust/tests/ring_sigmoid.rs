//! The ring sigmoid loss (RingSigmoidLoss over a Communicator) equals the
//! single-process sigmoid loss of the concatenated global batch, materialised
//! in f64 by tests/common/sigmoid.rs: the loss (mean over the B global rows),
//! this rank's rows of dL/dq and columns of dL/dk (gradients of the GLOBAL
//! mean, nothing summed over ranks), dL/ds and dL/dt (the same on every rank),
//! from value_and_grad, forward and backward(g). Two processes over UCX, and
//! 2 / 4 threads of an in-process group; shards of 1 row, primes and uneven
//! counts, c_r != b_r; global labels whose positives live on other ranks,
//! and the default positives (global row g -> global column g); s = 100 with
//! t = -10.
//!
//! Tolerances: the worst-case bounds of tests/common/sigmoid.rs for ONE
//! process computing the whole batch (B rows, C columns). The ring computes
//! the same per-element terms in fp32; only the order of the sums changes
//! (the loss and ds / dt across ranks, dk partials passed around the ring),
//! and those bounds hold for any order of a sum of the same number of terms,
//! so they apply unchanged to the global B and C.

mod common;

use common::ranks;
use common::sigmoid::{sigmoid_reference, sigmoid_tolerance, SigmoidProblem};
use common::{assert_close, labels_on_next_rank, prefix, widen, Rng};
use flatmem::{Communicator, Dtype, Features, Options, RingSigmoidLoss, SigmoidGradients, Status};

/// One global batch cut into shards: rank r holds rows[r] rows of q and
/// cols[r] columns of k.
struct Case {
    rows: Vec<usize>,
    cols: Vec<usize>,
    d: usize,
    labels: bool,
    scale: f32,
    bias: f32,
}

fn cases(world_size: usize) -> Vec<Case> {
    let case = |rows: Vec<usize>, cols: Vec<usize>, d, labels| Case { rows, cols, d, labels, scale: 10.0, bias: -10.0 };
    match world_size {
        2 => vec![
            case(vec![1, 4], vec![1, 4], 5, false),  // one row on rank 0
            case(vec![7, 3], vec![7, 3], 13, false), // primes, uneven
            case(vec![3, 2], vec![4, 7], 6, true),   // global labels, c_r != b_r
            case(vec![2, 5], vec![7, 1], 3, false),  // default positives g -> g, C > B
            Case { scale: 100.0, bias: -10.0, ..case(vec![5, 3], vec![2, 9], 7, true) },
        ],
        4 => vec![
            case(vec![2, 1, 5, 3], vec![2, 1, 5, 3], 11, false),
            case(vec![1, 4, 2, 3], vec![5, 2, 3, 1], 7, true),
            Case { scale: 100.0, bias: -10.0, ..case(vec![3, 3, 1, 2], vec![3, 4, 1, 2], 9, false) },
        ],
        n => panic!("no cases for {} ranks", n),
    }
}

/// This rank's value_and_grad, forward and backward of `case`, checked
/// against the f64 loss of the whole batch (every rank builds the same
/// global batch from the same seed and takes its shard).
fn check_case(comm: &Communicator, case: &Case, seed: u64) {
    let rank = comm.rank();
    let (big_b, big_c, d) = (case.rows.iter().sum::<usize>(), case.cols.iter().sum::<usize>(), case.d);
    let mut rng = Rng::new(seed);
    let (q, k) = rng.batch(big_b, big_c, d);
    let labels = if case.labels { Some(labels_on_next_rank(&mut rng, &case.rows, &case.cols)) } else { None };
    let (r0, b) = (prefix(&case.rows, rank), case.rows[rank]);
    let (c0, c) = (prefix(&case.cols, rank), case.cols[rank]);
    let (qf, kf) = (Features::f32(&q[r0 * d..(r0 + b) * d], b, d), Features::f32(&k[c0 * d..(c0 + c) * d], c, d));
    let labels_r = labels.as_ref().map(|l| &l[r0..r0 + b]);
    let what = format!("rows {:?} cols {:?} d {} rank {}", case.rows, case.cols, d, rank);

    let mut ring = RingSigmoidLoss::new(comm, &Options::new().threads(1)).unwrap();
    let vg = ring.value_and_grad(qf, kf, labels_r, case.scale, case.bias).unwrap_or_else(|e| panic!("{}: {}", what, e));
    let forward = ring.forward(qf, kf, labels_r, case.scale, case.bias).unwrap();
    let dloss = 0.75f32;
    let bwd = ring.backward(qf, kf, labels_r, case.scale, case.bias, dloss).unwrap();

    for (g, loss, grads) in [(1.0f32, Some(vg.loss), &vg.grads), (1.0, Some(forward), &vg.grads), (dloss, None, &bwd)] {
        let problem = SigmoidProblem {
            b: big_b,
            c: big_c,
            d,
            q: widen(&q),
            k: widen(&k),
            labels: labels.clone(),
            scale: case.scale as f64,
            bias: case.bias as f64,
            dloss: g as f64,
        };
        let want = sigmoid_reference(&problem);
        let tol = sigmoid_tolerance(&problem, &want, Dtype::F32);
        let what = format!("{} g={}", what, g);
        if let Some(loss) = loss {
            assert_close(&format!("{}: loss", what), &[loss as f64], &[want.loss], &[tol.loss]);
        }
        check_shard(&what, grads, (r0 * d, b * d), (c0 * d, c * d), &want, &tol);
    }
}

/// This rank's slices of the global gradients against the reference.
fn check_shard(
    what: &str,
    got: &SigmoidGradients,
    (q0, qn): (usize, usize),
    (k0, kn): (usize, usize),
    want: &common::sigmoid::SigmoidReference,
    tol: &common::sigmoid::SigmoidTolerance,
) {
    assert_close(&format!("{}: dq", what), &widen(&got.dq), &want.dq[q0..q0 + qn], &tol.dq[q0..q0 + qn]);
    assert_close(&format!("{}: dk", what), &widen(&got.dk), &want.dk[k0..k0 + kn], &tol.dk[k0..k0 + kn]);
    assert_close(&format!("{}: dlogit_scale", what), &[got.dlogit_scale as f64], &[want.ds], &[tol.ds]);
    assert_close(&format!("{}: dlogit_bias", what), &[got.dlogit_bias as f64], &[want.dt], &[tol.dt]);
}

fn check_all(comm: &Communicator) {
    for (n, case) in cases(comm.world_size()).iter().enumerate() {
        check_case(comm, case, 0x5195 + n as u64);
    }
}

#[test]
fn ring_sigmoid_over_two_processes_equals_the_global_batch() {
    const TEST: &str = "ring_sigmoid_over_two_processes_equals_the_global_batch";
    ranks::on_processes(TEST, 2, check_all);
}

#[test]
fn ring_sigmoid_on_threads_equals_the_global_batch() {
    for world_size in [2usize, 4] {
        ranks::on_threads(world_size, |comm| check_all(&comm));
    }
}

#[test]
fn ring_sigmoid_mismatch_is_named_on_every_rank() {
    // Rank 1 passes another logit bias: both ranks fail, naming it.
    ranks::on_threads(2, |comm| {
        let rank = comm.rank();
        let q = Rng::new(3).unit_rows(2, 4);
        let mut ring = RingSigmoidLoss::new(&comm, &Options::new()).unwrap();
        let bias = if rank == 0 { -10.0 } else { -5.0 };
        let e = ring.forward(Features::f32(&q, 2, 4), Features::f32(&q, 2, 4), None, 10.0, bias).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().contains("logit_bias"), "rank {}: {}", rank, e);
    });
}
