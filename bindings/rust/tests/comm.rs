//! Communicators: bootstrap from a unique id and from the environment (two
//! processes over UCX on loopback), point-to-point messages, the all-reduce,
//! the ring shift and the barrier against values computed here, the
//! in-process group on threads, bad arguments, and a killed peer.

mod common;

use std::time::{Duration, Instant};

use common::ranks::{self, Child};
use flatmem::{CommOptions, Communicator, Status, UniqueId};

/// Rank r's message: values no other rank sends, exact in every dtype used.
fn message(rank: usize, len: usize) -> Vec<f64> {
    (0..len).map(|i| (1000 * rank + i) as f64 + 0.25).collect()
}

/// Send/recv to the next rank, all_reduce (f64 and i64, out of place and in
/// place), ring_shift and barrier, each checked against its definition.
/// Lengths 1 and a prime; the sums are of small integers and quarters, exact
/// in f64, so the results must be exact.
fn exercise(comm: &Communicator) {
    let (rank, n) = (comm.rank(), comm.world_size());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    assert!(comm.health().is_ok());
    for len in [1usize, 13] {
        // Point to point, non-blocking, both directions in flight at once.
        let out = message(rank, len);
        let mut got = vec![0.0f64; len];
        comm.transfers(|t| {
            let receive = t.irecv(&mut got, prev, 5).unwrap();
            let send = t.isend(&out, next, 5).unwrap();
            send.wait().unwrap();
            // Poll until the message is in (the sender's wait returned, so
            // it is on its way; bounded like every wait here).
            let start = Instant::now();
            while !receive.test().unwrap() {
                assert!(start.elapsed() < Duration::from_secs(10), "rank {}: test() never saw the message", rank);
                std::thread::yield_now();
            }
            let got = receive.wait().unwrap();
            assert_eq!(got, &message(prev, len)[..], "rank {} received from {}", rank, prev);
        });
        // Blocking forms, the other way round the ring, another tag.
        let mut back = vec![0.0f64; len];
        comm.transfers(|t| {
            let receive = t.irecv(&mut back, next, 6).unwrap();
            comm.send(&out, prev, 6, None).unwrap();
            assert!(receive.wait().is_ok());
        });
        assert_eq!(back, message(next, len));

        // All-reduce: sum over ranks of message(r).
        let want: Vec<f64> = (0..len).map(|i| (0..n).map(|r| message(r, len)[i]).sum()).collect();
        let mut sum = vec![0.0f64; len];
        comm.all_reduce(&out, &mut sum, None).unwrap();
        assert_eq!(sum, want);
        let mut ints: Vec<i64> = (0..len).map(|i| (rank * 7 + i) as i64).collect();
        comm.all_reduce_in_place(&mut ints, None).unwrap();
        let want_ints: Vec<i64> = (0..len).map(|i| (0..n).map(|r| (r * 7 + i) as i64).sum()).collect();
        assert_eq!(ints, want_ints);

        // Ring shift: from rank - 1.
        let mut shifted = vec![0.0f64; len];
        comm.ring_shift(&out, &mut shifted, None).unwrap();
        assert_eq!(shifted, message(prev, len));
    }
    // A receive of the wrong size names both sizes; the handle stays usable.
    if n > 1 {
        let short = [0.0f64; 2];
        let mut long = [0.0f64; 3];
        let result = comm.transfers(|t| {
            let receive = t.irecv(&mut long, prev, 9).unwrap();
            let send = t.isend(&short, next, 9).unwrap();
            send.wait().unwrap();
            receive.wait().map(|_| ())
        });
        let e = result.unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().contains("16") && e.message().contains("24"), "{}", e);
        assert!(comm.health().is_ok());
    }
    comm.barrier(None).unwrap();
}

#[test]
fn unique_id_round_trips_through_bytes_and_hex() {
    let id = UniqueId::new(Some("127.0.0.1:0")).unwrap();
    let hex = id.to_hex();
    assert_eq!(hex.len(), 2 * flatmem::comm::UNIQUE_ID_BYTES);
    assert_eq!(UniqueId::from_hex(&hex).unwrap(), id);
    assert_eq!(UniqueId::from_hex(&hex.to_uppercase()).unwrap(), id);
    assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
    for bad in [&hex[1..], "zz", ""] {
        let e = UniqueId::from_hex(bad).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("unique id"), "{}", e);
    }
    let e = UniqueId::from_bytes(&[0u8; 5]).unwrap_err();
    assert!(e.message().contains("5 bytes"), "{}", e);
    let e = UniqueId::new(Some("a\0b")).unwrap_err();
    assert!(e.message().contains("address"), "{}", e);
}

#[test]
fn two_processes_from_unique_id() {
    const TEST: &str = "two_processes_from_unique_id";
    ranks::on_processes(TEST, 2, exercise);
}

/// Each rank of a from-env run: create, check rank and size, exercise.
fn from_env_child(child: &Child) {
    let comm = Communicator::from_env(&ranks::options()).unwrap();
    assert_eq!((comm.rank(), comm.world_size()), (child.rank, 2));
    exercise(&comm);
    ranks::done(child);
}

/// Runs `test` as two ranks that find each other through
/// FLATMEM_COORDINATOR (a port the kernel just handed out) and learn their
/// rank and size from `rank_variables` (FLATMEM_* or a launcher's).
fn run_from_env(test: &str, rank_variables: [&str; 2]) {
    let coordinator = format!("127.0.0.1:{}", ranks::free_port());
    let outcomes = ranks::run(test, 2, |rank| {
        vec![
            ("FLATMEM_COORDINATOR".into(), coordinator.clone()),
            (rank_variables[0].into(), rank.to_string()),
            (rank_variables[1].into(), "2".into()),
            ("FLATMEM_SESSION".into(), format!("rust-test-{}", std::process::id())),
        ]
    });
    ranks::assert_succeeded(test, &outcomes);
}

#[test]
fn two_processes_from_env() {
    const TEST: &str = "two_processes_from_env";
    if let Some(child) = ranks::child(TEST) {
        return from_env_child(&child);
    }
    run_from_env(TEST, ["FLATMEM_RANK", "FLATMEM_WORLD_SIZE"]);
}

#[test]
fn two_processes_from_launcher_variables() {
    // As Open MPI's mpirun sets them (FLATMEM_RANK / _WORLD_SIZE unset).
    const TEST: &str = "two_processes_from_launcher_variables";
    if let Some(child) = ranks::child(TEST) {
        assert!(std::env::var_os("FLATMEM_RANK").is_none());
        return from_env_child(&child);
    }
    run_from_env(TEST, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"]);
}

#[test]
fn from_env_names_the_missing_variable() {
    // The coordinator variable is required; this process has none (the test
    // harness never sets it), so creation fails at once naming it.
    if std::env::var_os("FLATMEM_COORDINATOR").is_some() {
        return;
    }
    let e = Communicator::from_env(&CommOptions::new()).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("FLATMEM_COORDINATOR"), "{}", e);
}

#[test]
fn local_group_on_threads() {
    for world_size in [1usize, 3] {
        ranks::on_threads(world_size, move |comm| {
            assert_eq!(comm.world_size(), world_size);
            exercise(&comm);
        });
    }
}

#[test]
fn bad_arguments_are_named() {
    let comms = Communicator::create_local(2, &ranks::options()).unwrap();
    let comm = &comms[0];
    let buffer = [0.0f32; 4];
    let e = comm.transfers(|t| t.isend(&buffer, 2, 0).map(|_| ())).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("peer"), "{}", e);
    // All-reduce lengths must agree (checked by the library before any message).
    let mut recv = [0.0f32; 3];
    let e = comm.all_reduce(&buffer, &mut recv, None).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    // u8 is a message dtype, not a summable one.
    let mut bytes = [0u8; 4];
    let e = comm.all_reduce_in_place(&mut bytes, None).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    let e = comm.barrier(Some(Duration::from_micros(10))).unwrap_err();
    assert!(e.message().contains("timeout"), "{}", e);
    assert!(comm.health().is_ok(), "argument errors do not poison");
    let e = Communicator::create_local(0, &CommOptions::new()).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("world_size"), "{}", e);
}

/// Rank 1 joins, passes a barrier, then is killed (SIGKILL, no goodbye).
/// Rank 0, waiting for a message from it, fails within its timeout with an
/// error naming rank 1; the communicator is then poisoned.
#[test]
fn killed_peer_is_named_within_the_timeout() {
    const TEST: &str = "killed_peer_is_named_within_the_timeout";
    const TIMEOUT: Duration = Duration::from_secs(5);
    if let Some(child) = ranks::child(TEST) {
        return killed_peer_child(child, TIMEOUT);
    }
    let outcomes = ranks::run(TEST, 2, |_| Vec::new());
    assert_eq!(outcomes[1].signal(), Some(9), "rank 1 should die of SIGKILL:\n{}", outcomes[1].output);
    ranks::assert_succeeded(TEST, &outcomes[..1]);
}

fn killed_peer_child(child: Child, timeout: Duration) {
    let comm = ranks::communicator_from_unique_id(&child);
    comm.barrier(None).unwrap();
    if child.rank == 1 {
        let _ = std::process::Command::new("kill").args(["-KILL", &std::process::id().to_string()]).status();
        std::thread::sleep(Duration::from_secs(30)); // not reached
        unreachable!("SIGKILL did not arrive");
    }
    let mut buffer = [0.0f32; 8];
    let start = Instant::now();
    let e = comm.recv(&mut buffer, 1, 3, Some(timeout)).unwrap_err();
    let took = start.elapsed();
    // PEER_FAILURE when UCX sees the connection reset, TIMEOUT at the
    // deadline otherwise; either way within it (plus scheduling slack) and
    // naming the dead rank.
    assert!(matches!(e.status(), Status::PeerFailure | Status::Timeout), "{}", e);
    assert!(e.message().contains("rank 1"), "{}", e);
    assert!(took < timeout + Duration::from_secs(2), "took {:?}: {}", took, e);
    assert_eq!(comm.health().unwrap_err().status(), e.status());
    let later = comm.barrier(None).unwrap_err();
    assert_eq!(later.status(), Status::CommPoisoned, "{}", later);
    comm.abort().unwrap();
    println!("rank 0 saw: {}", e);
    ranks::done(&child);
}
