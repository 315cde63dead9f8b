//! Drop destroys the handle: the crate's live-handle count returns to zero
//! and the worker threads the handle started are joined (counted in
//! /proc/self/task). One test in its own binary, so that no other test's
//! threads or handles come and go meanwhile.

use flatmem::{live_handles, Contrastive, Features, Options};

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

/// The thread count once it has settled at `expected`, or what it is after
/// two seconds. A joined thread can stay listed in /proc/self/task for a
/// moment: the kernel wakes the joiner (clearing the thread id) before it
/// releases the task, so an exact count read right after a join races.
fn threads_settled_at(expected: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let now = threads_now();
        if now == expected || std::time::Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn resident_kib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn use_once(h: &mut Contrastive) {
    let q: Vec<f32> = (0..64 * 16).map(|i| (i % 7) as f32 / 7.0).collect();
    let f = Features::f32(&q, 64, 16);
    let out = h.forward(f, f, None, 5.0).unwrap();
    h.backward(f, f, None, 5.0, &out, 1.0).unwrap();
}

#[test]
fn drop_destroys_the_handle() {
    assert_eq!(live_handles(), 0);
    let before = threads_now();

    let mut h = Options::new().threads(4).build().unwrap();
    assert_eq!(live_handles(), 1);
    assert_eq!(threads_settled_at(before + 3), before + 3, "a 4-thread handle starts 3 workers");
    use_once(&mut h);
    drop(h);
    assert_eq!(live_handles(), 0);
    assert_eq!(threads_settled_at(before), before, "workers still running after drop");

    // A failed construction leaves nothing behind.
    assert!(Options::new().threads(100_000).build().is_err());
    assert_eq!(live_handles(), 0);
    assert_eq!(threads_settled_at(before), before);

    // Many handles with workspaces: threads and memory come back.
    for _ in 0..20 {
        let mut h = Options::new().threads(3).build().unwrap();
        use_once(&mut h);
    }
    let rss = resident_kib();
    for _ in 0..300 {
        let mut h = Options::new().threads(3).tiles(32, 32).build().unwrap();
        use_once(&mut h);
    }
    assert_eq!(live_handles(), 0);
    assert_eq!(threads_settled_at(before), before);
    let grown = resident_kib().saturating_sub(rss);
    eprintln!("resident memory growth over 300 handles: {} KiB", grown);
    assert!(grown < 8 * 1024, "resident memory grew by {} KiB over 300 handles", grown);

    // Handles dropped on another thread than the one that made them.
    let handles: Vec<Contrastive> = (0..4).map(|_| Options::new().threads(2).build().unwrap()).collect();
    assert_eq!(live_handles(), 4);
    std::thread::spawn(move || drop(handles)).join().unwrap();
    assert_eq!(live_handles(), 0);
    assert_eq!(threads_settled_at(before), before);
}
