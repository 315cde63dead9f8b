//! Multi-process tests: a test spawns its own test binary once per rank
//! (`current_exe() <test> --exact`), with `FLATMEM_TEST_CHILD=<test>` and the
//! rank in the environment, over UCX on loopback; the child runs the same
//! test function, which sees [`child`] return its rank and does that rank's
//! part. Every child has a hard deadline: past it, all are killed and the
//! test fails with their output. No fixed ports: unique ids (port 0) or a
//! port the kernel just handed out.
//!
//! Also the threaded twin: [`on_threads`] runs one closure per rank of
//! [`Communicator::create_local`], each on its own thread, with the same
//! deadline.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use flatmem::{CommOptions, Communicator, UniqueId};

const CHILD_TEST: &str = "FLATMEM_TEST_CHILD";
const CHILD_RANK: &str = "FLATMEM_TEST_CHILD_RANK";
const CHILD_WORLD: &str = "FLATMEM_TEST_CHILD_WORLD";
const CHILD_DIR: &str = "FLATMEM_TEST_CHILD_DIR";

/// How long a whole multi-rank test may take before it is killed.
pub const DEADLINE: Duration = Duration::from_secs(40);

/// Deadlines inside a rank: every communicator wait, and creation.
pub fn options() -> CommOptions {
    CommOptions::new().timeout(Duration::from_secs(10)).connect_timeout(Duration::from_secs(15))
}

/// What a child process knows: its rank, the world size and a directory
/// shared by the ranks of this run.
pub struct Child {
    pub rank: usize,
    pub world_size: usize,
    pub dir: PathBuf,
}

/// `Some` in a child spawned by [`run`] for `test`, `None` in the parent.
pub fn child(test: &str) -> Option<Child> {
    if std::env::var(CHILD_TEST).ok().as_deref() != Some(test) {
        return None;
    }
    let number = |key: &str| std::env::var(key).unwrap().parse::<usize>().unwrap();
    Some(Child {
        rank: number(CHILD_RANK),
        world_size: number(CHILD_WORLD),
        dir: PathBuf::from(std::env::var(CHILD_DIR).unwrap()),
    })
}

/// How a rank's process ended.
pub struct Outcome {
    pub status: ExitStatus,
    pub output: String,
}

impl Outcome {
    /// The signal that killed it, if one did.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.signal()
    }
}

fn run_dir(test: &str) -> PathBuf {
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, Ordering::SeqCst);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flatmem-ranks").join(format!(
        "{}-{}-{}",
        test,
        std::process::id(),
        n
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Spawns `world_size` processes of this test binary running `test` (rank
/// r with `env(r)` added), waits for all within [`DEADLINE`] (else kills
/// them and panics with their output) and returns how each ended.
pub fn run(test: &str, world_size: usize, env: impl Fn(usize) -> Vec<(String, String)>) -> Vec<Outcome> {
    let dir = run_dir(test);
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for rank in 0..world_size {
        let log = dir.join(format!("rank{}.log", rank));
        let out = fs::File::create(&log).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_TEST, test)
            .env(CHILD_RANK, rank.to_string())
            .env(CHILD_WORLD, world_size.to_string())
            .env(CHILD_DIR, &dir)
            // UCX on loopback only; flatmem reports failures as statuses.
            .env("UCX_TLS", "tcp,self")
            .env("UCX_NET_DEVICES", "lo")
            .env("UCX_WARN_UNUSED_ENV_VARS", "n")
            .env_remove("FLATMEM_COMM_TIMEOUT_MS")
            // Only what the test passes says who is who.
            .env_remove("FLATMEM_RANK")
            .env_remove("FLATMEM_WORLD_SIZE")
            .env_remove("FLATMEM_COORDINATOR")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        for (key, value) in env(rank) {
            cmd.env(key, value);
        }
        children.push((cmd.spawn().unwrap(), log));
    }
    let start = Instant::now();
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; world_size];
    while statuses.iter().any(Option::is_none) {
        for (n, (child, _)) in children.iter_mut().enumerate() {
            if statuses[n].is_none() {
                statuses[n] = child.try_wait().unwrap();
            }
        }
        if start.elapsed() > DEADLINE {
            for (child, _) in children.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let logs: Vec<String> =
                children.iter().map(|(_, log)| fs::read_to_string(log).unwrap_or_default()).collect();
            panic!(
                "{}: the ranks overran the {:?} deadline and were killed; output:\n{}",
                test,
                DEADLINE,
                logs.join("\n---\n")
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    children
        .iter()
        .zip(statuses)
        .map(|((_, log), status)| Outcome {
            status: status.unwrap(),
            output: fs::read_to_string(log).unwrap_or_default(),
        })
        .collect()
}

/// Asserts that every rank's process exited successfully (printing all
/// outputs otherwise), and that each really ran its part (the child prints
/// a line saying so: a filter matching no test would also exit 0).
pub fn assert_succeeded(test: &str, outcomes: &[Outcome]) {
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert!(
            outcome.status.success() && outcome.output.contains(&done_line(rank)),
            "{}: rank {} ended with {} without finishing its part; output:\n{}",
            test,
            rank,
            outcome.status,
            outcome.output
        );
    }
}

fn done_line(rank: usize) -> String {
    format!("flatmem-test: rank {} done", rank)
}

/// A child calls this when its part passed.
pub fn done(child: &Child) {
    println!("{}", done_line(child.rank));
}

/// Rank 0 makes a unique id and publishes it (hex, in the run directory);
/// the others wait for it (at most 15 s). Then every rank creates its
/// communicator from it.
pub fn communicator_from_unique_id(child: &Child) -> Communicator {
    let path = child.dir.join("unique_id.hex");
    let id = if child.rank == 0 {
        let id = UniqueId::new(Some("127.0.0.1:0")).unwrap();
        let tmp = child.dir.join("unique_id.tmp");
        fs::write(&tmp, id.to_hex()).unwrap();
        fs::rename(&tmp, &path).unwrap(); // atomic: readers see all or nothing
        id
    } else {
        let start = Instant::now();
        loop {
            if let Ok(hex) = fs::read_to_string(&path) {
                break UniqueId::from_hex(&hex).unwrap();
            }
            assert!(start.elapsed() < Duration::from_secs(15), "rank 0 never published its unique id");
            thread::sleep(Duration::from_millis(10));
        }
    };
    Communicator::new(child.rank, child.world_size, &id, &options()).unwrap()
}

/// Runs `body(communicator)` on every rank of `world_size` processes over
/// UCX, bootstrapped from a unique id: in the parent (the test itself) it
/// spawns the ranks and asserts that each succeeded; in a rank spawned for
/// `test` it runs that rank's part.
pub fn on_processes(test: &str, world_size: usize, body: impl FnOnce(&Communicator)) {
    if let Some(child) = child(test) {
        let comm = communicator_from_unique_id(&child);
        assert_eq!((comm.rank(), comm.world_size()), (child.rank, world_size));
        body(&comm);
        return done(&child);
    }
    let outcomes = run(test, world_size, |_| Vec::new());
    assert_succeeded(test, &outcomes);
}

/// Runs `body(communicator)` for each rank of an in-process group of
/// `world_size`, one thread per rank, and fails when a thread panics or the
/// threads overrun [`DEADLINE`] (then they are left behind: the test fails).
pub fn on_threads<F>(world_size: usize, body: F)
where
    F: Fn(Communicator) + Send + Sync + Clone + 'static,
{
    let comms = Communicator::create_local(world_size, &options()).unwrap();
    let (tx, rx) = mpsc::channel();
    for comm in comms {
        let (tx, body) = (tx.clone(), body.clone());
        thread::spawn(move || {
            let rank = comm.rank();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(comm)));
            let _ = tx.send((rank, result.err().map(|e| panic_text(&*e))));
        });
    }
    drop(tx);
    let start = Instant::now();
    for _ in 0..world_size {
        let left = DEADLINE.checked_sub(start.elapsed()).unwrap_or_default();
        let (rank, failure) =
            rx.recv_timeout(left).unwrap_or_else(|_| panic!("the rank threads overran the {:?} deadline", DEADLINE));
        if let Some(text) = failure {
            panic!("rank {} (thread) failed: {}", rank, text);
        }
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-text panic)".to_string())
}
