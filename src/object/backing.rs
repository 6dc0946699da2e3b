//! Where an object keeps its pages' contents (the cache area, or the
//! memfd and its alias), and the calls that reach them: a page's address,
//! a copy for write-back, freeing after eviction, what they hold.

use super::Object;
use crate::sys::mem::{LazyMapping, Mapping, Memfd};

#[derive(Debug)]
pub(super) enum Backing {
    /// The cache area is made when a page first needs it (a store read or
    /// a failed write-back), so a region that only ever gets zero pages
    /// costs one mapping.
    Anonymous { area: LazyMapping },
    Shared {
        memfd: Memfd,
        alias: Mapping,
        /// The memfd is on hugetlbfs: no `write`, so pages are taken from
        /// the pool ([`crate::sys::huge::allocate`]) and filled through
        /// the alias.
        huge: bool,
    },
}

impl Object {
    /// The engine's view of page `i`'s cached contents; for an anonymous
    /// object, this makes its cache area on first use (the error is
    /// mmap's). Async-signal-safe.
    #[inline]
    pub fn data(&self, i: usize) -> Result<*mut u8, i32> {
        if i >= self.npages() {
            return Err(libc::EINVAL);
        }
        let base = match &self.backing {
            Backing::Anonymous { area } => area.get()?,
            Backing::Shared { alias, .. } => alias.addr(),
        };
        Ok((base + (i << self.shift)) as *mut u8)
    }

    /// Page `i`'s cached contents, to be written to its store or swap (see
    /// [`Object::data`]).
    ///
    /// Hazard: a 2 MiB shared page the application punched out of the memfd
    /// (`MADV_REMOVE` through its mapping) is a hole, and loading from a
    /// hugetlbfs hole takes a page from the pool: with the pool empty that
    /// load is SIGBUS in the engine's own thread. So the page is taken from
    /// the pool first (a no-op for a page that is there); where none can be
    /// had (`ENOSPC`), the hole's contents, zeros, are returned instead (what
    /// the kernel writes for a punched file range). Any other error leaves
    /// the page to the caller to keep dirty. An application punching the
    /// page between that check and the caller's read still has the window.
    ///
    /// # Safety
    /// The caller holds page `i`'s lock, so nobody else writes it through the
    /// engine (the application may still write it through an installed
    /// shared mapping; callers that read for write-back first unmap it or
    /// protect it against writes).
    pub unsafe fn page_to_write_out(&self, i: usize) -> Result<&[u8], i32> {
        let p = self.data(i)?;
        if let Backing::Shared {
            memfd, huge: true, ..
        } = &self.backing
        {
            match crate::sys::huge::allocate(memfd.fd(), i << self.shift, self.page_size()) {
                Ok(()) => {}
                // No page to be had: the page was a hole.
                Err(libc::ENOSPC) | Err(libc::ENOMEM) => {
                    return Ok(crate::sys::mem::zeros(self.page_size()))
                }
                Err(e) => return Err(e),
            }
        }
        // SAFETY: `p` is a page-sized range of a live mapping owned by this
        // object, backed by a page (a huge one was just made sure of);
        // exclusivity is the caller's contract.
        Ok(unsafe { std::slice::from_raw_parts(p, self.page_size()) })
    }

    /// A copy of shared page `i`, taken through the kernel (`pread` of the
    /// memfd), for a write-back of a page that stays writable while it is
    /// written (a guarded one): the application may write it meanwhile,
    /// so no Rust reference to it may be made ([`page_to_write_out`]'s
    /// contract). A hole copies as zeros. `EINVAL` for an anonymous
    /// object, which has no store to write back to.
    ///
    /// [`page_to_write_out`]: Self::page_to_write_out
    pub fn copy_page_out(&self, i: usize) -> Result<crate::sys::PagesBuf, i32> {
        let Backing::Shared { memfd, .. } = &self.backing else {
            return Err(libc::EINVAL);
        };
        // Page-aligned: a store over an `O_DIRECT` file refuses anything
        // else (`EINVAL`: a guarded page's write-back failed every time).
        let mut v = crate::sys::PagesBuf::zeroed(self.page_size());
        memfd.read_at(i << self.shift, v.as_mut_bytes())?;
        Ok(v)
    }

    /// Where the cache area holds page `i` of an anonymous object, if the
    /// area was made (the page itself may be absent there).
    pub fn cached_copy(&self, i: usize) -> Option<usize> {
        match &self.backing {
            Backing::Anonymous { area } => area.peek().map(|a| a + (i << self.shift)),
            Backing::Shared { .. } => None,
        }
    }

    /// What the object holds in memory outside its user mappings, in bytes:
    /// (memfd pages, cache-area pages, in-memory swap, page-state words).
    /// For reports ([`crate::MemoryUse`]).
    pub fn memory(&self) -> (u64, u64, u64, u64) {
        let (memfd, area) = match &self.backing {
            Backing::Shared { memfd, .. } => (memfd.allocated(), 0),
            Backing::Anonymous { area } => (0, area.resident()),
        };
        let swap = self.swap.as_ref().map_or(0, |s| s.memory_bytes());
        (memfd, area, swap, self.cache.resident_bytes())
    }

    /// The memfd, for shared objects (mapped by the user's region).
    pub fn memfd(&self) -> Option<&Memfd> {
        match &self.backing {
            Backing::Shared { memfd, .. } => Some(memfd),
            Backing::Anonymous { .. } => None,
        }
    }

    /// Frees the cached contents of pages `[i, i+n)` (after eviction).
    /// `EBUSY`, freeing nothing, for a range that covers part of a
    /// collapsed extent, which only `reclaim::extent`
    /// frees (whole). Async-signal-safe.
    pub fn free_data(&self, i: usize, n: usize) -> Result<(), i32> {
        if self.extents.as_ref().is_some_and(|x| x.cuts(i, n)) {
            return Err(libc::EBUSY);
        }
        self.free_data_whole(i, n)
    }

    /// [`free_data`](Self::free_data) without the check for collapsed
    /// extents: the caller frees whole ones.
    pub(crate) fn free_data_whole(&self, i: usize, n: usize) -> Result<(), i32> {
        match &self.backing {
            Backing::Anonymous { area } => match area.peek() {
                // (A cache area made after the application's
                // `mlockall(MCL_FUTURE)` is locked, where `MADV_DONTNEED`
                // fails: `zap` frees it all the same.)
                Some(a) => crate::sys::mem::zap(a + (i << self.shift), n << self.shift),
                None => Ok(()),
            },
            Backing::Shared { memfd, .. } => memfd.punch_hole(i << self.shift, n << self.shift),
        }
    }
}
