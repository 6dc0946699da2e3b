//! What a statistics snapshot says about residency while faults and
//! `reset_stats` run beside it.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};
use uffd_pager::Pager;
use util::*;

/// The peak a snapshot shows is at least the residency beside it. A
/// charge raises residency first and the peak after it, and a snapshot
/// between the two (or a `reset_stats` that stored a residency a charge
/// had just passed) showed residency above its own peak: about once in
/// 10⁴ looks here, while one thread faulted through a budget and another
/// looked and reset (found by review). Three seconds of that.
#[test]
fn a_snapshots_peak_is_never_below_its_residency() {
    let p = Pager::builder().budget_pages(64).build().unwrap();
    const PAGES: usize = 4096;
    let r = p.map_anonymous(PAGES * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    let (mut looks, mut below) = (0u64, Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3) {
                for pg in 0..PAGES {
                    // SAFETY: inside the region, alive for the scope.
                    unsafe { std::ptr::write_volatile((base + pg * PAGE) as *mut u8, 1) };
                }
            }
            stop.store(true, SeqCst);
        });
        while !stop.load(SeqCst) {
            let st = p.stats();
            looks += 1;
            if st.resident_pages > st.peak_resident_pages && below.len() < 4 {
                below.push((st.resident_pages, st.peak_resident_pages));
            }
            p.reset_stats();
        }
    });
    assert!(
        below.is_empty(),
        "(residency, peak) with the peak below, in {looks} looks: {below:?}"
    );
}
