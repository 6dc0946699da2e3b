//! Fault-injection points for the scripted scenario tests (feature
//! `fault-inject`). Without the feature every hook is an empty inline
//! function and costs nothing.

use crate::vma::Vma;

#[cfg(feature = "fault-inject")]
mod imp {
    use super::Vma;
    use std::sync::atomic::{AtomicUsize, Ordering::*};

    /// A hook: a plain function pointer, so calling it allocates nothing.
    pub type Hook = fn(&Site<'_>);

    /// The region a hook is called for.
    #[derive(Debug)]
    pub struct Site<'a>(&'a Vma);

    impl Site<'_> {
        /// The region's start address.
        pub fn start(&self) -> usize {
            self.0.start
        }

        /// Whether the region has been detached (taken out of the table by
        /// a writer), so a read lock on it now fails.
        pub fn is_detached(&self) -> bool {
            self.0.lock.is_detached()
        }
    }

    static AFTER_LOOKUP: AtomicUsize = AtomicUsize::new(0);
    static AFTER_DETACH: AtomicUsize = AtomicUsize::new(0);
    static AFTER_REPROTECT: AtomicUsize = AtomicUsize::new(0);

    fn call(slot: &AtomicUsize, v: &Vma) {
        let p = slot.load(Acquire);
        if p != 0 {
            // SAFETY: only `set_*` store here, and they store valid `Hook`s.
            let f: Hook = unsafe { std::mem::transmute::<usize, Hook>(p) };
            f(&Site(v));
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

    /// Runs in a remap once the range is registered again and given its
    /// protection back (`mprotect`), with the global and region locks
    /// still held for write. Set `None` to clear.
    pub fn set_after_reprotect(h: Option<Hook>) {
        AFTER_REPROTECT.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn after_reprotect(v: &Vma) {
        call(&AFTER_REPROTECT, v)
    }

    static BEFORE_RANGE_CHANGE: AtomicUsize = AtomicUsize::new(0);

    /// Runs in `Region::protect`, `Region::protect_in_kernel`, a quiet
    /// region's `dontneed`, `Region::lock_resident` (before its `mlock2`)
    /// and a region's unmap (for each piece), with the global lock held
    /// (and, in the first two, the region's for write), right before the
    /// call looks whether an event may have taken the region's range and
    /// then changes it. Set `None` to clear.
    pub fn set_before_range_change(h: Option<Hook>) {
        BEFORE_RANGE_CHANGE.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn before_range_change(v: &Vma) {
        call(&BEFORE_RANGE_CHANGE, v)
    }

    pub(crate) fn after_lookup(v: &Vma) {
        call(&AFTER_LOOKUP, v)
    }

    pub(crate) fn after_detach(v: &Vma) {
        call(&AFTER_DETACH, v)
    }

    /// A map hook: called with the mapping's length, returns an address
    /// to hint to the kernel (0: none). A plain function pointer.
    pub type MapHook = fn(usize) -> usize;

    static BEFORE_MAP: AtomicUsize = AtomicUsize::new(0);

    /// Runs in a map that has no fixed placement, with the global lock
    /// held for write, right before the kernel is asked for the range; its
    /// answer is passed to `mmap` as a hint (not `MAP_FIXED`). Set `None`
    /// to clear.
    pub fn set_before_map(h: Option<MapHook>) {
        BEFORE_MAP.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn before_map(len: usize) -> usize {
        let p = BEFORE_MAP.load(Acquire);
        if p == 0 {
            return 0;
        }
        // SAFETY: only `set_before_map` stores here, and it stores valid
        // `MapHook`s.
        let f: MapHook = unsafe { std::mem::transmute::<usize, MapHook>(p) };
        f(len)
    }

    static AFTER_LISTED: AtomicUsize = AtomicUsize::new(0);

    /// Runs in the release of an object's last region once the object is
    /// listed as owing its dirty pages to the store (`crate::unwritten`)
    /// and before its write-back starts. Set `None` to clear.
    pub fn set_after_listed(h: Option<fn()>) {
        AFTER_LISTED.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn after_listed() {
        call_plain(&AFTER_LISTED)
    }

    /// Calls the `fn()` in `slot`, if any.
    fn call_plain(slot: &AtomicUsize) {
        let p = slot.load(Acquire);
        if p != 0 {
            // SAFETY: only the `set_*` functions of `fn()` hooks store in
            // these slots, and they store valid `fn()`s.
            let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(p) };
            f();
        }
    }

    static AFTER_EVENT: AtomicUsize = AtomicUsize::new(0);

    /// Runs on the thread that applies the application's events, after
    /// each one is applied and before the next is read or applied (with
    /// the event gate held for write). Set `None` to clear.
    pub fn set_after_event(h: Option<fn()>) {
        AFTER_EVENT.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn after_event() {
        call_plain(&AFTER_EVENT)
    }

    static AFTER_PUBLISHED: AtomicUsize = AtomicUsize::new(0);

    /// Runs in a map once the new region is published (the application
    /// can unmap it) and before the map gives back its own reference to
    /// the region's object, with the region's start. Set `None` to clear.
    pub fn set_after_published(h: Option<fn(usize)>) {
        AFTER_PUBLISHED.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn after_published(start: usize) {
        call_with_addr(&AFTER_PUBLISHED, start)
    }

    /// Calls the `fn(usize)` in `slot`, if any, with `addr`.
    fn call_with_addr(slot: &AtomicUsize, addr: usize) {
        let p = slot.load(Acquire);
        if p != 0 {
            // SAFETY: only the `set_*` functions of `fn(usize)` hooks
            // store in these slots, and they store valid `fn(usize)`s.
            let f: fn(usize) = unsafe { std::mem::transmute::<usize, fn(usize)>(p) };
            f(addr);
        }
    }

    static BEFORE_OWN_RANGE: AtomicUsize = AtomicUsize::new(0);

    /// Runs in `Region::dontneed`, `populate`, `prefault` and
    /// `lock_resident` (both kinds) once the range was checked to be the
    /// region's own and before it is looked up by address, with no lock
    /// held, with the range's start. Set `None` to clear.
    pub fn set_before_own_range(h: Option<fn(usize)>) {
        BEFORE_OWN_RANGE.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn before_own_range(addr: usize) {
        call_with_addr(&BEFORE_OWN_RANGE, addr)
    }

    static BEFORE_MESSAGE: AtomicUsize = AtomicUsize::new(0);

    /// Runs in a handler thread (threads and per-region delivery) before
    /// it handles a fault message, with the fault's address and thread id.
    /// Set `None` to clear.
    pub fn set_before_message(h: Option<fn(usize, u32)>) {
        BEFORE_MESSAGE.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(crate) fn before_message(addr: usize, tid: u32) {
        let p = BEFORE_MESSAGE.load(Acquire);
        if p != 0 {
            // SAFETY: only `set_before_message` stores here, and it stores
            // valid `fn(usize, u32)`s.
            let f: fn(usize, u32) = unsafe { std::mem::transmute::<usize, fn(usize, u32)>(p) };
            f(addr, tid);
        }
    }

    static FAIL_REREGISTER: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// Makes the next remap's registration of the moved range fail with
    /// `ENOMEM`, as `UFFDIO_REGISTER` does at `vm.max_map_count`.
    pub fn fail_next_reregister() {
        FAIL_REREGISTER.store(true, Release);
    }

    pub(crate) fn reregister_fails() -> bool {
        FAIL_REREGISTER.swap(false, AcqRel)
    }

    static SKIP_REMAP_WAIT: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// Makes the next `Region::remap` go on without waiting for the
    /// pager's events on their way (as before it waited): for tests of
    /// what it does when it gives up waiting.
    pub fn skip_next_remap_wait() {
        SKIP_REMAP_WAIT.store(true, Release);
    }

    pub(crate) fn remap_waits() -> bool {
        !SKIP_REMAP_WAIT.swap(false, AcqRel)
    }

    static FAIL_REPROTECT: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// Makes the next remap's write protection of the moved range fail
    /// with `EAGAIN`, as it fails while an event is on its way on the
    /// region's descriptor.
    pub fn fail_next_reprotect() {
        FAIL_REPROTECT.store(true, Release);
    }

    pub(crate) fn reprotect_fails() -> bool {
        FAIL_REPROTECT.swap(false, AcqRel)
    }

    static FAIL_REMAP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Makes the next remap's `mremap` fail with `ENOMEM` before the
    /// kernel is asked, as it fails when a split would pass
    /// `vm.max_map_count`.
    pub fn fail_next_remap() {
        FAIL_REMAP.store(true, Release);
    }

    pub(crate) fn remap_fails() -> bool {
        FAIL_REMAP.swap(false, AcqRel)
    }
}

#[cfg(feature = "fault-inject")]
pub use imp::{
    fail_next_remap, fail_next_reprotect, fail_next_reregister, set_after_detach, set_after_event,
    set_after_listed, set_after_lookup, set_after_published, set_after_reprotect, set_before_map,
    set_before_message, set_before_own_range, set_before_range_change, skip_next_remap_wait, Hook,
    MapHook, Site,
};

#[cfg(feature = "fault-inject")]
pub(crate) use imp::{
    after_detach, after_event, after_listed, after_lookup, after_published, after_reprotect,
    before_map, before_message, before_own_range, before_range_change, remap_fails, remap_waits,
    reprotect_fails, reregister_fails,
};

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn before_map(_: usize) -> usize {
    0
}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_lookup(_: &Vma) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_detach(_: &Vma) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_listed() {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_published(_: usize) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_event() {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn after_reprotect(_: &Vma) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn before_message(_: usize, _: u32) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn before_range_change(_: &Vma) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn before_own_range(_: usize) {}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn reregister_fails() -> bool {
    false
}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn remap_fails() -> bool {
    false
}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn remap_waits() -> bool {
    true
}

#[cfg(not(feature = "fault-inject"))]
#[inline(always)]
pub(crate) fn reprotect_fails() -> bool {
    false
}
