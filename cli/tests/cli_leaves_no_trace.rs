//! What a run changes outside itself is put back when it ends: a kernel
//! setting it raised for the run; and what it made (a temporary file, a
//! memory cgroup and the processes in it, a Redis namespace) is removed
//! when SIGINT, SIGTERM, SIGHUP or SIGQUIT stops it, which ends it with
//! 128 + the signal's number.

mod cli_util;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

fn max_map_count() -> usize {
    std::fs::read_to_string(MAX_MAP_COUNT)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Puts `vm.max_map_count` back whatever the test saw.
struct PutBack(usize);

impl Drop for PutBack {
    fn drop(&mut self) {
        if max_map_count() != self.0 {
            let _ = std::fs::write(MAX_MAP_COUNT, self.0.to_string());
        }
    }
}

/// `bench scale` raises `vm.max_map_count` where it is too low for
/// `--many` regions (3 mappings each above 65536); before, the raised
/// value stayed after the run.
#[test]
fn scale_puts_max_map_count_back() {
    if !is_root() {
        eprintln!("skipped: needs root (to raise vm.max_map_count)");
        return;
    }
    let before = max_map_count();
    let _put_back = PutBack(before);
    let many = before.saturating_sub(65536) / 3 + 1;
    if many > 10_000 {
        eprintln!("skipped: vm.max_map_count is {before}, which --many {many} would need");
        return;
    }
    let many = many.max(2).to_string();
    let args = [
        "bench", "scale", "--few", "1", "--many", &many, "--faults", "64", "--passes", "1",
    ];
    let o = Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(max_map_count(), before, "{args:?} left it changed");
}

/// Starts `uffd-pager args`, waits (up to a minute) until `ready(pid)`
/// says what it makes is there, sends it `sig` and returns its exit code
/// with its pid (it must exit within a minute).
fn interrupt(args: &[&str], sig: i32, mut ready: impl FnMut(u32) -> bool) -> (u32, Option<i32>) {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "interrupt-{}-{}.stderr",
        std::process::id(),
        CALLS.fetch_add(1, Relaxed)
    ));
    let mut child = Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stderr = || std::fs::read_to_string(&log).unwrap_or_default();
    let pid = child.id();
    let t = Instant::now();
    while !ready(pid) {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("{args:?} ended ({st}) before it was ready:\n{}", stderr());
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?}: not ready after a minute:\n{}", stderr());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill has no memory preconditions; `pid` is our child, not
    // yet reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let err = stderr();
            let _ = std::fs::remove_file(&log);
            assert!(err.contains("stopped by"), "{args:?}: {st}\n{err}");
            return (pid, st.code());
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?}: still running a minute after signal {sig}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The entries of `dir` whose names start with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map_or_else(
        |_| Vec::new(),
        |d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        },
    )
}

/// The torture's file in `--dir` is gone after SIGTERM, SIGINT, SIGHUP (a
/// closed terminal) or SIGQUIT; before, only a destructor removed it,
/// which a signal skips, and SIGHUP and SIGQUIT still ended the run at
/// once until they were added.
#[test]
fn an_interrupted_torture_removes_its_file() {
    let signals = [
        (libc::SIGTERM, 143),
        (libc::SIGINT, 130),
        (libc::SIGHUP, 129),
        (libc::SIGQUIT, 131),
    ];
    for (sig, code) in signals {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("torture-{}-{sig}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let args = [
            "torture",
            "--pages",
            "4096",
            "--budget",
            "16",
            "--duration",
            "30",
            "--dir",
            dir.to_str().unwrap(),
        ];
        let file = |pid: u32| named(&dir, &format!("uffd-pager-torture-{pid}-"));
        let (_, got) = interrupt(&args, sig, |pid| !file(pid).is_empty());
        assert_eq!(got, Some(code));
        let left = named(&dir, "");
        assert!(left.is_empty(), "{args:?} left {left:?}");
        let _ = std::fs::remove_dir(&dir);
    }
}

/// The memory cgroups of `pid`'s kernel baseline, v1 or v2.
fn baseline_groups(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("uffd-pager-baseline-{pid}-");
    let mut v = named(Path::new("/sys/fs/cgroup/memory"), &prefix);
    v.extend(named(Path::new("/sys/fs/cgroup"), &prefix));
    v
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rsplit_once(") ").map(|(_, r)| r.chars().next());
        !matches!(state, Some(Some('Z' | 'X')))
    })
}

/// `bench random --baseline kernel` stopped by SIGTERM kills the side it
/// runs and removes its memory cgroup; before, the group (and the side
/// running in it) stayed.
#[test]
fn an_interrupted_kernel_baseline_removes_its_cgroup() {
    let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
    if !is_root() || !(v1 || v2) {
        eprintln!("skipped: needs root and a memory cgroup");
        return;
    }
    let dir = env!("CARGO_TARGET_TMPDIR");
    let args = [
        "bench",
        "random",
        "--baseline",
        "kernel",
        "--baseline-dir",
        dir,
        "--policy",
        "retry-once",
        "--budget",
        "512",
        "--duration",
        "30",
    ];
    let mut members = Vec::new();
    let (pid, code) = interrupt(&args, libc::SIGTERM, |pid| {
        let procs: Vec<i32> = baseline_groups(pid)
            .iter()
            .filter_map(|g| std::fs::read_to_string(g.join("cgroup.procs")).ok())
            .flat_map(|p| {
                p.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        let ready = !procs.is_empty();
        members = procs;
        ready
    });
    assert_eq!(code, Some(143));
    let left = baseline_groups(pid);
    assert!(left.is_empty(), "{args:?} left {left:?}");
    for m in members {
        assert!(!alive(m), "{args:?}: its side {m} still runs");
    }
}

/// `torture --store` stopped by SIGTERM deletes its namespace in Redis
/// (the object it filled; no writes, so nothing is written back while it
/// goes); before, the keys stayed. Against `UFFD_REDIS_URL` (default
/// `redis://127.0.0.1:6390`); `UFFD_SKIP_REDIS=1` skips it.
#[test]
fn an_interrupted_torture_deletes_its_redis_namespace() {
    let Some(url) = cli_util::redis_url() else {
        return;
    };
    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("{url}: {e} (are the servers up? `make redis-up`)"));
    let mut keys = |pid: u32| -> usize {
        redis::cmd("KEYS")
            .arg(format!("{{uffd-torture-{pid}-*"))
            .query::<Vec<String>>(&mut con)
            .unwrap()
            .len()
    };
    let args = [
        "torture",
        "--store",
        &url,
        "--pages",
        "4096",
        "--budget",
        "16",
        "--write-pct",
        "0",
        "--duration",
        "30",
    ];
    let (pid, code) = interrupt(&args, libc::SIGTERM, |pid| keys(pid) == 4096);
    assert_eq!(code, Some(143));
    assert_eq!(keys(pid), 0, "{args:?} left keys in Redis");
}
