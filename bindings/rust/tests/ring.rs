//! The ring contrastive loss (RingContrastive over a Communicator) equals
//! the single-process loss of the concatenated global batch, materialised
//! in f64 by tests/common: loss, this rank's slices of the global row and
//! column log-sum-exps, this rank's rows of dL/dq and columns of dL/dk (the
//! gradients of the GLOBAL mean, nothing summed over ranks) and dL/ds.
//! Two processes over UCX and 1 / 3 threads of an in-process group; shards
//! of 1 row, primes and uneven counts; symmetric and InfoNCE with global
//! labels whose positives live on other ranks.
//!
//! Tolerances: the worst-case bounds of tests/common for ONE process
//! computing the whole batch (B rows, C columns). The ring computes the same
//! terms in fp32; only the order of the sums over columns (log-sum-exp
//! merged block by block) and over rows (dk partials passed around the
//! ring) changes, and those bounds hold for any order of a sum of the same
//! number of terms (gamma_n grows with n, not with the order), so they
//! apply unchanged to the global B and C.

mod common;

use common::ranks;
use common::{
    assert_close, backward_tolerance, forward_tolerance, labels_on_next_rank, prefix, reference, widen, Problem, Rng,
};
use flatmem::{Communicator, Dtype, Features, Loss, Options, RingContrastive};

/// One global batch cut into shards: rank r holds rows[r] rows of q and
/// cols[r] columns of k.
struct Case {
    loss: Loss,
    rows: Vec<usize>,
    cols: Vec<usize>,
    d: usize,
    labels: bool,
}

fn cases(world_size: usize) -> Vec<Case> {
    let sym = |rows: Vec<usize>, d| Case { loss: Loss::Symmetric, cols: rows.clone(), rows, d, labels: false };
    let nce = |rows: Vec<usize>, cols: Vec<usize>, d, labels| Case { loss: Loss::InfoNce, rows, cols, d, labels };
    match world_size {
        1 => vec![sym(vec![5], 7), nce(vec![3], vec![5], 4, true)],
        2 => vec![
            sym(vec![1, 4], 5),                    // one row on rank 0
            sym(vec![7, 3], 13),                   // primes, uneven
            nce(vec![3, 2], vec![4, 7], 6, true),  // global labels, c_r != b_r
            nce(vec![2, 5], vec![7, 1], 3, false), // default positives g -> g
        ],
        3 => vec![sym(vec![2, 1, 5], 11), nce(vec![1, 4, 2], vec![5, 2, 3], 7, true)],
        n => panic!("no cases for {} ranks", n),
    }
}

/// This rank's forward and backward of `case`, checked against the f64
/// loss of the whole batch (every rank builds the same global batch from the
/// same seed and takes its shard).
fn check_case(comm: &Communicator, case: &Case, seed: u64) {
    let rank = comm.rank();
    let (big_b, big_c, d) = (case.rows.iter().sum::<usize>(), case.cols.iter().sum::<usize>(), case.d);
    let symmetric = case.loss == Loss::Symmetric;
    let mut rng = Rng::new(seed);
    let (q, k) = rng.batch(big_b, big_c, d);
    let labels = if case.labels { Some(labels_on_next_rank(&mut rng, &case.rows, &case.cols)) } else { None };
    let (scale, dloss) = (9.5f32, 0.75f32);
    let problem = Problem {
        symmetric,
        b: big_b,
        c: big_c,
        d,
        q: widen(&q),
        k: widen(&k),
        labels: labels.clone(),
        scale: scale as f64,
        dloss: dloss as f64,
    };
    let want = reference(&problem);
    let ftol = forward_tolerance(&problem, &want);
    let btol = backward_tolerance(&problem, &want, &ftol, Dtype::F32);

    let (r0, b) = (prefix(&case.rows, rank), case.rows[rank]);
    let (c0, c) = (prefix(&case.cols, rank), case.cols[rank]);
    let q_r = &q[r0 * d..(r0 + b) * d];
    let k_r = &k[c0 * d..(c0 + c) * d];
    let labels_r = labels.as_ref().map(|l| &l[r0..r0 + b]);
    let what = format!("{:?} rows {:?} cols {:?} d {} rank {}", case.loss, case.rows, case.cols, d, rank);

    let mut ring = RingContrastive::new(comm, &Options::new().loss(case.loss).threads(1)).unwrap();
    let (qf, kf) = (Features::f32(q_r, b, d), Features::f32(k_r, c, d));
    let out = ring.forward(qf, kf, labels_r, scale).unwrap();
    assert_close(&format!("{}: loss", what), &[out.loss as f64], &[want.loss], &[ftol.loss]);
    assert_close(
        &format!("{}: row_lse", what),
        &widen(&out.row_lse),
        &want.row_lse[r0..r0 + b],
        &ftol.row_lse[r0..r0 + b],
    );
    if symmetric {
        let col_lse = out.col_lse.as_ref().expect("symmetric col_lse");
        assert_close(
            &format!("{}: col_lse", what),
            &widen(col_lse),
            &want.col_lse[c0..c0 + c],
            &ftol.col_lse[c0..c0 + c],
        );
    }
    let g = ring.backward(qf, kf, labels_r, scale, &out, dloss).unwrap();
    assert_close(
        &format!("{}: dq", what),
        &widen(&g.dq),
        &want.dq[r0 * d..(r0 + b) * d],
        &btol.dq[r0 * d..(r0 + b) * d],
    );
    assert_close(
        &format!("{}: dk", what),
        &widen(&g.dk),
        &want.dk[c0 * d..(c0 + c) * d],
        &btol.dk[c0 * d..(c0 + c) * d],
    );
    assert_close(&format!("{}: dlogit_scale", what), &[g.dlogit_scale as f64], &[want.ds], &[btol.ds]);
}

fn check_all(comm: &Communicator) {
    for (n, case) in cases(comm.world_size()).iter().enumerate() {
        check_case(comm, case, 0x5eed + n as u64);
    }
}

#[test]
fn ring_loss_over_two_processes_equals_the_global_batch() {
    const TEST: &str = "ring_loss_over_two_processes_equals_the_global_batch";
    ranks::on_processes(TEST, 2, check_all);
}

#[test]
fn ring_loss_on_threads_equals_the_global_batch() {
    for world_size in [1usize, 3] {
        ranks::on_threads(world_size, |comm| check_all(&comm));
    }
}

#[test]
fn ring_loss_mismatch_is_named_on_every_rank() {
    // Rank 1 passes another logit scale: both ranks fail, naming it.
    ranks::on_threads(2, |comm| {
        let rank = comm.rank();
        let q = Rng::new(3).unit_rows(2, 4);
        let mut ring = RingContrastive::new(&comm, &Options::new()).unwrap();
        let scale = if rank == 0 { 10.0 } else { 20.0 };
        let e = ring.forward(Features::f32(&q, 2, 4), Features::f32(&q, 2, 4), None, scale).unwrap_err();
        assert_eq!(e.status(), flatmem::Status::InvalidArgument, "{}", e);
        assert!(e.message().contains("logit_scale"), "rank {}: {}", rank, e);
    });
}
