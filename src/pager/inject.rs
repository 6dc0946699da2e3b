//! Test hooks on a pager (feature `fault-inject`): holding its locks as a
//! writer in the middle of `mmap` or `mprotect` would, so that the scripted
//! scenario tests can line faults up behind them.

use super::Pager;
use crate::region::Region;
use crate::sync::global_lock::WriteGuard;
use crate::vma::Vma;
use std::sync::Arc;

/// The global lock held for write; released on drop.
pub struct GlobalWriteHold<'a> {
    _global: WriteGuard<'a>,
}

/// The global lock held for write and one region write-locked, as a writer
/// in the middle of `mprotect` would; released on drop.
pub struct RegionWriteHold<'a> {
    // (Dropped before the global lock: no unmap can take the region's
    // last other reference meanwhile.)
    vma: Arc<Vma>,
    _global: WriteGuard<'a>,
}

impl Pager {
    /// Takes the global lock for write (`mmap_write_lock`): faults that
    /// fall back to it wait until the hold is dropped.
    pub fn hold_global_write(&self) -> GlobalWriteHold<'_> {
        GlobalWriteHold {
            _global: self.inner.mm.lock.write(),
        }
    }

    /// Threads asleep waiting to read-lock the global lock.
    pub fn global_readers_sleeping(&self) -> u32 {
        self.inner.mm.lock.readers_sleeping()
    }

    /// Whether an event waits to be applied: its reader waits for the
    /// event gate, which a fault or reclaim holds.
    pub fn events_waiting(&self) -> bool {
        self.inner.mm.events.pending()
    }

    /// Takes the global write lock and write-locks `region`'s first piece.
    /// Returns `None` if the region is not mapped by this pager.
    pub fn hold_region_write<'a>(&'a self, region: &Region) -> Option<RegionWriteHold<'a>> {
        let mm = &self.inner.mm;
        let g = mm.lock.write();
        let start = region.as_ptr() as usize;
        let vma = mm.table.read(|t| t.find(start).cloned())?;
        vma.lock.write_lock();
        Some(RegionWriteHold { vma, _global: g })
    }
}

impl Drop for RegionWriteHold<'_> {
    fn drop(&mut self) {
        self.vma.lock.write_unlock();
    }
}
