//! The embedding API: [`Pager::builder`] → [`Pager`] → [`Region`]s.

use crate::address_space::{Config, Mm};
use crate::delivery::threads::{HandlerPool, Serve};
use crate::delivery::{sigbus, Delivery};
use crate::error::{Error, Result};
use crate::fault::Policy;
use crate::mmap::Placement;
use crate::object::{InstallKind, Object};
use crate::region::Region;
use crate::stats::Stats;
use crate::store::{FileStore, FileStoreOptions, Store, ZeroStore};
use crate::sys::uffd::{feature, Descriptor, Uffd, Want};
use crate::sys::PAGE_SIZE;
use std::path::Path;
use std::sync::Arc;

/// Builds a [`Pager`].
#[derive(Debug, Clone, Default)]
pub struct PagerBuilder {
    config: Config,
    user_mode_only: Option<bool>,
    swap_dir: Option<std::path::PathBuf>,
}

impl PagerBuilder {
    /// The fault-handling policy (default `retry-once`).
    pub fn policy(mut self, p: Policy) -> Self {
        self.config.policy = p;
        self
    }

    /// How faults are delivered (default in-thread).
    pub fn delivery(mut self, d: Delivery) -> Self {
        self.config.delivery = d;
        self
    }

    /// Store read attempts before a page is poisoned (default 3, min 1).
    pub fn read_attempts(mut self, n: u32) -> Self {
        self.config.read_attempts = n.max(1);
        self
    }

    /// Memory budget in pages across all regions (0: unlimited). Resident
    /// means cached plus installed.
    pub fn budget_pages(mut self, pages: u64) -> Self {
        self.config.budget_pages = pages;
        self
    }

    /// When populate drains the per-CPU LRU add batch (default `always`).
    pub fn drain_policy(mut self, d: crate::lru::DrainPolicy) -> Self {
        self.config.drain = d;
        self
    }

    /// LRU shards (default 1): the per-node lruvec analog.
    pub fn lru_shards(mut self, n: usize) -> Self {
        self.config.lru_shards = n.max(1);
        self
    }

    /// Swap anonymous regions to unlinked files in `dir` instead of memory
    /// (the default swap store is an in-memory [`MemoryStore`]).
    ///
    /// [`MemoryStore`]: crate::store::MemoryStore
    pub fn swap_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.swap_dir = Some(dir.into());
        self
    }

    /// Largest readahead window in pages (default 32; 0 turns readahead
    /// off) and the I/O threads that serve it (default 2).
    pub fn readahead(mut self, max_pages: u32, threads: usize) -> Self {
        self.config.readahead_pages = max_pages;
        self.config.readahead_threads = threads.max(1);
        self
    }

    /// Fault-around base cluster in pages (default 64 = 256 KiB; the
    /// kernel's `fault_around_bytes` default is 16 pages, but a userspace
    /// fault costs a signal or a thread hop, so the engine maps more per
    /// fault; 0 or 1 turns it off). Rounded down to a power of two. A
    /// sequential reader's cluster doubles at each fault, up to 8× this.
    pub fn fault_around(mut self, pages: usize) -> Self {
        self.config.fault_around_pages = if pages <= 1 {
            0
        } else {
            1 << (usize::BITS - 1 - pages.leading_zeros())
        };
        self
    }

    /// How long a call to a store that is not signal-safe may take before
    /// it counts as failed (default 30 s): a read that never returns then
    /// takes the read-error path (the access gets SIGBUS), a write-back
    /// keeps the page dirty. See [`crate::io`].
    pub fn io_timeout(mut self, t: std::time::Duration) -> Self {
        self.config.io_timeout_ns = t.as_nanos().clamp(1, u64::MAX as u128) as u64;
        self
    }

    /// I/O worker threads for stores that are not signal-safe (default 2,
    /// at least 1).
    pub fn io_threads(mut self, n: usize) -> Self {
        self.config.io_threads = n.max(1);
        self
    }

    /// Run the background reclaimer (default true; only with a budget).
    pub fn kswapd(mut self, on: bool) -> Self {
        self.config.kswapd = on;
        self
    }

    /// Restrict the descriptor to user-mode faults. Default: in-thread
    /// delivery uses user-mode-only (what unprivileged processes may do);
    /// handler threads try without it first, so faults inside syscalls are
    /// served, and fall back to it if the process lacks the privilege.
    pub fn user_mode_only(mut self, yes: bool) -> Self {
        self.user_mode_only = Some(yes);
        self
    }

    /// Opens the descriptor and starts delivery.
    pub fn build(self) -> Result<Pager> {
        crate::fork::watch();
        let in_thread = self.config.delivery.is_in_thread();
        let mut features =
            feature::MINOR_SHMEM | feature::MOVE | feature::POISON | feature::WP_HUGETLBFS_SHMEM;
        if in_thread {
            features |= feature::SIGBUS;
        } else {
            features |= feature::THREAD_ID;
        }
        if let Delivery::Threads { threads: 0, .. } = self.config.delivery {
            return Err(Error::Config("handler threads must be at least 1".into()));
        }
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
            Uffd::open_as(crate::events::features(features, quiet), want, true)
                .map_err(|e| Error::Unsupported(format!("userfaultfd: {e}")))
        };
        let uffd = open(false)?;
        let uffd_quiet = open(true)?;
        let umo = uffd.descriptor().user_mode_only;
        let mm = Arc::new(
            Mm::new(uffd, uffd_quiet, self.config.clone()).map_err(|(op, e)| Error::sys(op, e))?,
        );
        if self.config.delivery == Delivery::PerRegion {
            let p = crate::delivery::per_region::PerRegion::new(features, umo, Arc::downgrade(&mm));
            let _ = mm.per_region.set(p);
        }
        // Threads start one by one into `inner`: if a later step fails,
        // dropping it stops and joins the ones already running.
        let mut inner = PagerInner {
            mm: mm.clone(),
            pool: None,
            kswapd: None,
            ra_threads: Vec::new(),
            io_threads: Vec::new(),
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
            swap_dir: self.swap_dir,
        })
    }
}

/// Options for [`Pager::map_store`] and [`Pager::map_file`].
#[derive(Debug, Clone)]
pub struct MapOptions {
    /// How pages are installed (default: shared memfd, zero copy).
    pub kind: InstallKind,
    /// Map writable (default true).
    pub writable: bool,
    /// Place at exactly this address (must be free).
    pub fixed_addr: Option<usize>,
    /// Never evict this region's pages (the mlock analog).
    pub pinned: bool,
    /// Fault every page in at map time (the MAP_POPULATE analog).
    pub populate: bool,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            kind: InstallKind::Shared,
            writable: true,
            fixed_addr: None,
            pinned: false,
            populate: false,
        }
    }
}

/// A pager: one address space whose regions fault through the engine.
///
/// Several pagers may coexist in a process, in either delivery mode.
pub struct Pager {
    inner: Arc<PagerInner>,
    swap_dir: Option<std::path::PathBuf>,
}

/// What a pager's regions keep alive: the address space and its delivery.
#[derive(Debug)]
pub(crate) struct PagerInner {
    pub(crate) mm: Arc<Mm>,
    pool: Option<HandlerPool>,
    kswapd: Option<std::thread::JoinHandle<()>>,
    ra_threads: Vec<std::thread::JoinHandle<()>>,
    io_threads: Vec<std::thread::JoinHandle<()>>,
    /// In the SIGBUS handler's registry.
    in_registry: bool,
}

impl Drop for PagerInner {
    fn drop(&mut self) {
        // A fork()ed child has none of the engine's threads to stop: joining
        // them would wait forever. Its copy of the state is left as it is.
        if self.mm.in_child() {
            std::mem::forget(self.pool.take());
            std::mem::forget(self.kswapd.take());
            std::mem::forget(std::mem::take(&mut self.ra_threads));
            std::mem::forget(std::mem::take(&mut self.io_threads));
            return;
        }
        // Stop delivery before the address space goes: join the handler
        // threads, or leave the SIGBUS registry (waiting out running faults).
        if let Some(k) = self.kswapd.take() {
            crate::reclaim::stop_kswapd(&self.mm);
            let _ = k.join();
        }
        if !self.ra_threads.is_empty() {
            crate::readahead::stop(&self.mm);
            for t in self.ra_threads.drain(..) {
                let _ = t.join();
            }
        }
        self.pool.take();
        if let Some(p) = self.mm.per_region.get() {
            p.close_all();
        }
        // Workers last: anything above may have waited on them. A worker
        // stuck in a store call that never returns is left behind (its
        // requests were abandoned already).
        self.mm.io.stop();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        for t in self.io_threads.drain(..) {
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        if self.in_registry {
            sigbus::unregister(&self.mm);
        }
    }
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("policy", &self.inner.mm.config.policy)
            .field("delivery", &self.inner.mm.config.delivery)
            .finish()
    }
}

/// An unlinked swap file of `len` bytes in `dir`.
fn swap_file(dir: &Path, len: usize) -> Result<FileStore> {
    let io = |e| Error::Io {
        context: format!("creating a swap file in {}", dir.display()),
        source: e,
    };
    let f = tempfile_in(dir).map_err(io)?;
    f.set_len(len as u64).map_err(io)?;
    FileStore::from_file(f, true).map_err(io)
}

/// An anonymous (O_TMPFILE) file in `dir`.
fn tempfile_in(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

fn check_len(len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::ZeroLength);
    }
    if !len.is_multiple_of(PAGE_SIZE) {
        return Err(Error::Unaligned {
            what: "length",
            value: len,
        });
    }
    Ok(())
}

fn check_fixed(a: Option<usize>) -> Result<()> {
    match a {
        Some(a) if a % PAGE_SIZE != 0 || a == 0 => Err(Error::Unaligned {
            what: "address",
            value: a,
        }),
        _ => Ok(()),
    }
}

impl Pager {
    /// A builder with the defaults: `retry-once`, in-thread delivery.
    pub fn builder() -> PagerBuilder {
        PagerBuilder::default()
    }

    /// Maps `len` bytes of anonymous private memory (zero-filled; pages that
    /// are reclaimed go to the swap store: in memory, or a file in
    /// [`PagerBuilder::swap_dir`]).
    pub fn map_anonymous(&self, len: usize) -> Result<Region> {
        check_len(len)?;
        self.map_object(
            Arc::new(ZeroStore::new(len as u64)),
            len,
            true,
            &MapOptions {
                kind: InstallKind::Anonymous,
                ..MapOptions::default()
            },
        )
    }

    /// A swap store of `len` bytes for an anonymous object.
    fn swap_store(&self, len: usize) -> Result<Arc<dyn Store>> {
        Ok(match &self.swap_dir {
            None => Arc::new(crate::store::MemoryStore::new(len as u64)?),
            Some(dir) => Arc::new(swap_file(dir, len)?),
        })
    }

    /// Maps the file at `path`: the whole file if `len` is `None`.
    pub fn map_file(&self, path: &Path, len: Option<usize>, opts: &MapOptions) -> Result<Region> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Io {
            context: format!("stat {}", path.display()),
            source: e,
        })?;
        if !meta.is_file() {
            return Err(Error::NotRegularFile(path.to_path_buf()));
        }
        let store = FileStore::open(
            path,
            &FileStoreOptions {
                writable: opts.writable,
                ..FileStoreOptions::default()
            },
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM) if opts.writable => {
                Error::ReadOnlyStore
            }
            _ => Error::Io {
                context: format!("opening {}", path.display()),
                source: e,
            },
        })?;
        let file_len = std::fs::metadata(path)
            .map_err(|e| Error::Io {
                context: format!("stat {}", path.display()),
                source: e,
            })?
            .len();
        let len = match len {
            Some(l) => l,
            None => (file_len as usize).div_ceil(PAGE_SIZE) * PAGE_SIZE,
        };
        check_len(len)?;
        if (len as u64) > file_len.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64 {
            return Err(Error::FileTooShort {
                file_len,
                needed: len as u64,
            });
        }
        self.map_store(Arc::new(store), len, opts)
    }

    /// Maps `len` bytes backed by `store`.
    pub fn map_store(
        &self,
        store: Arc<dyn Store>,
        len: usize,
        opts: &MapOptions,
    ) -> Result<Region> {
        check_len(len)?;
        if store.len() < len as u64 {
            return Err(Error::FileTooShort {
                file_len: store.len(),
                needed: len as u64,
            });
        }
        // A shared mapping writes to its store; an anonymous one is a
        // private copy (writes go to its swap), so any store will do.
        if opts.writable && !store.writable() && opts.kind == InstallKind::Shared {
            return Err(Error::ReadOnlyStore);
        }
        self.map_object(store, len, false, opts)
    }

    /// A zero-filled region that is never written back (a read-mostly
    /// scratch mapping over [`ZeroStore`]).
    pub fn map_zero(&self, len: usize, kind: InstallKind) -> Result<Region> {
        check_len(len)?;
        self.map_object(
            Arc::new(ZeroStore::new(len as u64)),
            len,
            false,
            &MapOptions {
                kind,
                writable: kind == InstallKind::Anonymous,
                ..MapOptions::default()
            },
        )
    }

    fn map_object(
        &self,
        store: Arc<dyn Store>,
        len: usize,
        zero_fill: bool,
        opts: &MapOptions,
    ) -> Result<Region> {
        check_fixed(opts.fixed_addr)?;
        let npages = (store.len() as usize / PAGE_SIZE).max(len / PAGE_SIZE);
        let swap = match opts.kind {
            InstallKind::Anonymous => Some(self.swap_store(npages * PAGE_SIZE)?),
            InstallKind::Shared => None,
        };
        let mut obj = Object::new(opts.kind, store, swap, npages, zero_fill)
            .map_err(|(op, e)| Error::sys(op, e))?;
        // Only a writable anonymous region needs to hear of the
        // application's madvise (see `Object::quiet`).
        obj.quiet = opts.kind == InstallKind::Shared || !opts.writable;
        let (id, start) = self.inner.mm.map(
            Arc::new(obj),
            len,
            opts.writable,
            Placement {
                fixed: opts.fixed_addr,
            },
            opts.pinned,
        )?;
        let region = Region::new(self.inner.clone(), id, start, len);
        if opts.populate {
            region.populate(0, len)?;
        }
        Ok(region)
    }

    #[allow(dead_code)]
    pub(crate) fn mm(&self) -> &Arc<Mm> {
        &self.inner.mm
    }

    /// Reclaims up to `nr` pages now, from the calling thread (drop-caches
    /// style); returns how many were freed. Pages of pinned regions and
    /// pages in use (locked) are skipped.
    pub fn reclaim_pages(&self, nr: u64) -> u64 {
        let mm = &self.inner.mm;
        if mm.in_child() {
            return 0;
        }
        let _section = mm.events.section();
        crate::reclaim::shrink(mm, nr)
    }

    /// LRU-lock (acquisitions, contended acquisitions) per shard.
    pub fn lru_shard_counts(&self) -> Vec<(u64, u64)> {
        self.inner.mm.lru.shard_counts()
    }

    /// A statistics snapshot.
    pub fn stats(&self) -> Stats {
        self.inner.mm.stats()
    }

    /// Zeroes the counters.
    pub fn reset_stats(&self) {
        self.inner.mm.reset_stats()
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.inner.mm.config.policy
    }

    /// The userfaultfd descriptor the pager got: through `/dev/userfaultfd`
    /// or the system call, and whether it is user-mode-only (faults inside
    /// system calls fail with `EFAULT`; see [`Region::prefault`]).
    pub fn descriptor(&self) -> Descriptor {
        self.inner.mm.uffd.descriptor()
    }

    /// The delivery mode.
    pub fn delivery(&self) -> Delivery {
        self.inner.mm.config.delivery
    }

    /// The global lock, for writers outside the engine (benchmarks'
    /// map/unmap threads, scripted tests). Holding it for write blocks
    /// faults that fall back to it, exactly like `mmap_write_lock`.
    pub fn global_lock(&self) -> &crate::sync::global_lock::GlobalLock {
        &self.inner.mm.lock
    }
}
