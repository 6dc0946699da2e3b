//! The engine side of [`fault_cost`](super::fault_cost): a [`Pager`] whose
//! regions map a pre-filled [`MemoryStore`], so every touch is a major
//! fault (store read, then install).
//!
//! The store is read-only and regions are mapped read-only: a shared
//! region over a writable store would track writes (install with
//! `UFFDIO_CONTINUE_MODE_WP`, register WP), which the floor's plain
//! read-fault CONTINUE does not; read-only keeps the ioctls the same.

use super::{pattern, touch};
use std::sync::Arc;
use std::time::Duration;
use uffd_pager::store::{MemoryStore, Store, StoreError};
use uffd_pager::{Delivery, Error, InstallKind, MapOptions, Pager, Result, PAGE_SIZE};

/// Engine passes: each maps a fresh region (so every page is absent),
/// touches it, and unmaps it; only the touches are timed.
pub struct EngineLoop {
    pager: Pager,
    store: Arc<dyn Store>,
    pages: usize,
    kind: InstallKind,
    page_size: usize,
}

impl std::fmt::Debug for EngineLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineLoop")
            .field("store", &self.store.name())
            .field("pages", &self.pages)
            .field("kind", &self.kind)
            .field("page_size", &self.page_size)
            .finish_non_exhaustive()
    }
}

impl EngineLoop {
    /// A pager with `delivery` (default policy) and a store of `pages`
    /// pages of `page_size` (see [`MapOptions::page_size`]), every byte of
    /// page `i` set to its pattern.
    pub fn new(
        pages: usize,
        kind: InstallKind,
        delivery: Delivery,
        page_size: usize,
    ) -> Result<EngineLoop> {
        let store = Arc::new(Self::memory(pages, page_size)?);
        Self::over(store, kind, delivery, Duration::ZERO, page_size)
    }

    /// [`EngineLoop::new`] over the same pages in a store that is not
    /// signal-safe (ordinary Rust), so every read goes through the
    /// engine's I/O workers: the worker hop.
    pub fn with_hop(pages: usize, kind: InstallKind, delivery: Delivery) -> Result<EngineLoop> {
        Self::over(
            Arc::new(Ordinary(Self::memory(pages, PAGE_SIZE)?)),
            kind,
            delivery,
            Duration::ZERO,
            PAGE_SIZE,
        )
    }

    /// A read-only memory store of `pages` pages of `page_size`, every
    /// byte of page `i` set to its pattern.
    fn memory(pages: usize, page_size: usize) -> Result<MemoryStore> {
        if pages == 0 {
            return Err(Error::ZeroLength);
        }
        let len = pages
            .checked_mul(page_size)
            .ok_or_else(|| Error::Config(format!("{pages} pages is too large")))?;
        let store = MemoryStore::new(len as u64)?;
        let mut buf = vec![0u8; page_size];
        for i in 0..pages {
            buf.fill(pattern(i));
            store.write((i * page_size) as u64, &buf)?;
        }
        Ok(store.with_writable(false))
    }

    /// Engine passes over `store` (whose page `i` of `page_size` holds
    /// `pattern(i)`), with no readahead and no fault-around: one store read
    /// per fault, and [`io_spin`](uffd_pager::PagerBuilder::io_spin)
    /// `io_spin`. Huge pages get an unlimited budget, so that a pass holds
    /// every page it faults in (as the floor's does) and nothing is
    /// evicted mid-pass.
    pub fn over(
        store: Arc<dyn Store>,
        kind: InstallKind,
        delivery: Delivery,
        io_spin: Duration,
        page_size: usize,
    ) -> Result<EngineLoop> {
        let pages = store.len() as usize / page_size;
        if pages == 0 {
            return Err(Error::ZeroLength);
        }
        let mut b = Pager::builder()
            .delivery(delivery)
            // Every pass faults cold pages: nothing kept between passes.
            .keep_unmapped(0)
            .readahead(0, 1)
            .fault_around(0)
            .io_spin(io_spin);
        if page_size != PAGE_SIZE {
            b = b.budget_pages(0);
        }
        let pager = b.build()?;
        Ok(EngineLoop {
            pager,
            store,
            pages,
            kind,
            page_size,
        })
    }

    /// The pager, for its statistics.
    pub fn pager(&self) -> &Pager {
        &self.pager
    }

    /// Pages per full pass.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// One pass over the first `n` pages (at most [`EngineLoop::pages`]) of
    /// a freshly mapped region; returns the time of the touches alone.
    pub fn pass(&mut self, n: usize) -> Result<Duration> {
        let n = n.min(self.pages);
        // Read faults only: nothing is dirty at unmap, so the untimed
        // teardown stays cheap (and see the module docs).
        // SAFETY: the workload's stores and files are its own, and it changes them only through
        // its regions (the store contract).
        let region = unsafe {
            self.pager.map_store(
                self.store.clone(),
                self.pages * self.page_size,
                &MapOptions {
                    kind: Some(self.kind),
                    writable: false,
                    page_size: self.page_size,
                    ..MapOptions::default()
                },
            )
        }?;
        let t = touch(region.as_ptr() as usize, n, self.page_size);
        region.unmap()?;
        t
    }
}

/// A memory store that says it is not signal-safe: the engine then calls
/// it on its I/O workers, as ordinary Rust.
struct Ordinary(MemoryStore);

impl Store for Ordinary {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), StoreError> {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> std::result::Result<(), StoreError> {
        self.0.write(offset, buf)
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "ordinary"
    }
}
