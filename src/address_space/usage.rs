//! What an address space holds and counts: its statistics and the memory
//! it holds ([`crate::MemoryUse`]), for reports, and the 2 MiB pages its
//! regions could give back to the pool, for maps. None of it is for the
//! fault path.

use super::Mm;
use crate::object::{InstallKind, Object};
use crate::stats::Stats;
use crate::vma::Vma;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

impl Mm {
    /// The 2 MiB pages of this address space's huge regions
    /// ([`HugeUse`]), for a map of another to check the pool against. One
    /// walk of the table and of each huge object's state words: for maps,
    /// not faults.
    pub fn huge_pages_use(&self) -> HugeUse {
        use crate::page_cache::{MAPPED, UPTODATE};
        // Asynchronous signals wait (on an application thread, before the
        // map blocks them itself): a handler that faulted in the read
        // section waited for an event whose publication waits for the
        // section to end (`signal_masks signals_during_a_huge_maps_count`).
        let _deferred = crate::sys::thread::Deferred::new();
        // Counted inside the read section, with no reference taken out of
        // it (see `memory_use`'s hazard).
        self.table.read(|t| {
            let mut seen: Vec<*const Object> = Vec::new();
            let mut u = HugeUse::default();
            for v in t.iter().filter(|v| v.object.is_huge()) {
                let obj: &Object = &v.object;
                if seen.contains(&(obj as *const Object)) {
                    continue;
                }
                seen.push(obj);
                *if v.pinned {
                    &mut u.pinned
                } else {
                    &mut u.unpinned
                } += obj.npages() as u64;
                // An anonymous object's page counts only where it is
                // mapped: one resident in its cache area alone (its
                // eviction could not write it to swap, or its install
                // found the pool empty) is ordinary memory.
                let held_if = match obj.kind {
                    InstallKind::Anonymous => UPTODATE | MAPPED,
                    InstallKind::Shared => UPTODATE,
                };
                u.held += (0..obj.npages())
                    .filter(|&i| obj.cache.load(i) & held_if == held_if)
                    .count() as u64;
            }
            u
        })
    }

    /// A statistics snapshot.
    pub fn stats(&self) -> Stats {
        // A charge raises residency first and the peak after it: a look in
        // between saw residency above the peak (and `reset_stats` may
        // store a residency a charge has since passed). The peak is at
        // least the residency it is shown with.
        let resident = self.resident.load(Relaxed);
        Stats::capture(
            &self.counters,
            self.lock.contention(),
            resident,
            self.peak_resident.load(Relaxed).max(resident),
            self.config.budget_pages,
        )
    }

    /// What the pager holds in memory now (see [`crate::MemoryUse`]).
    /// Walks the regions under the global lock's read side, as the
    /// kernel's `/proc/PID/smaps` walks VMAs under `mmap_lock`: maps and
    /// unmaps wait for the walk (a read of `/proc/self/pagemap` per
    /// anonymous region, one `fstat` per memfd, and each swap store's
    /// `Store::memory_bytes`). For
    /// reports, not for signal handlers, nor for a store's own methods: a
    /// fault may wait for those while an unmap waits for the fault, under
    /// the global lock's write side, which the walk would wait for.
    ///
    /// Hazard: the walk must not hold a reference to an object that an
    /// unmap could find still taken. It once cloned the objects out under
    /// RCU and measured them outside any lock; an unmap that ran meanwhile
    /// left the last reference to the report (`Mm::release_object`), so
    /// the unmap returned before its write-back, which then ran on the
    /// reporting thread with its error only logged
    /// (`tests/memory_report_race.rs`). Under the read lock no unmap runs,
    /// so the references are the regions' own, only borrowed.
    pub fn memory_use(&self) -> crate::MemoryUse {
        // An application handler that faulted under the read lock below
        // would wait for an event being applied, which waits for the
        // global lock's write side, which waits for this walk.
        let _deferred = crate::sys::thread::Deferred::new();
        let mut m = crate::MemoryUse {
            resident_pages: self.resident.load(Relaxed),
            budget_pages: self.config.budget_pages,
            metadata_bytes: self.lru.ring_bytes() as u64 + self.objects.resident_bytes(),
            buffer_bytes: self.io.resident_bytes() + self.reclaim.resident_bytes(),
            ..crate::MemoryUse::default()
        };
        let g = self.lock.read();
        // The table changes only under the global write lock: what the RCU
        // read section copies out stays mapped until `g` goes.
        let vmas: Vec<Arc<Vma>> = self.table.read(|t| t.iter().cloned().collect());
        let mut objects: Vec<&Object> = Vec::with_capacity(vmas.len());
        for vma in &vmas {
            if vma.object.kind == crate::object::InstallKind::Anonymous {
                // Not `mincore`: it counts the zero page's PTEs.
                let (start, len) = (vma.start, vma.end - vma.start);
                m.anonymous_bytes += crate::sys::pagemap::anonymous_bytes(start, len)
                    .unwrap_or_else(|| crate::sys::mem::resident(start, len));
            }
            objects.push(&vma.object);
        }
        objects.sort_unstable_by_key(|o| *o as *const Object as usize);
        objects.dedup_by_key(|o| *o as *const Object as usize);
        let mut add = |obj: &Object| {
            let (memfd, area, swap, state) = obj.memory();
            m.memfd_bytes += memfd;
            m.cache_area_bytes += area;
            m.swap_bytes += swap;
            m.metadata_bytes += state;
        };
        for obj in objects {
            add(obj);
        }
        // Objects kept after their last region went (`crate::kept`): no
        // region maps them, but their pages are resident and charged to
        // the budget. (Never one a region maps: a map takes it off the
        // list.)
        self.kept.for_each(&mut add);
        // Objects whose write-back failed (`crate::unwritten`): out of the
        // budget, but their pages are in memory until written.
        self.unwritten.for_each(&mut add);
        // The copied references go while the lock still keeps the regions
        // mapped: none of them can be the last.
        drop(vmas);
        drop(g);
        m
    }

    /// Zeroes counters, lock statistics and the peak.
    pub fn reset_stats(&self) {
        self.counters.reset();
        self.lock.reset_counters();
        self.peak_resident
            .store(self.resident.load(Relaxed), Relaxed);
        // (A charge between the load and the store raised the peak, which
        // the store then put back below residency.)
        self.peak_resident
            .fetch_max(self.resident.load(Relaxed), Relaxed);
    }
}

/// The 2 MiB pages of an address space's huge regions.
#[derive(Debug, Default, Clone, Copy)]
pub struct HugeUse {
    /// Pages of regions that are not pinned (reclaim may evict them).
    pub unpinned: u64,
    /// Pages of pinned regions (never evicted once faulted in).
    pub pinned: u64,
    /// Pages they hold now, taken from the pool.
    pub held: u64,
}
