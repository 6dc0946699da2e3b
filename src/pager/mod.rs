//! The embedding API: [`Pager::builder`] → [`Pager`] → [`Region`]s.

use crate::address_space::Mm;
use crate::delivery::Delivery;
use crate::error::Result;
use crate::fault::Policy;
use crate::stats::Stats;
use crate::sys::uffd::Descriptor;
use inner::PagerInner;
use std::sync::Arc;

mod builder;
#[cfg(feature = "fault-inject")]
pub(crate) mod inject;
pub(crate) mod inner;
pub mod limits;
mod map;
mod map_checks;
mod options;

pub use builder::PagerBuilder;
pub use options::{Access, MapOptions};

/// A pager: one address space whose regions fault through the engine.
///
/// Several pagers may coexist in a process, in either delivery mode.
///
/// ```
/// use uffd_pager::{MapOptions, Pager};
///
/// let pager = Pager::builder().budget_pages(64).build()?;
/// let mut region = pager.map_anonymous(1 << 20)?; // 256 pages, 64 resident at most
/// for page in region.as_mut_slice().chunks_mut(uffd_pager::PAGE_SIZE) {
///     page[0] = 1; // each write faults; older pages go to swap
/// }
/// assert!(region.as_slice().chunks(uffd_pager::PAGE_SIZE).all(|p| p[0] == 1));
/// assert!(pager.stats().peak_resident_pages <= 64 + 32);
/// # Ok::<(), uffd_pager::Error>(())
/// ```
///
/// Mapping a file works the same way ([`Pager::map_file`]; a fuller example
/// is `examples/embed_file.rs`).
pub struct Pager {
    inner: Arc<PagerInner>,
    swap: map::Swap,
}

/// `Pager { policy: Policy { .. }, delivery: InThread, budget_pages: 4096,
/// regions: 2 }`: its settings and how many regions it has, not the engine
/// state behind them.
impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mm = &self.inner.mm;
        f.debug_struct("Pager")
            .field("policy", &mm.config.policy)
            .field("delivery", &mm.config.delivery)
            .field("budget_pages", &mm.config.budget_pages)
            .field("regions", &mm.region_count())
            .finish()
    }
}

impl Pager {
    /// A builder with the defaults: `retry-once`, in-thread delivery.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn builder() -> PagerBuilder {
        PagerBuilder::default()
    }

    #[allow(dead_code)]
    pub(crate) fn mm(&self) -> &Arc<Mm> {
        &self.inner.mm
    }

    /// Reclaims up to `nr` pages now, from the calling thread (drop-caches
    /// style); returns how many were freed. Pages of pinned regions and
    /// pages in use (locked) are skipped.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn reclaim_pages(&self, nr: u64) -> u64 {
        // Evictions hold page locks (a dirty one's across its store
        // write): a handler of the application's that touched one of those
        // pages would wait for its own thread (see `Deferred`).
        let _deferred = crate::sys::thread::Deferred::new();
        let mm = &self.inner.mm;
        if mm.in_child() {
            return 0;
        }
        // The application's own munmap/mmap just made is applied first,
        // so this call sees the address space it left.
        mm.events.wait_applied();
        let _section = mm.events.section();
        crate::reclaim::shrink(mm, nr)
    }

    /// Writes back, again, the dirty pages of regions that were unmapped
    /// (by [`Region::unmap`](crate::Region::unmap), a drop, or the
    /// application's own `munmap`) while their store refused them. The
    /// pager keeps such pages, outside its budget, until they are written:
    /// here, before another region over the same store is mapped, or when
    /// the pager is dropped (which logs any it still cannot write: only
    /// those are lost). A write-back whose store `sync` fails keeps its
    /// pages dirty too. Also writes the dirty pages of shared regions the
    /// application unmapped while a residency guard, or a flush or
    /// refresh in flight, held them (still charged to the budget: their
    /// release waits for that holder, and a map of the same store writes
    /// them first too). Returns the first store error; what failed stays
    /// kept. Waits for the stores in this thread (called on the I/O
    /// workers for a store that is not signal-safe, within the I/O
    /// timeout).
    ///
    /// ```
    /// use uffd_pager::Pager;
    ///
    /// let pager = Pager::builder().build()?;
    /// pager.flush_unmapped()?; // nothing is waiting
    /// assert_eq!(pager.unwritten_bytes(), 0);
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    pub fn flush_unmapped(&self) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        let mm = &self.inner.mm;
        mm.check_owner()?;
        // The application's own munmap just made is applied first, so its
        // region's pages are among those written.
        mm.events.quiesce();
        mm.flush_unwritten(crate::unwritten::Which::All)
    }

    /// [`flush_unmapped`](Self::flush_unmapped) for the pages of one file
    /// only: of stores whose [`Store::identity`](crate::store::Store::identity)
    /// is `identity` (its device and inode numbers, as `stat` gives them).
    pub fn flush_unmapped_of(&self, identity: (u64, u64)) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        let mm = &self.inner.mm;
        mm.check_owner()?;
        mm.events.quiesce();
        mm.flush_unwritten(crate::unwritten::Which::Identity(identity))
    }

    /// The bytes of dirty pages of unmapped regions waiting for their
    /// store (see [`flush_unmapped`](Self::flush_unmapped)), those a
    /// residency guard or a flush in flight holds among them.
    pub fn unwritten_bytes(&self) -> u64 {
        // (As `Region::mapped`: an event being applied may take the list.)
        let _deferred = crate::sys::thread::Deferred::new();
        self.inner.mm.unwritten_bytes(crate::unwritten::Which::All)
    }

    /// LRU-lock (acquisitions, contended acquisitions) per shard.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn lru_shard_counts(&self) -> Vec<(u64, u64)> {
        self.inner.mm.lru.shard_counts()
    }

    /// A statistics snapshot.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn stats(&self) -> Stats {
        self.inner.mm.stats()
    }

    /// What the pager holds in memory now, by kind, beside its budget: its
    /// real footprint (see [`MemoryUse`](crate::MemoryUse)). Walks the
    /// regions and asks the kernel about their pages: a report, not a
    /// counter (milliseconds for gigabytes of regions). The walk holds the
    /// global lock's read side, as `/proc/PID/smaps` holds `mmap_lock`:
    /// maps, unmaps and faults that fall back to the global lock wait for
    /// it; faults under a region's lock do not. Not to be called from a
    /// [`Store`](crate::store::Store)'s own methods: a fault may be waiting
    /// for the store while an unmap, holding the write side, waits for the
    /// fault.
    ///
    /// Example: [`MemoryUse`](crate::MemoryUse).
    pub fn memory_use(&self) -> crate::MemoryUse {
        self.inner.mm.memory_use()
    }

    /// Zeroes the counters.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn reset_stats(&self) {
        self.inner.mm.reset_stats()
    }

    /// The policy.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn policy(&self) -> Policy {
        self.inner.mm.config.policy
    }

    /// The userfaultfd descriptor the pager got: through `/dev/userfaultfd`
    /// or the system call, and whether it is user-mode-only (faults inside
    /// system calls fail with `EFAULT`; see [`Region::prefault`](crate::Region::prefault)).
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn descriptor(&self) -> Descriptor {
        self.inner.mm.uffd.descriptor()
    }

    /// The delivery mode.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn delivery(&self) -> Delivery {
        self.inner.mm.config.delivery
    }
}
