//! Getting region memory ready for system calls, and dropping it: the
//! `MAP_POPULATE`, `mlock` and `MADV_DONTNEED` analogs of [`Region`].

use super::Region;
use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;

impl Region {
    /// Makes `[offset, offset+len)` ready for a system call to use: in-thread
    /// delivery (and user-mode-only descriptors) cannot serve faults taken
    /// inside syscalls. Pages of a writable region are faulted in as for a
    /// write (a syscall such as `read(2)` may write them; write-tracked
    /// pages become dirty). Pages may be evicted again later under a memory
    /// budget, so prefault right before the syscall.
    ///
    /// A range larger than the budget's low watermark (see
    /// [`watermarks`](crate::watermarks): a sixteenth below the budget) is
    /// refused ([`Error::OverBudget`]): reclaim begins at the high
    /// watermark, and a range past it had its first pages evicted before
    /// the call (a range of the whole budget did; found by review).
    /// Prefaulting is best-effort: another thread can keep the pager at
    /// its budget and evict the buffer again before the call;
    /// [`Region::lock_resident`] keeps it resident until the guard is
    /// dropped.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        let span = self.page_span(offset, len)?;
        let budget = self.owner.mm.config.budget_pages;
        let pages = ((span.1 - span.0).div_ceil(PAGE_SIZE)) as u64;
        if budget > 0 && pages > crate::watermarks(budget).1 {
            return Err(Error::OverBudget { pages, budget });
        }
        let (_, writable, _) = self.vma_flags();
        self.fault_span(span, writable)
    }

    /// Faults `[offset, offset+len)` in and keeps it resident until the
    /// guard is dropped (the `mlock` analog; see [`ResidentGuard`](crate::ResidentGuard)): for
    /// a buffer that a system call reads or writes while other threads
    /// keep the pager at its budget. Pages of a writable region are faulted
    /// in as for a write. A range larger than the budget is refused
    /// ([`Error::OverBudget`]).
    ///
    /// ```no_run
    /// use std::io::Read;
    /// use uffd_pager::Pager;
    ///
    /// let pager = Pager::builder().budget_pages(1024).build()?;
    /// let mut region = pager.map_anonymous(64 << 20)?;
    /// let mut file = std::fs::File::open("/etc/hostname").unwrap();
    /// let guard = region.lock_resident(0, 4096)?;
    /// // SAFETY: the guard keeps the first page resident and mapped
    /// // writable; nothing else refers to it meanwhile.
    /// let buf = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), 4096) };
    /// let n = file.read(buf).unwrap(); // a syscall writing region memory
    /// drop(guard);
    /// # let _ = n;
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    pub fn lock_resident(&self, offset: usize, len: usize) -> Result<crate::ResidentGuard<'_>> {
        let (start, end) = self.page_span(offset, len)?;
        let end = end.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        crate::resident::lock(&self.owner.mm, self.id, start, end, true)
    }

    /// [`lock_resident`](Self::lock_resident), the guard holding the
    /// pager's address space instead of borrowing the region: for a caller
    /// that cannot keep the region borrowed across the system call (an
    /// interposer whose table of regions is behind a lock it must not hold
    /// while the call blocks). `for_write`: the call writes the range
    /// (`read(2)` into it), so its pages are faulted in for a write where
    /// the region is writable there; false (`write(2)` from it): for a
    /// read, which leaves clean pages clean. The region, and the pager, may
    /// be dropped meanwhile: the guard keeps what the pager needs to give
    /// its pages back alive until it is dropped, as a borrowed one whose
    /// region the application unmapped gives them back.
    ///
    /// Hazard: the guard does not borrow the region, so `remap` and
    /// `protect` may run while it lives. A range moved meanwhile is not
    /// `munlock`ed when the guard goes (it is no longer where the guard
    /// found it), and stays locked where the kernel allowed the lock.
    pub fn lock_resident_owned(
        &self,
        offset: usize,
        len: usize,
        for_write: bool,
    ) -> Result<crate::ResidentGuard<'static>> {
        let (start, end) = self.page_span(offset, len)?;
        let end = end.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let keep: std::sync::Arc<dyn std::any::Any + Send + Sync> = self.owner.clone();
        crate::resident::lock_held(&self.owner.mm, keep, self.id, start, end, for_write)
    }

    /// Faults in `[offset, offset+len)` through the engine without touching
    /// the memory (the MAP_POPULATE / `populate_vma_page_range` analog: a
    /// private writable region is populated for write, others for read),
    /// then drains this CPU's LRU add batch as the pager's drain policy says.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn populate(&self, offset: usize, len: usize) -> Result<()> {
        // The drain below holds an LRU lock: asynchronous signals wait for
        // it too, not only for the faults (see `Deferred`).
        let _deferred = crate::sys::thread::Deferred::new();
        let span = self.page_span(offset, len)?;
        let (pinned, writable, kind) = self.vma_flags();
        self.fault_span(
            span,
            writable && kind == crate::object::InstallKind::Anonymous,
        )?;
        let mm = &self.owner.mm;
        let drain = match mm.config.drain {
            crate::lru::DrainPolicy::Always => true,
            crate::lru::DrainPolicy::LockedOnly => pinned,
            crate::lru::DrainPolicy::Never => false,
        };
        if drain && mm.config.budget_pages > 0 {
            mm.lru.drain_local(&mm.objects, &mm.counters);
        }
        Ok(())
    }

    /// Drops `[offset, offset+len)` from the mapping (`MADV_DONTNEED`):
    /// for a shared region the pages stay cached and the next access is a
    /// minor fault; an anonymous region's contents there are discarded (the
    /// next access reads what the store holds: zeros for
    /// [`Pager::map_anonymous`](crate::Pager::map_anonymous)).
    ///
    /// `offset` must be a page boundary ([`Error::Unaligned`] otherwise,
    /// as `madvise` answers `EINVAL`); the end is rounded up to a page
    /// with 4 KiB pages and down with 2 MiB ones (hugetlb's rule).
    ///
    /// Takes `&mut self`: the bytes change under any slice of the region.
    ///
    /// A pinned region ([`MapOptions::pinned`](crate::MapOptions::pinned),
    /// the `mlock` analog) refuses it with [`Error::Config`] (`EINVAL`), as
    /// `madvise` refuses a locked mapping, and keeps its bytes.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn dontneed(&mut self, offset: usize, len: usize) -> Result<()> {
        // SAFETY: `&mut self` means no slice of the region is alive.
        unsafe { self.dontneed_unchecked(offset, len) }
    }

    /// [`dontneed`](Self::dontneed) through a shared reference, for callers
    /// outside Rust's borrow rules (the C API, the `LD_PRELOAD` shim).
    ///
    /// # Safety
    /// No Rust reference to the bytes of the dropped pages (a slice from
    /// [`as_slice`](Self::as_slice)) is alive during the call: they change
    /// under it.
    pub unsafe fn dontneed_unchecked(&self, offset: usize, len: usize) -> Result<()> {
        // As the kernel's madvise: the start must be a page boundary
        // (rounding it down would drop bytes the caller did not name),
        // even for an empty range (which was let through unaligned).
        if !offset.is_multiple_of(self.page_size) {
            return Err(Error::Unaligned {
                what: "offset",
                value: offset,
                page_size: self.page_size,
            });
        }
        if len == 0 {
            return Ok(());
        }
        let (start, mut end) = self.page_span(offset, len)?;
        // (Found by review: the shim's `MAP_LOCKED` mappings are pinned,
        // and a program's `MADV_DONTNEED` of one read zeros and was told
        // 0, where the kernel answers EINVAL and keeps the bytes.)
        if self.vma_flags().0 {
            return Err(Error::Config(
                "a pinned region keeps its pages: madvise refuses MADV_DONTNEED on a locked \
                 mapping"
                    .into(),
            ));
        }
        if self.page_size != PAGE_SIZE {
            // As on hugetlb: a partial last page is kept.
            end = (self.start + offset + len) & !(self.page_size - 1);
            if end <= start {
                return Ok(());
            }
        }
        self.owner.mm.dontneed(self.id, start, end - start)
    }
}
