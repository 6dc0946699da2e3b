//! Fault-around (`filemap_map_pages`): on a read fault on a shared object,
//! install the faulting page and the neighbouring pages that are already
//! cached, in the same aligned cluster, with one `UFFDIO_CONTINUE` per run
//! of pages — never waiting: a page that is locked, absent or mapped ends
//! the run.

use crate::address_space::Mm;
use crate::object::Object;
use crate::page_cache::{LOCKED, MAPPED, PINNED, POISONED, READAHEAD, UPTODATE};
use crate::stats::Counter::*;
use crate::sys::uffd::{MODE_DONTWAKE, MODE_WP};
use crate::sys::PAGE_SIZE;
use crate::vma::Vma;
use std::sync::atomic::Ordering::Relaxed;

/// Maps page `i` (cached, unmapped and locked by the caller) together
/// with its cached neighbours within its cluster of
/// `mm.config.fault_around_pages`, as `filemap_map_pages` maps the
/// faulting page with the rest: page `i` joins the run of neighbours it
/// sits in, so a sequential reader's fault costs one `UFFDIO_CONTINUE`.
/// Returns whether page `i` was mapped; the caller still unlocks it (and
/// installs it alone if not). Every other page is unlocked here.
///
/// `referenced` is what page `i` gets (`REFERENCED` for a page the fault
/// found cached, 0 for one it read or zero-filled itself, see
/// `finish_install`): the neighbours get the same, never more. Nobody
/// touched them; marked referenced while page `i` was not, they outlived
/// the one page the application used.
pub(super) fn map_pages(mm: &Mm, vma: &Vma, i: usize, referenced: u32) -> bool {
    let obj = &vma.object;
    let pages = vma.pages();
    let (first, last) = cluster(obj, i, mm.config.fault_around_pages.max(1), &pages);
    let mode = MODE_DONTWAKE | if obj.install_wp(false) { MODE_WP } else { 0 };
    let pinned = if vma.pinned { PINNED } else { 0 };
    let mut i_mapped = false;
    let mut j = first;
    while j < last {
        // Lock a run of cached, unmapped pages starting at `j` (page `i`
        // is locked already).
        let mut k = j;
        while k < last {
            if k == i {
                k += 1;
                continue;
            }
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
            // (An event-safe fill, as every install: `Events::fill`.)
            let uffd = mm.uffd_for(obj);
            let in_thread = mm.config.delivery.is_in_thread();
            let mapped = match mm.events.fill(in_thread, || {
                uffd.cont(vma.addr_of(j), (k - j) * PAGE_SIZE, mode)
            }) {
                Ok(b) => (b as usize / PAGE_SIZE).min(k - j),
                Err(_) => 0,
            };
            let mut around = 0;
            for p in j..k {
                if p == i {
                    i_mapped = p < j + mapped;
                    continue;
                }
                if p < j + mapped {
                    around += 1;
                    if obj.cache.load(p) & READAHEAD != 0 {
                        mm.counters.inc(RA_USED);
                    }
                    obj.cache.unlock(p, MAPPED | referenced | pinned, READAHEAD);
                } else {
                    obj.cache.unlock(p, 0, 0);
                }
            }
            mm.counters.add(FAULT_AROUND, around);
            mm.counters.add(PGINSTALL, around);
        }
        if (j..k).contains(&i) && i_mapped {
            // A sequential reader faults next at `k`, the first page after
            // `i` that this left unmapped.
            obj.fa_next.store(k, Relaxed);
        }
        j = k + 1;
    }
    i_mapped
}

/// How far a cluster grows for a sequential reader: up to this many times
/// the configured base.
pub const GROWTH: usize = 8;
const _: () = assert!(GROWTH >= 2, "a sequential cluster must be able to double");

/// The cluster to map around page `i`: `[first, last)` within `pages`.
///
/// A fault where the last cluster ended (a sequential reader) doubles the
/// cluster, up to [`GROWTH`] × `base`, and maps forward from `i`, as
/// readahead ramps its window up; any other fault falls back to the
/// aligned `base`-page cluster around `i` (the kernel's fixed
/// `fault_around_bytes` window). So a scan pays a signal per 512 pages
/// at most, and a random reader maps no more than before.
fn cluster(obj: &Object, i: usize, base: usize, pages: &std::ops::Range<usize>) -> (usize, usize) {
    let sequential = obj.fa_next.load(Relaxed) == i;
    if sequential {
        let w = (obj.fa_window.load(Relaxed) as usize).clamp(base, base * GROWTH / 2);
        let n = w * 2;
        obj.fa_window.store(n as u32, Relaxed);
        (i, (i + n).min(pages.end))
    } else {
        // Written only when it changes: a random reader's faults then leave
        // the object's line unwritten.
        if obj.fa_window.load(Relaxed) != base as u32 {
            obj.fa_window.store(base as u32, Relaxed);
        }
        let first = (i - i % base).max(pages.start);
        (first, (first + base).min(pages.end))
    }
}
