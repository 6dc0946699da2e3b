//! `madvise` on a region: `MADV_DONTNEED` (its pages leave the user
//! mapping) and the access advice `MADV_NORMAL` / `MADV_RANDOM`.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::events::coming::{range_in_doubt, until_settled, Tried, Unsettled};
use crate::object::InstallKind;
use crate::page_cache::{MAPPED, POISONED};
use crate::sys::mem::madvise;

impl Mm {
    /// `madvise(MADV_NORMAL | MADV_RANDOM)` over every piece of region
    /// `id`: sets or clears the `VM_RAND_READ` analog, which the next
    /// fault attempt reads. The kernel takes `mmap_lock` for write to change
    /// `vm_flags`; here the flag is an atomic that an attempt reads once,
    /// so the global lock's read side (which keeps the region's pieces as
    /// they are) is enough, and no fault waits for the advice.
    pub fn advise(&self, id: u64, access: crate::Access) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        self.check_owner()?;
        let random = match access {
            crate::Access::Normal => false,
            crate::Access::Random => true,
        };
        let _g = self.lock.read();
        for vma in self.pieces(id) {
            vma.random
                .store(random, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// `MADV_DONTNEED` over `[addr, addr+len)` of one region: the pages
    /// leave the user mapping. Shared pages stay in the page cache (the next
    /// access is a minor fault); anonymous contents are discarded (the next
    /// access reads what the source holds), as with the kernel's madvise.
    ///
    /// Only region `id`'s own memory: the caller checked that the range
    /// was, but without the lock, and the application's `munmap` of it may
    /// be applied since and a new region of this pager's mapped there.
    pub fn dontneed(&self, id: u64, addr: usize, len: usize) -> Result<()> {
        crate::inject::before_own_range(addr);
        let _deferred = crate::sys::thread::Deferred::new();
        self.check_owner()?;
        let quiet = until_settled(self, "madvise(MADV_DONTNEED)", || {
            let _g = self.lock.read();
            let Some(vma) = self
                .find_vma_locked(addr)
                .filter(|v| v.id == id && addr + len <= v.end)
            else {
                return Ok(Err(Error::Config(format!(
                    "{addr:#x}+{len:#x} is not inside one region"
                ))));
            };
            if range_in_doubt(self, self.uffd_for(&vma.object)) {
                return Err(Unsettled);
            }
            Ok(Ok(vma.object.quiet))
        })?;
        if !quiet {
            // The region's descriptor reports the application's madvise:
            // this one is applied by the same event, as the application's
            // own would be. No engine lock is held across it (the event
            // reader takes them), so the look above at the events on their
            // way cannot cover it: an unmap of the application's and its
            // own new mapping there, both between that look and this
            // call, would lose that mapping's pages.
            let r = madvise(addr, len, libc::MADV_DONTNEED)
                .map_err(|e| Error::sys("madvise(MADV_DONTNEED)", e));
            // The madvise returns once its REMOVE event is *read*; with
            // handler threads (the pool or per-region) it is applied only
            // after that. Until then the engine believes the dropped pages
            // still hold their cached or swapped contents, and a fault it
            // runs itself (`Region::populate`, `prefault`, `lock_resident`)
            // would install them again. Return only once it is applied.
            self.events.wait_applied();
            return r;
        }
        // (Each chunk only while no event may have taken the range from
        // the region: see `range_in_doubt`.)
        until_settled(self, "madvise(MADV_DONTNEED)", || {
            self.dontneed_quiet(id, addr, len)
        })
    }

    /// One try of a quiet region's [`dontneed`](Self::dontneed).
    fn dontneed_quiet(&self, id: u64, addr: usize, len: usize) -> Tried<()> {
        const CHUNK: usize = 64;
        let _g = self.lock.read();
        let Some(vma) = self
            .find_vma_locked(addr)
            .filter(|v| v.id == id && addr + len <= v.end)
        else {
            return Ok(Err(Error::Config("the region changed".into())));
        };
        let obj = &vma.object;
        let first = vma.page_index(addr);
        let last = vma.page_index(addr + len - 1) + 1;
        let mut i = first;
        while i < last {
            let end = (i + CHUNK).min(last);
            crate::inject::before_range_change(vma);
            if range_in_doubt(self, self.uffd_for(obj)) {
                return Err(Unsettled);
            }
            for p in i..end {
                obj.cache.lock(p);
            }
            let r = madvise(
                vma.addr_of(i),
                (end - i) << obj.page_shift(),
                libc::MADV_DONTNEED,
            );
            for p in i..end {
                // A shared page keeps its cached contents; one that was
                // poisoned (its read failed: it has none) is read again by
                // the next fault, as a dropped private page is.
                if obj.kind == InstallKind::Shared || r.is_err() {
                    obj.cache
                        .unlock(p, 0, if r.is_ok() { MAPPED | POISONED } else { 0 });
                    continue;
                }
                let clear = crate::discard::discard_page(self, obj, p, obj.cache.load(p));
                obj.cache.unlock(p, 0, clear);
            }
            if let Err(e) = r {
                return Ok(Err(Error::sys("madvise(MADV_DONTNEED)", e)));
            }
            i = end;
        }
        Ok(Ok(()))
    }
}
