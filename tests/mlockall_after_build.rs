//! An application that calls `mlockall` after it built a pager locks the
//! engine's own staging areas too, where reclaim moves anonymous pages on
//! their way to swap, and `MADV_DONTNEED` fails on a locked mapping. The
//! slot was then never emptied: the next move into it failed with EEXIST
//! and was taken for a move that arrived, so another page's bytes went to
//! swap while the page itself stayed mapped and uncharged, and residency
//! grew past the budget without bound.
//!
//! `mlockall(MCL_FUTURE)` after the build locks the regions mapped later
//! but not the staging areas, and `UFFDIO_MOVE` refuses a move between a
//! locked and an unlocked mapping: no anonymous page of such a region
//! could be evicted.
//!
//! Checked in a child process (the test binary run again): `mlockall` is
//! process-wide.

#[path = "engine_util.rs"]
mod util;

use uffd_pager::{Counter, Pager};
use util::*;

const BUDGET: usize = 16;
const PAGES: usize = 64;

/// Child: writes every page of a region four times the budget, locks
/// everything (`UFFD_MLOCK=current`: after the region is mapped; `future`:
/// before, what is mapped from then on), writes and checks them all again
/// twice.
#[test]
fn child_evicts_after_mlockall() {
    if !is_child() {
        return;
    }
    let future = std::env::var("UFFD_MLOCK").as_deref() == Ok("future");
    let pager = Pager::builder()
        .budget_pages(BUDGET as u64)
        .build()
        .unwrap();
    if future {
        // SAFETY: mlockall has no memory-safety preconditions.
        let rc = unsafe { libc::mlockall(libc::MCL_FUTURE | libc::MCL_ONFAULT) };
        assert_eq!(rc, 0, "mlockall: {}", errno());
    }
    let r = pager.map_anonymous(PAGES * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let write = |round: u8| {
        for p in 0..PAGES {
            // SAFETY: inside the region.
            unsafe { std::ptr::write_volatile((base + p * PAGE) as *mut u8, round ^ p as u8) };
        }
    };
    write(1);
    if !future {
        // SAFETY: mlockall has no memory-safety preconditions; MCL_ONFAULT
        // populates nothing.
        let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_ONFAULT) };
        assert_eq!(rc, 0, "mlockall: {}", errno());
    }
    for round in 2..4u8 {
        write(round);
        for p in 0..PAGES {
            // SAFETY: inside the region.
            let b = unsafe { std::ptr::read_volatile((base + p * PAGE) as *const u8) };
            assert_eq!(b, round ^ p as u8, "page {p} in round {round}");
        }
    }
    let m = pager.memory_use();
    let s = pager.stats();
    println!(
        "RESULT anonymous {} KiB, ioctl_did_work {}",
        m.anonymous_bytes / 1024,
        s.get(Counter::IOCTL_DID_WORK)
    );
    assert_eq!(
        s.get(Counter::IOCTL_DID_WORK),
        0,
        "a full slot taken for a move"
    );
    assert!(
        m.anonymous_bytes <= (2 * BUDGET * PAGE) as u64,
        "residency past the budget: {} bytes",
        m.anonymous_bytes
    );
}

/// Runs the child test `name` with `envs`, `runs` times, as root only
/// (`mlockall` needs the privilege, or a memlock limit as large).
fn run_children(name: &str, envs: &[(&str, &str)], runs: usize) {
    if !is_root() {
        eprintln!("skipped: not root");
        return;
    }
    for _ in 0..runs {
        let out = run_child(name, envs);
        assert!(out.status.success(), "{envs:?}: {}", describe(&out));
    }
}

#[test]
fn eviction_after_the_applications_mlockall_keeps_the_budget() {
    for when in ["current", "future"] {
        run_children("child_evicts_after_mlockall", &[("UFFD_MLOCK", when)], 1);
    }
}

/// A pager of the budget, then `mlockall(MCL_FUTURE | MCL_ONFAULT)`:
/// every mapping made from then on is locked.
fn pager_then_lock_future() -> Pager {
    let pager = Pager::builder()
        .budget_pages(BUDGET as u64)
        .build()
        .unwrap();
    // SAFETY: mlockall has no memory-safety preconditions.
    let rc = unsafe { libc::mlockall(libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    assert_eq!(rc, 0, "mlockall: {}", errno());
    pager
}

/// Child: a shared region (writable, over a memory store) and a
/// kernel-mapped one mapped after `mlockall(MCL_FUTURE)`, each four times
/// the budget, read and written through twice: every byte right, and the
/// memfd bounded (the kernel refuses `MADV_DONTNEED` on a locked mapping).
#[test]
fn child_shared_pages_evict_after_mlockall() {
    if !is_child() {
        return;
    }
    use std::sync::Arc;
    use uffd_pager::store::MemoryStore;
    use uffd_pager::{InstallKind, MapOptions};
    let pager = pager_then_lock_future();
    let data = pattern_vec(5, PAGES * PAGE);
    for kernel_maps in [false, true] {
        let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        let opts = MapOptions {
            kind: Some(InstallKind::Shared),
            writable: !kernel_maps,
            kernel_maps,
            ..MapOptions::default()
        };
        // SAFETY: the store changes only through the region.
        let r = unsafe { pager.map_store(store, data.len(), &opts) }.unwrap();
        let base = r.as_ptr() as usize;
        for round in 0..2 {
            for p in 0..PAGES {
                // SAFETY: inside the region.
                let b = unsafe { std::ptr::read_volatile((base + p * PAGE + 7) as *const u8) };
                assert_eq!(
                    b,
                    data[p * PAGE + 7],
                    "page {p}, round {round}, {kernel_maps}"
                );
            }
        }
        let m = pager.memory_use();
        let s = pager.stats();
        println!(
            "RESULT kernel_maps {kernel_maps}: memfd {} KiB\n{s}",
            m.memfd_bytes / 1024
        );
        assert!(
            m.memfd_bytes <= (2 * BUDGET * PAGE) as u64,
            "kernel_maps {kernel_maps}: memfd {} bytes",
            m.memfd_bytes
        );
    }
}

#[test]
fn shared_eviction_after_the_applications_mlockall_keeps_the_budget() {
    run_children("child_shared_pages_evict_after_mlockall", &[], 1);
}

/// Child: an anonymous read-only region over a file on a disk (read into
/// the object's cache area, made after the `mlockall(MCL_FUTURE)`, so
/// locked) four times the budget, read through twice: every byte right,
/// and the cache area holds no more than the budget. Its copies of
/// evicted pages were freed with `MADV_DONTNEED`, which fails on a locked
/// mapping (found by review): it held 56–252 KiB for a budget of 64 in
/// ten runs (over it in seven), 0–28 KiB since.
#[test]
fn child_cache_area_after_mlockall() {
    if !is_child() {
        return;
    }
    use std::sync::Arc;
    use uffd_pager::store::{FileStore, FileStoreOptions};
    use uffd_pager::{InstallKind, MapOptions};
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mlockall-area-{}", std::process::id()));
    let data = pattern_vec(11, PAGES * PAGE);
    std::fs::write(&path, &data).unwrap();
    let store = FileStore::open(&path, &FileStoreOptions::default()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let pager = pager_then_lock_future();
    let opts = MapOptions {
        kind: Some(InstallKind::Anonymous),
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: nothing changes the store.
    let r = unsafe { pager.map_store(Arc::new(store), data.len(), &opts) }.unwrap();
    for round in 0..2 {
        for p in 0..PAGES {
            let at = p * PAGE + 5;
            assert_eq!(r.as_slice()[at], data[at], "page {p}, round {round}");
        }
    }
    let m = pager.memory_use();
    println!(
        "RESULT cache area {} KiB\n{}",
        m.cache_area_bytes / 1024,
        pager.stats()
    );
    assert!(
        m.cache_area_bytes <= (BUDGET * PAGE) as u64,
        "cache area {} bytes",
        m.cache_area_bytes
    );
}

#[test]
fn a_locked_cache_area_keeps_the_budget() {
    // Three times: the area outgrew the budget in seven runs of ten.
    run_children("child_cache_area_after_mlockall", &[], 3);
}
