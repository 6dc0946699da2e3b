//! Reclaim's own state: the staging slots anonymous pages are moved into
//! on their way to swap, and kswapd's wake-up word.

use crate::stats::Counter::IOCTL_DID_WORK;
use crate::stats::Counters;
use crate::sys::mem::Mapping;
use crate::sys::uffd::{feature, mode, Uffd, Want, MODE_DONTWAKE};
use crate::sys::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

/// Staging slots for anonymous eviction (one per concurrent evictor).
const STAGING_SLOTS: usize = 64;

/// How many times `take_slot` yields while every slot is taken before it
/// gives up.
const TAKE_SLOT_TRIES: u32 = 100_000;

/// Per-pager reclaim state.
#[derive(Debug)]
pub struct Reclaim {
    /// Staging slots that anonymous pages are moved into before they are
    /// written to swap: read-write for pages of writable mappings, and a
    /// read-only twin for pages of read-only ones (`UFFDIO_MOVE` moves only
    /// between mappings of the same protection).
    staging: Mapping,
    staging_ro: Mapping,
    /// The descriptor the staging areas are registered with (a `UFFDIO_MOVE`
    /// is issued on its destination's descriptor). It asks for no
    /// non-cooperative events, so emptying a slot with `MADV_DONTNEED`
    /// blocks on no event reader.
    uffd: Uffd,
    pub(super) free_slots: AtomicU64,
    pub(super) kswapd_seq: AtomicU32,
    pub(super) kswapd_sleeping: AtomicBool,
    /// A faulting context's clean pass past the high watermark freed less
    /// than its batch: faulting contexts leave reclaim to kswapd until it
    /// sleeps again (see `kswapd`'s module docs).
    pub(super) clean_refused: AtomicBool,
    pub(super) stop: AtomicBool,
}

impl Reclaim {
    /// Bytes of memory the staging slots hold now (pages in flight to swap).
    pub fn resident_bytes(&self) -> u64 {
        self.staging.resident() + self.staging_ro.resident()
    }

    /// Staging areas registered (MISSING) with a descriptor of their own,
    /// so they can be `UFFDIO_MOVE` destinations.
    pub fn new() -> Result<Reclaim, (&'static str, i32)> {
        let uffd = Uffd::open_as(feature::MOVE, Want::UserModeOnly, false)
            .map_err(|_| ("userfaultfd for staging", libc::EPERM))?;
        let staging =
            Mapping::anonymous(STAGING_SLOTS * PAGE_SIZE).map_err(|e| ("mmap staging", e))?;
        let staging_ro =
            Mapping::anonymous(STAGING_SLOTS * PAGE_SIZE).map_err(|e| ("mmap staging", e))?;
        crate::sys::mem::mprotect(staging_ro.addr(), staging_ro.len(), libc::PROT_READ)
            .map_err(|e| ("mprotect staging", e))?;
        for area in [&staging, &staging_ro] {
            uffd.register(area.addr(), area.len(), mode::MISSING)
                .map_err(|e| ("UFFDIO_REGISTER staging", e))?;
        }
        Ok(Reclaim {
            staging,
            staging_ro,
            uffd,
            free_slots: AtomicU64::new(u64::MAX),
            kswapd_seq: AtomicU32::new(0),
            kswapd_sleeping: AtomicBool::new(false),
            clean_refused: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    /// Moves the page at `addr` into staging slot `s`, the read-only slot if
    /// `read_only`. Returns where the page is now, or the errno if it did
    /// not move.
    ///
    /// # Hazard
    /// This kernel's `UFFDIO_MOVE` can return an error (EEXIST, seen with
    /// a racing write that changed the source PTE) after it moved the page
    /// (`shared/tools/uffd-move-eexist.c`). The slot was empty and is ours,
    /// so on any error the slot itself says whether the page arrived.
    pub(super) fn move_to_slot(
        &self,
        counters: &Counters,
        addr: usize,
        s: usize,
        read_only: bool,
    ) -> Result<usize, i32> {
        let area = if read_only {
            &self.staging_ro
        } else {
            &self.staging
        };
        let slot = area.addr() + s * PAGE_SIZE;
        match self.uffd.mv(slot, addr, PAGE_SIZE, MODE_DONTWAKE) {
            Ok(_) => Ok(slot),
            Err(e) => {
                if crate::sys::pagemap::page_there(slot) == Ok(true) {
                    counters.inc(IOCTL_DID_WORK);
                    Ok(slot)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Empties the slot page at `slot` for its next page. `MADV_DONTNEED`
    /// fails on a locked mapping (the application's `mlockall` after the
    /// pager was built locks the staging areas too): `MADV_DONTNEED_LOCKED`
    /// empties it then, and leaves the lock (`UFFDIO_MOVE` moves only
    /// between mappings both locked or both not, so the slot must stay as
    /// locked as the regions). Before, the failure was ignored, and the
    /// next move into the full slot failed with EEXIST and was taken for a
    /// move that arrived: another page's bytes went to swap and the page
    /// itself stayed mapped, uncharged. False if it could not be emptied
    /// (the slot must not be used again). Async-signal-safe.
    pub(super) fn empty(&self, slot: usize) -> bool {
        use crate::sys::mem::madvise;
        /// `MADV_DONTNEED_LOCKED` (Linux 5.18, before `UFFDIO_MOVE`).
        const MADV_DONTNEED_LOCKED: i32 = 24;
        match madvise(slot, PAGE_SIZE, libc::MADV_DONTNEED) {
            Ok(()) => true,
            Err(libc::EINVAL) => madvise(slot, PAGE_SIZE, MADV_DONTNEED_LOCKED).is_ok(),
            Err(_) => false,
        }
    }

    /// A free slot, or `None` if every slot stays taken for a long while
    /// (the caller's eviction fails; it spun for ever before, were slots
    /// ever stranded).
    pub(super) fn take_slot(&self) -> Option<usize> {
        let mut tries = 0u32;
        loop {
            let f = self.free_slots.load(Acquire);
            if f == 0 {
                tries += 1;
                if tries > TAKE_SLOT_TRIES {
                    return None;
                }
                std::thread::yield_now();
                continue;
            }
            let b = f.trailing_zeros() as u64;
            if self
                .free_slots
                .compare_exchange(f, f & !(1 << b), AcqRel, Relaxed)
                .is_ok()
            {
                return Some(b as usize);
            }
        }
    }

    pub(super) fn put_slot(&self, s: usize) {
        self.free_slots.fetch_or(1 << s, Release);
    }
}
