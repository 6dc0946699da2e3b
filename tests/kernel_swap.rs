//! The kernel swaps an anonymous region's pages out behind the engine's
//! back (system swap, under memory pressure; here `MADV_PAGEOUT`). A page
//! swapped out is still the application's: a swap entry, not a dropped
//! page. The engine's own faults over it (`prefault`, `populate`, a
//! residency guard) asked `mincore`, which says "not resident" for a page
//! in swap, took the page for one the application dropped, and discarded
//! it: the application's data read as zeros.
//!
//! Needs root (`swapon` of a swap file made for the test, removed after);
//! skipped with a line otherwise, or where the file system takes no swap
//! file.

#[path = "engine_util.rs"]
mod util;

use std::path::PathBuf;
use std::process::Command;
use uffd_pager::{Counter, Delivery, Pager};
use util::{is_root, pattern, PAGE};

/// A swap file in use for the test's life.
struct Swap(PathBuf);

impl Swap {
    fn on() -> Result<Swap, String> {
        let path = std::env::temp_dir().join(format!("uffd-swap-{}", std::process::id()));
        let run = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        run(Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", path.display()))
            .args(["bs=1M", "count=64", "status=none"]))?;
        let swap = Swap(path);
        run(Command::new("chmod").arg("600").arg(&swap.0))?;
        run(Command::new("mkswap").arg(&swap.0))?;
        run(Command::new("swapon").arg(&swap.0))?;
        Ok(swap)
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        // (swapoff can fail for a moment, ENOMEM, while the kernel is still
        // busy with the pages; it is tried again.)
        for _ in 0..50 {
            let off = Command::new("swapoff").arg(&self.0).output();
            if off.is_ok_and(|o| o.status.success()) {
                let _ = std::fs::remove_file(&self.0);
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!(
            "swapoff {} failed: the swap file stays on",
            self.0.display()
        );
    }
}

/// Whether the kernel holds the page at `addr` in swap
/// (`/proc/self/pagemap` bit 62).
fn swapped(addr: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, (addr / PAGE * 8) as u64).unwrap();
    u64::from_ne_bytes(b) & (1 << 62) != 0
}

/// A v1 memory cgroup of the test's, for its process's charges: emptied
/// (`memory.force_empty`) once the process has left it, which takes the
/// swapped-out pages out of the swap cache too, where `mincore` still
/// counted them resident.
struct Group(PathBuf);

impl Group {
    fn new() -> Option<Group> {
        let root = std::path::Path::new("/sys/fs/cgroup/memory");
        let dir = root.join(format!("uffd-swap-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(Group(dir))
    }

    /// Moves this process in (`true`) or back to the root group: pages
    /// are charged to the group of the process (its `mm`'s owner), not of
    /// the thread.
    fn enter(&self, inside: bool) {
        let dir = if inside {
            self.0.clone()
        } else {
            self.0.parent().unwrap().to_path_buf()
        };
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).unwrap();
    }

    fn empty(&self) {
        std::fs::write(self.0.join("memory.force_empty"), "1").unwrap();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // (Out first, in case a panic left the process inside.)
        let root = self.0.parent().unwrap().join("cgroup.procs");
        let _ = std::fs::write(root, std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn resident(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore writes one byte to `v`; the address is only queried.
    unsafe { libc::mincore(addr as *mut _, PAGE, &mut v) };
    v & 1 != 0
}

/// Every descriptor the process may open, taken (a lowered soft limit,
/// filled with `dup`s) until dropped.
struct Exhausted {
    fds: Vec<i32>,
    limit: libc::rlimit,
}

impl Exhausted {
    fn now() -> Exhausted {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes `limit`.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let low = libc::rlimit {
            rlim_cur: 256.min(limit.rlim_cur),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads `low`.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
        let mut fds = Vec::new();
        loop {
            // SAFETY: dup of standard input; each new descriptor is ours.
            let fd = unsafe { libc::dup(0) };
            if fd < 0 {
                assert_eq!(
                    std::io::Error::last_os_error().raw_os_error(),
                    Some(libc::EMFILE)
                );
                break;
            }
            fds.push(fd);
        }
        Exhausted { fds, limit }
    }
}

impl Drop for Exhausted {
    fn drop(&mut self) {
        for &fd in &self.fds {
            // SAFETY: our own descriptors, closed once.
            unsafe { libc::close(fd) };
        }
        // SAFETY: setrlimit reads the limit saved before.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.limit) };
    }
}

#[test]
fn pages_the_kernel_swapped_out_survive_the_engines_own_faults() {
    if !is_root() {
        eprintln!("skipped: swapon needs root");
        return;
    }
    let _swap = match Swap::on() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: no swap file here: {e}");
            return;
        }
    };
    let Some(group) = Group::new() else {
        eprintln!("skipped: no v1 memory cgroup");
        return;
    };
    const PAGES: usize = 64;
    // In-thread delivery: this thread's faults install the pages, so they
    // are charged to its group.
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut r = p.map_anonymous(PAGES * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    group.enter(true);
    for (i, b) in r.as_mut_slice().iter_mut().enumerate() {
        *b = pattern(7, i);
    }
    // SAFETY: advice on the region's own memory.
    let rc = unsafe { libc::madvise(base as *mut _, PAGES * PAGE, libc::MADV_PAGEOUT) };
    group.enter(false);
    assert_eq!(rc, 0);
    // The swap writes finish in the background: empty the group until
    // they have (a page under write-back stays in the swap cache).
    let in_swap_only = || {
        (0..PAGES)
            .filter(|&i| swapped(base + i * PAGE) && !resident(base + i * PAGE))
            .count()
    };
    for _ in 0..50 {
        group.empty();
        if in_swap_only() == PAGES {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // (As root, with swap on and the group emptied, the kernel leaves pages
    // in swap alone: a run where it left none tested nothing, and fails.)
    let out = in_swap_only();
    assert!(out > 0, "the kernel left no page in swap alone");
    // The engine's own faults over every page, in a process out of
    // descriptors (a server at its limit): the engine cannot open
    // `/proc/self/pagemap` then, and took every page for dropped.
    let fds = Exhausted::now();
    r.prefault(0, PAGES * PAGE).unwrap();
    drop(r.lock_resident(0, PAGES * PAGE).unwrap());
    drop(fds);
    let st = p.stats();
    assert_eq!(
        st.get(Counter::PAGE_DROPPED),
        0,
        "{out} pages in swap; {st}"
    );
    for (i, &b) in r.as_slice().iter().enumerate() {
        assert_eq!(b, pattern(7, i), "byte {i} ({out} pages had been in swap)");
    }
}
