//! What the engine spends on bookkeeping for a region: [`Footprint`].

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
    /// Bytes the state words of `pages` pages take (address space for a
    /// large region: its words have a mapping of their own).
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
