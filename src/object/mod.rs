//! Mapped objects: what a region maps (the kernel's `address_space` of a
//! file, or the anonymous memory behind an `anon_vma`).
//!
//! An object owns its page cache (state words plus the pages' contents) and
//! its backing store. The engine reads and writes cached contents through
//! the object's own view, never through the user's mapping:
//!
//! - **Shared** objects (install kind [`InstallKind::Shared`]): a memfd is the
//!   page cache. The engine fills the memfd (`pwrite`, or a pipe for a
//!   kernel-mapped object; 2 MiB pages through a private alias mapping of
//!   it, hugetlbfs having no `write`) and installs pages with
//!   UFFDIO_CONTINUE: zero copy.
//! - **Anonymous** objects ([`InstallKind::Anonymous`]): an unregistered
//!   private anonymous area holds cached contents; installs move the page
//!   from it with UFFDIO_MOVE (zero copy; UFFDIO_COPY where a move is not
//!   allowed, e.g. into a read-only region), or UFFDIO_ZEROPAGE for a page
//!   that was never swapped out.

use crate::page_cache::PageCache;
use crate::store::Store;
use crate::sys::huge::HUGE_PAGE_SHIFT;
use crate::sys::mem::{At, LazyMapping, Mapping, Memfd};
use crate::sys::PAGE_SHIFT;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};
use std::sync::Arc;

mod backing;
mod extents;
mod fill;
mod windows;

use backing::Backing;
pub use extents::{Extents, EXTENT_PAGES};
pub use windows::{Window, Windows};

/// How a region's pages are installed.
///
/// ```
/// use uffd_pager::{InstallKind, Pager};
///
/// let pager = Pager::builder().build()?;
/// let region = pager.map_zero(8 * uffd_pager::PAGE_SIZE, InstallKind::Shared)?;
/// assert!(region.as_slice().iter().all(|&b| b == 0));
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallKind {
    /// Private anonymous memory, registered MISSING and WP: a page read
    /// from the store is installed with UFFDIO_MOVE (UFFDIO_COPY where a
    /// move is not allowed), one never written back with UFFDIO_ZEROPAGE.
    Anonymous,
    /// A memfd-backed shared mapping, registered MINOR, MISSING and WP
    /// (MISSING only when kernel-mapped): pages are installed from the
    /// memfd with UFFDIO_CONTINUE (zero copy).
    Shared,
}

impl std::str::FromStr for InstallKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "anon" | "anonymous" | "copy" => Ok(InstallKind::Anonymous),
            "shared" | "memfd" | "minor" | "continue" => Ok(InstallKind::Shared),
            _ => Err(format!("unknown install kind {s:?} (anonymous, shared)")),
        }
    }
}

impl std::fmt::Display for InstallKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InstallKind::Anonymous => "anonymous",
            InstallKind::Shared => "shared",
        })
    }
}

/// A value alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct OwnLine<T>(T);

/// A mapped object. See the module docs.
pub struct Object {
    /// How its pages are installed.
    pub kind: InstallKind,
    /// `log2` of its page size: [`PAGE_SHIFT`] or
    /// [`HUGE_PAGE_SHIFT`](crate::sys::huge::HUGE_PAGE_SHIFT). Page
    /// indices, state words, LRU entries, installs and store calls are all
    /// in pages of this size.
    shift: u32,
    /// Where pages come from: the store a region maps. A shared object's
    /// dirty pages go back to it; an anonymous object's never do (a private
    /// mapping: they go to [`Object::swap`]).
    pub store: Arc<dyn Store>,
    /// Where an anonymous object's evicted dirty pages go, and come back
    /// from (`SWAPPED`). `None` for shared objects.
    swap: Option<Arc<dyn Store>>,
    /// [`Store::writable`] of `store` and of the swap, asked once, here.
    /// Everything that decides whether a dirty page is owed a write asks
    /// these, never the store again: a store whose answer turned false
    /// later would have its dirty pages dropped as if clean and a flush
    /// report success. Its `write` errors instead, and the pages stay
    /// dirty (`crate::write_error`).
    writes: bool,
    swap_writes: bool,
    /// `store` as a map of it waits for a write-back in flight
    /// ([`crate::kept::KeptObjects::wait_for`]), made once, here: the
    /// release marks and unmarks it by this one key.
    pub(crate) store_key: crate::store::StoreKey,
    /// The page state words.
    pub cache: PageCache,
    /// The source is all zeros (anonymous memory): a page that was never
    /// swapped out is a zero page, with no store read.
    pub zero_fill: bool,
    /// Registered with the pager's quiet descriptor, which reports the
    /// application's `munmap` and `mremap` but not its `madvise`: shared
    /// objects (whose data `MADV_DONTNEED` keeps) and anonymous objects
    /// mapped read-only (whose pages equal their source). Set before the
    /// object is mapped.
    pub quiet: bool,
    /// The kernel maps this object's cached pages itself
    /// ([`MapOptions::kernel_maps`](crate::MapOptions::kernel_maps)): a
    /// read-only shared object of base pages whose regions are registered
    /// MISSING only, so a fault reaches the engine only for a page absent
    /// from the memfd; the engine fills the memfd and the access, run
    /// again, is mapped by the kernel's own fault path (clean PTEs, its
    /// fault-around). Set before the object is mapped.
    pub kernel_maps: bool,
    /// Which 2 MiB extents of a kernel-mapped object's memfd are
    /// collapsed into huge folios ([`crate::collapse`]); `None` for other
    /// objects. Set before the object is mapped.
    pub extents: Option<Extents>,
    /// A pinned region ([`MapOptions::pinned`](crate::MapOptions::pinned))
    /// has mapped the object: set when it is mapped, never cleared.
    pub mapped_pinned: std::sync::atomic::AtomicBool,
    backing: Backing,
    /// Attempts working on this object with their lock dropped, and
    /// reclaim's references while it evicts a page. On a cache line of its
    /// own: reclaim takes and drops a pin for every page it scans, and
    /// those writes must not evict the fields every fault reads from the
    /// faulting CPUs' caches.
    pins: OwnLine<AtomicU32>,
    /// Slot in the pager's reverse map ([`crate::rmap`]); `u32::MAX` if none.
    pub slot: AtomicU32,
    /// The store's stamp when the object was made, before any page was
    /// read ([`crate::kept`]): it may be kept after its last region goes
    /// only if the store still has this stamp then. `None`: never kept (no
    /// stamp, or a pinned region mapped it). Never touched in a signal
    /// handler.
    pub(crate) keep_stamp: std::sync::Mutex<Option<u64>>,
    /// Where the object's pages are mapped: the reverse map reclaim and
    /// write-back use to find a page's user address.
    pub windows: Windows,
    /// Reclaim's view of the writes to the store its dirty pages go to
    /// (the swap store for an anonymous object): see [`crate::write_error`].
    pub write_health: crate::write_error::WriteHealth,
    /// Its store's writes and syncs: which are durable (see
    /// [`crate::durability`]).
    pub durability: crate::durability::Durability,
    /// Readahead state (`file_ra_state`): where the next sequential fault
    /// is expected, the current window, and the end of what was requested.
    pub ra_next: AtomicUsize,
    /// Readahead window in pages.
    pub ra_window: AtomicU32,
    /// The region's own userfaultfd, with per-region delivery (set once, at
    /// map time); otherwise the pager's descriptor serves it.
    pub region_uffd: std::sync::OnceLock<crate::sys::uffd::OwnDescriptor>,
    /// One past the last page requested by readahead.
    pub ra_end: AtomicUsize,
    /// Readahead's miss count (`mmap_miss`, see [`crate::readahead`]).
    pub ra_miss: AtomicU32,
    /// Fault-around state ([`crate::fault`]'s `around`): where a
    /// sequential reader's next fault is expected (the page after the last
    /// cluster), and the current cluster in pages.
    pub fa_next: AtomicUsize,
    /// Fault-around cluster in pages (0: the configured base).
    pub fa_window: AtomicU32,
    /// The process that made it: only there does its drop free the memfd's
    /// pages (see `Drop`).
    owner_pid: i32,
    /// The first and last page whose swap copy was forgotten without the
    /// swap store hearing of it ([`crate::discard::forget_swap`] on a
    /// store that is not signal-safe; `usize::MAX` and 0 while none was):
    /// [`crate::discard::discard_swap_left`] tells the store at release.
    pub(crate) swap_left: [AtomicUsize; 2],
}

impl Drop for Object {
    /// Frees a shared object's pages with a hole punch over its memfd.
    /// Closing the memfd frees them only where no one else holds it: a
    /// child `fork()`ed since holds the descriptor (and the alias mapping)
    /// until it execs or exits, and the pages, 2 MiB ones from the hugetlb
    /// pool among them, stayed allocated outside any budget all that time
    /// (found by review). Not in such a child, whose drop would punch the
    /// parent's page cache.
    fn drop(&mut self) {
        if let Backing::Shared { memfd, .. } = &self.backing {
            // SAFETY: getpid has no preconditions.
            if unsafe { libc::getpid() } == self.owner_pid {
                let _ = memfd.punch_hole(0, self.npages() << self.shift);
            }
        }
    }
}

/// Keeps an object alive while a fault works on it with its lock dropped
/// (I/O, or waiting on a page): the kernel's folio and file references.
/// Taking and dropping a pin are single atomics; teardown waits for pins
/// to drain ([`Object::wait_unpinned`]) before freeing the object, so the
/// last reference is never dropped in a signal handler.
pub struct ObjectPin {
    obj: *const Object,
}

impl std::ops::Deref for ObjectPin {
    type Target = Object;
    fn deref(&self) -> &Object {
        // SAFETY: the object is not freed while pinned (see `wait_unpinned`).
        unsafe { &*self.obj }
    }
}

impl Drop for ObjectPin {
    fn drop(&mut self) {
        self.pins.0.fetch_sub(1, Release);
    }
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("kind", &self.kind)
            .field("store", &self.store.name())
            .field("pages", &self.cache.len())
            .finish()
    }
}

impl Object {
    /// An object of `npages` pages of `1 << shift` bytes over `store`:
    /// [`PAGE_SHIFT`], or [`HUGE_PAGE_SHIFT`] (a shared object's memfd is
    /// then on hugetlbfs; an anonymous object's cache area, which only
    /// holds a page on its way in or out, asks for transparent huge pages
    /// instead of taking from the pool). Anonymous
    /// objects need `swap`, where their dirty pages go when evicted; shared
    /// objects take none (their dirty pages go back to `store`).
    pub fn new(
        kind: InstallKind,
        store: Arc<dyn Store>,
        swap: Option<Arc<dyn Store>>,
        npages: usize,
        zero_fill: bool,
        shift: u32,
    ) -> Result<Object, (&'static str, i32)> {
        if (kind == InstallKind::Anonymous) != swap.is_some() {
            return Err(("an anonymous object needs a swap store", libc::EINVAL));
        }
        if shift != PAGE_SHIFT && shift != HUGE_PAGE_SHIFT {
            return Err(("page size", libc::EINVAL));
        }
        let huge = shift == HUGE_PAGE_SHIFT;
        let bytes = npages << shift;
        let backing = match kind {
            InstallKind::Anonymous => {
                // Installs move single pages out of this area: keep it in
                // base pages so a move never has to split a huge page. A
                // huge object's page comes and goes 2 MiB at a time
                // (copied in, then dropped whole): ask for a transparent
                // huge page, so that filling one is one fault that clears
                // 2 MiB rather than 512 faults.
                let advice = if huge {
                    libc::MADV_HUGEPAGE
                } else {
                    libc::MADV_NOHUGEPAGE
                };
                Backing::Anonymous {
                    area: LazyMapping::new(bytes, advice),
                }
            }
            InstallKind::Shared if huge => {
                let memfd = crate::sys::huge::memfd("uffd-pager-2m", bytes)
                    .map_err(|e| ("memfd_create(MFD_HUGETLB)", e))?;
                let alias = crate::sys::huge::shared_at(memfd.fd(), bytes, At::Near(0))
                    .map_err(|e| ("mmap memfd alias", e))?;
                Backing::Shared { memfd, alias, huge }
            }
            InstallKind::Shared => {
                let memfd = Memfd::new("uffd-pager", bytes).map_err(|e| ("memfd_create", e))?;
                // Aligned to 2 MiB where the object has a whole extent of
                // that size, so that its extents can be collapsed into huge
                // folios through it (`crate::collapse`).
                let at = if bytes >= crate::sys::huge::HUGE_PAGE_SIZE {
                    At::Over(
                        Mapping::reserve_aligned(bytes, crate::sys::huge::HUGE_PAGE_SIZE)
                            .map_err(|e| ("mmap memfd alias", e))?,
                    )
                } else {
                    At::Near(0)
                };
                let alias =
                    Mapping::shared(memfd.fd(), bytes, at).map_err(|e| ("mmap memfd alias", e))?;
                Backing::Shared { memfd, alias, huge }
            }
        };
        Ok(Object {
            kind,
            shift,
            store_key: crate::store::StoreKey::of(&store),
            writes: store.writable(),
            swap_writes: swap.as_ref().unwrap_or(&store).writable(),
            store,
            swap,
            cache: PageCache::new(npages).map_err(|e| ("mmap page cache", e))?,
            zero_fill,
            quiet: kind == InstallKind::Shared,
            kernel_maps: false,
            extents: None,
            mapped_pinned: Default::default(),
            backing,
            pins: OwnLine(AtomicU32::new(0)),
            slot: AtomicU32::new(u32::MAX),
            keep_stamp: std::sync::Mutex::new(None),
            windows: Windows::new(shift),
            ra_next: AtomicUsize::new(usize::MAX),
            write_health: Default::default(),
            durability: Default::default(),
            ra_window: AtomicU32::new(0),
            region_uffd: std::sync::OnceLock::new(),
            ra_end: AtomicUsize::new(0),
            ra_miss: AtomicU32::new(0),
            fa_next: AtomicUsize::new(usize::MAX),
            fa_window: AtomicU32::new(0),
            // SAFETY: getpid has no preconditions.
            owner_pid: unsafe { libc::getpid() },
            swap_left: [AtomicUsize::new(usize::MAX), AtomicUsize::new(0)],
        })
    }

    /// Pins the object; call while a lock keeps it alive.
    pub fn pin(&self) -> ObjectPin {
        self.pins.0.fetch_add(1, Acquire);
        ObjectPin { obj: self }
    }

    /// Whether a page no window finds may be a pinned region's all the
    /// same: a pinned region mapped the object, and it has more pieces
    /// than its windows hold.
    pub fn maybe_pinned_unfound(&self) -> bool {
        self.windows.overflowed() && self.mapped_pinned.load(Acquire)
    }

    /// Waits until no attempt holds a pin. Teardown calls this after the
    /// object's regions left the table and were write-locked, so no new pin
    /// can be taken. A pin can be held across a store call (a readahead
    /// run), as long as the store takes: after a few yields the wait
    /// sleeps, 20 µs at first, growing to 1 ms (it spun a CPU for the whole
    /// store call). Async-signal-safe.
    pub fn wait_unpinned(&self) {
        let mut pause = 20_000;
        for round in 0u32.. {
            if self.pins.0.load(Acquire) == 0 {
                return;
            }
            if round < 16 {
                std::thread::yield_now();
            } else {
                crate::sys::sleep_ns(pause);
                pause = (pause * 2).min(1_000_000);
            }
        }
    }

    /// Whether writes are tracked with write-protect faults: shared objects
    /// over writable stores. Their pages are installed write-protected; the
    /// first write faults, marks the page dirty and lifts the protection
    /// (the kernel's `page_mkwrite` for shared file mappings).
    pub fn tracks_writes(&self) -> bool {
        self.kind == InstallKind::Shared && self.writes && !self.kernel_maps
    }

    /// Whether a page is mapped write-protected.
    ///
    /// A shared page: always, but for a write to a page over a writable
    /// store (which makes it dirty). Over a read-only store every page stays
    /// protected, so a write (after the application's own
    /// `mprotect(PROT_WRITE)`) faults and is refused with SIGSEGV instead of
    /// changing a page no write-back would save.
    ///
    /// A 2 MiB anonymous page: for a read. It is then clean (its contents are
    /// its source's) until its first write, which faults and marks it dirty;
    /// reclaim drops a clean one without writing 2 MiB to swap. A base
    /// anonymous page is not protected here: it leaves by `UFFDIO_MOVE` and
    /// is written out whatever it holds (see `reclaim`), but for a clean
    /// one of a read-only region, which reclaim drops (see
    /// [`Object::protects_clean`]).
    #[inline]
    pub fn install_wp(&self, write: bool) -> bool {
        match self.kind {
            InstallKind::Shared => !(write && self.writes),
            InstallKind::Anonymous => self.is_huge() && !write,
        }
    }

    /// Whether a base anonymous page installed clean (a read in a region
    /// mapped read-only) is also write-protected: in a quiet object, whose
    /// clean pages reclaim drops with a zap. Nothing else would tell the
    /// engine that the application's own `mprotect(PROT_WRITE)` let a write
    /// change such a page; protected, the write faults first and marks it
    /// dirty (see `fault::install`'s `recheck_installed`).
    #[inline]
    pub fn protects_clean(&self) -> bool {
        self.kind == InstallKind::Anonymous && self.quiet && !self.is_huge()
    }

    /// Pages in the object.
    pub fn npages(&self) -> usize {
        self.cache.len()
    }

    /// Bytes in one of its pages.
    #[inline]
    pub fn page_size(&self) -> usize {
        1 << self.shift
    }

    /// `log2` of [`Object::page_size`].
    #[inline]
    pub fn page_shift(&self) -> u32 {
        self.shift
    }

    /// Whether its pages are 2 MiB (hugetlb).
    #[inline]
    pub fn is_huge(&self) -> bool {
        self.shift != PAGE_SHIFT
    }

    /// What one of its pages counts against the budget, which is kept in
    /// 4 KiB units: 1, or 512 for a 2 MiB page.
    #[inline]
    pub fn units(&self) -> u64 {
        1 << (self.shift - PAGE_SHIFT)
    }

    /// Where dirty pages go when they are written back or evicted: the
    /// store for a shared object, the swap for an anonymous one.
    #[inline]
    pub fn swap(&self) -> &Arc<dyn Store> {
        self.swap.as_ref().unwrap_or(&self.store)
    }

    /// Whether `store` took writes when the object was made: a shared
    /// object's dirty pages are owed to it. Asked of the store once
    /// (see the field).
    #[inline]
    pub fn store_writes(&self) -> bool {
        self.writes
    }

    /// Whether [`Object::swap`] took writes when the object was made: its
    /// dirty pages are owed a write there.
    #[inline]
    pub fn swap_writes(&self) -> bool {
        self.swap_writes
    }

    /// Where page `i`'s contents are read from, given its state word `w`:
    /// the swap if an anonymous page was swapped out, the store otherwise.
    #[inline]
    pub fn source(&self, w: u32) -> &Arc<dyn Store> {
        if w & crate::page_cache::SWAPPED != 0 {
            self.swap()
        } else {
            &self.store
        }
    }
}
