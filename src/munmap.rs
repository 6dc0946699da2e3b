//! Unmapping a region and releasing its object: the engine's `munmap`
//! (detach, unregister, unmap every piece, as the kernel's
//! `do_vmi_munmap`), and the object's release when its last reference
//! goes (`remove_vma` → `fput`): dirty pages written back, the object kept
//! with its pages cached ([`crate::kept`]) or freed.

use crate::address_space::Mm;
use crate::error::Result;
use crate::object::{InstallKind, Object};
use crate::page_cache::{LRU_BATCHED, MAPPED, ON_LRU, PINNED, UPTODATE};
use crate::sys::mem::{madvise, mprotect, Mapping};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

impl Mm {
    /// Unmaps every piece of region `id`: detach, unregister, unmap, and
    /// release the object (writing back a shared object over a writable
    /// store).
    pub fn unmap(&self, id: u64, store: crate::kept::StoreKey) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        self.check_owner()?;
        // The application's own munmap of the region, all of it, was
        // applied and is being released: done before this returns, so the
        // store holds the region's writes then (see `crate::events::release`).
        self.events.wait_applied();
        self.kept.wait_for(store);
        // Hazard: the `madvise`, `mprotect` and `munmap` below act on
        // whatever is mapped at the address. The application's own
        // `munmap` of a piece returns once its event is read, and its
        // application waits for the write lock held here: the application
        // may have mapped its own memory there meanwhile (found by review:
        // it was made inaccessible and unmapped). So, as for the engine's
        // other calls on a region's range (`range_in_doubt`), while an
        // event may be on its way on a piece's descriptor the lock is let
        // go and the events waited for; bounded, then as before (as a
        // remap). What is left: an unmap and a new mapping both between
        // this look and the calls.
        let deadline = std::time::Instant::now() + crate::events::coming::SETTLE_PATIENCE;
        let (w, pieces) = loop {
            let w = self.lock.write();
            let pieces = self.pieces(id);
            pieces
                .iter()
                .for_each(|v| crate::inject::before_range_change(v));
            let doubt = pieces
                .iter()
                .any(|v| crate::events::coming::range_in_doubt(self, self.uffd_for(&v.object)));
            if !doubt || std::time::Instant::now() >= deadline {
                break (w, pieces);
            }
            drop((pieces, w));
            crate::events::coming::wait_for_any(self, deadline);
            self.events.wait_applied();
        };
        let mut objects = Vec::new();
        // Hazard: from the detach below until the region's dirty pages are
        // written (by this unmap, by the release of its object, or by the
        // holder that outlives it: see below), a map of the same store
        // would find the object neither kept nor listed as unwritten, read
        // the store's older bytes, and its own write-back would put them
        // back over this region's writes. So the store is marked as being
        // written, under the global lock (a map that starts after this
        // waits: `KeptObjects::wait_for`), until every object is released.
        // (One mark per piece: a region's pieces share its object.)
        let _writing: Vec<_> = pieces
            .iter()
            .filter(|v| v.object.kind == InstallKind::Shared && v.object.store_writes())
            .map(|v| self.kept.writing(v.object.store_key))
            .collect();
        for vma in &pieces {
            vma.lock.write_lock();
            vma.lock.mark_detached();
            let (s, e) = (vma.start, vma.end);
            self.table.update(|t| {
                let mut t = t.clone();
                t.dying.push((s, e));
                t
            });
            self.publish(std::slice::from_ref(vma), &[]);
            crate::inject::after_detach(vma);
            // Unregistered first, so that the munmap raises no event; made
            // inaccessible before that, so that an access racing the unmap
            // (a fault the unregister wakes, or one made between it and the
            // munmap) gets SIGSEGV, as on a plain mapping being unmapped,
            // and not a page the kernel makes up (zeros) once the range is
            // no longer registered.
            //
            // A shared region's PTEs are zapped first: mprotect then walks
            // empty page tables and flushes nothing, and the munmap has
            // nothing left to zap, so the range costs one zap and one flush
            // instead of a protection change of every PTE, its flush, and the
            // zap. (Its pages stay in the memfd; an access racing the zap
            // faults and is mapped again, or waits on the detached region.)
            // Shared objects are quiet, so the madvise raises no event.
            if vma.object.kind == InstallKind::Shared && vma.object.quiet {
                let _ = madvise(s, e - s, libc::MADV_DONTNEED);
            }
            let _ = mprotect(s, e - s, libc::PROT_NONE);
            let _ = self.uffd_for(&vma.object).unregister(s, e - s);
            // The dying range leaves the table before the range is freed:
            // another pager may map it next, and its faults must not find
            // this one's claim.
            self.table.update(|t| {
                let mut t = t.clone();
                t.dying.retain(|&r| r != (s, e));
                t
            });
            self.claims_dropped.fetch_add(1, SeqCst);
            // SAFETY: the region owned this range since `map`/`remap`.
            drop(unsafe { Mapping::from_raw(s, e - s) });
            vma.lock.write_unlock();
            let (first, end, _) = vma.window();
            vma.object.windows.replace(first, end, &[]);
            // (Only words that say MAPPED: see `give_up_pages`.)
            for i in first..end {
                if vma.object.cache.load(i) & MAPPED != 0 {
                    vma.object.cache.update(i, 0, MAPPED);
                }
            }
            objects.push(vma.object.clone());
        }
        drop(pieces);
        drop(w);
        // The region's own handler (per-region delivery) may have been
        // waiting for the global lock: tell it only now (it lingers while
        // the object holds its descriptor).
        let mut r = Ok(());
        objects.dedup_by(|a, b| Arc::ptr_eq(a, b));
        for obj in objects {
            if let (Some(p), Some(u)) = (self.per_region.get(), obj.region_uffd.get()) {
                if !self.maps_object(&obj) {
                    p.retire(u);
                }
            }
            // Another holder (a residency guard, a flush under way,
            // another region of the object) keeps it past this unmap, and
            // its dirty pages would be written when that one lets go: for
            // a guard, at its drop, which can only log a failure. This
            // unmap reports the write-back of the region's writes, so they
            // are written now. (Later writes through another region are
            // that region's.)
            if Arc::strong_count(&obj) > 1
                && obj.kind == InstallKind::Shared
                && obj.store_writes()
                && crate::unwritten::owes_pages(&obj)
            {
                let x = self.writeback_object(&obj, crate::writeback::Gate::Sections);
                if r.is_ok() {
                    r = x;
                }
            }
            let x = self.release_object(obj);
            if r.is_ok() {
                r = x;
            }
        }
        r
    }

    /// Drops a reference to `obj`; the last one writes dirty pages back
    /// and keeps the object cached ([`crate::kept`]) or releases it
    /// ([`Mm::release_now`]).
    ///
    /// Every holder of an `Arc<Object>` besides a region's VMAs (an unmap
    /// on its way, a [`ResidentGuard`](crate::ResidentGuard), a flush or a
    /// refresh) gives its reference back here, never by a plain drop: the
    /// application's own `munmap` may have removed the last VMA meanwhile,
    /// and then the holder's is the last reference. Dropped plainly, it
    /// would free the object with its pages charged, its dirty pages
    /// unwritten and its rmap slot still pointing at it. The count is
    /// checked and the reference dropped under one lock, so of two holders
    /// giving theirs back at once, one sees the other's gone. (A VMA is
    /// dropped only where its object lives on in a new VMA or in a
    /// reference given back here.)
    pub(crate) fn release_object(&self, obj: Arc<Object>) -> Result<()> {
        let Some(obj) = self.give_back_unless_last(obj) else {
            return Ok(());
        };
        // The only reference now: no VMA, kept list or holder has another,
        // so none can be made. Until `release_now` has taken it out of
        // the rmap, a panic (in the store's own code: `contents_stamp`,
        // `write`, `sync`) leaks it rather than freeing what the rmap
        // still points at.
        let obj = Unreleased(Some(obj));
        // Kept ([`crate::kept`]): a shared object, written back in full,
        // over a store someone else still holds (so it can be mapped
        // again), whose stamp has not moved since the object was made (its
        // pages are the store's: not even its own write-backs moved it),
        // with nothing pinned (a pinned page has left the LRU, and reclaim
        // would never free it), under a budget (without one there is no
        // LRU to reclaim kept pages from). Not with per-region delivery:
        // the object holds its region's own descriptor, whose reader
        // lingers until the object lets it go, and a new region registers
        // a descriptor of its own.
        let cap = self.config.keep_unmapped;
        let made = *obj.keep_stamp.lock().unwrap_or_else(|e| e.into_inner());
        // Not one of 2 MiB pages: its pages are the hugetlb pool's, which
        // only budget pressure would give back, while a live region or a
        // map of the same store waited for them in vain.
        let candidate = cap > 0
            && self.config.budget_pages > 0
            && obj.kind == InstallKind::Shared
            && !obj.is_huge()
            && self.per_region.get().is_none()
            && Arc::strong_count(&obj.store) > 1;
        // (Held to the end: a write-back that fails lists the object in
        // `release_now` below before a waiting map goes on.)
        let mut _keeping = None;
        if let (true, Some(made)) = (candidate, made) {
            // Its dirty pages are owed to the store: a map of the store
            // waits while they are written (`KeptObjects::writing`). A
            // failed write-back releases it, which tries once more and
            // reports the error.
            // (A page whose sync is in flight counts: a map's write-back
            // of the object held before may be mid-sync.)
            let owed = obj.store_writes() && crate::unwritten::owes_pages(&obj);
            _keeping = owed.then(|| self.kept.writing(obj.store_key));
            // (Noted as held before? A map of the store waits on the mark
            // from here: the note goes, or it would outlive the keeping.)
            self.unwritten.unhold(&obj);
            let written = self.writeback_object(&obj, crate::writeback::Gate::Held);
            let pinned = (0..obj.npages()).any(|i| obj.cache.load(i) & PINNED != 0);
            if written.is_ok() && !pinned && obj.store.contents_stamp() == Some(made) {
                let out = self.kept.keep(obj.take(), made, cap);
                return self
                    .release_each(out)
                    .unwrap_or_else(|p| std::panic::resume_unwind(p));
            }
            // A failed write-back's error is the caller's, whatever the
            // release's own try says: a failed sync may have lost pages
            // reclaim wrote before (the kernel reports a lost write-back
            // once), and the release's sync then succeeded, so the unmap
            // said Ok over lost pages (found by review). (A write that
            // fails and then succeeds in the release is reported too.)
            if let Err(e) = written {
                // (The release's own error, if any, is about the same
                // pages: theirs is listed as unwritten.)
                let _ = self.release_now(obj.take());
                return Err(e);
            }
        }
        self.release_now(obj.take())
    }

    /// [`release_now`](Self::release_now) of each of `objs` (objects the
    /// kept list let go): the first error, or the first panic (in the
    /// store's own code), once all are released. Hazard: unwound from the
    /// middle of the list, the panic dropped the objects after it plainly,
    /// still in the rmap and charged, where reclaim reaches them; so each
    /// release is caught, and the one that panicked is leaked (see
    /// `Unreleased`).
    pub(crate) fn release_each(&self, objs: Vec<Arc<Object>>) -> std::thread::Result<Result<()>> {
        let (mut r, mut panic) = (Ok(()), None);
        for obj in objs {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.release_now(obj))) {
                Ok(x) => r = r.and(x),
                Err(p) => {
                    panic.get_or_insert(p);
                }
            }
        }
        panic.map_or(Ok(r), Err)
    }

    /// The first step of [`release_object`](Self::release_object): drops
    /// `obj` if another reference is left, under the lock that orders two
    /// holders giving theirs back; returns it if it is the last. Cheap
    /// (a mutex, no store call; a walk of the region table and the
    /// object's state words only for an object no region maps): an unmap
    /// being applied gives back at once
    /// a reference that is not the last, so that the holder of the last
    /// one (a residency guard dropped next) releases the object itself
    /// ([`crate::events::release::Released::push`]).
    ///
    /// An object no region maps that another holder keeps owes its dirty
    /// pages to the store until that holder releases it: it is noted, so
    /// that a map of the store writes them first (`crate::unwritten`'s
    /// held objects). (The windows are read first: atomics, empty for an
    /// object no region maps, and for one cut into more pieces than it
    /// has windows for, which the table walk then finds. No store call: a
    /// page can be dirty only over a writable one.)
    pub(crate) fn give_back_unless_last(&self, obj: Arc<Object>) -> Option<Arc<Object>> {
        let _g = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
        // (A local declared after the guard: dropped before it, under the
        // lock, on an unwind too.)
        let obj = obj;
        if Arc::strong_count(&obj) == 1 {
            return Some(obj);
        }
        // Noted, and the reference dropped, under the lock: the holder's
        // release, which drops the note, comes after; and of two holders
        // giving theirs back at once, the second sees the first's gone.
        if obj.kind == InstallKind::Shared
            && obj.windows.is_empty()
            && !self.maps_object(&obj)
            && crate::unwritten::owes_pages(&obj)
        {
            self.unwritten
                .hold(obj.slot.load(Acquire), Arc::downgrade(&obj));
        }
        drop(obj);
        None
    }

    /// Writes `obj`'s dirty pages back, uncharges its resident pages and
    /// frees it: the caller's is the last reference but the rmap's. One
    /// whose write-back fails is kept with its dirty pages
    /// ([`crate::unwritten`]), and the error returned.
    pub(crate) fn release_now(&self, obj: Arc<Object>) -> Result<()> {
        // Until it is out of the rmap, a panic in the store's own code
        // (`write`, `sync`) leaks it rather than freeing what the rmap points
        // at (see `Unreleased`).
        let obj = Unreleased(Some(obj));
        // Dirty pages owed to the store: listed before the write starts
        // (`crate::unwritten`), so that a map over the store sees them
        // while it is in flight, and kept there if it fails. No mapping is
        // left to write them, so a page written is clean (see
        // `writeback_object`). Listed before the wait for pins below too:
        // a readahead run reading into the object holds one for as long
        // as its store call, and a map of the store meanwhile read the
        // store's older bytes. (A page reclaim is writing back now counts
        // as dirty, and so does one whose sync is in flight, by a map's
        // write-back of the object held before: it goes dirty again if
        // that sync fails. The list is tidied after the write-back.)
        let owed = obj.kind == InstallKind::Shared
            && obj.store_writes()
            && crate::unwritten::owes_pages(&obj);
        if owed {
            for i in 0..obj.npages() {
                if obj.cache.load(i) & MAPPED != 0 {
                    obj.cache.lock(i);
                    obj.cache.unlock(i, 0, MAPPED);
                }
            }
            self.unwritten.add(&obj);
        }
        // No region maps it any more: take it out of the rmap so reclaim
        // cannot reach it. (After it is listed: a map of its store finds
        // it through the rmap, as a held object, until then; see
        // `Mm::flush_unwritten`.)
        self.unwritten.unhold(&obj);
        let slot = obj.slot.load(Acquire);
        self.objects.remove(slot);
        let obj = obj.take();
        // Then wait for evictions and readahead already under way.
        obj.wait_unpinned();
        crate::inject::after_listed();
        let r = self.writeback_object(&obj, crate::writeback::Gate::Held);
        // No page of it goes to swap again.
        crate::discard::discard_swap_left(self, &obj);
        let (mut resident, mut on_lru) = (0, 0);
        for i in 0..obj.npages() {
            let w = obj.cache.load(i);
            if w & UPTODATE != 0 {
                resident += 1;
            }
            // Pages in the LRU proper (not in an add batch) are taken off it
            // under the LRU lock, a batch of 31 per acquisition
            // (`folios_put`); their ring entries go stale.
            if w & ON_LRU != 0 && w & LRU_BATCHED == 0 {
                if on_lru % crate::lru::BATCH == 0 {
                    self.lru.release_lock_once(slot, &self.counters);
                }
                on_lru += 1;
            }
        }
        self.uncharge(resident * obj.units());
        if owed {
            // (A flush of the list may have written it meanwhile and taken
            // it off: listed again if this write-back failed.)
            match r {
                Ok(()) => self.unwritten.remove_if_written(&obj),
                Err(_) => self.unwritten.add(&obj),
            }
        }
        r
    }
}

/// The last reference to an object but the rmap's, on its way to
/// [`Mm::release_now`] or the kept list: forgotten, not freed, if it is
/// dropped before it gets there (a panic unwinding past it), since the
/// rmap still holds the object by address.
struct Unreleased(Option<Arc<Object>>);

impl Unreleased {
    fn take(mut self) -> Arc<Object> {
        self.0.take().expect("taken once")
    }
}

impl std::ops::Deref for Unreleased {
    type Target = Arc<Object>;
    fn deref(&self) -> &Arc<Object> {
        self.0.as_ref().expect("taken only by `take`")
    }
}

impl Drop for Unreleased {
    fn drop(&mut self) {
        if let Some(obj) = self.0.take() {
            std::mem::forget(obj);
        }
    }
}
