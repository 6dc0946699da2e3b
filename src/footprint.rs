//! What the engine spends on bookkeeping for a region ([`Footprint`],
//! computed) and what a pager holds in memory now ([`MemoryUse`],
//! measured).

use crate::error::{Error, Result};
use crate::lru::{Entry, Lru};
use crate::object::Object;
use crate::page_cache::PageCache;
use crate::vma::Vma;

/// The engine's bookkeeping for one region of `pages` pages under a
/// budget, from the structures themselves (built, sized and dropped by
/// [`Footprint::of`]). Resident memory is less: the larger structures live
/// in anonymous mappings of their own, whose untouched pages cost nothing.
///
/// ```
/// let f = uffd_pager::Footprint::of(1 << 20, 4096)?;
/// assert!(f.state_bytes >= (1 << 20) * f.state_bytes_per_page);
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes of page state per tracked page (one state word).
    pub state_bytes_per_page: usize,
    /// Bytes of one LRU entry.
    pub lru_entry_bytes: usize,
    /// Fixed bytes per region: its region and object structs.
    pub region_bytes: usize,
    /// Bytes the state words of `pages` pages take outside the object
    /// (address space for a large region: its words have a mapping of their
    /// own, or a heap allocation up to 1024 pages); 0 for a region of 8
    /// pages or fewer, whose words sit in the object (`region_bytes`).
    pub state_bytes: usize,
    /// Bytes the LRU ring for the budget takes (address space; sized by
    /// the budget, not by the regions).
    pub lru_bytes: usize,
}

impl Footprint {
    /// The bookkeeping of a region of `pages` pages in a pager with a
    /// budget of `budget_pages` (0: no budget, so no LRU).
    ///
    /// Example: [`Footprint`](crate::Footprint).
    pub fn of(pages: usize, budget_pages: u64) -> Result<Footprint> {
        let sys = |op| move |errno| Error::Sys { op, errno };
        let state = PageCache::new(pages).map_err(sys("mmap page states"))?;
        let lru_bytes = if budget_pages == 0 {
            0
        } else {
            Lru::new(1, budget_pages as usize)
                .map_err(sys("mmap LRU"))?
                .ring_bytes()
        };
        Ok(Footprint {
            state_bytes_per_page: PageCache::BYTES_PER_PAGE,
            lru_entry_bytes: std::mem::size_of::<Entry>(),
            region_bytes: std::mem::size_of::<Vma>() + std::mem::size_of::<Object>(),
            state_bytes: state.words_bytes(),
            lru_bytes,
        })
    }
}

/// What a pager holds in memory now, measured from its own mappings
/// (`/proc/self/pagemap` or `mincore`, and `fstat` of the memfds), beside its budget:
/// [`Pager::memory_use`](crate::Pager::memory_use).
///
/// The budget counts `resident_pages`: the pages installed in regions plus
/// the pages cached for them. The rest is outside it: page-state words and
/// the LRU ring (about 4 bytes per mapped page and 32 per budget page),
/// request and staging buffers (at most a few hundred KiB), and in-memory
/// swap, which holds every page an anonymous region evicted that differs
/// from its store: memory the budget does not bound. To bound it, swap to
/// a file ([`PagerBuilder::swap_dir`](crate::PagerBuilder::swap_dir)),
/// whose page cache the kernel can reclaim.
///
/// ```
/// use uffd_pager::{Pager, PAGE_SIZE};
/// let pager = Pager::builder().budget_pages(16).build()?;
/// let mut region = pager.map_anonymous(64 * PAGE_SIZE)?;
/// region.as_mut_slice().fill(7); // 64 dirty pages through a 16-page budget
/// let m = pager.memory_use();
/// assert!(m.resident_pages <= 16 + 8);
/// assert!(m.swap_bytes >= 40 * PAGE_SIZE as u64); // evicted to memory
/// assert!(m.total_bytes() >= m.swap_bytes + m.metadata_bytes);
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Pages counted against the budget now.
    pub resident_pages: u64,
    /// The budget in pages (0: none).
    pub budget_pages: u64,
    /// Bytes the pages of installed anonymous regions take (their user
    /// mappings' resident pages of their own: the shared zero page, which
    /// a read of a never-written page maps, costs nothing and is not
    /// counted, though the budget counts it, since a write makes it a
    /// page with no fault the engine sees).
    pub anonymous_bytes: u64,
    /// Bytes the shared regions' page caches (memfds) hold, and those of
    /// the objects kept cached after their last region went
    /// ([`PagerBuilder::keep_unmapped`](crate::PagerBuilder::keep_unmapped))
    /// or kept because their write-back failed
    /// ([`Pager::unwritten_bytes`](crate::Pager::unwritten_bytes)).
    pub memfd_bytes: u64,
    /// Bytes the anonymous regions' cache areas hold (pages read ahead or
    /// kept after a failed write-back), those of unwritten objects
    /// included.
    pub cache_area_bytes: u64,
    /// Bytes in-memory swap holds (outside the budget).
    pub swap_bytes: u64,
    /// Bytes of page-state words and the object table (resident), and of
    /// the LRU ring (its size: it is touched as the budget fills).
    pub metadata_bytes: u64,
    /// Bytes of request and staging buffers.
    pub buffer_bytes: u64,
}

impl MemoryUse {
    /// Everything above, in bytes: the pager's real footprint.
    /// (Saturating: the fields are public, and a caller may fill them.)
    pub fn total_bytes(&self) -> u64 {
        [
            self.page_bytes(),
            self.swap_bytes,
            self.metadata_bytes,
            self.buffer_bytes,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// The pages' share of it (installed, memfd and cache area), which the
    /// budget bounds.
    pub fn page_bytes(&self) -> u64 {
        self.anonymous_bytes
            .saturating_add(self.memfd_bytes)
            .saturating_add(self.cache_area_bytes)
    }
}

impl std::fmt::Display for MemoryUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        write!(
            f,
            "footprint {:.1} MiB (budget {:.1} MiB): pages {:.1}, in-memory swap {:.1}, metadata {:.2}, buffers {:.2}",
            mib(self.total_bytes()),
            mib(self.budget_pages.saturating_mul(crate::PAGE_SIZE as u64)),
            mib(self.page_bytes()),
            mib(self.swap_bytes),
            mib(self.metadata_bytes),
            mib(self.buffer_bytes),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `MemoryUse` a caller filled with figures near the limit sums and
    /// prints without overflow (a debug build panicked).
    #[test]
    fn sums_of_large_figures_saturate() {
        let m = MemoryUse {
            swap_bytes: u64::MAX,
            metadata_bytes: 1,
            anonymous_bytes: u64::MAX,
            memfd_bytes: 1,
            budget_pages: u64::MAX,
            ..MemoryUse::default()
        };
        assert_eq!(m.total_bytes(), u64::MAX);
        assert_eq!(m.page_bytes(), u64::MAX);
        assert!(m.to_string().starts_with("footprint"));
    }
}
