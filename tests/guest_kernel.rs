//! Living inside someone else's process, the kernel's side
//! (`shared/design/guest.md`): the interrupted code's errno survives a
//! fault; a page the kernel unmapped behind the engine's back is mapped
//! again rather than faulting forever; an ioctl that reports an error
//! after doing its work does not lose the page.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};
use util::*;

/// Sets the calling thread's errno.
fn set_errno(e: i32) {
    // SAFETY: __errno_location points to this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Every faulting access in in-thread delivery runs the SIGBUS handler,
/// which makes syscalls (ioctls, reclaim's madvise, futex waits); the
/// interrupted code must find its errno as it left it.
#[test]
fn errno_survives_faults_in_thread() {
    with_deadline(60, "errno", || {
        let pager = Pager::builder()
            .delivery(Delivery::InThread)
            .budget_pages(64)
            .build()
            .unwrap();
        let pages = 1024;
        let mut anon = pager.map_anonymous(pages * PAGE).unwrap();
        let data = pattern_vec(9, 64 * PAGE);
        let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let shared = unsafe { pager.map_store(store, data.len(), &MapOptions::default()) }.unwrap();
        let mut changed = 0;
        for round in 0..2 {
            for p in 0..pages {
                let sentinel = 1000 + (p as i32 % 97);
                set_errno(sentinel);
                // A write fault (and, past the budget, direct reclaim).
                anon.as_mut_slice()[p * PAGE] = (p + round) as u8;
                if errno() != sentinel {
                    changed += 1;
                }
                set_errno(sentinel);
                let b = std::hint::black_box(shared.as_slice()[(p % 64) * PAGE + 1]);
                assert_eq!(b, data[(p % 64) * PAGE + 1]);
                if errno() != sentinel {
                    changed += 1;
                }
            }
        }
        assert!(pager.stats().get(Counter::PGFAULT) > 2 * pages as u64);
        assert_eq!(changed, 0, "faults changed errno");
    });
}

/// The kernel's reclaim (here `MADV_PAGEOUT`, as DAMON's pageout scheme
/// does on this machine) unmaps shared pages behind the engine's back: the
/// page stays in the memfd, the PTE goes. The next access must be mapped
/// again (`reinstall`), not answered "already installed" forever.
#[test]
fn pages_the_kernel_unmapped_are_mapped_again() {
    for d in DELIVERIES {
        with_deadline(60, "pageout", move || {
            let pager = pager(d);
            let data = pattern_vec(11, 64 * PAGE);
            let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let mut region =
                unsafe { pager.map_store(store, data.len(), &MapOptions::default()) }.unwrap();
            assert_bytes(region.as_slice(), &data, &format!("{d}: first read"));
            // Dirty a few pages too: their contents must survive.
            let mut want = data.clone();
            for p in (0..64).step_by(8) {
                region.as_mut_slice()[p * PAGE + 3] = 0xd1;
                want[p * PAGE + 3] = 0xd1;
            }
            for round in 0..3 {
                // SAFETY: advice only; the range is the region's own.
                let rc = unsafe {
                    libc::madvise(region.as_ptr().cast(), region.len(), libc::MADV_PAGEOUT)
                };
                assert_eq!(rc, 0, "MADV_PAGEOUT: {}", errno());
                assert_bytes(region.as_slice(), &want, &format!("{d}: round {round}"));
            }
            assert!(
                pager.stats().get(Counter::REINSTALL) > 0,
                "{d}: the kernel unmapped nothing? {}",
                pager.stats()
            );
        });
    }
}

/// With the default install kind the application's own
/// `madvise(MADV_DONTNEED)` on a shared region drops PTEs and keeps the
/// data, as on a file mapping.
#[test]
fn shared_dontneed_by_the_application_keeps_data() {
    for d in DELIVERIES {
        with_deadline(60, "shared dontneed", move || {
            let pager = pager(d);
            let data = pattern_vec(12, 32 * PAGE);
            let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let mut region =
                unsafe { pager.map_store(store, data.len(), &MapOptions::default()) }.unwrap();
            region.as_mut_slice()[5 * PAGE] = 0x42;
            let mut want = data.clone();
            want[5 * PAGE] = 0x42;
            // SAFETY: the range is the region's own; DONTNEED on a shared
            // mapping drops PTEs only.
            let rc =
                unsafe { libc::madvise(region.as_ptr().cast(), region.len(), libc::MADV_DONTNEED) };
            assert_eq!(rc, 0);
            assert_bytes(region.as_slice(), &want, &format!("{d}: after DONTNEED"));
        });
    }
}

/// Eviction takes an anonymous page out of the mapping with `UFFDIO_MOVE`.
/// This kernel's MOVE can return EEXIST after it moved the page when the
/// source PTE changes during the move (`shared/tools/uffd-move-eexist.c`:
/// a write that replaces a zero-page PTE). Here, over and over: a page is
/// dropped (never-written memory again), read (a zero-page install), and
/// then evicted by one thread while another writes it after a varying
/// delay. Every write must be read back and no page may be poisoned; the
/// count of ioctls that did their work despite the error shows the race
/// was met.
#[test]
fn eviction_survives_a_move_that_reports_eexist_after_moving() {
    with_deadline(300, "move eexist", || {
        let pager = Pager::builder()
            .delivery(Delivery::InThread)
            .budget_pages(64)
            .kswapd(false)
            .readahead(0, 1)
            .build()
            .unwrap();
        let mut region = pager.map_anonymous(PAGE).unwrap();
        let base = region.as_ptr() as usize;
        let go = std::sync::atomic::AtomicU64::new(0);
        let done = std::sync::atomic::AtomicU64::new(0);
        let cycles = 50_000u64;
        std::thread::scope(|sc| {
            sc.spawn(|| {
                // The two racing threads on different CPUs, where there are two.
                pin_to_cpu(1);
                for k in 1..=cycles {
                    // Spinning keeps this CPU busy and ready; the event
                    // reader applies the DONTNEED on the writer's CPU while
                    // the writer waits in it.
                    while go.load(Ordering::Acquire) < k {
                        std::hint::spin_loop();
                    }
                    // The first pass clears the page's referenced bit, the
                    // second evicts it: a MOVE of its zero-page PTE.
                    pager.reclaim_pages(1);
                    pager.reclaim_pages(1);
                    done.store(k, Ordering::Release);
                }
            });
            pin_to_cpu(0);
            for k in 1..=cycles {
                region.dontneed(0, PAGE).unwrap();
                // SAFETY: inside the region; volatile byte accesses.
                let z = unsafe { std::ptr::read_volatile(base as *const u8) };
                assert_eq!(z, 0, "cycle {k}: not zero after DONTNEED");
                go.store(k, Ordering::Release);
                for _ in 0..(k % 97) * 13 {
                    std::hint::spin_loop();
                }
                let v = (k as u8) | 1;
                // SAFETY: as above.
                unsafe { std::ptr::write_volatile(base as *mut u8, v) };
                while done.load(Ordering::Acquire) < k {
                    std::thread::yield_now();
                }
                // SAFETY: as above.
                let r = unsafe { std::ptr::read_volatile(base as *const u8) };
                assert_eq!(r, v, "cycle {k}: lost write");
            }
        });
        let s = pager.stats();
        assert_eq!(s.get(Counter::POISONED), 0, "{s}");
        assert!(
            s.get(Counter::PGSTEAL) > cycles / 2,
            "too few evictions: {s}"
        );
        eprintln!(
            "evictions {} ioctl_did_work {}",
            s.get(Counter::PGSTEAL),
            s.get(Counter::IOCTL_DID_WORK)
        );
    });
}

/// Pins the calling thread to CPU `cpu` modulo the CPUs there are.
fn pin_to_cpu(cpu: usize) {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity
    // only read and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % n, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn region_dontneed(base: usize, pages: usize) {
    // SAFETY: the region's own range; its pages read as zeros afterwards.
    let rc = unsafe { libc::madvise(base as *mut libc::c_void, pages * PAGE, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0);
}

/// An anonymous page the application dropped with its own
/// `madvise(MADV_DONTNEED)` reads as zeros afterwards, whether it was
/// installed, cached or swapped out at the time, as on a plain mapping.
#[test]
fn anonymous_dontneed_by_the_application_reads_zeros() {
    for d in DELIVERIES {
        with_deadline(60, "anon dontneed", move || {
            let pager = Pager::builder()
                .delivery(d)
                .budget_pages(32)
                .build()
                .unwrap();
            let pages = 256;
            let mut region = pager.map_anonymous(pages * PAGE).unwrap();
            for p in 0..pages {
                region.as_mut_slice()[p * PAGE + 11] = 0xab;
            }
            // Most pages are swapped out now, the last ones installed.
            region_dontneed(region.as_ptr() as usize, pages);
            for p in 0..pages {
                assert_eq!(region.as_slice()[p * PAGE + 11], 0, "{d}: page {p}");
            }
            let _ = InstallKind::Anonymous;
        });
    }
}
