//! Issue 14 item 3: every workload of the command line, with both install
//! kinds where it has them (and kernel-mapped shared regions), runs inside a memory cgroup whose limit is the
//! budget × 1.1, plus the engine's fixed overhead (its footprint and
//! [`FIXED_OVERHEAD`]), plus the workload's own data, without being
//! OOM-killed. The workload's data is what a real deployment keeps
//! outside the pager: the simulated stores and tmpfs pattern files (its
//! "disk", held in memory here), the torture's model of the expected
//! contents and its final snapshot, and the in-memory swap of writable anonymous regions (which
//! holds what was evicted and is not charged to the budget: see the
//! README's "A budget that bounds memory"). Needs root and a memory
//! cgroup controller; skipped otherwise, saying so.

use std::process::{Command, Output};
use uffd_pager::PAGE_SIZE;
use uffd_pager_cli::bench::kernel_baseline::FIXED_OVERHEAD;
use uffd_pager_cli::os::cgroup::MemCgroup;

const MIB: u64 = 1 << 20;

/// One run: its arguments, its budget and mapped pages (4 KiB), and the
/// bytes of the workload's own data.
struct Case {
    name: &'static str,
    args: Vec<String>,
    budget: u64,
    mapped: usize,
    data: u64,
}

fn pages(n: usize) -> u64 {
    (n * PAGE_SIZE) as u64
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let s = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let common = ["--duration", "1", "--policy", "retry-once"];
    // The two install kinds, and shared regions the kernel maps itself.
    for kind in ["shared", "anonymous", "kernel-maps"] {
        let anon = kind == "anonymous";
        let k: Vec<String> = if kind == "kernel-maps" {
            s(&["--kernel-maps"])
        } else {
            s(&["--kind", kind])
        };
        // Two threads' files of 2048 pages each, read only: nothing swaps.
        let mut a = s(&["bench", "filemap", "--threads", "2", "--pages", "2048"]);
        a.extend(s(&["--budget", "1024"]));
        a.extend(k.clone());
        a.extend(s(&common));
        v.push(Case {
            name: "filemap",
            args: a,
            budget: 1024,
            mapped: 4096,
            data: pages(4096),
        });
        // A file of 4 x the budget in tmpfs. Without the raw floor, which
        // holds a file and a budget of its own beside the engine's.
        let mut a = s(&["bench", "random", "--budget", "1024", "--no-floor"]);
        a.extend(k.clone());
        a.extend(s(&common));
        v.push(Case {
            name: "random",
            args: a,
            budget: 1024,
            mapped: 4096,
            data: pages(4096),
        });
        // A tmpfs file the budget holds, and a second one with the same
        // bytes that the kernel's own mapping reads. (Not of the anonymous
        // kind, which `scan` refuses: its passes would not be warm.)
        let mut a = s(&["bench", "scan", "--pages", "2048", "--budget", "4096"]);
        a.extend(k.clone());
        a.extend(s(&common));
        if !anon {
            v.push(Case {
                name: "scan",
                args: a,
                budget: 4096,
                mapped: 2048,
                data: 2 * pages(2048),
            });
        }
        // The shipped trace addresses 4096 pages (launch has no --pages).
        let mut a = s(&["bench", "launch", "--launches", "1", "--think-scale", "10"]);
        a.extend(s(&["--budget", "1024"]));
        a.extend(k.clone());
        a.extend(s(&["--policy", "retry-once"]));
        v.push(Case {
            name: "launch",
            args: a,
            budget: 1024,
            mapped: 4096,
            data: pages(4096),
        });
        // The model (a word per word), the final snapshot it is compared
        // with, and for anonymous memory its swap. (The torture writes: no
        // kernel-mapped run.)
        if kind == "kernel-maps" {
            continue;
        }
        let mut a = s(&[
            "torture", "--pages", "4096", "--budget", "1024", "--ops", "20000",
        ]);
        if anon {
            a.extend(s(&["--kind", "anonymous"]));
        } else {
            a.extend(s(&["--kind", "file", "--dir", "/var/tmp"]));
        }
        v.push(Case {
            name: "torture",
            args: a,
            budget: 1024,
            mapped: 4096,
            data: pages(4096) * if anon { 3 } else { 2 },
        });
    }
    // Anonymous by definition: its store, and its swap.
    let mut a = s(&["bench", "swap", "--pages", "4096", "--budget", "1024"]);
    a.extend(s(&common));
    v.push(Case {
        name: "swap",
        args: a,
        budget: 1024,
        mapped: 4096,
        data: pages(4096) * 2,
    });
    // (populate-churn takes no --budget: it holds a page per thread under
    // a budget that never evicts. Its cgroup is sized as for 1,024.)
    let mut a = s(&["bench", "populate-churn", "--threads", "2"]);
    a.extend(s(&common));
    v.push(Case {
        name: "populate-churn",
        args: a,
        budget: 1024,
        mapped: 1,
        data: 0,
    });
    v
}

/// Runs the command line with `args` in `g` from its first allocation on
/// (a shell joins the group, then `exec`s it).
fn run_in(g: &MemCgroup, args: &[impl AsRef<std::ffi::OsStr>]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec \"$0\" \"$@\"",
            g.procs_file().display()
        ))
        .arg(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running uffd-pager")
}

#[test]
fn every_workload_runs_in_a_cgroup_of_its_budget_and_overhead() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: memory cgroups need root");
        return;
    }
    for (n, c) in cases().into_iter().enumerate() {
        let f = uffd_pager::Footprint::of(c.mapped, c.budget).unwrap();
        let limit = pages(c.budget as usize) * 11 / 10
            + (f.state_bytes + f.lru_bytes) as u64
            + FIXED_OVERHEAD
            + c.data;
        let name = format!("uffd-pager-test-{}-{n}", std::process::id());
        let g = match MemCgroup::create(&name, limit) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let o = run_in(&g, &c.args);
        let st = g.stat();
        let what = format!(
            "{} ({}) in a {} cgroup of {:.1} MiB: peak {:.1} MiB, {} OOM kill(s), {:?}\nstdout: {}\nstderr: {}",
            c.name,
            c.args.join(" "),
            g.version(),
            limit as f64 / MIB as f64,
            st.peak_bytes as f64 / MIB as f64,
            st.oom_kills,
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        println!("{}", what.lines().next().unwrap_or_default());
        assert_eq!(st.oom_kills, 0, "{what}");
        assert_eq!(o.status.code(), Some(0), "{what}");
    }
}

/// The limit does bite: the same swap run in a cgroup without room for
/// its data is OOM-killed (so the test above is not passing for want of a
/// limit). 40 MiB is above what the command line's check before the run
/// counts (the store's 32 MiB and the budget's 4: see the next test) and
/// below what the run holds (its in-memory swap too).
#[test]
fn a_cgroup_without_room_for_the_data_kills() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: memory cgroups need root");
        return;
    }
    let name = format!("uffd-pager-test-{}-tight", std::process::id());
    let Ok(g) = MemCgroup::create(&name, 40 * MIB) else {
        eprintln!("skipped: no memory cgroup");
        return;
    };
    let o = run_in(
        &g,
        &[
            "bench",
            "swap",
            "--pages",
            "8192",
            "--budget",
            "1024",
            "--duration",
            "1",
        ],
    );
    let st = g.stat();
    assert!(
        st.oom_kills > 0 && !o.status.success(),
        "a 32 MiB store and its swap ran in 40 MiB: {o:?} {st:?}"
    );
}

/// A run whose data cannot fit under the limit of the cgroup it runs in
/// (here the parent's: the child allows more) is refused before it
/// starts, exit 2, with the limit in the message. Before, the check knew
/// only the machine's memory, and the run started and was OOM-killed.
#[test]
fn a_run_larger_than_its_cgroup_allows_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: memory cgroups need root");
        return;
    }
    let name = format!("uffd-pager-test-{}-refused", std::process::id());
    let Ok(parent) = MemCgroup::create(&name, 64 * MIB) else {
        eprintln!("skipped: no memory cgroup");
        return;
    };
    let child = MemCgroup::create(&format!("{name}/child"), 1024 * MIB).unwrap();
    // Exit 2, the limit named, and `also` in the message.
    let refused = |args: &[&std::ffi::OsStr], also: &str| {
        let o = run_in(&child, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        assert!(err.contains("memory cgroup allows 64 MiB"), "{err}");
        assert!(err.contains(also), "{err}");
    };
    fn os(v: &[&'static str]) -> Vec<&'static std::ffi::OsStr> {
        v.iter().map(|a| std::ffi::OsStr::new(*a)).collect()
    }
    // 65536 pages: the torture's model and region, about 512 MiB.
    refused(
        &os(&["torture", "--pages", "65536", "--budget", "1024"]),
        "",
    );
    // A launch trace addressing 256 MiB (its region lives in a memory
    // store): only the machine's memory was asked, and it was OOM-killed.
    let trace = std::env::temp_dir().join(format!("{name}-trace.txt"));
    std::fs::write(&trace, "65535\n").unwrap();
    let mut launch = os(&["bench", "launch", "--launches", "1", "--trace"]);
    launch.push(trace.as_os_str());
    refused(&launch, "");
    let _ = std::fs::remove_file(&trace);
    // A far scan of 256 MiB, which its region ends holding: refused
    // before the store is opened or filled (only --pages was asked).
    let far = ["bench", "far", "--store", "redis://127.0.0.1:1"];
    refused(
        &os(&[&far[..], &["--scan-pages", "65536"]].concat()),
        "--scan-pages 65536 needs",
    );
    // The metadata bench over 2^30 pages, touched 10^7 times: a page of
    // state words and a page table per touch, some 12 GiB, never asked.
    let metadata = [
        "bench",
        "metadata",
        "--pages",
        "1073741824",
        "--touch",
        "10000000",
    ];
    refused(&os(&metadata), "");
    assert_eq!(parent.stat().oom_kills + child.stat().oom_kills, 0);
}
