//! Reclaim's own state: the staging slots anonymous pages are moved into
//! on their way to swap, kswapd's wake-up word, and the flag that leaves
//! reclaim to kswapd once a faulting context's clean pass fell short.

use crate::stats::Counter::IOCTL_DID_WORK;
use crate::stats::Counters;
use crate::sys::mem::Mapping;
use crate::sys::uffd::{feature, mode, Uffd, Want, MODE_DONTWAKE};
use crate::sys::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

/// Staging slots for anonymous eviction (one per concurrent evictor).
const STAGING_SLOTS: usize = 64;

/// How long `take_slot` waits while every slot is taken before it gives
/// up (a slot is held for one store write).
const TAKE_SLOT_WAIT_NS: u64 = 5_000_000;

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
    /// Slots that could not be emptied, never used again.
    stranded: AtomicU64,
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
            stranded: AtomicU64::new(0),
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

    /// Moves the page at `addr` into slot `s` (see
    /// [`move_to_slot`](Self::move_to_slot)): the read-write slot, or the
    /// read-only one for a read-only mapping. `UFFDIO_MOVE` also refuses
    /// (EINVAL) a move between a locked and an unlocked mapping: where
    /// neither slot takes the page, the slot's pages are locked
    /// (`MLOCK_ONFAULT`) and it is tried again, then unlocked and tried
    /// again (the application's `mlock` or `mlockall(MCL_FUTURE)` locks its
    /// regions, not the staging areas; its `mlockall(MCL_CURRENT)` after
    /// the pager was built locks the staging areas, not regions mapped
    /// later). Async-signal-safe (ioctls, `mlock2`, `munlock`).
    pub(super) fn move_out(
        &self,
        counters: &Counters,
        addr: usize,
        s: usize,
    ) -> Result<usize, i32> {
        let either = || match self.move_to_slot(counters, addr, s, false) {
            Err(libc::EINVAL) => self.move_to_slot(counters, addr, s, true),
            m => m,
        };
        match either() {
            Err(libc::EINVAL) => {}
            m => return m,
        }
        for lock in [true, false] {
            let mut changed = true;
            for area in [&self.staging, &self.staging_ro] {
                let slot = (area.addr() + s * PAGE_SIZE) as *const libc::c_void;
                // SAFETY: (un)locking one page of the engine's own staging
                // area; it changes nothing but the lock.
                let rc = unsafe {
                    if lock {
                        libc::syscall(libc::SYS_mlock2, slot, PAGE_SIZE, libc::MLOCK_ONFAULT) as i32
                    } else {
                        libc::munlock(slot, PAGE_SIZE)
                    }
                };
                changed &= rc == 0;
            }
            // (Not locked: past the process's RLIMIT_MEMLOCK, or not
            // allowed. No use trying the move again.)
            if !changed {
                continue;
            }
            match either() {
                Err(libc::EINVAL) => {}
                m => return m,
            }
        }
        Err(libc::EINVAL)
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
        crate::sys::mem::zap(slot, PAGE_SIZE).is_ok()
    }

    /// A free slot, or `None` if every slot stays taken for
    /// [`TAKE_SLOT_WAIT_NS`], or at once if every one is stranded (the
    /// caller's eviction fails; it spun for ever before, were slots ever
    /// stranded). Async-signal-safe (`sched_yield`, the clock).
    pub(super) fn take_slot(&self) -> Option<usize> {
        let mut deadline = 0u64;
        loop {
            let f = self.free_slots.load(Acquire);
            if f == 0 {
                if self.stranded.load(Relaxed) == u64::MAX {
                    return None;
                }
                let now = crate::sys::now_ns();
                if deadline == 0 {
                    deadline = now + TAKE_SLOT_WAIT_NS;
                } else if now > deadline {
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

    /// Slot `s` could not be emptied: it is not used again.
    pub(super) fn retire(&self, s: usize) {
        self.stranded.fetch_or(1 << s, Release);
    }

    pub(super) fn put_slot(&self, s: usize) {
        self.free_slots.fetch_or(1 << s, Release);
    }
}
