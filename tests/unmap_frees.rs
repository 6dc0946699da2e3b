//! `Region::unmap` gives back everything the region held: it dropped the
//! region's fields by hand and left out its `Weak` of the object, so each
//! explicit unmap leaked the object's allocation (a drop did not). Counted
//! with a global allocator of this test binary's own.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use uffd_pager::{Pager, PAGE_SIZE};

/// Bytes allocated and not yet freed, by anyone in this process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: forwards every call to the system allocator unchanged; the
// counter is an atomic and allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Relaxed);
        // SAFETY: `p` came from `alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn an_unmapped_region_leaves_nothing_allocated() {
    let pager = Pager::builder().build().unwrap();
    let cycle = || {
        let r = pager.map_anonymous(PAGE_SIZE).unwrap();
        assert_eq!(r.as_slice()[7], 0);
        r.unmap().unwrap();
    };
    // (The first maps grow the engine's tables and per-thread caches.)
    for _ in 0..200 {
        cycle();
    }
    let before = LIVE.load(Relaxed);
    const N: isize = 2000;
    for _ in 0..N {
        cycle();
    }
    let grown = LIVE.load(Relaxed) - before;
    assert!(
        grown < 64 << 10,
        "{grown} bytes more allocated after {N} map/unmap cycles ({} per cycle)",
        grown / N
    );
}
