//! `mremap` of a region: grow, shrink or move it, replacing its region
//! struct as the kernel replaces VMAs.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::mmap::register_mode;
use crate::object::InstallKind;
use crate::page_cache::{CLEAN, DIRTY, MAPPED};
use crate::sys::mem::{mprotect, Mapping};
use crate::vma::Vma;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

impl Mm {
    /// Grows, shrinks or moves region `id`, which starts at `start`, to
    /// `new_len` bytes (at `new_addr` if given). Returns the new start. The
    /// old region is detached and a new one published, as the kernel
    /// replaces VMAs.
    ///
    /// The outer error means nothing changed. The inner one means the
    /// region moved to the returned start but its new range could not be
    /// registered: the range is then made inaccessible (`PROT_NONE`), as
    /// an access there would get the kernel's own page (zeros, or the
    /// memfd's hole) instead of the engine's: a clean `SIGSEGV` rather
    /// than a silently wrong page. Unmapping the region still works.
    ///
    /// With `replace`, what is mapped at `new_addr` (none of the pager's
    /// memory) is replaced, as the kernel's `MREMAP_FIXED` replaces it,
    /// once every check has passed; without it the target must be free.
    pub fn remap(
        &self,
        id: u64,
        new_len: usize,
        new_addr: Option<usize>,
        replace: bool,
    ) -> Result<(usize, Result<()>)> {
        let _deferred = crate::sys::thread::Deferred::new();
        self.check_owner()?;
        self.events.wait_applied();
        // The table may still hold regions where the kernel is about to
        // put this one (grown in place, or moved anywhere free): the
        // application freed their range with its own `munmap` or `mremap`,
        // and the event is not read yet. A move taken for an unmap loses
        // the region (`settle_stale` below: its evicted pages discarded,
        // its own move's event finding nothing; found by review). So while
        // any event of the pager's is on its way the remap waits, with no
        // lock held, as a map does for the range it lands on; bounded, then
        // as before. (A move the application starts after this look and
        // the kernel finishes before this mremap is still taken for an
        // unmap.)
        let deadline = std::time::Instant::now() + crate::events::coming::SETTLE_PATIENCE;
        let _w = loop {
            let w = self.lock.write();
            if std::time::Instant::now() >= deadline
                || !crate::inject::remap_waits()
                || !crate::events::coming::any_coming(self)
            {
                break w;
            }
            drop(w);
            self.counters.inc(crate::stats::Counter::MAP_WAITED_EVENT);
            crate::events::coming::wait_for_any(self, deadline);
        };
        let old = self.only_piece(id)?;
        let start = old.start;
        let old_len = old.len();
        let cap = (old.object.npages() - old.pgoff) << old.object.page_shift();
        if new_len > cap {
            return Err(Error::OutOfRange {
                offset: 0,
                len: new_len,
                region_len: cap,
            });
        }
        // A fixed target is reserved first (never replacing anything that
        // is mapped there: the heap, a stack, another library's memory),
        // and mremap then replaces only our own reservation.
        let target = match new_addr {
            Some(a) if a.checked_add(new_len).is_none() => {
                return Err(crate::mmap::past_the_end(a, new_len))
            }
            Some(a) if self.table.read(|t| t.overlaps(a, a + new_len, Some(&old))) => {
                return Err(Error::Overlap {
                    addr: a,
                    len: new_len,
                })
            }
            Some(a) if a < start + old_len && start < a + new_len => {
                return Err(Error::Overlap {
                    addr: a,
                    len: new_len,
                })
            }
            // The caller asked for the target to be replaced, and none of
            // the pager's regions is in it (checked above, under the global
            // write lock): mremap itself replaces it, in one step. Not
            // reserved over first: a move the kernel then refuses (a
            // region split into several kernel mappings, a map count at
            // `vm.max_map_count`) is refused before it touches the
            // target, and a reservation dropped on that error left a hole
            // where the caller's memory had been.
            // (A range an `AddressHold` keeps is the pager's: replaced,
            // the hold's drop would unmap the moved region.)
            Some(a) if replace && crate::hold::overlaps(a, new_len) => {
                return Err(Error::Overlap {
                    addr: a,
                    len: new_len,
                })
            }
            Some(_) if replace => None,
            Some(a) => Some(Mapping::reserve_at(a, new_len).map_err(|e| match e {
                libc::EEXIST => Error::Overlap {
                    addr: a,
                    len: new_len,
                },
                e => Error::sys("mmap", e),
            })?),
            None => None,
        };
        old.lock.write_lock();
        // Unregistered first, so the move (and the tail a shrink unmaps)
        // raises no event; inaccessible meanwhile, so that an access racing
        // the remap gets SIGSEGV rather than a page the kernel makes up.
        // (A region made read-only with write protection keeps a
        // writable mapping: see `Vma::read_only_wp`.)
        let prot = if old.writable.load(Acquire) || old.read_only_wp.load(Acquire) {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let _ = mprotect(start, old_len, libc::PROT_NONE);
        let uffd = self.uffd_for(&old.object);
        let _ = uffd.unregister(start, old_len);
        let flags = match new_addr {
            Some(_) => libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            None if new_len > old_len => libc::MREMAP_MAYMOVE,
            None => 0,
        };
        let p = if crate::inject::remap_fails() {
            crate::sys::set_errno(libc::ENOMEM);
            libc::MAP_FAILED
        } else {
            // SAFETY: remaps a range the region owns; with MREMAP_FIXED the
            // target is our own reservation (made above, over free
            // addresses), or with `replace` a range the caller gave up.
            unsafe {
                libc::mremap(
                    start as *mut libc::c_void,
                    old_len,
                    new_len,
                    flags,
                    new_addr.unwrap_or(0) as *mut libc::c_void,
                )
            }
        };
        // A shrink that moves (`MREMAP_FIXED`) unmaps the target and then
        // the tail before checks that can still fail: then the region was
        // shrunk where it was, and follows that (with the error), as a
        // refused registration after a move does below.
        let mut refused = None;
        let p = if p == libc::MAP_FAILED {
            let e = crate::sys::errno();
            if new_len < old_len && crate::sys::pagemap::page_present(start + new_len).is_err() {
                refused = Some(Error::sys("mremap", e));
                start as *mut libc::c_void
            } else {
                // As it was, write protection included (see
                // `register_again`).
                let _ = register_again(uffd, &old, start, old_len, prot);
                old.lock.write_unlock();
                // A target the kernel unmapped before it failed is not ours
                // to unmap again.
                if let (Some(t), Some(a)) = (target, new_addr) {
                    if crate::sys::pagemap::page_present(a).is_err() {
                        let _ = t.into_raw();
                    }
                }
                return Err(Error::sys("mremap", e));
            }
        } else {
            p
        };
        if let Some(t) = target {
            // mremap replaced the reservation (or unmapped it, before it
            // failed).
            let _ = t.into_raw();
        }
        // Shrinking dropped the tail's PTEs. Shared pages stay in the memfd
        // (cached); anonymous memory past the end is discarded, as the
        // kernel does: those pages read as zeros if the region grows again.
        // Only now that the shrink happened: a refused mremap leaves the
        // region as it was, its tail's pages (resident or swapped) too.
        // (State words and the object's own memory only: no user address
        // is touched, and reclaim cannot reach the tail meanwhile, its
        // region lock held for writing.)
        if new_len < old_len {
            let shift = old.object.page_shift();
            let tail = old.pgoff + (new_len >> shift)..old.pgoff + (old_len >> shift);
            crate::discard::give_up_pages(self, &old.object, tail);
        }
        let new_start = p as usize;
        settle_stale(
            self,
            &old,
            new_start..new_start + new_len,
            start..start + old_len,
        );
        let new = Arc::new(old.resized(new_start, new_len));
        new.lock.write_lock();
        old.lock.mark_detached();
        let (first, end, _) = old.window();
        old.object.windows.replace(first, end, &[new.window()]);
        self.publish(std::slice::from_ref(&old), std::slice::from_ref(&new));
        let r = if crate::inject::reregister_fails() {
            Err(libc::ENOMEM)
        } else {
            register_again(uffd, &new, new_start, new_len, prot)
        };
        if r.is_err() {
            let _ = mprotect(new_start, new_len, libc::PROT_NONE);
            new.unregistered.store(true, Release);
        }
        old.lock.write_unlock();
        new.lock.write_unlock();
        let r = r.map(|_| ()).map_err(|e| Error::sys("UFFDIO_REGISTER", e));
        Ok((new_start, refused.map_or(r, Err)))
    }
}

/// Takes the regions the table still holds in `got`, the range the
/// kernel has just given the remap of `vma` (outside `own`, its old range),
/// for unmapped (see `events::apply::settle_stale`; the caller holds the
/// global lock for write).
///
/// Hazard: the application unmapped them with its own `munmap` (or moved
/// them with `mremap`) and the kernel freed the range before it posted the
/// event, which is not read yet; the remap's `quiesce` waits only for
/// events already read. Applied late, that event cut every region of its
/// descriptor in its range: the remapped region's new part too (its pages
/// lost, its range still registered with no region).
fn settle_stale(mm: &Mm, vma: &Vma, got: std::ops::Range<usize>, own: std::ops::Range<usize>) {
    let outside = [
        (got.start, got.end.min(own.start)),
        (got.start.max(own.end), got.end),
    ];
    // (Released here, under the global lock: see `Released::here`.)
    let mut released = crate::events::release::Released::here(mm);
    crate::events::apply::settle_stale(
        mm,
        &outside,
        Some((got.start, got.end)),
        &vma.object,
        false,
        &mut released,
    );
}

/// Registers `[start, start + len)`, mapped by `vma`, again after a remap
/// unregistered it (moved, or refused and left where it was), and gives it
/// protection `prot` back. The unregister cleared the write protection of
/// the clean pages of a shared object, and of an anonymous object that
/// protects its clean pages ([`Object::protects_clean`]), so they are
/// protected again and the next write to each is seen.
///
/// [`Object::protects_clean`]: crate::object::Object::protects_clean
fn register_again(
    uffd: &crate::sys::uffd::Uffd,
    vma: &crate::vma::Vma,
    start: usize,
    len: usize,
    prot: i32,
) -> std::result::Result<u64, i32> {
    let r = uffd.register(start, len, register_mode(&vma.object));
    // Unregistered, its unmap raises no event (`Vma::unregistered`).
    vma.unregistered.store(r.is_err(), Release);
    // Write-protected before the protection is given back: every PTE the
    // engine installed is dirty, so until then `mprotect(PROT_WRITE)` would
    // make a clean page writable, and a write to it from another thread
    // would go unseen (the page stays clean: lost at its eviction).
    let obj = &vma.object;
    let emulated = vma.read_only_wp.load(Acquire);
    let protects =
        (obj.kind == InstallKind::Shared && !obj.kernel_maps) || obj.protects_clean() || emulated;
    let mut prot = prot;
    let protect = || match crate::inject::reprotect_fails() {
        true => Err(libc::EAGAIN),
        false => uffd.writeprotect(start, len, true, false),
    };
    if r.is_ok() && protects && protect().is_err() {
        // A region made read-only with write protection that cannot be
        // protected again now is made read-only with `mprotect` instead
        // (its pages then stay resident: see `Mm::protect_with_wp`).
        if emulated {
            vma.read_only_wp.store(false, Release);
            prot = libc::PROT_READ;
        }
        // EAGAIN: an event is waiting, and it cannot be applied while the
        // caller holds the global lock. Without the protection a write to a
        // clean page would go unseen, so every mapped page counts as dirty
        // instead (written back once, needlessly at worst; an anonymous
        // one is moved out to swap rather than dropped, and one of a
        // read-only mapping, which cannot be moved, stays resident).
        // (Without the pages' locks: no write-back that would clear this
        // mark as it lets go of a page can be in flight. A flush takes
        // `&Region`, which the caller's `&mut` excludes; an eviction zaps
        // the page before it writes it, so a write after this faults and
        // waits for it: `race_windows`'s
        // `a_remap_that_cannot_protect_again_during_an_eviction_keeps_a_write`.)
        if obj.tracks_writes() || obj.protects_clean() {
            for i in vma.pages() {
                if obj.cache.load(i) & MAPPED != 0 {
                    obj.cache.update(i, DIRTY, CLEAN);
                }
            }
        }
    }
    let r = r.and_then(|m| mprotect(start, len, prot).map(|_| m));
    if r.is_ok() {
        crate::inject::after_reprotect(vma);
    }
    r
}
