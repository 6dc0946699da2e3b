//! Making regions: the object, and the swap store an anonymous region
//! gets (the checks on what is asked for: `map_checks.rs`).

use super::map_checks::{check_fixed, check_len, page_shift};
use super::{MapOptions, Pager};
use crate::error::{Error, Result};
use crate::mmap::Placement;
use crate::object::{InstallKind, Object};
use crate::region::Region;
use crate::store::{FileStore, FileStoreOptions, Store, ZeroStore};
use crate::sys::PAGE_SIZE;
use std::path::Path;
use std::sync::Arc;

/// An unlinked swap file of `len` bytes in `dir`.
fn swap_file(dir: &Path, len: usize) -> Result<FileStore> {
    let io = |e| Error::Io {
        context: format!("creating a swap file in {}", dir.display()),
        source: e,
    };
    let f = tempfile_in(dir).map_err(io)?;
    f.set_len(len as u64).map_err(io)?;
    FileStore::from_file(f, true)
        .map(FileStore::punching_discards)
        .map_err(io)
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

/// Where anonymous regions swap to ([`crate::PagerBuilder::swap_dir`],
/// [`crate::PagerBuilder::swap_to`]).
#[derive(Clone, Default)]
pub(crate) enum Swap {
    /// An in-memory store per region.
    #[default]
    Memory,
    /// An unlinked file per region in this directory.
    Dir(std::path::PathBuf),
    /// The store this returns, per region.
    To(Arc<SwapFn>),
}

/// [`crate::PagerBuilder::swap_to`]'s store maker.
type SwapFn = dyn Fn(usize) -> std::io::Result<Arc<dyn Store>> + Send + Sync;

impl std::fmt::Debug for Swap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Swap::Memory => f.write_str("Memory"),
            Swap::Dir(d) => f.debug_tuple("Dir").field(d).finish(),
            Swap::To(_) => f.write_str("To(..)"),
        }
    }
}

impl Pager {
    /// Maps `len` bytes of anonymous private memory (zero-filled; pages that
    /// are reclaimed go to the swap store: in memory, or a file in
    /// [`PagerBuilder::swap_dir`](crate::PagerBuilder::swap_dir)).
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn map_anonymous(&self, len: usize) -> Result<Region> {
        self.map_anonymous_with(len, &MapOptions::default())
    }

    /// [`Pager::map_anonymous`] with options: `opts.kind` is ignored (the
    /// region is anonymous); the page size, placement, pinning and
    /// populating are taken. `opts.writable` must be true
    /// ([`Error::Config`] otherwise: a region of zeros nothing may write;
    /// make one read-only after the map with
    /// [`Region::protect`](crate::Region::protect)). It was taken as true.
    ///
    /// ```no_run
    /// use uffd_pager::{MapOptions, Pager, HUGE_PAGE_SIZE};
    ///
    /// // 2 MiB pages: root must have reserved some (vm.nr_hugepages).
    /// let pager = Pager::builder().budget_pages(4 * 512).build()?;
    /// let opts = MapOptions { page_size: HUGE_PAGE_SIZE, ..MapOptions::default() };
    /// let mut region = pager.map_anonymous_with(16 * HUGE_PAGE_SIZE, &opts)?;
    /// region.as_mut_slice()[5 * HUGE_PAGE_SIZE] = 1; // one fault maps 2 MiB
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    pub fn map_anonymous_with(&self, len: usize, opts: &MapOptions) -> Result<Region> {
        check_len(len)?;
        if !opts.writable {
            return Err(Error::Config(
                "map_anonymous_with: writable: false would map zeros nothing may write; map it \
                 writable and make it read-only with Region::protect(false)"
                    .into(),
            ));
        }
        self.map_object(
            Arc::new(ZeroStore::new(len as u64)),
            len,
            true,
            &MapOptions {
                kind: Some(InstallKind::Anonymous),
                writable: true,
                ..opts.clone()
            },
        )
    }

    /// A swap store of `len` bytes for an anonymous object (of 2 MiB pages
    /// if `huge`).
    fn swap_store(&self, len: usize, huge: bool) -> Result<Arc<dyn Store>> {
        use crate::store::MemoryStore;
        let store: Arc<dyn Store> = match &self.swap {
            Swap::Memory if huge => Arc::new(MemoryStore::for_huge_pages(len as u64)?),
            Swap::Memory => Arc::new(MemoryStore::new(len as u64)?),
            Swap::Dir(dir) => Arc::new(swap_file(dir, len)?),
            Swap::To(make) => make(len).map_err(|e| Error::Io {
                context: "making a swap store (PagerBuilder::swap_to)".into(),
                source: e,
            })?,
        };
        if store.len() < len as u64 || !store.writable() {
            return Err(Error::Io {
                context: format!(
                    "the swap store ({}) holds {} bytes{}; {len} writable bytes are needed",
                    store.name(),
                    store.len(),
                    if store.writable() { "" } else { ", read-only" }
                ),
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        Ok(store)
    }

    /// Maps the file at `path`: the whole file if `len` is `None`.
    ///
    /// # Safety
    /// The store contract of [`Pager::map_store`], where the store is the
    /// file: nothing but this region changes the file's bytes, all of
    /// them, not only the first `len` ([`Region::remap`] may grow the
    /// region over the rest) (not
    /// the application through another descriptor or mapping, not another
    /// region, not another process) unless the region is refreshed before
    /// any slice of it is made again. It is the contract that makes
    /// `memmap2::Mmap::map` `unsafe`, for the same reason.
    ///
    /// Example: [`Pager`](crate::Pager).
    pub unsafe fn map_file(
        &self,
        path: &Path,
        len: Option<usize>,
        opts: &MapOptions,
    ) -> Result<Region> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Io {
            context: format!("stat {}", path.display()),
            source: e,
        })?;
        if !meta.is_file() {
            return Err(Error::NotRegularFile(path.to_path_buf()));
        }
        // Opened for writing only where the region writes to it: an
        // anonymous one is a private copy (as `MAP_PRIVATE` needs no write
        // access to the file; it was opened read-write, and a read-only
        // file was refused).
        let writes_back = opts.writable && opts.install_kind() == InstallKind::Shared;
        let store = FileStore::open(
            path,
            &FileStoreOptions {
                writable: writes_back,
                ..FileStoreOptions::default()
            },
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM) if writes_back => {
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
        // SAFETY: the store is the file, and this function's caller keeps
        // the store contract for it (this function's own contract).
        unsafe { self.map_store(Arc::new(store), len, opts) }
    }

    /// Maps `len` bytes backed by `store`.
    ///
    /// # Safety
    /// The *store contract*. The engine reads a page from `store` on its
    /// first touch and again each time it has evicted it clean, so the
    /// store's bytes are the region's bytes. For as long as the region
    /// exists, the bytes of `store` in `[0, store.len())` (all of them,
    /// not only the first `len`: [`Region::remap`], a safe call, may grow
    /// the region over the rest) change only by the engine's write-back of
    /// this region's own pages; or else, from such
    /// a change on, no slice of the region ([`Region::as_slice`],
    /// [`Region::as_mut_slice`]) is alive or made until a
    /// [`Region::refresh`] over the changed range has returned. (Only a
    /// region of the shared kind can be refreshed: an anonymous one is a
    /// private copy, so after a change no slice of it may be made again.)
    ///
    /// A change is any other way the store comes to return other bytes: a
    /// write through another handle on it (a clone of the `Arc`, another
    /// region or pager over the same store), another process writing what
    /// the store reads (a file, a Redis key), or a store whose reads are
    /// not repeatable. A change made while no region mapped the store
    /// counts as one for the next region over it only where the engine
    /// kept the store's pages meanwhile
    /// ([`PagerBuilder::keep_unmapped`](crate::PagerBuilder::keep_unmapped))
    /// and the change did not move the store's [`Store::contents_stamp`].
    ///
    /// Broken, a page evicted and read again shows new bytes under a live
    /// `&[u8]`, which is undefined behaviour in Rust. A caller that makes
    /// no slice of the region (only raw accesses through
    /// [`Region::as_ptr`], as C does), or whose store nothing else can
    /// reach, keeps it without effort.
    ///
    /// And the store keeps its own word: if [`Store::signal_safe`] says
    /// true, its methods are async-signal-safe, for the engine calls them
    /// inside its SIGBUS handler (see [`crate::store`]'s contract; one that
    /// allocates there, in a thread the fault interrupted inside `malloc`,
    /// corrupts the heap); and its [`Store::read_to_fd`] writes only the
    /// bytes it is asked for (the descriptor is the engine's page cache,
    /// which regions map).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use uffd_pager::store::MemoryStore;
    /// use uffd_pager::{MapOptions, Pager, PAGE_SIZE};
    ///
    /// let pager = Pager::builder().build()?;
    /// let store = Arc::new(MemoryStore::from_bytes(&[3; 4 * PAGE_SIZE])?);
    /// // SAFETY: the store was moved in, so nothing else can change it.
    /// let region = unsafe { pager.map_store(store, 4 * PAGE_SIZE, &MapOptions::default()) }?;
    /// assert_eq!(region.as_slice()[PAGE_SIZE], 3);
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    ///
    /// Without the promise it does not compile:
    ///
    /// ```compile_fail,E0133
    /// # use std::sync::Arc;
    /// # use uffd_pager::{store::MemoryStore, MapOptions, Pager, PAGE_SIZE};
    /// # let pager = Pager::builder().build().unwrap();
    /// let store = Arc::new(MemoryStore::new(PAGE_SIZE as u64).unwrap());
    /// let region = pager.map_store(store.clone(), PAGE_SIZE, &MapOptions::default());
    /// ```
    pub unsafe fn map_store(
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
        if opts.writable && !store.writable() && opts.install_kind() == InstallKind::Shared {
            return Err(Error::ReadOnlyStore);
        }
        self.map_object(store, len, false, opts)
    }

    /// A zero-filled region that is never written back (a read-mostly
    /// scratch mapping over [`ZeroStore`]).
    ///
    /// Example: [`Pager`](crate::Pager).
    pub fn map_zero(&self, len: usize, kind: InstallKind) -> Result<Region> {
        check_len(len)?;
        self.map_object(
            Arc::new(ZeroStore::new(len as u64)),
            len,
            false,
            &MapOptions {
                kind: Some(kind),
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
        // The writes of a store's unwritten pages and the release of a held
        // object below are store I/O with page locks held, on the caller's
        // thread: cancellation waits (`NoCancel`; the map itself defers
        // signals too, `Mm::map`).
        let _no_cancel = crate::sys::thread::NoCancel::new();
        check_fixed(opts.fixed_addr, PAGE_SIZE)?;
        let shift = page_shift(&self.inner.mm, opts, len)?;
        // Held before anything below maps memory of its own (`crate::hold`).
        let hold = opts
            .fixed_addr
            .map(|a| crate::hold::take_or_hold(a, len))
            .transpose()?;
        let kind = opts.install_kind();
        if opts.kernel_maps {
            if kind != InstallKind::Shared || opts.writable || shift != crate::sys::PAGE_SHIFT {
                return Err(Error::Config(
                    "kernel_maps needs a read-only shared region of 4 KiB pages \
                     (kind: Shared, writable: false, page_size: PAGE_SIZE)"
                        .into(),
                ));
            }
            self.inner
                .mm
                .io
                .pipes
                .prepare()
                .map_err(|e| Error::sys("pipe2", e))?;
        }
        let npages = ((store.len() as usize) >> shift).max(len >> shift);
        let swap = match kind {
            InstallKind::Anonymous => {
                Some(self.swap_store(npages << shift, shift != crate::sys::PAGE_SHIFT)?)
            }
            InstallKind::Shared => None,
        };
        let mm = &self.inner.mm;
        // Dirty pages an earlier region over this store could not write
        // back when it went ([`crate::unwritten`]): written now, or no map.
        // (The application's own munmap is applied first: its region's
        // pages may be among them.)
        mm.check_owner()?;
        mm.events.wait_applied();
        let same = crate::unwritten::Which::SameAs(&store);
        if let Err(e) = mm.flush_unwritten(same) {
            return Err(Error::UnwrittenPages {
                bytes: mm.unwritten_bytes(same),
                source: Box::new(e),
            });
        }
        // A shared object kept since its last region went, over this store,
        // whose contents have not changed since: its pages are still cached.
        // (One whose unmap is writing its dirty pages back first is waited
        // for, by a map of either kind, since both read the store: then it
        // is kept, or listed as unwritten and flushed here.)
        let key = crate::kept::StoreKey::of(&store);
        mm.kept.wait_for(key);
        if let Err(e) = mm.flush_unwritten(same) {
            return Err(Error::UnwrittenPages {
                bytes: mm.unwritten_bytes(same),
                source: Box::new(e),
            });
        }
        let kept = match kind {
            InstallKind::Shared => match mm.kept.take(&store, npages, shift) {
                // (Registered one way or the other for its whole life.)
                // (And asked the store whether it takes writes once, when
                // it was made: see `Object::store_writes`.)
                Some(Ok(obj))
                    if obj.kernel_maps == opts.kernel_maps
                        && obj.store_writes() == store.writable() =>
                {
                    Some(obj)
                }
                Some(Ok(other)) => {
                    mm.release_now(other)?;
                    None
                }
                Some(Err(stale)) => {
                    mm.release_now(stale)?;
                    None
                }
                None => None,
            },
            InstallKind::Anonymous => None,
        };
        let reused = kept.is_some();
        let obj = match kept {
            Some(obj) => obj,
            None => {
                // Checked when an object's memfd is made, not on every map of
                // a kept one (ten sysfs reads were a sixth of a map and
                // unmap of 4 MiB); a setting changed later is not seen.
                if opts.kernel_maps && crate::sys::pipe::large_folios_possible() {
                    return Err(Error::Config(
                        "kernel_maps needs shmem's large folios off (the kernel would map \
                         pages the engine has not filled as zeros): set \
                         /sys/kernel/mm/transparent_hugepage/shmem_enabled and every \
                         hugepages-*kB/shmem_enabled to never, advise or deny"
                            .into(),
                    ));
                }
                let mut obj = Object::new(kind, store, swap, npages, zero_fill, shift)
                    .map_err(|(op, e)| Error::sys(op, e))?;
                // Only a writable anonymous region of base pages needs to
                // hear of the application's madvise (see `Object::quiet`);
                // a huge one must not, since reclaim zaps its pages with
                // `MADV_DONTNEED` (see `reclaim`'s `huge`).
                obj.quiet = kind == InstallKind::Shared || !opts.writable || obj.is_huge();
                obj.kernel_maps = opts.kernel_maps;
                if opts.kernel_maps && crate::collapse::possible() {
                    obj.extents = crate::object::Extents::new(npages);
                    if obj.extents.is_some() {
                        self.inner.start_khugepaged().map_err(|e| {
                            Error::sys("start khugepaged", e.raw_os_error().unwrap_or(0))
                        })?;
                    }
                }
                // Stamped before any page is read: kept later only if the
                // store still has this stamp (nothing changed it while the
                // object was mapped, not even its own write-backs).
                if kind == InstallKind::Shared && !opts.pinned {
                    *obj.keep_stamp.get_mut().unwrap_or_else(|e| e.into_inner()) =
                        obj.store.contents_stamp();
                }
                Arc::new(obj)
            }
        };
        let at = Placement {
            fixed: opts.fixed_addr,
            hold: hold.map(crate::hold::Taken::into_mapping),
        };
        let flags = crate::vma::VmFlags {
            writable: opts.writable,
            pinned: opts.pinned,
            random: opts.access == super::Access::Random,
        };
        let (id, start) = match mm.map(obj.clone(), len, flags, at, reused) {
            Ok(m) => m,
            Err(e) => {
                if reused {
                    let _ = mm.release_now(obj);
                }
                return Err(e);
            }
        };
        crate::inject::after_published(start);
        let object = Arc::downgrade(&obj);
        // Given back through the release, never dropped plainly: the
        // application may have unmapped the new region already, and then
        // this is the last reference (see `Mm::release_object`). (An error
        // there is a write-back of that unmap's, which keeps its pages.)
        let _ = mm.release_object(obj);
        let region = Region::new(
            self.inner.clone(),
            id,
            start,
            len,
            1 << shift,
            kind,
            (object, key),
        );
        if opts.populate {
            region.populate(0, len)?;
        }
        Ok(region)
    }
}
