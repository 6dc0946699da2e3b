//! Fault-injection points for the scripted scenario tests (feature
//! `fault-inject`). Without the feature every hook is an empty inline
//! function and costs nothing.

use crate::vma::Vma;

#[cfg(feature = "fault-inject")]
mod imp {
    use super::Vma;
    use std::sync::atomic::{AtomicUsize, Ordering::*};

    /// A hook: a plain function pointer, so calling it allocates nothing.
    pub type Hook = fn(&Vma);

    static AFTER_LOOKUP: AtomicUsize = AtomicUsize::new(0);
    static AFTER_DETACH: AtomicUsize = AtomicUsize::new(0);

    fn call(slot: &AtomicUsize, v: &Vma) {
        let p = slot.load(Acquire);
        if p != 0 {
            // SAFETY: only `set_*` store here, and they store valid `Hook`s.
            let f: Hook = unsafe { std::mem::transmute::<usize, Hook>(p) };
            f(v);
        }
    }

    /// Runs inside the lockless lookup, after the region is found and before
    /// it is read-locked. Set `None` to clear.
    pub fn set_after_lookup(h: Option<Hook>) {
        AFTER_LOOKUP.store(h.map_or(0, |f| f as usize), Release);
    }

    /// Runs in unmap after the region left the table and before it is
    /// unregistered and unmapped. Set `None` to clear.
    pub fn set_after_detach(h: Option<Hook>) {
        AFTER_DETACH.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn after_lookup(v: &Vma) {
        call(&AFTER_LOOKUP, v)
    }

    pub(crate) fn after_detach(v: &Vma) {
        call(&AFTER_DETACH, v)
    }
}

#[cfg(feature = "fault-inject")]
pub use imp::{set_after_detach, set_after_lookup, Hook};

#[cfg(feature = "fault-inject")]
pub(crate) use imp::{after_detach, after_lookup};

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_lookup(_: &Vma) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_detach(_: &Vma) {}

/// Holds the global lock for write and one region write-locked, as a
/// writer in the middle of `mprotect` would; released on drop.
#[cfg(feature = "fault-inject")]
pub struct RegionWriteHold<'a> {
    _global: crate::sync::global_lock::WriteGuard<'a>,
    vma: std::sync::Arc<Vma>,
}

#[cfg(feature = "fault-inject")]
impl crate::pager::Pager {
    /// Takes the global write lock and write-locks `region` (test hook).
    pub fn hold_region_write<'a>(&'a self, region: &crate::Region) -> RegionWriteHold<'a> {
        let mm = self.mm();
        let g = mm.lock.write();
        let start = region.as_ptr() as usize;
        let vma = mm
            .table
            .read(|t| t.find(start).cloned())
            .expect("region is mapped");
        vma.lock.write_lock();
        RegionWriteHold { _global: g, vma }
    }
}

#[cfg(feature = "fault-inject")]
impl Drop for RegionWriteHold<'_> {
    fn drop(&mut self) {
        self.vma.lock.write_unlock();
    }
}
