//! A large region's page-state words are mapped lazily: a words page costs
//! memory only once written. Calls over the whole region that had nothing
//! to change in most words (making it writable again, the application's
//! own `munmap` of part of it) wrote every word all the same (a `lock
//! cmpxchg` is a write), and made the whole array resident: 16 MiB for a
//! 16 GiB region of which one page was touched.
//!
//! Measured in a child process (the test binary run again), from the
//! growth of its anonymous resident memory (`RssAnon`).

#[path = "engine_util.rs"]
mod util;

use uffd_pager::Pager;
use util::*;

const LEN: usize = 16 << 30;

/// Child: touches one page of a 16 GiB region, protects it, makes it
/// writable again and unmaps its upper half itself; prints the growth.
#[test]
fn child_whole_region_calls_on_a_large_region() {
    if !is_child() {
        return;
    }
    let pager = Pager::builder().build().unwrap();
    let r = pager.map_anonymous(LEN).unwrap();
    let base = r.as_ptr() as usize;
    // SAFETY: inside the region.
    unsafe { std::ptr::write_volatile(base as *mut u8, 1) };
    let before = rss_anon_kib();
    r.protect(false).unwrap();
    r.protect(true).unwrap();
    let protected = rss_anon_kib();
    // SAFETY: the upper half of the region, which the application may
    // unmap itself (the engine hears of it).
    assert_eq!(
        unsafe { libc::munmap((base + LEN / 2) as *mut libc::c_void, LEN / 2) },
        0
    );
    // (The unmap's event is applied by the event thread: measured once it
    // has been, or the growth would read 0 however large.)
    pager.flush_unmapped().unwrap();
    assert!(pager.stats().get(uffd_pager::Counter::EVENT_UNMAP) >= 1);
    let unmapped = rss_anon_kib();
    // SAFETY: inside what is left of the region.
    assert_eq!(unsafe { std::ptr::read_volatile(base as *const u8) }, 1);
    println!(
        "GROWTH protect {} KiB, munmap {} KiB",
        protected.saturating_sub(before),
        unmapped.saturating_sub(protected)
    );
}

#[test]
fn whole_region_calls_leave_untouched_words_alone() {
    let out = run_child("child_whole_region_calls_on_a_large_region", &[]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.find("GROWTH").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("{}", describe(&out)));
    let kib: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // 16 MiB of words for the region; a few pages of them at most now.
    assert!(
        kib.iter().all(|&k| k < 2048),
        "the calls made the region's words resident: {line}"
    );
}
