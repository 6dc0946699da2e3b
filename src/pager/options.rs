//! [`MapOptions`]: how a region is mapped, and the install kind the
//! engine chooses for it when the caller does not.

use crate::object::InstallKind;

/// How the application will read a region: the engine's analog of the
/// `madvise` advice `MADV_NORMAL` and `MADV_RANDOM` (the kernel's
/// `VM_RAND_READ` flag on a VMA), given when the region is mapped
/// ([`MapOptions::access`], which also picks the install kind) or later
/// ([`Region::advise`](crate::Region::advise), readahead only).
///
/// | | `Normal` | `Random` |
/// |---|---|---|
/// | readahead | adaptive (grows on sequential faults, off after 100 scattered ones) | none, from the first fault |
/// | install kind chosen by `kind: None` for a read-only region of 4 KiB pages | shared | anonymous |
///
/// Why random reads get the anonymous kind: `UFFDIO_CONTINUE` maps a
/// shared page with a dirty PTE, and the kernel flushes the TLB once per
/// page table in which it zaps a dirty file PTE, so a batch of 32 scattered
/// evictions costs 32 flushes (each a shootdown IPI when another thread of
/// the process runs on another CPU). An anonymous read-only page is
/// installed clean by `UFFDIO_COPY` and dropped with no write-back, and a
/// batch of them costs one flush. What the anonymous kind gives up: its
/// page cache goes with the region (a shared object's cached pages are
/// kept for the next map of the same file), and a sequential reader gets
/// no fault-around. The README's "Speed" has the measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Access {
    /// No advice: readahead adapts to what the faults look like.
    #[default]
    Normal,
    /// Scattered reads: no readahead; a read-only region with `kind: None`
    /// gets the anonymous kind.
    Random,
}

impl std::str::FromStr for Access {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "normal" => Ok(Access::Normal),
            "random" => Ok(Access::Random),
            _ => Err(format!("unknown access pattern {s:?} (normal, random)")),
        }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Access::Normal => "normal",
            Access::Random => "random",
        })
    }
}

/// Options for [`Pager::map_store`](crate::Pager::map_store) and [`Pager::map_file`](crate::Pager::map_file).
///
/// ```
/// use uffd_pager::{InstallKind, MapOptions, Pager};
/// use uffd_pager::store::MemoryStore;
/// use std::sync::Arc;
///
/// let pager = Pager::builder().build()?;
/// let store = Arc::new(MemoryStore::new(1 << 20)?);
/// let opts = MapOptions {
///     kind: Some(InstallKind::Anonymous),
///     populate: true,
///     ..MapOptions::default()
/// };
/// // SAFETY: the store was moved in; nothing else can change it.
/// let region = unsafe { pager.map_store(store, 1 << 20, &opts) }?;
/// assert_eq!(region.as_slice()[0], 0);
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct MapOptions {
    /// How pages are installed. `None` (the default) lets the engine
    /// choose from the other options ([`MapOptions::install_kind`]): the
    /// shared memfd kind (zero copy) unless the region is a read-only one
    /// of 4 KiB pages, not kernel-mapped, read at random
    /// ([`Access::Random`]), which gets the anonymous kind.
    pub kind: Option<InstallKind>,
    /// Map writable (default true).
    pub writable: bool,
    /// Place at exactly this address (must be free).
    pub fixed_addr: Option<usize>,
    /// Never evict this region's pages (the mlock analog).
    pub pinned: bool,
    /// Fault every page in at map time (the MAP_POPULATE analog).
    pub populate: bool,
    /// Bytes per page: [`PAGE_SIZE`](crate::PAGE_SIZE) (the default) or
    /// [`HUGE_PAGE_SIZE`](crate::HUGE_PAGE_SIZE), 2 MiB pages from the
    /// kernel's hugetlb pool (which root reserves with
    /// `sysctl vm.nr_hugepages=N`; mapping fails with
    /// [`Error::NoHugePages`](crate::Error::NoHugePages) if too few are
    /// free). Faults, installs, eviction, write-back and store calls then
    /// work 2 MiB at a time; the budget still counts 4 KiB units (a huge
    /// page is 512 of them) and must hold two huge pages at least. A region
    /// of 2 MiB pages has no fault-around (a page is 512 base pages
    /// already); a shared one reads the next page ahead for a sequential
    /// reader, within the budget. It cannot be remapped, and its length (and fixed
    /// address) must be multiples of 2 MiB. A huge anonymous region does
    /// not hear of the application's own `madvise(MADV_DONTNEED)` on pages
    /// it has evicted (use [`Region::dontneed`](crate::Region::dontneed)).
    pub page_size: usize,
    /// Let the kernel map cached pages itself (default false): for a
    /// read-only shared region of 4 KiB pages (`kind: Shared`, `writable:
    /// false`; anything else is [`Error::Config`](crate::Error::Config)).
    /// The region is registered for MISSING faults only, so the engine
    /// hears of a page only when it is absent from the memfd: it reads the
    /// page into the memfd and lets the access run again, and the kernel's
    /// own fault path maps it, with its fault-around over the pages the
    /// memfd holds. A page the engine cached but has not mapped (read
    /// ahead, or left by an earlier region of the object) then costs a
    /// kernel minor fault and no engine fault, and PTEs are installed
    /// clean, so evicting a batch of pages costs one TLB flush, not one
    /// per page (see the README's "Speed"). Once all 512 pages of a 2 MiB
    /// extent of the memfd are cached, the engine collapses them into a
    /// huge folio (`MADV_COLLAPSE`; counter `thp_collapse_alloc`; none
    /// where huge pages are denied to shmem or to the process), which
    /// the kernel maps with one PMD (a region of 2 MiB or more is placed
    /// on a 2 MiB boundary), and reclaim evicts the extent whole.
    ///
    /// What it costs: each extent's collapse copies 2 MiB, in the context
    /// that completed it (a readahead thread or a fault): a cold sequential
    /// pass cost 1.3–2.4× the plain shared kind's on this project's
    /// machine kind (the README's "Speed"). For data read again.
    ///
    /// What it gives up: the engine sees only the faults that miss, so
    /// `pgfault` and `readahead_used` count only those, the LRU's
    /// second chance never sees a page the kernel mapped, and a page read
    /// ahead is used without moving the readahead window until the reader
    /// reaches a page that is not there yet. The engine's own
    /// fault-around and write protection need MINOR and WP registration,
    /// which turn the kernel's fault-around off, so a write is refused only
    /// where it reaches the engine: [`Region::protect`](crate::Region::protect)
    /// refuses to make the region writable, but if the application makes it
    /// writable with its own `mprotect` and writes, a write to a page the
    /// memfd holds goes into the cache unseen and is lost when the page is
    /// evicted (a write to an absent page is SIGSEGV).
    ///
    /// Refused ([`Error::Config`](crate::Error::Config)) while shmem may
    /// use large folios (`/sys/kernel/mm/transparent_hugepage/shmem_enabled`
    /// or a per-size `hugepages-*kB/shmem_enabled` set to `always`,
    /// `within_size` or `force`): a folio larger than the page the engine
    /// fills would hold pages it never read, as zeros, which the kernel
    /// would map. The settings are read when the region's object (its
    /// memfd) is made, not again when a kept object is mapped anew:
    /// turning them on while the object lives is not noticed.
    pub kernel_maps: bool,
    /// How the application will read the region (the `madvise` advice
    /// `MADV_NORMAL` / `MADV_RANDOM`; default [`Access::Normal`]).
    pub access: Access,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            kind: None,
            writable: true,
            fixed_addr: None,
            pinned: false,
            populate: false,
            page_size: crate::PAGE_SIZE,
            kernel_maps: false,
            access: Access::Normal,
        }
    }
}

impl MapOptions {
    /// The install kind a region mapped with these options gets: `kind`
    /// if set; otherwise anonymous for a read-only region of 4 KiB pages
    /// that is not kernel-mapped and is read at random
    /// ([`Access::Random`]), shared for every other.
    /// ([`Pager::map_anonymous_with`](crate::Pager::map_anonymous_with)
    /// always maps anonymous memory.)
    ///
    /// ```
    /// use uffd_pager::{Access, InstallKind, MapOptions};
    ///
    /// let random = MapOptions { writable: false, access: Access::Random, ..MapOptions::default() };
    /// assert_eq!(random.install_kind(), InstallKind::Anonymous);
    /// assert_eq!(MapOptions::default().install_kind(), InstallKind::Shared);
    /// let writable = MapOptions { access: Access::Random, ..MapOptions::default() };
    /// assert_eq!(writable.install_kind(), InstallKind::Shared);
    /// ```
    pub fn install_kind(&self) -> InstallKind {
        match self.kind {
            Some(k) => k,
            None if !self.writable
                && self.access == Access::Random
                && self.page_size == crate::PAGE_SIZE
                && !self.kernel_maps =>
            {
                InstallKind::Anonymous
            }
            None => InstallKind::Shared,
        }
    }
}
