//! Putting a page that reclaim moved out back where it was.

use crate::address_space::Mm;
use crate::sys::uffd::MODE_DONTWAKE;
use crate::sys::PAGE_SIZE;
use crate::vma::Vma;
use std::sync::atomic::Ordering::*;

/// Puts a page moved out of `vma` at `addr` into the staging slot at
/// `src` back where it was (a page in the slot is one there, resident or
/// swapped out by the kernel meanwhile), when it can go nowhere else (no cache area
/// could be made to keep it). Returns whether the slot is free again: the
/// page went home, or it was not there. Async-signal-safe.
///
/// Hazard: the move back can be refused where the move out was not: a
/// first write made a region that was read-only with write protection
/// read-only for real meanwhile (a fault under the region's read lock, as
/// the caller holds; see `Vma::read_only_wp`). A copy then puts the
/// contents back, and the slot is emptied. A page moved in is mapped
/// writable: in a region still read-only with write protection it is
/// protected again, or the region is made read-only for real.
///
/// Hazard: the range may have left the region since the page moved out
/// (the application's `munmap` or `mremap`, whose event is read and not
/// yet applied with handler threads), and another mapping taken its place:
/// the copy would fill it, the `mprotect` change it. So it runs as a fill
/// ([`crate::events::Events::fill`]), and not while an unmap or move is on
/// its way; backed off, the page stays in the slot (the caller retires
/// it), as a page whose range went away is the application's to drop.
pub(super) fn put_back(mm: &Mm, vma: &Vma, addr: usize, src: usize) -> bool {
    use crate::sys::pagemap::page_there;
    let uffd = mm.uffd_for(&vma.object);
    let in_thread = mm.config.delivery.is_in_thread();
    let home = mm.events.fill(in_thread, || match uffd.mmap_changing() {
        true => Err(libc::EAGAIN),
        false => Ok(put_back_now(mm, vma, addr, src)),
    });
    home.unwrap_or_else(|_| page_there(src) != Ok(true))
}

/// [`put_back`], once it is safe to.
fn put_back_now(mm: &Mm, vma: &Vma, addr: usize, src: usize) -> bool {
    use crate::sys::mem::mprotect;
    use crate::sys::pagemap::page_there;
    let uffd = mm.uffd_for(&vma.object);
    let emulated = vma.read_only_wp.load(Acquire);
    let back = uffd.mv(addr, src, PAGE_SIZE, MODE_DONTWAKE);
    if back.is_ok()
        && emulated
        && uffd.writeprotect(addr, PAGE_SIZE, true, true).is_err()
        && mprotect(vma.start, vma.len(), libc::PROT_READ).is_ok()
    {
        vma.read_only_wp.store(false, Release);
    }
    let wp = if emulated {
        crate::sys::uffd::MODE_WP
    } else {
        0
    };
    let copied = back.is_err()
        && page_there(src) == Ok(true)
        && uffd.copy(addr, src, PAGE_SIZE, MODE_DONTWAKE | wp).is_ok();
    let emptied = copied && mm.reclaim.empty(src);
    back.is_ok() || emptied || page_there(src) != Ok(true)
}
