//! `bench random --baseline kernel`: both sides run under one memory
//! cgroup limit and report; without cgroup access it is refused, not faked.

use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uffd-pager"));
    c.env_remove("RUST_LOG");
    c
}

const ARGS: [&str; 12] = [
    "bench",
    "random",
    "--policy",
    "retry-once",
    "--threads",
    "1",
    "--budget",
    "512",
    "--kind",
    "shared",
    "--duration",
    "0.5",
];

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn the_engine_and_the_kernel_run_under_the_same_limit() {
    if !is_root() || !std::path::Path::new("/sys/fs/cgroup").exists() {
        eprintln!("skipped: needs root and a memory cgroup");
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let o = bin()
        .args(ARGS)
        .args(["--baseline", "kernel", "--baseline-dir"])
        .arg(dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("limit 18 MiB (budget + 16 MiB)"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| engine") || l.starts_with("| kernel"))
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    for r in rows {
        let cells: Vec<&str> = r.split('|').map(str::trim).collect();
        let reads: f64 = cells[2].parse().unwrap_or_else(|_| panic!("{r}"));
        assert!(reads > 0.0, "{r}");
        assert_eq!(cells[9], "0", "mismatches in {r}");
        // Every side's memory was charged to its group.
        let peak: u64 = cells[8].parse().unwrap();
        assert!(peak > 0 && peak <= 18, "{r}");
    }
}

#[test]
fn without_a_disk_or_a_budget_it_is_refused() {
    let o = bin()
        .args(ARGS)
        .args(["--baseline", "kernel", "--baseline-dir", "/dev/shm"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tmpfs") || err.contains("cgroup"), "{err}");
    let o = bin()
        .args(["bench", "scan", "--baseline", "kernel"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn an_ordinary_user_is_refused_with_a_message() {
    if !is_root() || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipped: needs root (to become uid 65534) and setpriv");
        return;
    }
    // The binary may sit where uid 65534 cannot reach it: copy it.
    let exe = std::env::temp_dir().join(format!("uffd-pager-baseline-{}", std::process::id()));
    std::fs::copy(env!("CARGO_BIN_EXE_uffd-pager"), &exe).unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(ARGS)
        .args(["--baseline", "kernel", "--baseline-dir", "/var/tmp"])
        .current_dir("/")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&exe);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("needs root") || err.contains("cgroup"),
        "{err}"
    );
}
