//! [`PagerBuilder`]: the settings, and `build`, which opens the
//! descriptors and starts delivery.

use super::{inner::PagerInner, limits, map, Pager};
use crate::address_space::{Config, Mm};
use crate::delivery::threads::{HandlerPool, Serve};
use crate::delivery::{sigbus, Delivery};
use crate::error::{Error, Result};
use crate::fault::Policy;
use crate::sys::uffd::{feature, Uffd, Want};
use std::sync::Arc;

/// Builds a [`Pager`].
///
/// ```
/// use uffd_pager::{Delivery, Pager, Policy, PolicyKind};
///
/// let pager = Pager::builder()
///     .policy(Policy::new(PolicyKind::RetryOnce))
///     .delivery(Delivery::Threads { threads: 1, spin_us: 0 })
///     .budget_pages(256) // at most 1 MiB resident; the rest is evicted
///     .readahead(16, 1)
///     .build()?;
/// assert_eq!(pager.delivery(), Delivery::Threads { threads: 1, spin_us: 0 });
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct PagerBuilder {
    config: Config,
    user_mode_only: Option<bool>,
    swap: map::Swap,
}

impl PagerBuilder {
    /// The largest fault-around cluster [`fault_around`](Self::fault_around)
    /// takes, in pages (64 MiB of 4 KiB pages; a sequential reader's
    /// cluster then grows to 512 MiB). A larger value is taken as this.
    pub const MAX_FAULT_AROUND: usize = 16384;

    /// The fault-handling policy (default `retry-once`).
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn policy(mut self, p: Policy) -> Self {
        self.config.policy = p;
        self
    }

    /// How faults are delivered (default in-thread).
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn delivery(mut self, d: Delivery) -> Self {
        self.config.delivery = d;
        self
    }

    /// Store read attempts before a page is poisoned (default 3, min 1).
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn read_attempts(mut self, n: u32) -> Self {
        self.config.read_attempts = n.max(1);
        self
    }

    /// Memory budget in pages across all regions (0: unlimited; else at
    /// least 4, as one access may need four pages resident at once: a
    /// smaller one is [`Error::Config`](crate::Error::Config) at `build`).
    /// Resident means cached plus installed.
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn budget_pages(mut self, pages: u64) -> Self {
        self.config.budget_pages = pages;
        self
    }

    /// When populate drains the per-CPU LRU add batch (default `always`).
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn drain_policy(mut self, d: crate::lru::DrainPolicy) -> Self {
        self.config.drain = d;
        self
    }

    /// LRU shards (default 1): the per-node lruvec analog.
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn lru_shards(mut self, n: usize) -> Self {
        self.config.lru_shards = n.max(1);
        self
    }

    /// Swap anonymous regions to unlinked files in `dir` instead of memory
    /// (the default swap store is an in-memory [`MemoryStore`]).
    ///
    /// [`MemoryStore`]: crate::store::MemoryStore
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn swap_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.swap = map::Swap::Dir(dir.into());
        self
    }

    /// Swap anonymous regions to stores that `make` returns: called once
    /// for each anonymous region (and each store-backed region installed
    /// anonymously) with the byte length its swap must hold, it returns
    /// that region's own swap store, for example a namespace of its own on
    /// a Redis server (far memory). An error from `make` fails the map
    /// call with [`Error::Io`](crate::Error::Io). The stores may be
    /// ordinary Rust (see [`crate::store`]): pages then go to swap and
    /// come back through the I/O workers.
    ///
    /// # Safety
    /// Each store `make` returns is the swap of one region and of nothing
    /// else: until the pager is dropped, its bytes change only by the
    /// engine's writes, and a read returns what the engine last wrote
    /// there. A page swapped out is read back when it is touched again, so
    /// a store changed behind the engine (through a handle the caller
    /// kept, or a Redis key another client writes) would change the bytes
    /// under a live slice of an anonymous region, which is undefined
    /// behaviour in Rust. A fresh store per call that the caller does not
    /// keep, or a namespace nobody else uses, keeps it. A store whose
    /// [`Store::signal_safe`](crate::store::Store::signal_safe) says true
    /// must be async-signal-safe, as for
    /// [`Pager::map_store`](crate::Pager::map_store).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use uffd_pager::store::{MemoryStore, Store};
    /// use uffd_pager::Pager;
    ///
    /// let builder = Pager::builder().budget_pages(4);
    /// // SAFETY: each swap store is made here and kept by the pager alone.
    /// let builder = unsafe {
    ///     builder.swap_to(|len| Ok(Arc::new(MemoryStore::new(len as u64)?) as Arc<dyn Store>))
    /// };
    /// let pager = builder.build()?;
    /// let mut region = pager.map_anonymous(64 * uffd_pager::PAGE_SIZE)?;
    /// region.as_mut_slice().fill(7); // most pages go to their swap store
    /// assert!(region.as_slice().iter().all(|&b| b == 7));
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    ///
    /// Without the promise it does not compile:
    ///
    /// ```compile_fail,E0133
    /// # use std::sync::Arc;
    /// # use uffd_pager::store::{MemoryStore, Store};
    /// let builder = uffd_pager::Pager::builder()
    ///     .swap_to(|len| Ok(Arc::new(MemoryStore::new(len as u64)?) as Arc<dyn Store>));
    /// ```
    pub unsafe fn swap_to<F>(mut self, make: F) -> Self
    where
        F: Fn(usize) -> std::io::Result<Arc<dyn crate::store::Store>> + Send + Sync + 'static,
    {
        self.swap = map::Swap::To(Arc::new(make));
        self
    }

    /// Largest readahead window in pages (default 32; 0 turns readahead
    /// off) and the I/O threads that serve it (default 2).
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn readahead(mut self, max_pages: u32, threads: usize) -> Self {
        self.config.readahead_pages = max_pages;
        self.config.readahead_threads = threads.max(1);
        self
    }

    /// Fault-around base cluster in pages (default 64 = 256 KiB; the
    /// kernel's `fault_around_bytes` default is 16 pages, but a userspace
    /// fault costs a signal or a thread hop, so the engine maps more per
    /// fault; 0 or 1 turns it off). Rounded down to a power of two, and
    /// to [`MAX_FAULT_AROUND`](Self::MAX_FAULT_AROUND) pages at most. A
    /// sequential reader's cluster doubles at each fault, up to 8× this.
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn fault_around(mut self, pages: usize) -> Self {
        let pages = pages.min(Self::MAX_FAULT_AROUND);
        self.config.fault_around_pages = if pages <= 1 {
            0
        } else {
            1 << (usize::BITS - 1 - pages.leading_zeros())
        };
        self
    }

    /// Shared objects whose pages stay cached after the last region over
    /// their store is unmapped, at most (default 16; 0: none). A region
    /// mapped again over the same store (the same `Arc`, the same length
    /// and page size) finds its pages there, as the kernel's page cache
    /// outlives a file's mappings, if the store says its contents have not
    /// changed since ([`Store::contents_stamp`](crate::store::Store::contents_stamp));
    /// otherwise it reads them anew. Kept pages stay charged to the budget
    /// and reclaim frees them like any cached page; the oldest kept object
    /// goes first when more are kept. Only with a budget, for a store the
    /// caller still holds, whose stamp has not moved since the object was
    /// made (its own write-backs move it too); never after a pinned region
    /// or with per-region delivery.
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn keep_unmapped(mut self, objects: usize) -> Self {
        self.config.keep_unmapped = objects;
        self
    }

    /// How long a call to a store that is not signal-safe (and any
    /// store's sync) may take before it counts as failed (default 30 s): a read that never returns then
    /// takes the read-error path (the access gets SIGBUS), a write-back
    /// keeps the page dirty, a sync fails its flush. (The worker pool is
    /// described in the README's "Embedding", under "Your own stores".)
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn io_timeout(mut self, t: std::time::Duration) -> Self {
        self.config.io_timeout_ns = t.as_nanos().clamp(1, u64::MAX as u128) as u64;
        self
    }

    /// I/O worker threads for stores that are not signal-safe (default 2,
    /// at least 1). One more thread is started beside them, and one store
    /// has at most `n` calls in it at a time: a store that stops answering
    /// never takes the last worker from the others.
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn io_threads(mut self, n: usize) -> Self {
        self.config.io_threads = n.max(1);
        self
    }

    /// How long a faulting thread that waits on an I/O worker, and an idle
    /// worker, spin before they sleep (default 0: they sleep at once).
    /// Spinning trades CPU time for the wake-ups of a thread hop (tens of
    /// microseconds each when the other vCPU is idle): worth it for a store
    /// on a network whose round trip is that short (a Redis on the same
    /// host or rack), wasted for slow stores. At most 1 ms.
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn io_spin(mut self, t: std::time::Duration) -> Self {
        self.config.io_spin_ns = t.as_nanos().min(1_000_000) as u64;
        self
    }

    /// Run the background reclaimer (default true; only with a budget).
    /// With it, a fault that takes residency past the high watermark
    /// frees a batch of clean pages itself, and kswapd writes the pages
    /// that need writing (dirty pages, anonymous pages on their way to
    /// swap); without it, faults reclaim at the budget only, writing as
    /// they must. See the README's "Memory budget and reclaim".
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn kswapd(mut self, on: bool) -> Self {
        self.config.kswapd = on;
        self
    }

    /// Restrict the descriptor to user-mode faults. Default: in-thread
    /// delivery uses user-mode-only (what unprivileged processes may do);
    /// handler threads try without it first, so faults inside syscalls are
    /// served, and fall back to it if the process lacks the privilege.
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn user_mode_only(mut self, yes: bool) -> Self {
        self.user_mode_only = Some(yes);
        self
    }

    /// Opens the descriptor and starts delivery. A budget, thread count,
    /// shard count or spin past [`limits`](crate::limits) is
    /// [`Error::Config`].
    ///
    /// Example: [`PagerBuilder`](crate::PagerBuilder).
    pub fn build(self) -> Result<Pager> {
        // (Its `open`s are cancellation points: a cancel acting in one left
        // a half-made pager's threads running.)
        let _no_cancel = crate::sys::thread::NoCancel::new();
        crate::fork::watch();
        crate::sys::pagemap::keep_pagemap();
        let in_thread = self.config.delivery.is_in_thread();
        let mut features =
            feature::MINOR_SHMEM | feature::MOVE | feature::POISON | feature::WP_HUGETLBFS_SHMEM;
        if in_thread {
            features |= feature::SIGBUS;
        } else {
            features |= feature::THREAD_ID;
        }
        limits::check(&self.config)?;
        let want = match self.user_mode_only {
            Some(true) => Want::UserModeOnly,
            Some(false) => Want::Full,
            // In-thread delivery cannot serve faults inside syscalls
            // whatever the descriptor, so it asks for what any process may
            // open.
            None if in_thread => Want::UserModeOnly,
            None => Want::Any,
        };
        let open = |quiet: bool| {
            Uffd::open_as(crate::events::features(features, quiet), want, true).map_err(|e| {
                if e.denied {
                    Error::NotAllowed(e.message)
                } else if matches!(e.errno, libc::EMFILE | libc::ENFILE | libc::ENOMEM) {
                    // (Out of descriptors or memory: not what the kernel lacks.)
                    Error::sys("userfaultfd", e.errno)
                } else {
                    Error::Unsupported(format!("userfaultfd: {e}"))
                }
            })
        };
        let uffd = open(false)?;
        let uffd_quiet = open(true)?;
        let umo = uffd.descriptor().user_mode_only;
        let mm = Arc::new(
            Mm::new(uffd, uffd_quiet, self.config.clone()).map_err(|(op, e)| Error::sys(op, e))?,
        );
        if self.config.delivery == Delivery::PerRegion {
            let p = crate::delivery::per_region::PerRegion::new(features, umo, Arc::downgrade(&mm));
            let _ = mm.per_region.set(Box::new(p));
        }
        // Threads start one by one into `inner`: if a later step fails,
        // dropping it stops and joins the ones already running.
        let mut inner = PagerInner {
            mm: mm.clone(),
            pool: None,
            kswapd: None,
            ra_threads: Vec::new(),
            khugepaged: Default::default(),
            io_threads: Vec::new(),
            release: None,
            in_registry: false,
        };
        let io = |what: &str| {
            let what = what.to_string();
            move |e| Error::Io {
                context: format!("starting {what}"),
                source: e,
            }
        };
        crate::io::start(
            &mm,
            |mm| &mm.io,
            self.config.io_threads,
            &mut inner.io_threads,
        )
        .map_err(io("I/O workers"))?;
        inner.release = Some(crate::events::release::start(&mm).map_err(io("the release thread"))?);
        if self.config.readahead_pages > 0 {
            inner.ra_threads =
                crate::readahead::start(&mm, self.config.readahead_threads, &mut inner.ra_threads)
                    .map_err(io("readahead threads"))?;
        }
        if self.config.budget_pages > 0 && self.config.kswapd {
            inner.kswapd = Some(crate::reclaim::start_kswapd(&mm).map_err(io("kswapd"))?);
        }
        inner.pool = match self.config.delivery {
            // The descriptors carry events only: one thread reads them.
            Delivery::InThread => Some(
                HandlerPool::start_on(&mm, Serve::Events, 1, 0, "uffd-events")
                    .map_err(io("the event reader"))?,
            ),
            // Every region has a descriptor and a thread of its own.
            Delivery::PerRegion => None,
            Delivery::Threads { threads, spin_us } => {
                Some(HandlerPool::start(&mm, threads, spin_us).map_err(io("handler threads"))?)
            }
        };
        if self.config.delivery.is_in_thread() {
            sigbus::register(&mm).map_err(|e| Error::sys("sigaction(SIGBUS)", e))?;
            inner.in_registry = true;
        }
        Ok(Pager {
            inner: Arc::new(inner),
            swap: self.swap,
        })
    }
}
