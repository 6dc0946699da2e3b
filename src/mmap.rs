//! Writers on the address space: map, unmap, remap, protect. Each takes the
//! global lock for write and write-locks every region it touches, as the
//! kernel's `mmap_write_lock` + `vma_start_write`.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::object::{InstallKind, Object};
use crate::page_cache::{
    CLEAN, DIRTY, LRU_BATCHED, MAPPED, MOVED, ON_LRU, POISONED, READAHEAD, SWAPPED, UPTODATE,
};
use crate::sys::mem::{mprotect, Mapping};
use crate::sys::uffd::mode;
use crate::sys::PAGE_SIZE;
use crate::vma::Vma;
use std::sync::Arc;

fn register_mode(obj: &Object) -> u64 {
    let wp = if obj.tracks_writes() { mode::WP } else { 0 };
    wp | match obj.kind {
        InstallKind::Anonymous => mode::MISSING,
        // MINOR catches pages present in the memfd but not mapped; MISSING
        // catches holes (absent pages), which would otherwise be zero-filled
        // by the kernel. Both are resolved by filling the memfd through the
        // alias and UFFDIO_CONTINUE.
        InstallKind::Shared => mode::MINOR | mode::MISSING,
    }
}

/// The state bits a page loses when its contents are dropped.
pub(crate) const DISCARDED: u32 =
    UPTODATE | MAPPED | DIRTY | SWAPPED | MOVED | POISONED | CLEAN | READAHEAD;

/// Drops page `i` of `obj` as `MADV_DONTNEED` drops a private page: its
/// contents revert to the object's source (zeros for anonymous memory, or
/// the store), any copy in the cache area, the memfd or swap is dropped
/// (the swap copy by forgetting it: `SWAPPED` goes), and a resident page
/// is uncharged. The caller holds the page lock and unlocks it clearing the
/// returned bits; the page's LRU entry, if any, goes stale and is dropped
/// when reclaim reaches it. `w` is the word as the caller locked it.
/// Async-signal-safe.
pub(crate) fn discard_page(mm: &Mm, obj: &Object, i: usize, w: u32) -> u32 {
    if w & UPTODATE != 0 {
        mm.uncharge(1);
    }
    if w & MOVED == 0 {
        let _ = obj.free_data(i, 1);
    }
    DISCARDED
}

/// Where a new mapping goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement {
    /// Exact address (must be free), or anywhere.
    pub fixed: Option<usize>,
}

impl Mm {
    /// Maps `len` bytes of `object` (from page 0) and registers the range.
    pub fn map(
        &self,
        object: Arc<Object>,
        len: usize,
        writable: bool,
        at: Placement,
        pinned: bool,
    ) -> Result<usize> {
        let _w = self.lock.write();
        let (hint, fixed) = at.fixed.map_or((0, false), |a| (a, true));
        if fixed && self.table.read(|t| t.overlaps(hint, hint + len, None)) {
            return Err(Error::Overlap { addr: hint, len });
        }
        let m = match object.kind {
            InstallKind::Anonymous => Mapping::anonymous_at(hint, len, fixed),
            InstallKind::Shared => {
                let fd = object.memfd().expect("shared objects have a memfd").fd();
                Mapping::shared(fd, len, hint, fixed)
            }
        }
        .map_err(|e| match e {
            libc::EEXIST => Error::Overlap { addr: hint, len },
            e => Error::sys("mmap", e),
        })?;
        let start = m.addr();
        let Some(slot) = self.objects.insert(&object) else {
            return Err(Error::Config(format!(
                "too many mapped objects (at most {})",
                crate::rmap::MAX_OBJECTS
            )));
        };
        object
            .slot
            .store(slot, std::sync::atomic::Ordering::Release);
        object
            .mapped_at
            .store(start, std::sync::atomic::Ordering::Release);
        if !writable {
            mprotect(start, len, libc::PROT_READ).map_err(|e| Error::sys("mprotect", e))?;
        }
        let own = match self.per_region.get() {
            Some(p) => Some(p.open().map_err(|e| {
                self.objects.remove(slot);
                Error::Io {
                    context: "opening a region's userfaultfd".into(),
                    source: e,
                }
            })?),
            None => None,
        };
        let uffd = own.as_deref().unwrap_or(&self.uffd);
        if let Err(e) = uffd.register(start, len, register_mode(&object)) {
            self.objects.remove(slot);
            if let (Some(p), Some(u)) = (self.per_region.get(), &own) {
                p.close(u);
            }
            return Err(Error::sys("UFFDIO_REGISTER", e));
        }
        if let Some(u) = own {
            let _ = object.region_uffd.set(u);
        }
        let mut vma = Vma::new(start, len, 0, object, writable);
        vma.pinned = pinned;
        let vma = Arc::new(vma);
        self.table.update(|t| {
            let mut t = t.clone();
            t.insert(vma.clone());
            t
        });
        // The region now owns the range; unmap releases it.
        let _ = m.into_raw();
        Ok(start)
    }

    fn find_exact(&self, start: usize) -> Result<Arc<Vma>> {
        self.table
            .read(|t| t.find(start).filter(|v| v.start == start).cloned())
            .ok_or(Error::Config(format!("no region starts at {start:#x}")))
    }

    /// Unmaps the region starting at `start`: detach, unregister, unmap,
    /// write back (shared objects over writable stores) and free.
    pub fn unmap(&self, start: usize) -> Result<()> {
        let w = self.lock.write();
        let vma = self.find_exact(start)?;
        vma.lock.write_lock();
        vma.lock.mark_detached();
        let (s, e) = (vma.start, vma.end);
        self.table.update(|t| {
            let mut t = t.clone();
            t.remove(&vma);
            t.dying.push((s, e));
            t
        });
        crate::inject::after_detach(&vma);
        let _ = vma.object.uffd(&self.uffd).unregister(s, e - s);
        // SAFETY: the region owned this range since `map`/`remap`.
        drop(unsafe { Mapping::from_raw(s, e - s) });
        self.table.update(|t| {
            let mut t = t.clone();
            t.dying.retain(|&r| r != (s, e));
            t
        });
        vma.lock.write_unlock();
        drop(w);
        // The region's own handler (per-region delivery) may have been
        // waiting for the global lock: stop it only now.
        if let (Some(p), Some(u)) = (self.per_region.get(), vma.object.region_uffd.get()) {
            p.close(u);
        }
        let obj = vma.object.clone();
        obj.mapped_at.store(0, std::sync::atomic::Ordering::Release);
        for i in vma.pages() {
            obj.cache.update(i, 0, MAPPED);
        }
        drop(vma);
        self.release_object(obj)
    }

    /// Drops a reference to `obj`; the last one writes dirty pages back,
    /// uncharges its resident pages and frees it.
    pub(crate) fn release_object(&self, obj: Arc<Object>) -> Result<()> {
        if Arc::strong_count(&obj) > 1 {
            return Ok(());
        }
        // No region maps it any more: take it out of the rmap so reclaim
        // cannot reach it, then wait for evictions already under way.
        let slot = obj.slot.load(std::sync::atomic::Ordering::Acquire);
        self.objects.remove(slot);
        obj.wait_unpinned();
        let r = self.writeback_object(&obj);
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
        self.uncharge(resident);
        r
    }

    /// Writes every dirty page of a shared object back to its store (the
    /// msync analog), write-protecting mapped pages again so the next write
    /// is seen.
    pub(crate) fn writeback_object(&self, obj: &Object) -> Result<()> {
        if obj.kind != InstallKind::Shared || !obj.store.writable() {
            return Ok(());
        }
        for i in 0..obj.npages() {
            if obj.cache.load(i) & (UPTODATE | DIRTY) != UPTODATE | DIRTY {
                continue;
            }
            let w = obj.cache.lock(i);
            if w & (UPTODATE | DIRTY) != UPTODATE | DIRTY {
                obj.cache.unlock(i, 0, 0);
                continue;
            }
            // A mapped page is write-protected again first, so a write that
            // races the write-back faults, waits for the page lock and
            // marks the page dirty anew.
            let base = obj.mapped_at.load(std::sync::atomic::Ordering::Acquire);
            let reprotected = w & MAPPED == 0
                || (base != 0
                    && obj
                        .uffd(&self.uffd)
                        .writeprotect(base + i * PAGE_SIZE, PAGE_SIZE, true, false)
                        .is_ok());
            // SAFETY: we hold the page lock; the contents are only read.
            let r = match unsafe { obj.page_mut(i) } {
                Ok(buf) => obj.store.write((i * PAGE_SIZE) as u64, buf),
                Err(e) => Err(crate::store::StoreError(e)),
            };
            let clear = if r.is_ok() && reprotected { DIRTY } else { 0 };
            obj.cache.unlock(i, 0, clear);
            r?;
            self.counters.inc(crate::stats::Counter::WRITEBACK);
        }
        obj.store.sync()?;
        Ok(())
    }

    /// `MADV_DONTNEED` over `[addr, addr+len)` of one region: the pages
    /// leave the user mapping. Shared pages stay in the page cache (the next
    /// access is a minor fault); anonymous contents are discarded (the next
    /// access reads zeros), as with the kernel's madvise. Takes the global
    /// lock for read, as madvise takes `mmap_lock`.
    pub fn dontneed(&self, addr: usize, len: usize) -> Result<()> {
        const CHUNK: usize = 64;
        let _g = self.lock.read();
        let vma = self
            .find_vma_locked(addr)
            .filter(|v| addr + len <= v.end)
            .ok_or(Error::Config(format!(
                "{addr:#x}+{len:#x} is not inside one region"
            )))?;
        let obj = &vma.object;
        let first = vma.page_index(addr);
        let last = vma.page_index(addr + len - 1) + 1;
        let mut i = first;
        while i < last {
            let end = (i + CHUNK).min(last);
            for p in i..end {
                obj.cache.lock(p);
            }
            let r = crate::sys::mem::madvise(
                vma.addr_of(i),
                (end - i) * PAGE_SIZE,
                libc::MADV_DONTNEED,
            );
            for p in i..end {
                if obj.kind == InstallKind::Shared || r.is_err() {
                    obj.cache.unlock(p, 0, if r.is_ok() { MAPPED } else { 0 });
                    continue;
                }
                let clear = discard_page(self, obj, p, obj.cache.load(p));
                obj.cache.unlock(p, 0, clear);
            }
            r.map_err(|e| Error::sys("madvise(MADV_DONTNEED)", e))?;
            i = end;
        }
        Ok(())
    }

    /// Changes the protection of the region at `start`.
    pub fn protect(&self, start: usize, writable: bool) -> Result<()> {
        let _w = self.lock.write();
        let vma = self.find_exact(start)?;
        vma.lock.write_lock();
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let r = mprotect(vma.start, vma.len(), prot);
        if r.is_ok() {
            vma.writable
                .store(writable, std::sync::atomic::Ordering::Release);
            // Writable now: its anonymous pages may change without a fault,
            // so none is clean any more. Reclaim re-checks CLEAN under this
            // region's read lock, which it holds until its zap.
            if writable && vma.object.kind == InstallKind::Anonymous {
                for i in vma.pages() {
                    vma.object.cache.update(i, 0, CLEAN);
                }
            }
        }
        vma.lock.write_unlock();
        r.map_err(|e| Error::sys("mprotect", e))
    }

    /// Grows, shrinks or moves the region at `start` to `new_len` bytes
    /// (at `new_addr` if given). Returns the new start. The old region is
    /// detached and a new one published, as the kernel replaces VMAs.
    pub fn remap(&self, start: usize, new_len: usize, new_addr: Option<usize>) -> Result<usize> {
        let _w = self.lock.write();
        let old = self.find_exact(start)?;
        let old_len = old.len();
        let cap = (old.object.npages() - old.pgoff) * PAGE_SIZE;
        if new_len > cap {
            return Err(Error::OutOfRange {
                offset: 0,
                len: new_len,
                region_len: cap,
            });
        }
        if let Some(a) = new_addr {
            if self.table.read(|t| t.overlaps(a, a + new_len, Some(&old))) {
                return Err(Error::Overlap {
                    addr: a,
                    len: new_len,
                });
            }
        }
        old.lock.write_lock();
        // Shrinking drops the tail's PTEs. Shared pages stay in the memfd
        // (cached); anonymous memory past the end is discarded, as the
        // kernel does: those pages read as zeros if the region grows again.
        if new_len < old_len {
            let obj = &old.object;
            for i in old.pgoff + new_len / PAGE_SIZE..old.pgoff + old_len / PAGE_SIZE {
                if obj.kind == InstallKind::Shared {
                    obj.cache.update(i, 0, MAPPED);
                    continue;
                }
                let w = obj.cache.lock(i);
                let clear = discard_page(self, obj, i, w);
                obj.cache.unlock(i, 0, clear);
            }
        }
        let flags = match new_addr {
            Some(_) => libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            None if new_len > old_len => libc::MREMAP_MAYMOVE,
            None => 0,
        };
        // SAFETY: remaps a range the region owns; with MREMAP_FIXED the
        // target was checked free of regions (the kernel replaces whatever
        // else is there, as mremap(2) documents).
        let p = unsafe {
            libc::mremap(
                start as *mut libc::c_void,
                old_len,
                new_len,
                flags,
                new_addr.unwrap_or(0) as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            old.lock.write_unlock();
            return Err(Error::sys("mremap", crate::sys::errno()));
        }
        let new_start = p as usize;
        old.object
            .mapped_at
            .store(new_start, std::sync::atomic::Ordering::Release);
        let new = Arc::new(old.resized(new_start, new_len));
        new.lock.write_lock();
        old.lock.mark_detached();
        self.table.update(|t| {
            let mut t = t.clone();
            t.remove(&old);
            t.insert(new.clone());
            t
        });
        // A moved or grown range may have lost (or lack) its registration;
        // a moved one also lost its write protection (the kernel clears
        // uffd-wp bits on mremap without EVENT_REMAP): protect it again so
        // the next write to each page is seen.
        let uffd = new.object.uffd(&self.uffd);
        let mut r = uffd.register(new_start, new_len, register_mode(&new.object));
        if r.is_ok() && new.object.tracks_writes() && new_start != start {
            r = uffd
                .writeprotect(new_start, new_len, true, false)
                .map(|_| 0);
        }
        old.lock.write_unlock();
        new.lock.write_unlock();
        r.map_err(|e| Error::sys("UFFDIO_REGISTER", e))?;
        Ok(new_start)
    }
}
