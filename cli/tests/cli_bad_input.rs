//! Bad input to the command line, as a read-only review found it: values
//! too large to run (before, panics on overflow, aborts, allocations of
//! 64 GiB, spins and sleeps without end), flags a workload would have
//! ignored, mistakes in where output or files go, a process that may not
//! start more threads, and standard output that cannot be written. Each
//! is exit 2 with a message before anything runs, or exit 1 with a message
//! for what fails while running; never a panic (101), an abort (134) or a
//! hang.

mod cli_util;

use cli_util::rejects;
use std::process::{Command, Output, Stdio};

const MAX: &str = "18446744073709551615";

fn describe(args: &[&str], o: &Output) -> String {
    format!(
        "{args:?}: {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn values_too_large_to_run_are_usage_errors() {
    for (args, needle) in [
        (&["bench", "swap", "--budget", MAX][..], "--budget"),
        (&["bench", "random", "--budget", MAX], "--budget"),
        (&["bench", "metadata", "--budget", MAX], "--budget"),
        (&["bench", "random", "--budget", "100000000"], "memory"),
        (&["bench", "populate-churn", "--shards", MAX], "--shards"),
        // (Counted into --ops before it was checked: a panic, exit 101.)
        (
            &["torture", "--duration", "1", "--threads", "4294967295"],
            "--threads",
        ),
        // Zeros nobody wrote check nothing (it reported PASS).
        (
            &["torture", "--kind", "anonymous", "--write-pct", "0"],
            "--write-pct",
        ),
        (
            &["torture", "--kind", "swapfile", "--write-pct", "0"],
            "--write-pct",
        ),
        (
            &["bench", "swap", "--delivery", "threads:100000"],
            "delivery",
        ),
        (
            &["bench", "swap", "--delivery", "threads:1:spin4294967295"],
            "delivery",
        ),
        (
            &["bench", "filemap", "--latency", "fixed:100s"],
            "--latency",
        ),
        // (The cap looked at an exponential model's mean: its draws reach
        // 37x it, 3.7 s here.)
        (
            &[
                "bench",
                "filemap",
                "--latency",
                "exp:100ms",
                "--duration",
                "10",
            ],
            "at most 1 s",
        ),
        (
            &["bench", "launch", "--think-scale", "4294967295"],
            "--think-scale",
        ),
        (&["bench", "swap", "--threads", "100000"], "at most"),
        // (A billion faults, an hour and a half, were accepted before.)
        (
            &[
                "bench",
                "metadata",
                "--pages",
                "1073741824",
                "--touch",
                "1073741824",
            ],
            "--touch",
        ),
        // (It started 5,000 threads before: only --pages bounded them.)
        (
            &[
                "torture",
                "--threads",
                "5000",
                "--pages",
                "20000",
                "--budget",
                "100",
            ],
            "is more than 1024",
        ),
        (
            &["torture", "--pages", "16777216", "--budget", "4"],
            "--pages",
        ),
        (
            &[
                "torture",
                "--page-size",
                "2M",
                "--pages",
                "65536",
                "--budget",
                "4",
            ],
            "--pages",
        ),
        (&["bench", "scale", "--passes", "1000"], "--passes"),
        (&["bench", "scale", "--few", "100", "--many", "2"], "--few"),
        (&["bench", "evict", "--passes", "1000"], "--passes"),
        (&["bench", "wakeup", "--passes", "1000"], "--passes"),
        (
            &[
                "bench",
                "far",
                "--store",
                "redis://127.0.0.1:1",
                "--io-spin-us",
                "5000",
            ],
            "--io-spin-us",
        ),
        // 8 GiB of 2 MiB pages (before, the 1048576 limit counted them
        // as 4 KiB pages: 2 TiB passed).
        (
            &[
                "bench",
                "far",
                "--store",
                "redis://127.0.0.1:1",
                "--page-size",
                "2M",
                "--pages",
                "4096",
            ],
            "--pages",
        ),
        (&["bench", "metadata", "--touch", "0"], "--touch"),
        // Before, taken as 16384.
        (
            &["bench", "scan", "--fault-around", "16385"],
            "--fault-around",
        ),
        (
            &[
                "bench",
                "swap",
                "--duration",
                "0.2",
                "--latency",
                "fixed:1s",
            ],
            "--latency",
        ),
        (&["bench", "scan", "--pages", "4503599627370496"], "--pages"),
    ] {
        rejects(args, needle);
    }
}

/// Physical memory in bytes.
fn phys_mem() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    pages as u64 * size as u64
}

/// Sizes that need more memory than the machine has are refused before
/// the run, with the check fault-cost, evict and torture use; before,
/// these started filling or faulting until the OOM killer came.
#[test]
fn sizes_past_the_memory_are_usage_errors() {
    // More than any machine has.
    let mut cases = vec![
        &[
            "bench",
            "filemap",
            "--pages",
            "16777216",
            "--budget",
            "0",
            "--threads",
            "1024",
        ][..],
        &["bench", "wakeup", "--faulters", "256", "--pages", "1048576"],
        &[
            "bench",
            "scale",
            "--page-size",
            "2M",
            "--faults",
            "10000000",
        ],
    ];
    // The sizes as found (64 GiB and more), where they do not fit.
    if phys_mem() < 64 << 30 {
        cases.extend([
            &["bench", "filemap", "--pages", "16777216"][..],
            &["bench", "swap", "--pages", "16777216"],
        ]);
    }
    if phys_mem() < 96 << 30 {
        cases.push(&["bench", "wakeup", "--faulters", "2", "--pages", "1048576"]);
    }
    for args in cases {
        rejects(args, "memory");
    }
}

/// A budget under two 2 MiB pages is refused in the units given; before,
/// the engine refused it while running, in 4 KiB pages (and filemap's
/// default budget, 512 KiB, was such a budget).
#[test]
fn a_budget_under_two_huge_pages_is_a_usage_error() {
    for w in ["filemap", "swap", "random", "metadata"] {
        rejects(
            &["bench", w, "--page-size", "2M", "--budget", "1"],
            "--budget 1 is under two 2 MiB pages",
        );
    }
    // (torture: before, exit 1 once the model was made and the file
    // written.)
    rejects(
        &[
            "torture",
            "--page-size",
            "2M",
            "--pages",
            "4",
            "--budget",
            "1",
        ],
        "--budget 1 is under two 2 MiB pages",
    );
}

/// A budget under four 4 KiB pages is refused in the units given: the
/// engine refuses it (one access may need four pages resident at once),
/// and the run failed with exit 1 once it had begun.
#[test]
fn a_budget_under_four_pages_is_a_usage_error() {
    for w in ["filemap", "swap", "random", "metadata"] {
        rejects(
            &["bench", w, "--budget", "3"],
            "--budget 3 is under 4 pages",
        );
    }
    rejects(
        &["torture", "--pages", "16", "--budget", "2"],
        "--budget 2 is under 4 pages",
    );
}

/// `random` and `scan` keep two files in tmpfs (random: its own and its
/// floor's, each 4x the budget; scan: its own and the kernel side's, each
/// --pages) and caches beside them. Only one file was checked, against
/// half the memory: sizes just under that were accepted, and the run
/// filled /dev/shm after gigabytes of writing (exit 1) or was OOM-killed.
#[test]
fn workload_files_past_tmpfs_or_memory_are_usage_errors() {
    let pages = phys_mem() / 4096;
    let scan = (pages * 45 / 100).min(1 << 24).to_string();
    let budget = (pages * 11 / 100).to_string();
    rejects(&["bench", "scan", "--pages", &scan], "scan's files");
    rejects(&["bench", "random", "--budget", &budget], "random's files");
}

/// A trace that is not a regular file, or is too large, is refused
/// before it is read: `/dev/zero` was read until the OOM killer came (14
/// GiB), and a FIFO without a writer blocked for ever.
#[test]
fn a_trace_that_is_no_regular_file_or_too_large_is_a_usage_error() {
    let dir = std::env::temp_dir().join(format!("uffd-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let big = dir.join("big");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(65 << 20).unwrap(); // (sparse)
    for (path, needle) in [
        ("/dev/zero", "not a regular file"),
        (fifo.to_str().unwrap(), "not a regular file"),
        (big.to_str().unwrap(), "a trace is at most"),
    ] {
        rejects(&["bench", "launch", "--trace", path], needle);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--baseline kernel` whose files would not fit on the disk is refused
/// before it writes them: it wrote at a gigabyte a second until the disk
/// was full (a 1 TiB `filemap`, a 16 TB `random`).
#[test]
fn baseline_files_larger_than_the_disk_are_a_usage_error() {
    for args in [
        &[
            "bench",
            "filemap",
            "--baseline",
            "kernel",
            "--policy",
            "retry-once",
            "--pages",
            "16777216",
            "--threads",
            "16",
            "--budget",
            "16",
        ][..],
        &[
            "bench",
            "random",
            "--baseline",
            "kernel",
            "--policy",
            "retry-once",
            "--budget",
            "1000000000",
        ],
    ] {
        rejects(args, "free on");
    }
}

#[test]
fn flags_a_workload_would_ignore_are_refused() {
    for (args, needle) in [
        (&["bench", "random", "--pages", "10"][..], "--pages"),
        // Engine settings the run never uses (before, taken and ignored;
        // given with their default values too).
        (&["bench", "random", "--readahead", "64"], "--readahead"),
        (&["bench", "random", "--readahead", "32"], "--readahead"),
        (
            &["bench", "populate-churn", "--readahead", "8"],
            "--readahead",
        ),
        (
            &["bench", "swap", "--fault-around", "128"],
            "--fault-around",
        ),
        (
            &["bench", "random", "--fault-around", "64"],
            "--fault-around",
        ),
        (
            &[
                "bench",
                "filemap",
                "--kind",
                "anonymous",
                "--fault-around",
                "16",
            ],
            "--fault-around",
        ),
        (
            &["bench", "scan", "--kernel-maps", "--fault-around", "16"],
            "--fault-around",
        ),
        (
            &["bench", "scan", "--page-size", "2M", "--fault-around", "16"],
            "--fault-around",
        ),
        (&["bench", "populate-churn", "--no-kswapd"], "--no-kswapd"),
        (
            &["bench", "swap", "--budget", "0", "--no-kswapd"],
            "--no-kswapd",
        ),
        (&["bench", "scan", "--threads", "2"], "--threads"),
        (&["bench", "launch", "--threads", "2"], "--threads"),
        (&["bench", "launch", "--pages", "10"], "--pages"),
        (&["bench", "launch", "--duration", "1"], "--duration"),
        (
            &["bench", "populate-churn", "--policy", "vanilla,retry-once"],
            "populate-churn",
        ),
        (&["bench", "swap", "--kind", "shared"], "--kind"),
        (&["bench", "swap", "--drain", "never"], "--drain"),
        (&["bench", "swap", "--shards", "2"], "--shards"),
        (&["bench", "swap", "--trace", "/etc/hostname"], "--trace"),
        (&["bench", "scan", "--noise", "1"], "--noise"),
        // Only filemap, swap and launch read a simulated store: the others
        // took the latency and ran as fast as without it.
        (
            &["bench", "random", "--max-inflight", "1"],
            "--max-inflight",
        ),
        (&["bench", "scan", "--latency", "fixed:1ms"], "--latency"),
        // The same given with their default values: taken and ignored.
        (&["bench", "random", "--latency", "fixed:50us"], "--latency"),
        (&["bench", "scan", "--max-inflight", "0"], "--max-inflight"),
        (&["bench", "filemap", "--launches", "10"], "--launches"),
        (&["bench", "filemap", "--shards", "1"], "--shards"),
        (
            &["bench", "swap", "--drain", "always,locked-only,never"],
            "--drain",
        ),
        (
            &[
                "bench",
                "random",
                "--baseline",
                "kernel",
                "--policy",
                "retry-once",
                "--latency",
                "fixed:50us",
            ],
            "--latency",
        ),
        (
            &["bench", "populate-churn", "--writer-pause-us", "5"],
            "--writer-pause-us",
        ),
        // Before, raised to 65536 pages without a word.
        (
            &["bench", "populate-churn", "--budget", "16"],
            "--budget applies to",
        ),
        (
            &[
                "bench",
                "filemap",
                "--store",
                "redis://127.0.0.1:1",
                "--latency",
                "fixed:10us",
            ],
            "--latency",
        ),
        (
            &[
                "bench",
                "scan",
                "--baseline",
                "kernel",
                "--policy",
                "retry-once",
                "--json",
            ],
            "--json",
        ),
        (
            &["bench", "filemap", "--policy", "vanilla,vanilla"],
            "twice",
        ),
        (&["bench", "filemap", "--threads", "2,2"], "twice"),
        // Before, the benches ran the one given twice once, silently.
        (
            &[
                "bench",
                "fault-cost",
                "--kind",
                "anonymous",
                "--kind",
                "anonymous",
            ],
            "--kind lists anonymous twice",
        ),
        (
            &[
                "bench",
                "fault-cost",
                "--delivery",
                "in-thread",
                "--delivery",
                "in-thread",
            ],
            "--delivery lists in-thread twice",
        ),
        (
            &["bench", "evict", "--kind", "shared", "--kind", "shared"],
            "twice",
        ),
        (
            &["bench", "wakeup", "--kind", "shared", "--kind", "shared"],
            "twice",
        ),
        (
            &["bench", "fault-cost", "--hop", "--delivery", "per-region"],
            "--hop",
        ),
        // Before, accepted and ignored: the install kind and the directory
        // of a region that has neither, the baseline's directory without
        // the baseline, and the shape of writers that do not run.
        (
            &["torture", "--kind", "anonymous", "--install", "anonymous"],
            "--install applies to --kind file only",
        ),
        (
            &["torture", "--kind", "swapfile", "--install", "shared"],
            "--install applies to --kind file only",
        ),
        (
            &["torture", "--kind", "anonymous", "--dir", "/tmp"],
            "--dir applies to",
        ),
        (
            &["bench", "random", "--baseline-dir", "/var/tmp"],
            "--baseline-dir applies to --baseline kernel only",
        ),
        (
            &["bench", "filemap", "--writer-pause-us", "5"],
            "filemap runs none",
        ),
        (
            &["bench", "swap", "--writers", "0", "--writer-burst-us", "5"],
            "swap runs none",
        ),
        // The scan runs with 4 KiB pages only: before, these were taken
        // and ignored.
        (
            &[
                "bench",
                "far",
                "--store",
                "redis://127.0.0.1:1",
                "--page-size",
                "2M",
                "--scan-pages",
                "5",
            ],
            "--scan-pages",
        ),
        (
            &[
                "bench",
                "far",
                "--store",
                "redis://127.0.0.1:1",
                "--page-size",
                "2M",
                "--readahead",
                "8",
            ],
            "--readahead",
        ),
    ] {
        rejects(args, needle);
    }
}

/// A refusal names the values as given and only ways out that exist;
/// before, torture suggested `--budget 0 or less` and `--pages 2^64-1 or
/// more`, swap echoed a --pages it had multiplied (saturating) and
/// divided again, and two hosts in a redis:// URL were taken for an
/// IPv6 address without brackets.
#[test]
fn messages_name_the_values_given_and_ways_that_exist() {
    let big = "36028797018963968";
    for (args, want, not) in [
        (
            &["torture", "--pages", "7", "--budget", "4"][..],
            "(use --pages 16 or more)",
            "--budget 0",
        ),
        (
            &["torture", "--budget", MAX],
            "(use --budget 1024 or less)",
            "or more",
        ),
        (
            &["bench", "swap", "--page-size", "2M", "--pages", big],
            "--pages 36028797018963968 must",
            "--pages 36028797018963967",
        ),
        (
            &["probe", "--store", "redis://127.0.0.1:6999,127.0.0.1:6998"],
            "nodes go in redis-cluster://",
            "brackets",
        ),
    ] {
        rejects(args, want);
        let err = String::from_utf8_lossy(&cli_util::run(args).stderr).into_owned();
        assert!(!err.contains(not), "{args:?}: {err}");
    }
}

/// `--baseline kernel` runs the accesses alone on files: flags for the
/// store, writers and noise would be ignored (before, filemap ran without
/// them and said nothing).
#[test]
fn flags_the_kernel_baseline_would_ignore_are_refused() {
    let base = ["--baseline", "kernel", "--policy", "retry-once"];
    for (flags, needle) in [
        (
            &["filemap", "--store", "redis://127.0.0.1:1"][..],
            "--store",
        ),
        (&["filemap", "--writers", "2"], "--writers"),
        (&["filemap", "--noise", "1"], "--noise"),
        (&["filemap", "--latency", "fixed:10us"], "--latency"),
        (&["filemap", "--max-inflight", "4"], "--max-inflight"),
        (&["random", "--writer-pause-us", "5"], "--writer-pause-us"),
        (&["scan", "--writer-burst-us", "5"], "--writer-burst-us"),
        (&["random", "--no-floor"], "--no-floor"),
    ] {
        let args = [&["bench"][..], flags, &base].concat();
        rejects(&args, needle);
    }
}

#[test]
fn where_files_and_output_go_is_checked_before_the_run() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let empty = dir.join("empty-trace.txt");
    std::fs::write(&empty, "# nothing\n").unwrap();
    let far = dir.join("far-trace.txt");
    std::fs::write(&far, format!("{MAX}\n")).unwrap();
    let slow = dir.join("slow-trace.txt");
    std::fs::write(&slow, "0 4294967295\n").unwrap();
    let a_dir = dir.join("a-directory.svg");
    std::fs::create_dir_all(&a_dir).unwrap();
    let (empty, far, slow, a_dir) = (
        empty.to_str().unwrap(),
        far.to_str().unwrap(),
        slow.to_str().unwrap(),
        a_dir.to_str().unwrap(),
    );
    let baseline_in = |dir| {
        let policy = ["--policy", "retry-once", "--budget", "16"];
        [
            &["bench", "random", "--baseline", "kernel"][..],
            &policy,
            &["--baseline-dir", dir],
        ]
        .concat()
    };
    for (args, needle) in [
        (&baseline_in("/nonexistent")[..], "not a directory"),
        (
            &["bench", "filemap", "--plot", "/nonexistent/x.svg"],
            "--plot",
        ),
        // Before, these ran the whole bench or demo first (exit 1 after).
        (&["bench", "filemap", "--plot", "/proc/x.svg"], "--plot"),
        // Before, SVG went into a .png.
        (&["bench", "filemap", "--plot", "x.png"], ".svg"),
        (&["bench", "swap", "--plot", a_dir], "--plot"),
        (&["bench", "filemap", "--plot", "/dev/full"], "--plot"),
        (&["demo", "--out-dir", "/proc/sys"], "--out-dir"),
        (&["demo", "--out-dir", "/etc/passwd"], "--out-dir"),
        (&baseline_in("/proc"), "--baseline-dir /proc"),
        // Before, exit 1 once the model was built.
        (&["torture", "--dir", "/proc"], "--dir /proc"),
        (
            &["torture", "--kind", "swapfile", "--dir", "/proc"],
            "--dir /proc",
        ),
        (&["bench", "launch", "--trace", empty], "no accesses"),
        (&["bench", "launch", "--trace", far], "page index"),
        (&["bench", "launch", "--trace", slow], "think"),
    ] {
        rejects(args, needle);
    }
}

/// Output that cannot be written is exit 1 with a message, as for every
/// other subcommand; before, `probe` and `bench scale|wakeup|far` panicked.
#[test]
fn output_that_cannot_be_written_is_an_error_not_a_panic() {
    for args in [
        &["probe"][..],
        &["probe", "--json"],
        &[
            "bench", "scale", "--few", "2", "--many", "4", "--faults", "64",
        ],
        &["bench", "wakeup", "--pages", "16", "--passes", "1"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(full))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", describe(args, &o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("writing output"),
            "{}",
            describe(args, &o)
        );
    }
}

/// A process that may start no more threads gets an error from every
/// workload that starts them (exit 1, the reason named); before, swap,
/// filemap and torture panicked, and torture then waited for ever for its
/// background thread.
#[test]
fn a_thread_that_cannot_start_is_an_error() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // Root is not held to RLIMIT_NPROC: run as nobody.
    let have = |tool: &str| Command::new(tool).arg("--help").output().is_ok();
    if !root || !have("setpriv") || !have("prlimit") {
        eprintln!("skipped: needs root (to become uid 65534), setpriv and prlimit");
        return;
    }
    let exe = std::env::temp_dir().join(format!("uffd-pager-nproc-{}", std::process::id()));
    std::fs::copy(env!("CARGO_BIN_EXE_uffd-pager"), &exe).unwrap();
    for args in [
        &["bench", "swap", "--threads", "100", "--duration", "1"][..],
        &["bench", "swap", "--writers", "100", "--duration", "1"],
        &["bench", "swap", "--noise", "100", "--duration", "1"],
        // (Its handlers start, and the faulters cannot: it hung.)
        &[
            "bench",
            "wakeup",
            "--faulters",
            "14",
            "--pages",
            "16",
            "--passes",
            "1",
        ],
        &[
            "bench",
            "filemap",
            "--threads",
            "100",
            "--duration",
            "1",
            "--policy",
            "vanilla",
        ],
        &[
            "torture",
            "--threads",
            "100",
            "--pages",
            "4096",
            "--budget",
            "64",
            "--ops",
            "100000",
            "--kind",
            "anonymous",
        ],
    ] {
        let o = Command::new("timeout")
            .arg("120")
            .arg("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["prlimit", "--nproc=40"])
            .arg(&exe)
            .args(args)
            .current_dir("/tmp")
            .output()
            .unwrap();
        // (Which thread fails first, a workload's or one of the pager's own,
        // depends on what else uid 65534 runs meanwhile.)
        assert_eq!(o.status.code(), Some(1), "{}", describe(args, &o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("starting "),
            "{}",
            describe(args, &o)
        );
    }
    let _ = std::fs::remove_file(&exe);
}
