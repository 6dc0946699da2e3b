//! Writers on the address space: map, unmap, remap, protect, dontneed.
//! Each takes the global lock for write and write-locks every region it
//! touches, as the kernel's `mmap_write_lock` + `vma_start_write`.
//!
//! The engine's own calls never raise a non-cooperative event (they would
//! block on the event reader): a range is unregistered before the engine
//! unmaps or moves it, and anonymous pages leave mappings by `UFFDIO_MOVE`.
//! The application's own calls do raise them; [`crate::events`] applies
//! them with the helpers at the end of this file.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::object::{InstallKind, Object};
use crate::page_cache::{LRU_BATCHED, MAPPED, ON_LRU, PINNED, UPTODATE};
use crate::sys::mem::{madvise, mprotect, At, Mapping};
use crate::sys::uffd::mode;
use crate::vma::{VmFlags, Vma};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

pub(crate) fn register_mode(obj: &Object) -> u64 {
    match obj.kind {
        // WP: a huge page is write-protected while reclaim copies it out
        // (`reclaim`'s `huge`: hugetlb has no `UFFDIO_MOVE`).
        // WP for base pages: clean pages of a read-only region are
        // installed protected (`Object::protects_clean`), and `protect`
        // makes a region read-only with write protection
        // (`Vma::read_only_wp`).
        InstallKind::Anonymous => mode::MISSING | mode::WP,
        // MINOR catches pages present in the memfd but not mapped; MISSING
        // catches holes (absent pages), which would otherwise be zero-filled
        // by the kernel. Both are resolved by filling the memfd and
        // UFFDIO_CONTINUE. WP: pages are installed write-protected (see
        // `Object::install_wp`), for dirty tracking over a writable store
        // and to refuse writes to a read-only one.
        // MISSING only: the kernel maps what the memfd holds, with its own
        // fault-around, which MINOR or WP registration would turn off.
        InstallKind::Shared if obj.kernel_maps => mode::MISSING,
        InstallKind::Shared => mode::MINOR | mode::MISSING | mode::WP,
    }
}

/// Where a new mapping goes.
#[derive(Debug, Default)]
pub struct Placement {
    /// Exact address, or anywhere.
    pub fixed: Option<usize>,
    /// The fixed range's hold (see [`crate::hold`]): the region is mapped
    /// over it. Without one, the fixed range must be free.
    pub hold: Option<Mapping>,
}

impl Mm {
    /// Maps `len` bytes of `object` (from page 0) and registers the range.
    /// Returns the region's id and start.
    ///
    /// `kept`: `object` is one [`KeptObjects::take`](crate::kept) gave
    /// back, still in the rmap. On an error the caller then releases it
    /// ([`Mm::release_now`]).
    pub fn map(
        &self,
        object: Arc<Object>,
        len: usize,
        flags: VmFlags,
        at: Placement,
        kept: bool,
    ) -> Result<(u64, usize)> {
        let _deferred = crate::sys::thread::Deferred::new();
        let VmFlags {
            writable, pinned, ..
        } = flags;
        self.check_owner()?;
        self.events.wait_applied();
        let mut w = self.lock.write();
        let mut hold = at.hold;
        let (hint, fixed) = at
            .fixed
            .map_or((crate::inject::before_map(len), false), |a| (a, true));
        if fixed && hint.checked_add(len).is_none() {
            return Err(past_the_end(hint, len));
        }
        // The table may still hold regions where this map lands: the
        // application freed their range with its own `munmap` or `mremap`
        // and the event is not applied yet. A move taken for an unmap
        // loses the region (its evicted pages are discarded, its new
        // address has none), so while such an event is on its way the map
        // lets its range go, waits with no lock held, and starts again
        // (see `events::apply::event_coming`). Bounded; then the regions
        // there are taken for unmapped (`stale`).
        let deadline = std::time::Instant::now() + crate::events::apply::SETTLE_PATIENCE;
        let mut waited = false;
        let wait = |w, claim: &crate::events::apply::Claim, waited: &mut bool| {
            drop(w);
            if !std::mem::replace(waited, true) {
                self.counters.inc(crate::stats::Counter::MAP_WAITED_EVENT);
            }
            crate::events::apply::wait_for_event(self, claim, deadline);
            self.lock.write()
        };
        let m = loop {
            let coming = crate::events::apply::event_coming;
            if fixed {
                match coming(self, hint, hint + len, &object) {
                    None => {}
                    Some(c) if c.coming && std::time::Instant::now() < deadline => {
                        w = wait(w, &c, &mut waited);
                        continue;
                    }
                    Some(c) if c.only_own => {}
                    // (A range a move left, whose unmap was not read in
                    // time: the kernel has it free.)
                    Some(_) if !self.table.read(|t| t.overlaps(hint, hint + len, None)) => {
                        crate::events::apply::stale(self, hint, hint + len, true);
                    }
                    Some(_) => return Err(Error::Overlap { addr: hint, len }),
                }
            }
            // Over the hold (a retry's too: see the wait below).
            let place = match hold.take() {
                _ if !fixed => At::Near(hint),
                Some(h) => At::Over(h),
                None => At::Free(hint),
            };
            let m = match object.kind {
                InstallKind::Anonymous if object.is_huge() => {
                    crate::sys::huge::anonymous_at(place, len)
                }
                InstallKind::Anonymous => Mapping::anonymous_at(place, len),
                InstallKind::Shared => {
                    let fd = object.memfd().expect("shared objects have a memfd").fd();
                    if object.is_huge() {
                        crate::sys::huge::shared_at(fd, len, place)
                    } else {
                        Mapping::shared(fd, len, place)
                    }
                }
            }
            .map_err(|e| match e {
                libc::EEXIST => Error::Overlap { addr: hint, len },
                e => Error::sys("mmap", e),
            })?;
            let start = m.addr();
            match coming(self, start, start + len, &object) {
                None => {}
                // (Unmapped at once: not registered, so no event.)
                Some(c) if c.coming && std::time::Instant::now() < deadline => {
                    // A fixed range stays held while the map waits: left
                    // free, anything could take it meanwhile (a thread's
                    // stack, a large malloc), and the next try would be
                    // an overlap.
                    if fixed {
                        hold = Some(m.into_hold().map_err(|e| Error::sys("mmap", e))?);
                    } else {
                        drop(m);
                    }
                    w = wait(w, &c, &mut waited);
                    continue;
                }
                Some(c) if c.only_own => {}
                Some(c) => crate::events::apply::stale(self, start, start + len, c.coming),
            }
            break m;
        };
        let _w = w;
        let start = m.addr();
        // A fork()ed child gets no copy of region memory: its touches are a
        // clean SIGSEGV, and the engine refuses to work in a child (see
        // `crate::fork`).
        madvise(start, len, libc::MADV_DONTFORK).map_err(|e| Error::sys("madvise", e))?;
        if !writable {
            mprotect(start, len, libc::PROT_READ).map_err(|e| Error::sys("mprotect", e))?;
        }
        let slot = if kept {
            object.slot.load(Acquire)
        } else {
            let Some(slot) = self.objects.insert(&object) else {
                return Err(Error::Config(format!(
                    "too many mapped objects (at most {})",
                    crate::rmap::MAX_OBJECTS
                )));
            };
            object.slot.store(slot, Release);
            slot
        };
        // (A kept object stays in the rmap on an error: the caller's
        // release takes it out.)
        let unslot = || {
            if !kept {
                self.objects.remove(slot)
            }
        };
        let own = match self.per_region.get() {
            Some(p) => match p.open(object.quiet) {
                Ok(u) => Some(u),
                Err(e) => {
                    unslot();
                    return Err(Error::Io {
                        context: "opening a region's userfaultfd".into(),
                        source: e,
                    });
                }
            },
            None => None,
        };
        let uffd = own.as_deref().unwrap_or(self.pager_uffd(object.quiet));
        if let Err(e) = uffd.register(start, len, register_mode(&object)) {
            unslot();
            if let (Some(p), Some(u)) = (self.per_region.get(), &own) {
                p.close(u);
            }
            return Err(Error::sys("UFFDIO_REGISTER", e));
        }
        if let Some(u) = own {
            let _ = object.region_uffd.set(u);
        }
        if pinned {
            // (Its pages leave the LRU: a kept object would hold them.)
            *object.keep_stamp.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        let id = self.next_region_id();
        let mut vma = Vma::new(start, len, 0, object, writable);
        vma.pinned = pinned;
        vma.random = std::sync::atomic::AtomicBool::new(flags.random);
        vma.id = id;
        vma.object.windows.set(&[vma.window()]);
        self.publish(&[], &[Arc::new(vma)]);
        // The region now owns the range; unmap releases it.
        let _ = m.into_raw();
        Ok((id, start))
    }

    /// The pieces of region `id`, in address order.
    ///
    /// Hazard: a piece's reference holds its object, and once the
    /// application's own unmap of the region is applied it can be the
    /// object's last: dropped plainly then, it frees the object without its
    /// release (dirty pages lost, the rmap pointing at freed memory; see
    /// [`Mm::release_object`]). So a caller drops them under the global
    /// lock (which applying an event takes for writing), or holds a
    /// reference of its own to the object that it gives back through
    /// `release_object`; one that needs only their spans and flags takes
    /// [`piece_spans`](Self::piece_spans), which holds no reference.
    pub(crate) fn pieces(&self, id: u64) -> Vec<Arc<Vma>> {
        self.with_pieces(id, |v| v.clone())
    }

    /// Where the pieces of region `id` are and how they are mapped, in
    /// address order, read without taking a reference to them (see
    /// [`pieces`](Self::pieces)' hazard).
    pub(crate) fn piece_spans(&self, id: u64) -> Vec<PieceSpan> {
        self.with_pieces(id, |v| PieceSpan {
            start: v.start,
            end: v.end,
            pinned: v.pinned,
            writable: v.writable.load(Acquire),
            kind: v.object.kind,
        })
    }

    fn with_pieces<T>(&self, id: u64, f: impl Fn(&Arc<Vma>) -> T) -> Vec<T> {
        // Applying the application's munmap takes this lock (`publish`):
        // an application handler that faulted while this thread held it
        // would wait for that event, and so for itself (see `Deferred`).
        let _deferred = crate::sys::thread::Deferred::new();
        let spans = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let Some(starts) = spans.get(&id) else {
            return Vec::new();
        };
        self.table.read(|t| {
            starts
                .iter()
                .filter_map(|&s| t.find(s).filter(|v| v.start == s && v.id == id).map(&f))
                .collect()
        })
    }

    /// The address ranges of region `id` still mapped, in address order,
    /// once every event the kernel has sent is applied (the application's
    /// own `munmap`, `mremap` or `MAP_FIXED` over the region cut or move
    /// its pieces). Empty in a `fork()`ed child.
    pub fn mapped(&self, id: u64) -> Vec<std::ops::Range<usize>> {
        if self.check_owner().is_err() {
            return Vec::new();
        }
        self.events.wait_applied();
        self.piece_spans(id)
            .iter()
            .map(|v| v.start..v.end)
            .collect()
    }

    /// The one piece of region `id`, or an error if the application split
    /// it or unmapped it all.
    pub(crate) fn only_piece(&self, id: u64) -> Result<Arc<Vma>> {
        let mut p = self.pieces(id);
        match p.len() {
            1 => Ok(p.pop().unwrap()),
            0 => Err(Error::Config(
                "the region's memory was unmapped by the application".into(),
            )),
            n => Err(Error::Config(format!(
                "the application split the region into {n} pieces with its own munmap/mremap"
            ))),
        }
    }

    /// Replaces `old` VMAs by `new` ones in the table and in the region
    /// index (the caller holds the global lock for write).
    pub(crate) fn publish(&self, old: &[Arc<Vma>], new: &[Arc<Vma>]) {
        // The index of starts is held across the table's update: a reader
        // of a region's pieces ([`Mm::piece_spans`]) takes it before its
        // read of the table, so it sees both before or both after. (With
        // the new table and the old starts, a region whose head the
        // application had just unmapped read as having no piece at all.)
        let mut r = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        self.table.update(|t| {
            let mut t = t.clone();
            for v in old {
                t.remove(v);
            }
            for v in new {
                t.insert(v.clone());
            }
            t
        });
        for v in old {
            if let Some(s) = r.get_mut(&v.id) {
                s.retain(|&x| x != v.start);
                if s.is_empty() {
                    r.remove(&v.id);
                }
            }
        }
        for v in new {
            let s = r.entry(v.id).or_default();
            if let Err(k) = s.binary_search(&v.start) {
                s.insert(k, v.start);
            }
        }
    }

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
        let w = self.lock.write();
        let pieces = self.pieces(id);
        let mut objects = Vec::new();
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
        // waiting for the global lock: stop it only now.
        let mut r = Ok(());
        objects.dedup_by(|a, b| Arc::ptr_eq(a, b));
        for obj in objects {
            if let (Some(p), Some(u)) = (self.per_region.get(), obj.region_uffd.get()) {
                if !self.maps_object(&obj) {
                    p.close(u);
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
        // so none can be made. Until it reaches `release_now`, which takes
        // it out of the rmap first, a panic (in the store's own code:
        // `writable`, `contents_stamp`) leaks it rather than freeing what
        // the rmap still points at.
        let obj = Unreleased(Some(obj));
        // Kept ([`crate::kept`]): a shared object, written back in full,
        // over a store someone else still holds (so it can be mapped
        // again), whose stamp has not moved since the object was made (its
        // pages are the store's: not even its own write-backs moved it),
        // with nothing pinned (a pinned page has left the LRU, and reclaim
        // would never free it), under a budget (without one there is no
        // LRU to reclaim kept pages from). Per-region delivery closes a
        // region's descriptor with its region, so an object there is never
        // kept.
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
            let owed = obj.store.writable() && crate::unwritten::dirty_pages(&obj) > 0;
            _keeping = owed.then(|| self.kept.writing(&obj.store));
            let written = self
                .writeback_object(&obj, crate::writeback::Gate::Held)
                .is_ok();
            let pinned = (0..obj.npages()).any(|i| obj.cache.load(i) & PINNED != 0);
            if written && !pinned && obj.store.contents_stamp() == Some(made) {
                let mut r = Ok(());
                for out in self.kept.keep(obj.take(), made, cap) {
                    let x = self.release_now(out);
                    r = r.and(x);
                }
                return r;
            }
        }
        self.release_now(obj.take())
    }

    /// The first step of [`release_object`](Self::release_object): drops
    /// `obj` if another reference is left, under the lock that orders two
    /// holders giving theirs back; returns it if it is the last. Cheap
    /// (a mutex, no store call): an unmap being applied gives back at once
    /// a reference that is not the last, so that the holder of the last
    /// one (a residency guard dropped next) releases the object itself
    /// ([`crate::events::release::Released::push`]).
    pub(crate) fn give_back_unless_last(&self, obj: Arc<Object>) -> Option<Arc<Object>> {
        let _g = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
        (Arc::strong_count(&obj) == 1).then_some(obj)
    }

    /// Writes `obj`'s dirty pages back, uncharges its resident pages and
    /// frees it: the caller's is the last reference but the rmap's. One
    /// whose write-back fails is kept with its dirty pages
    /// ([`crate::unwritten`]), and the error returned.
    pub(crate) fn release_now(&self, obj: Arc<Object>) -> Result<()> {
        // No region maps it any more: take it out of the rmap so reclaim
        // cannot reach it.
        let slot = obj.slot.load(Acquire);
        self.objects.remove(slot);
        // Dirty pages owed to the store: listed before the write starts
        // (`crate::unwritten`), so that a map over the store sees them
        // while it is in flight, and kept there if it fails. No mapping is
        // left to write them, so a page written is clean (see
        // `writeback_object`). Listed before the wait for pins below too:
        // a readahead run reading into the object holds one for as long
        // as its store call, and a map of the store meanwhile read the
        // store's older bytes. (A page reclaim is writing back now counts
        // as dirty; the list is tidied after the write-back.)
        let owed = obj.kind == InstallKind::Shared
            && obj.store.writable()
            && crate::unwritten::dirty_pages(&obj) > 0;
        if owed {
            for i in 0..obj.npages() {
                if obj.cache.load(i) & MAPPED != 0 {
                    obj.cache.lock(i);
                    obj.cache.unlock(i, 0, MAPPED);
                }
            }
            self.unwritten.add(&obj);
        }
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

/// The error for a fixed range `[addr, addr+len)` that wraps past the end
/// of the address space (`mmap`'s `EINVAL`).
pub(crate) fn past_the_end(addr: usize, len: usize) -> Error {
    Error::Config(format!(
        "range {addr:#x}+{len:#x} runs past the end of the address space"
    ))
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

/// A piece of a region as [`Mm::piece_spans`] reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PieceSpan {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) pinned: bool,
    pub(crate) writable: bool,
    pub(crate) kind: InstallKind,
}
