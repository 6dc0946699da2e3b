//! The address space: the engine's `mm_struct`. One per pager.
//!
//! It holds the global lock (`mmap_lock`), the region table (read locklessly
//! through [`Rcu`], as the kernel reads its maple tree under RCU), the
//! two of the pager's three userfaultfd descriptors (one that reports the
//! application's `madvise` and a quiet one; reclaim's own is in
//! `reclaim::staging`), the policy and the counters.

use crate::delivery::Delivery;
use crate::fault::Policy;
use crate::lru::{entry, DrainPolicy, Lru};
use crate::object::Object;
use crate::page_cache::{LRU_BATCHED, ON_LRU};
use crate::reclaim::staging::Reclaim;
pub use crate::region_table::Table;
use crate::rmap::ObjectTable;
use crate::stats::{Counter, Counters};
use crate::sync::global_lock::GlobalLock;
use crate::sync::rcu::Rcu;
use crate::sync::region_lock::TryReadError;
use crate::sync::work_queue::WorkQueue;
use crate::sys::uffd::Uffd;
use crate::vma::Vma;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;

mod usage;

/// Readahead requests that can wait at once; more are dropped (readahead
/// is a hint).
const READAHEAD_QUEUE: usize = 4096;

/// Busy extents that can wait at once for khugepaged; more stay in base
/// pages until their next fill.
const KHUGEPAGED_QUEUE: usize = 256;

/// Per-pager settings fixed at build time.
#[derive(Debug, Clone)]
pub struct Config {
    /// What the fault driver does after a RETRY.
    pub policy: Policy,
    /// How faults reach the engine.
    pub delivery: Delivery,
    /// Store read attempts before a page is poisoned.
    pub read_attempts: u32,
    /// Memory budget in pages (0: unlimited; no LRU is kept).
    pub budget_pages: u64,
    /// When populate drains the per-CPU LRU add batch.
    pub drain: DrainPolicy,
    /// LRU shards (per-node lruvec analog).
    pub lru_shards: usize,
    /// Run a background reclaimer (kswapd) when there is a budget.
    pub kswapd: bool,
    /// Largest readahead window in pages (0: no readahead).
    pub readahead_pages: u32,
    /// Readahead I/O threads.
    pub readahead_threads: usize,
    /// Fault-around base cluster in pages (≤ 1: off); a sequential
    /// reader's cluster grows to 8× this.
    pub fault_around_pages: usize,
    /// I/O worker threads, for stores that are not signal-safe.
    pub io_threads: usize,
    /// How long a store call on an I/O worker may take before it counts as
    /// failed, in ns.
    pub io_timeout_ns: u64,
    /// How long a thread waiting on an I/O worker, and a worker waiting for
    /// work, spin before they sleep (0: no spin).
    pub io_spin_ns: u64,
    /// Shared objects kept cached after their last region goes, at most
    /// ([`crate::kept`]; 0: none).
    pub keep_unmapped: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::default(),
            delivery: Delivery::default(),
            read_attempts: 3,
            budget_pages: 0,
            drain: DrainPolicy::Always,
            lru_shards: 1,
            kswapd: true,
            readahead_pages: 32,
            readahead_threads: 2,
            fault_around_pages: 64,
            io_threads: 2,
            io_spin_ns: 0,
            io_timeout_ns: 30_000_000_000,
            keep_unmapped: 16,
        }
    }
}

/// Descriptors of their own for regions, opened as regions are mapped and
/// closed as they go (per-region delivery: `crate::delivery::per_region`
/// implements it and serves each descriptor with a thread). The address
/// space knows only this much of how faults are delivered.
pub trait RegionDescriptors: Send + Sync + std::fmt::Debug {
    /// Opens a descriptor for a new region and starts serving it.
    /// `quiet`: the descriptor does not report `madvise` (see
    /// [`Object::quiet`]).
    fn open(&self, quiet: bool) -> std::io::Result<crate::sys::uffd::OwnDescriptor>;
    /// Stops serving `uffd` and joins its server: for a descriptor that
    /// registered nothing (a map that failed), which is the one caller,
    /// under the global lock: its server has read nothing to wait for.
    fn close(&self, uffd: &Uffd);
    /// Tells the server of `uffd` that its region is gone, without waiting
    /// for it: it serves what else the kernel keeps registered on the
    /// descriptor until the region's object lets the descriptor go (see
    /// `crate::delivery::per_region`). Called under the global lock too,
    /// for a region the application unmapped itself, whose event that
    /// server may be applying right now. Joined later (at the next `open`,
    /// `close` or `retire` once it has returned, or at `close_all`).
    fn retire(&self, uffd: &Uffd);
    /// Stops serving every descriptor (the pager is going).
    fn close_all(&self);
}

/// Why a lockless lookup gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupFail {
    /// No region, write-locked, or out of range: go to the global lock.
    Abort,
}

/// A region read-locked by a lockless lookup; unlocks on drop.
#[derive(Debug)]
pub struct VmaReadGuard<'a> {
    vma: &'a Vma,
}

impl std::ops::Deref for VmaReadGuard<'_> {
    type Target = Vma;
    fn deref(&self) -> &Vma {
        self.vma
    }
}

impl Drop for VmaReadGuard<'_> {
    fn drop(&mut self) {
        self.vma.lock.read_unlock();
    }
}

/// The address space. See the module docs.
#[derive(Debug)]
pub struct Mm {
    /// The global lock (`mmap_lock`).
    pub lock: GlobalLock,
    /// The region table.
    pub table: Rcu<Table>,
    /// The pager's userfaultfd for regions whose pages the application's
    /// `madvise` must reach ([`crate::events`]): anonymous regions mapped
    /// writable. It reports `munmap`, `mremap` and `madvise` on them. With
    /// per-region delivery every region has a descriptor of its own
    /// instead ([`Mm::uffd_for`]).
    pub uffd: Uffd,
    /// The pager's userfaultfd for the other regions (shared ones, and
    /// anonymous ones mapped read-only): it reports `munmap` and `mremap`
    /// only, so reclaim's batched `MADV_DONTNEED` of their clean pages
    /// raises no event.
    pub uffd_quiet: Uffd,
    /// The application's own calls on region memory, and the gate that
    /// keeps faults and reclaim out while the engine applies them.
    pub events: crate::events::Events,
    /// The process that made the address space (see [`crate::fork`]).
    pub pid: i32,
    /// Live pieces of each region (by region id): their start addresses.
    pub(crate) regions: std::sync::Mutex<std::collections::HashMap<u64, Vec<usize>>>,
    next_id: AtomicU64,
    /// Per-region descriptors and their handlers (per-region delivery only;
    /// set once, right after the address space is made).
    pub per_region: std::sync::OnceLock<Box<dyn RegionDescriptors>>,
    /// Settings.
    pub config: Config,
    /// Event counters.
    pub counters: Counters,
    /// Unmaps that have given their range up (dropped their dying claim);
    /// with the events applied, what [`Mm::claims_epoch`] counts.
    pub claims_dropped: AtomicU64,
    /// Pages cached or installed now.
    pub resident: AtomicU64,
    /// Highest `resident` seen.
    pub peak_resident: AtomicU64,
    /// Objects by slot, for reclaim (the rmap).
    pub objects: ObjectTable,
    /// Resident pages in reclaim order.
    pub lru: Lru,
    /// Reclaim state (staging area, kswapd wake-ups).
    pub reclaim: Reclaim,
    /// Readahead requests, drained by the readahead threads
    /// ([`crate::readahead`]).
    pub readahead: WorkQueue,
    /// Extents to collapse into huge folios that were busy when their
    /// fill completed them, drained by khugepaged ([`crate::collapse`]).
    pub khugepaged: WorkQueue,
    /// Requests to the I/O workers (stores that are not signal-safe).
    pub io: crate::io::Io,
    /// Shared objects no region maps, kept with their pages cached.
    pub(crate) kept: crate::kept::KeptObjects,
    /// Objects no region maps whose write-back failed.
    pub(crate) unwritten: crate::unwritten::Unwritten,
    /// Serialises dropping a reference to an object with the check for the
    /// last one ([`Mm::release_object`]).
    pub(crate) releasing: std::sync::Mutex<()>,
}

impl Mm {
    /// A new, empty address space over `uffd` (and `uffd_quiet`: see the
    /// fields).
    pub fn new(uffd: Uffd, uffd_quiet: Uffd, config: Config) -> Result<Mm, (&'static str, i32)> {
        let lru = Lru::new(config.lru_shards, config.budget_pages as usize)
            .map_err(|e| ("mmap LRU", e))?;
        let reclaim = Reclaim::new()?;
        let io = crate::io::Io::new(config.io_timeout_ns, config.io_spin_ns)
            .map_err(|e| ("mmap I/O buffers", e))?;
        Ok(Mm {
            lock: GlobalLock::new(),
            table: Rcu::new(Table::default()),
            uffd,
            uffd_quiet,
            events: Default::default(),
            pid: crate::fork::pid(),
            regions: Default::default(),
            next_id: AtomicU64::new(1),
            claims_dropped: AtomicU64::new(0),
            per_region: std::sync::OnceLock::new(),
            config,
            counters: Counters::default(),
            resident: AtomicU64::new(0),
            peak_resident: AtomicU64::new(0),
            objects: ObjectTable::new().map_err(|e| ("mmap object table", e))?,
            lru,
            reclaim,
            readahead: WorkQueue::new(READAHEAD_QUEUE),
            khugepaged: WorkQueue::new(KHUGEPAGED_QUEUE),
            io,
            kept: Default::default(),
            unwritten: Default::default(),
            releasing: Default::default(),
        })
    }

    /// The descriptor `obj`'s mapping is registered with: its own
    /// (per-region delivery) or one of the pager's. Async-signal-safe (two
    /// loads).
    #[inline]
    pub fn uffd_for<'a>(&'a self, obj: &'a Object) -> &'a Uffd {
        match obj.region_uffd.get() {
            Some(u) => u.arc(),
            None => self.pager_uffd(obj.quiet),
        }
    }

    /// Goes up whenever a range this address space claimed stops being
    /// claimed: an unmap finished, or an event (the application's own
    /// `munmap` or `mremap`) applied. Atomics only: signal-safe.
    pub fn claims_epoch(&self) -> u64 {
        self.claims_dropped
            .load(std::sync::atomic::Ordering::SeqCst)
            .wrapping_add(self.events.epoch())
    }

    /// The pager's descriptor for quiet or event-reporting regions.
    #[inline]
    pub fn pager_uffd(&self, quiet: bool) -> &Uffd {
        if quiet {
            &self.uffd_quiet
        } else {
            &self.uffd
        }
    }

    /// `Err(ForkedChild)` in a `fork()`ed child (see [`crate::fork`]).
    #[inline]
    pub fn check_owner(&self) -> crate::error::Result<()> {
        if crate::fork::is_child_of(self.pid) {
            Err(crate::error::Error::ForkedChild)
        } else {
            Ok(())
        }
    }

    /// Whether this is a `fork()`ed child of the process that made the
    /// address space.
    #[inline]
    pub fn in_child(&self) -> bool {
        crate::fork::is_child_of(self.pid)
    }

    /// Regions mapped now.
    pub fn region_count(&self) -> usize {
        // (A lock applying an event takes: see `Mm::with_pieces`.)
        let _deferred = crate::sys::thread::Deferred::new();
        self.regions.lock().map_or(0, |r| r.len())
    }

    /// A fresh region id.
    pub(crate) fn next_region_id(&self) -> u64 {
        self.next_id.fetch_add(1, Relaxed)
    }

    /// `lock_vma_under_rcu`: finds the region of `addr` without the global
    /// lock and read-locks it. A region found detached is counted
    /// (`VMA_LOCK_MISS`) and the lookup repeated. Async-signal-safe.
    #[inline]
    pub fn lock_vma_under_rcu(&self, addr: usize) -> Result<VmaReadGuard<'_>, LookupFail> {
        self.lookup_and_lock(addr, true)
    }

    /// As [`Mm::lock_vma_under_rcu`], for reclaim: nothing is counted.
    pub fn lock_vma_quiet(&self, addr: usize) -> Option<VmaReadGuard<'_>> {
        self.lookup_and_lock(addr, false).ok()
    }

    #[inline]
    fn lookup_and_lock(&self, addr: usize, count: bool) -> Result<VmaReadGuard<'_>, LookupFail> {
        loop {
            let r = self.table.read(|t| {
                let e = t.find_entry(addr).ok_or(TryReadError::WriteLocked)?;
                // The object's lines load while we lock the region.
                e.prefetch_object();
                let v = e.vma();
                crate::inject::after_lookup(v);
                v.lock.try_read()?;
                if !v.contains(addr) {
                    v.lock.read_unlock();
                    return Err(TryReadError::WriteLocked);
                }
                Ok(Arc::as_ptr(v))
            });
            match r {
                // SAFETY: the region is read-locked; a writer must write-lock
                // it (waiting for us) before it can be detached and freed, so
                // the pointer stays valid for the guard's life, which is tied
                // to `&self` (the table's owner).
                Ok(p) => {
                    return Ok(VmaReadGuard {
                        vma: unsafe { &*p },
                    })
                }
                Err(TryReadError::Detached) => {
                    if count {
                        self.counters.inc(Counter::VMA_LOCK_MISS);
                    }
                    std::hint::spin_loop();
                }
                Err(TryReadError::WriteLocked) => return Err(LookupFail::Abort),
            }
        }
    }

    /// Finds the region of `addr` while the caller holds the global lock
    /// (read or write), which keeps the region alive.
    #[inline]
    pub fn find_vma_locked(&self, addr: usize) -> Option<&Vma> {
        // SAFETY: with the global lock held no writer can change the table,
        // so the snapshot and its regions outlive the caller's lock guard,
        // which borrows `self` as we do.
        self.table
            .read(|t| t.find(addr).map(Arc::as_ptr))
            .map(|p| unsafe { &*p })
    }

    /// Whether a live region of this address space holds `addr`.
    /// Async-signal-safe.
    pub fn owns_live(&self, addr: usize) -> bool {
        self.live_placement(addr).is_some()
    }

    /// When the live region that holds `addr` was placed there
    /// ([`Vma::placed`]), if one does. Async-signal-safe.
    pub fn live_placement(&self, addr: usize) -> Option<u64> {
        self.table.read(|t| t.find(addr).map(|v| v.placed))
    }

    /// [`live_placement`](Self::live_placement), and whether the claim is
    /// in doubt: an event of this address space is on its way (its
    /// descriptor's `mmap_changing`: the application's `munmap` or
    /// `mremap` began and the event is unread), read and not yet applied,
    /// or being applied; or the engine itself is changing the region (it
    /// is write-locked, or detached and replaced: an unmap or remap of it,
    /// whose range the kernel may have freed already); or the region's range is no longer
    /// registered ([`Vma::unregistered`]), so its unmap raises no event.
    /// Otherwise an application's unmap of the region would have raised
    /// an event first. The events are the whole address space's, so a
    /// true claim can be in doubt too: the SIGBUS handler prefers a claim
    /// that is not and compares placements among the rest. One system
    /// call, for a fault that more than one address space claims.
    /// Async-signal-safe (errno is the caller's to keep).
    pub fn live_claim(&self, addr: usize) -> Option<(u64, bool)> {
        self.table.read(|t| {
            t.find(addr).map(|v| {
                // The descriptor before the events: an event read since
                // the look at the descriptor counts as in flight until it
                // is applied, and the kernel clears `mmap_changing` only
                // after the read.
                let doubt = v.lock.is_write_locked()
                    || v.lock.is_detached()
                    || v.unregistered.load(Acquire)
                    || self.uffd_for(&v.object).mmap_changing()
                    || self.events.pending()
                    || self.events.in_flight();
                (v.placed, doubt)
            })
        })
    }

    /// Whether a fault at `addr` may have to read its page from a store
    /// now, or wait for another's store call: the page is locked, or not up
    /// to date in its cache and not a never-swapped page of zero-filled
    /// memory (filled without I/O). What a handler thread asks before it serves a
    /// fault while others it served wait for their wake-up. A lockless
    /// look: a wrong answer only wakes them early, or late as before.
    pub fn may_read_store(&self, addr: usize) -> bool {
        use crate::page_cache::{LOCKED, SWAPPED, UPTODATE};
        self.table.read(|t| {
            t.find(addr).is_some_and(|v| {
                let w = v.object.cache.load(v.page_index(addr));
                // (Locked: a read in flight, or an eviction's write, which
                // the fault waits for.)
                w & LOCKED != 0 || w & UPTODATE == 0 && (!v.object.zero_fill || w & SWAPPED != 0)
            })
        })
    }

    /// Whether a region of this address space still maps `obj` (a piece of
    /// it). Not its windows, which keep at most `WINDOWS` (4) pieces for
    /// reclaim:
    /// a region cut into more has pieces none lists. One walk of the table.
    pub fn maps_object(&self, obj: &crate::object::Object) -> bool {
        self.table
            .read(|t| t.iter().any(|v| std::ptr::eq(&*v.object, obj)))
    }

    /// Whether `addr` lies in a range this address space is unmapping.
    /// Async-signal-safe.
    pub fn claims_dying(&self, addr: usize) -> bool {
        self.table.read(|t| t.dying_claims(addr))
    }

    /// A page of `obj` became resident (cached or installed): the LRU add
    /// hook. Async-signal-safe.
    #[inline]
    pub fn page_cached(&self, obj: &Object, i: usize) {
        if self.config.budget_pages == 0 {
            return;
        }
        // One step: a page already tracked is left as it is. (Setting both
        // bits and then taking LRU_BATCHED back off a page in the ring
        // let a `compact` in between take the page for one waiting in an
        // add batch and drop its only entry.)
        let prev = obj
            .cache
            .word(i)
            .fetch_update(AcqRel, Relaxed, |w| {
                (w & ON_LRU == 0).then_some(w | ON_LRU | LRU_BATCHED)
            })
            .unwrap_or_else(|w| w);
        if prev & ON_LRU != 0 {
            return;
        }
        let slot = obj.slot.load(Relaxed);
        self.lru.add(entry(slot, i), &self.objects, &self.counters);
    }

    /// Uncharges `n` pages.
    #[inline]
    pub fn uncharge(&self, n: u64) {
        self.resident.fetch_sub(n, Relaxed);
    }
}
