//! `mprotect` on a region: write access on or off for every piece.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::events::coming::{range_in_doubt, until_settled, Tried, Unsettled};
use crate::object::InstallKind;
use crate::page_cache::CLEAN;
use crate::sys::mem::mprotect;
use crate::vma::Vma;
use std::sync::atomic::Ordering::*;

impl Mm {
    /// Changes the protection of every piece of region `id`.
    ///
    /// Each piece's protection changes only while no event on its way may
    /// have taken its range from it ([`range_in_doubt`]); otherwise the
    /// call lets go of its locks, waits for the events, and starts again
    /// on what is left of the region.
    pub fn protect(&self, id: u64, writable: bool) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        self.check_owner()?;
        until_settled(self, "mprotect", || self.protect_settled(id, writable))
    }

    /// One try of [`protect`](Self::protect).
    fn protect_settled(&self, id: u64, writable: bool) -> Tried<()> {
        let _w = self.lock.write();
        let pieces = self.pieces(id);
        if let Some(v) = pieces.first() {
            if writable && v.object.kind == InstallKind::Shared && !v.object.store_writes() {
                return Ok(Err(Error::ReadOnlyStore));
            }
            if writable && v.object.kernel_maps {
                return Ok(Err(Error::Config(
                    "a kernel_maps region cannot be made writable: the engine would not see \
                     its writes"
                        .into(),
                )));
            }
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        for vma in &pieces {
            vma.lock.write_lock();
            crate::inject::before_range_change(vma);
            if range_in_doubt(self, self.uffd_for(&vma.object)) {
                vma.lock.write_unlock();
                return Err(Unsettled);
            }
            if self.protect_with_wp(vma, writable) {
                vma.lock.write_unlock();
                continue;
            }
            let r = mprotect(vma.start, vma.len(), prot);
            if r.is_ok() {
                vma.writable.store(writable, Release);
                // (Made writable here after `protect_with_wp` failed
                // half way: its read-only-through-protection is over too,
                // or each new page went in write-protected and the first
                // write made the region read-only for real.)
                if writable {
                    vma.read_only_wp.store(false, Release);
                }
                // Writable now: its anonymous pages may change without a
                // fault, so none is clean any more. Reclaim re-checks CLEAN
                // under this region's read lock, which it holds until its
                // zap.
                if writable && vma.object.kind == InstallKind::Anonymous {
                    // (Only words that say CLEAN: see `give_up_pages`.)
                    for i in vma.pages() {
                        if vma.object.cache.load(i) & CLEAN != 0 {
                            vma.object.cache.update(i, 0, CLEAN);
                        }
                    }
                    // None is clean now, so none needs the write protection
                    // a clean page of a read-only region is installed with
                    // (`Object::protects_clean`, `Vma::read_only_wp`): lifted,
                    // so a write inside a system call does not fault where
                    // the kernel will not deliver it (EFAULT). If it cannot
                    // be lifted now (an event first: EAGAIN), each page's
                    // first write faults and lifts it.
                    if !vma.object.is_huge() {
                        let uffd = self.uffd_for(&vma.object);
                        let _ = uffd.writeprotect(vma.start, vma.len(), false, false);
                    }
                }
            }
            vma.lock.write_unlock();
            if let Err(e) = r {
                return Ok(Err(Error::sys("mprotect", e)));
            }
        }
        Ok(Ok(()))
    }

    /// Makes the read-only of every piece of region `id` that is read-only
    /// through write protection ([`Vma::read_only_wp`]) the kernel's own,
    /// as the first write to it would (`mprotect(PROT_READ)`); other
    /// pieces are left as they are. For an application about to make part
    /// of the region writable with its own `mprotect`, which would change
    /// nothing in a mapping that is writable already.
    /// Settled as [`protect`](Self::protect) is.
    pub fn protect_in_kernel(&self, id: u64) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        self.check_owner()?;
        until_settled(self, "mprotect", || self.protect_in_kernel_settled(id))
    }

    /// One try of [`protect_in_kernel`](Self::protect_in_kernel).
    fn protect_in_kernel_settled(&self, id: u64) -> Tried<()> {
        let _w = self.lock.write();
        for vma in &self.pieces(id) {
            vma.lock.write_lock();
            crate::inject::before_range_change(vma);
            if range_in_doubt(self, self.uffd_for(&vma.object)) {
                vma.lock.write_unlock();
                return Err(Unsettled);
            }
            let r = match vma.read_only_wp.load(Acquire) {
                true => mprotect(vma.start, vma.len(), libc::PROT_READ),
                false => Ok(()),
            };
            if r.is_ok() {
                vma.read_only_wp.store(false, Release);
            }
            vma.lock.write_unlock();
            if let Err(e) = r {
                return Ok(Err(Error::sys("mprotect", e)));
            }
        }
        Ok(Ok(()))
    }

    /// `protect` of a writable anonymous region of base pages without
    /// `mprotect`: its mapping stays writable and every page is
    /// write-protected ([`Vma::read_only_wp`]), and back. Returns whether
    /// that was done (the caller holds the region's write lock).
    ///
    /// Hazard: a region made read-only with `mprotect` cannot give up a
    /// page it holds that differs from its source (`UFFDIO_MOVE` moves only
    /// out of writable mappings, and a zap would raise an event the engine
    /// must not cause), so its resident pages would stay in memory for good,
    /// over the budget. Where the protection cannot be set (an event is
    /// waiting: `EAGAIN`), the caller's `mprotect` does it, with that cost.
    fn protect_with_wp(&self, vma: &Vma, writable: bool) -> bool {
        let obj = &vma.object;
        if obj.kind != InstallKind::Anonymous || obj.is_huge() {
            return false;
        }
        let uffd = self.uffd_for(obj);
        let emulated = vma.read_only_wp.load(Acquire);
        if !writable {
            if emulated {
                return true;
            }
            if !vma.writable.load(Acquire) {
                // Mapped read-only: `mprotect` (again, in case the
                // application's own call made it writable).
                return false;
            }
            if uffd
                .writeprotect(vma.start, vma.len(), true, false)
                .is_err()
            {
                return false;
            }
            // The mapping itself must be readable and writable under the
            // write protection: the application's own `mprotect` may have
            // changed it (`PROT_NONE` through the preload shim, which
            // passes that to the kernel), and the write protection alone
            // left it so: every read was SIGSEGV. (Writable already: a
            // no-op. Its write-protected PTEs stay so.)
            if mprotect(vma.start, vma.len(), libc::PROT_READ | libc::PROT_WRITE).is_err() {
                return false;
            }
            vma.writable.store(false, Release);
            vma.read_only_wp.store(true, Release);
            return true;
        }
        if !emulated {
            return false;
        }
        // Writable again. Its pages may change unseen from now on, so none
        // is clean (see `protect`'s note); then the protection goes. (If
        // it cannot go now, each page's first write lifts it.)
        for i in vma.pages() {
            if obj.cache.load(i) & CLEAN != 0 {
                obj.cache.update(i, 0, CLEAN);
            }
        }
        // (Writable already, but for the application's own `mprotect`.)
        if mprotect(vma.start, vma.len(), libc::PROT_READ | libc::PROT_WRITE).is_err() {
            return false;
        }
        vma.read_only_wp.store(false, Release);
        vma.writable.store(true, Release);
        let _ = uffd.writeprotect(vma.start, vma.len(), false, false);
        true
    }
}
