//! The ZeRO relay mode of `Cyclic` (`CyclicOptions::relayed`): an MLP
//! (common/stage_mlp.rs) trained with each rank holding 1/N of every stage
//! equals the replicated `Delay1` training bit for bit (every rank's shards
//! against its range of the replicated parameters), f32 and f64, over
//! threads (N = 2, 3, a stage smaller than N) and two processes; each rank
//! holds its shards plus the staging, not a replica.

mod common;

use std::sync::{Arc, Mutex};

use common::ranks;
use common::stage_mlp::{assert_bitwise, train_data_parallel, train_relayed, Mlp, Real};
use flatmem::cyclic::{Cyclic, CyclicOptions, Rule};
use flatmem::{Communicator, Status};

const LR: f64 = 0.25;
const STEPS: u64 = 3;

/// Each rank's (relayed shards, replicated parameters of its shard ranges).
fn check_rank<T: Real>(comm: &Communicator, mlp: &Mlp) {
    let replicated = train_data_parallel::<T>(comm, mlp, STEPS, Rule::Delay1, LR);
    let (shards, summary) = train_relayed::<T>(comm, mlp, STEPS, LR);
    let (n, r, size) = (comm.world_size(), comm.rank(), std::mem::size_of::<T>());
    let want: Vec<Vec<T>> = (0..mlp.stages())
        .map(|j| {
            let c = (mlp.count(j) + n - 1) / n; // c_j = ceil(n_j / N)
            let range = (r * c).min(mlp.count(j))..((r + 1) * c).min(mlp.count(j));
            replicated[j][range].to_vec()
        })
        .collect();
    assert_bitwise(&format!("relayed vs replicated, rank {} of {}", r, n), &shards, &want);
    let shard_bytes: usize = want.iter().map(|s| s.len() * size).sum();
    let replica_bytes: usize = (0..mlp.stages()).map(|j| mlp.count(j) * size).sum();
    assert_eq!((summary.shard_bytes as usize, summary.replicated_bytes as usize), (shard_bytes, replica_bytes));
    let largest = (0..mlp.stages()).map(|j| mlp.count(j) * size).max().unwrap();
    assert_eq!(summary.staging_bytes as usize, summary.staging_buffers as usize * largest);
    assert!(summary.peak_parameter_bytes_scheduled as usize <= shard_bytes + summary.staging_bytes as usize);
    // Every rank but the last relays full stages on; an owner of a non-empty
    // shard sends copies to rank 0 (the last rank of widths [3, 1, 1] owns none).
    if n > 1 && (r + 1 < n || shard_bytes > 0) {
        assert!(summary.relay_bytes_sent > 0, "{:?}", summary);
    }
}

fn on_threads<T: Real>(world: usize, mlp: Mlp) {
    let seen = Arc::new(Mutex::new(0usize));
    let count = seen.clone();
    ranks::on_threads(world, move |comm| {
        check_rank::<T>(&comm, &mlp);
        *count.lock().unwrap() += 1;
    });
    assert_eq!(*seen.lock().unwrap(), world);
}

#[test]
fn relayed_equals_replicated_on_threads_f64() {
    on_threads::<f64>(3, Mlp { widths: vec![3, 5, 4, 2], rows: 3, seed: 11 });
}

#[test]
fn relayed_equals_replicated_on_threads_f32_with_a_stage_smaller_than_n() {
    // stage 1 of widths [3, 1, 1] has 2 elements: rank 2 of 3 owns none
    on_threads::<f32>(3, Mlp { widths: vec![3, 1, 1], rows: 2, seed: 4 });
    on_threads::<f32>(2, Mlp { widths: vec![4, 3, 2], rows: 2, seed: 5 });
}

#[test]
fn relayed_equals_replicated_over_two_processes() {
    const TEST: &str = "relayed_equals_replicated_over_two_processes";
    ranks::on_processes(TEST, 2, |comm| check_rank::<f64>(comm, &Mlp { widths: vec![4, 3, 2], rows: 2, seed: 9 }));
}

#[test]
fn relay_calls_are_refused_where_they_do_not_apply() {
    ranks::on_threads(2, |comm| {
        // SYNC cannot relay (no stagger); a replicated handle has no shards.
        let e = Cyclic::<f64>::new(&comm, &CyclicOptions::new(1, 1, Rule::Sync).relayed(vec![4])).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        let e = Cyclic::<f64>::new(&comm, &CyclicOptions::new(2, 1, Rule::Delay1).relayed(vec![4])).unwrap_err();
        assert!(e.message().contains("options.parameter_count: 1 entries"), "{}", e);
        let mut replicated = Cyclic::<f64>::new(&comm, &CyclicOptions::new(1, 1, Rule::Delay1)).unwrap();
        let e = replicated.set_shard(0, vec![0.0; 2]).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(replicated.shard(0).is_none());
        drop(replicated);
        let mut relayed = Cyclic::<f64>::new(&comm, &CyclicOptions::new(1, 1, Rule::Delay1).relayed(vec![5])).unwrap();
        let range = relayed.shard_range(0, comm.rank()).unwrap();
        assert_eq!(range, if comm.rank() == 0 { 0..3 } else { 3..5 });
        let e = relayed.set_shard(0, vec![0.0; range.len() + 1]).unwrap_err(); // both sizes named
        assert!(
            e.message().contains(&range.len().to_string()) && e.message().contains(&(range.len() + 1).to_string()),
            "{}",
            e
        );
        let e = relayed.parameters(&mut [0.0; 5]).unwrap_err(); // not during a forward / backward
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    });
}
