//! An anonymous page whose swap write fails is kept in its object's cache
//! area. The area is made on first use, and it was first used after the
//! page had left the mapping: where it could not be made (ENOMEM), the
//! page could only go home, which an event on its way refuses (any
//! application `munmap` of another anonymous region, unread), and it was
//! lost in a retired staging slot: its next fault read zeros. The area is
//! now made before the page leaves the mapping.
//!
//! One test in its own binary: it lowers the process's `RLIMIT_AS` for a
//! moment.

#[path = "engine_util.rs"]
mod util;

#[path = "held_reader.rs"]
mod held;

#[path = "gated_store.rs"]
mod gated;

use gated::{Gated, Held};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use uffd_pager::store::{MemoryStore, Store};
use uffd_pager::{Counter, Delivery, Pager};
use util::PAGE;

/// This process's virtual size (`VmSize`), in bytes.
fn vm_size() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmSize")
        * 1024
}

fn set_as_limit(bytes: u64) {
    let l = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain rlimit of this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &l) }, 0);
}

#[test]
fn a_page_whose_swap_write_fails_is_kept_when_memory_runs_short() {
    const LEN: usize = 64 << 20;
    let swap = Arc::new(Gated::new(vec![0; LEN], Held::FailingWrites));
    let first = AtomicBool::new(true);
    let made = swap.clone();
    // SAFETY: each store is made for one region and changed only by the
    // engine (the gated one's bytes are never kept).
    let builder = unsafe {
        Pager::builder()
            .delivery(Delivery::InThread)
            .readahead(0, 1)
            .fault_around(0)
            .kswapd(false)
            .budget_pages(64)
            .swap_to(move |len| {
                Ok(if first.swap(false, SeqCst) {
                    made.clone() as Arc<dyn Store>
                } else {
                    Arc::new(MemoryStore::new(len as u64)?)
                })
            })
    };
    let p = builder.build().unwrap();
    let a = p.map_anonymous(LEN).unwrap();
    let b = p.map_anonymous(PAGE).unwrap();
    let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
    // SAFETY: the region's own first page.
    unsafe { std::ptr::write_volatile(pa as *mut u8, 0x5a) };
    let _held = held::hold(held::thread_named("uffd-events"));
    std::thread::scope(|s| {
        // The eviction of the written page: moved out, its swap write waits.
        let evictor = s.spawn(|| p.reclaim_pages(1));
        swap.until_a_call_waits(|| evictor.is_finished());
        // The application unmaps the other region itself: its event waits
        // unread (the reader is held), so a page could not go home now.
        let unmapper = s.spawn(move || {
            // SAFETY: region `b`'s range, given up by the test.
            unsafe { libc::munmap(pb as *mut libc::c_void, PAGE) }
        });
        std::thread::sleep(Duration::from_millis(100));
        // No room for the 64 MiB cache area from here on (8 MiB of room
        // for anything else: a thread that starts now, malloc).
        set_as_limit(vm_size() + (8 << 20));
        swap.open_after(Duration::ZERO);
        let evicted = evictor.join().unwrap();
        set_as_limit(libc::RLIM_INFINITY);
        held::HOLD.store(false, SeqCst);
        assert_eq!(unmapper.join().unwrap(), 0, "munmap");
        assert_eq!(evicted, 0, "the swap write failed: nothing was evicted");
    });
    assert!(p.stats().get(Counter::IO_ERROR) >= 1, "{}", p.stats());
    // SAFETY: the region's own first page.
    let seen = unsafe { std::ptr::read_volatile(pa as *const u8) };
    assert_eq!(seen, 0x5a, "the page whose swap write failed was lost");
    drop(b);
}
