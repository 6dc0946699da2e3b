//! Memory cgroups for the kernel baseline: one made for a run, a limit
//! written to it, a process moved in, its statistics read back, and the
//! group removed. cgroup v2 (`memory.max`) where the unified hierarchy has
//! the memory controller, else v1 (`memory.limit_in_bytes`), as on this
//! project's machine kind. Needs root; without it [`MemCgroup::create`]
//! fails with a message.

use super::interrupt::{self, OnInterrupt};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A memory cgroup of this process's making; removed on drop, or with the
/// processes in it killed first if a signal ends the run
/// ([`interrupt`]).
#[derive(Debug)]
pub struct MemCgroup {
    dir: PathBuf,
    v2: bool,
    _on_interrupt: OnInterrupt,
}

/// What a cgroup's files said after a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemStat {
    /// Page faults charged to the group (`pgfault`).
    pub pgfault: u64,
    /// Major page faults (`pgmajfault`).
    pub pgmajfault: u64,
    /// Pages reclaimed: v2 `pgsteal`, v1 `pgpgout` (pages uncharged).
    pub reclaimed: u64,
    /// The most memory the group held (`memory.peak`, v1
    /// `memory.max_usage_in_bytes`).
    pub peak_bytes: u64,
    /// OOM kills in the group.
    pub oom_kills: u64,
}

fn read_keyed(path: &Path, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

fn read_num(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Where the memory controller's hierarchy is mounted, and whether it is
/// v2: v2 at `/sys/fs/cgroup` where the unified hierarchy has the memory
/// controller, else v1 at `/sys/fs/cgroup/memory`; `None` if neither.
fn controller() -> Option<(PathBuf, bool)> {
    let unified = Path::new("/sys/fs/cgroup/cgroup.controllers");
    let v2 =
        std::fs::read_to_string(unified).is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
    let (root, probe) = if v2 {
        (PathBuf::from("/sys/fs/cgroup"), "cgroup.procs")
    } else {
        (
            PathBuf::from("/sys/fs/cgroup/memory"),
            "memory.limit_in_bytes",
        )
    };
    root.join(probe).exists().then_some((root, v2))
}

/// The memory limit this process runs under: the smallest limit of its
/// memory cgroup and of the groups above it (v2 `memory.max`, v1
/// `memory.limit_in_bytes`), as the kernel enforces every one of them.
/// `None` where no group limits it, or where that cannot be read (no
/// controller mounted, a group outside this process's view).
pub fn own_memory_limit() -> Option<u64> {
    let (root, v2) = controller()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let ours = if v2 {
            id == "0" && ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == "memory")
        };
        ours.then(|| path.trim_start_matches('/').to_string())
    })?;
    let file = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    let mut limit: Option<u64> = None;
    let mut dir = Some(Path::new(rel.as_str()));
    while let Some(d) = dir {
        // "max" (v2) does not parse; v1 writes its "unlimited" as a number
        // near 2^63.
        let v = std::fs::read_to_string(root.join(d).join(file))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&v| v < 1 << 60);
        if let Some(v) = v {
            limit = Some(limit.map_or(v, |l| l.min(v)));
        }
        dir = d.parent();
    }
    limit
}

impl MemCgroup {
    /// Makes a group named `name` with `limit` bytes of memory (no swap on
    /// this machine kind; where there is swap, v2's `memory.swap.max` is
    /// set to 0 too).
    pub fn create(name: &str, limit: u64) -> Result<MemCgroup, String> {
        let (root, v2) = controller().ok_or(
            "no memory cgroup controller is mounted (cgroup v2 with memory, or v1 at /sys/fs/cgroup/memory)",
        )?;
        let dir = root.join(name);
        // Registered before the group exists: a signal that comes meanwhile
        // is handled before it is made.
        let on_interrupt = interrupt::on_interrupt({
            let dir = dir.clone();
            move || kill_and_remove(&dir)
        });
        std::fs::create_dir(&dir).map_err(|e| {
            format!(
                "creating the memory cgroup {} ({e}): the kernel baseline needs root",
                dir.display()
            )
        })?;
        let g = MemCgroup {
            dir,
            v2,
            _on_interrupt: on_interrupt,
        };
        let (file, value) = if v2 {
            ("memory.max", limit.to_string())
        } else {
            ("memory.limit_in_bytes", limit.to_string())
        };
        g.write(file, &value)?;
        if v2 && g.dir.join("memory.swap.max").exists() {
            g.write("memory.swap.max", "0")?;
        }
        Ok(g)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let p = self.dir.join(file);
        std::fs::write(&p, value).map_err(|e| format!("writing {value} to {}: {e}", p.display()))
    }

    /// Moves process `pid` (all its threads) into the group. Memory it
    /// charged before stays where it was charged.
    pub fn add(&self, pid: i32) -> Result<(), String> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The group's `cgroup.procs`: a process that writes its own pid there
    /// (say a shell, before it `exec`s the program to measure) runs in the
    /// group from its first allocation on.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The group's statistics now.
    pub fn stat(&self) -> MemStat {
        let stat = self.dir.join("memory.stat");
        if self.v2 {
            MemStat {
                pgfault: read_keyed(&stat, "pgfault"),
                pgmajfault: read_keyed(&stat, "pgmajfault"),
                reclaimed: read_keyed(&stat, "pgsteal"),
                peak_bytes: read_num(&self.dir.join("memory.peak")),
                oom_kills: read_keyed(&self.dir.join("memory.events"), "oom_kill"),
            }
        } else {
            MemStat {
                pgfault: read_keyed(&stat, "pgfault"),
                pgmajfault: read_keyed(&stat, "pgmajfault"),
                reclaimed: read_keyed(&stat, "pgpgout"),
                peak_bytes: read_num(&self.dir.join("memory.max_usage_in_bytes")),
                oom_kills: read_keyed(&self.dir.join("memory.oom_control"), "oom_kill"),
            }
        }
    }

    /// `v2` or `v1`, for reports.
    pub fn version(&self) -> &'static str {
        if self.v2 {
            "v2 memory.max"
        } else {
            "v1 memory.limit_in_bytes"
        }
    }
}

/// Kills the processes in the group at `dir` and removes it, for a run a
/// signal ends. A child forked but not yet in the group joins it a moment
/// later, and a killed process leaves it only once it is gone, so this
/// tries again for up to five seconds.
fn kill_and_remove(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace().filter_map(|p| p.parse().ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The processes run in it have exited; an empty group can go.
        let _ = std::fs::remove_dir(&self.dir);
    }
}
