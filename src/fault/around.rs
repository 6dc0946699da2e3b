//! Fault-around (`filemap_map_pages`): after a read fault on a shared
//! object, install the neighbouring pages that are already cached, in the
//! same aligned cluster, with one `UFFDIO_CONTINUE` per run of pages —
//! never waiting: a page that is locked, absent or mapped ends the run.

use crate::address_space::Mm;
use crate::page_cache::{LOCKED, MAPPED, PINNED, POISONED, READAHEAD, REFERENCED, UPTODATE};
use crate::stats::Counter::*;
use crate::sys::uffd::{MODE_DONTWAKE, MODE_WP};
use crate::sys::PAGE_SIZE;
use crate::vma::Vma;

/// Maps the cached neighbours of page `i` (already installed by the
/// caller) within its cluster of `mm.config.fault_around_pages`.
pub(super) fn map_pages(mm: &Mm, vma: &Vma, i: usize) {
    let n = mm.config.fault_around_pages;
    if n <= 1 {
        return;
    }
    let obj = &vma.object;
    let pages = vma.pages();
    let first = (i - i % n).max(pages.start);
    let last = (first + n).min(pages.end);
    let mode = MODE_DONTWAKE | if obj.tracks_writes() { MODE_WP } else { 0 };
    let pinned = if vma.pinned { PINNED } else { 0 };
    let mut j = first;
    while j < last {
        // Lock a run of cached, unmapped pages starting at `j`.
        let mut k = j;
        while k < last && k != i {
            let w = obj.cache.load(k);
            if w & (UPTODATE | MAPPED | LOCKED | POISONED) != UPTODATE {
                break;
            }
            match obj.cache.try_lock(k) {
                Ok(w) if w & (UPTODATE | MAPPED | POISONED) == UPTODATE => k += 1,
                Ok(_) => {
                    obj.cache.unlock(k, 0, 0);
                    break;
                }
                Err(_) => break,
            }
        }
        if k > j {
            let mapped = match obj
                .uffd(&mm.uffd)
                .cont(vma.addr_of(j), (k - j) * PAGE_SIZE, mode)
            {
                Ok(b) => (b as usize / PAGE_SIZE).min(k - j),
                Err(_) => 0,
            };
            for p in j..k {
                if p < j + mapped {
                    if obj.cache.load(p) & READAHEAD != 0 {
                        mm.counters.inc(RA_USED);
                    }
                    obj.cache.unlock(p, MAPPED | REFERENCED | pinned, READAHEAD);
                } else {
                    obj.cache.unlock(p, 0, 0);
                }
            }
            mm.counters.add(FAULT_AROUND, mapped as u64);
            mm.counters.add(PGINSTALL, mapped as u64);
        }
        j = k + 1;
    }
}
