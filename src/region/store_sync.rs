//! Keeping a region and its store in step: write-back ([`Region::flush`],
//! the `msync` analog) and changes made behind the engine's back
//! ([`Region::flush_range`] before, [`Region::refresh`] after).

use super::Region;
use crate::error::Result;
use crate::page_cache::{DIRTY, GUARDS, UPTODATE};

/// How many times [`Region::flush_range`] lets events in and writes its
/// range again while pages stay dirty because the descriptor is changing.
const FLUSH_RANGE_TRIES: u32 = 100;

impl Region {
    /// Writes cached pages back to the store (the msync analog), then
    /// syncs the store ([`Store::sync`](crate::store::Store::sync)) if
    /// anything was written to it since its last sync: by this flush, or
    /// by reclaim before it. A flush with nothing to write syncs nothing.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn flush(&self) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        let mm = &self.owner.mm;
        mm.check_owner()?;
        let Some(obj) = mm.pieces(self.id).first().map(|v| v.object.clone()) else {
            // The application unmapped it all itself; the unmap wrote it
            // back, or kept what its store refused: written now.
            return self.flush_unmapped_object();
        };
        // A map of the store waits while this writes: the application may
        // unmap the region meanwhile (this reference then writes what is
        // left when it is given back), and a new region over the store
        // would read the older bytes.
        let _writing = mm.kept.writing(obj.store_key);
        let r = mm.writeback_object(&obj, crate::writeback::Gate::Sections);
        // (The application may have unmapped it all meanwhile.)
        r.and(mm.release_object(obj))
    }

    /// [`flush`](Self::flush) of a region the application unmapped all of
    /// itself: once its unmap is applied and released, and any flush of its
    /// store in flight (whose reference to the object outlived the unmap)
    /// is done, what the store refused is written. The object is found by
    /// address in the list of unwritten ones, never revived from `object`.
    fn flush_unmapped_object(&self) -> Result<()> {
        let mm = &self.owner.mm;
        mm.events.wait_applied();
        mm.kept.wait_for(self.store);
        mm.flush_unwritten_object(self.object.as_ptr())
    }

    /// [`flush`](Self::flush) of the pages that hold store bytes
    /// `[offset, offset + len)` only (offsets as in
    /// [`refresh`](Self::refresh)): the first half of a change behind the
    /// engine's back. Call it right before the store is changed there, and
    /// [`refresh`](Self::refresh) right after: a dirty page holds its own
    /// copy of the bytes about to change, and a write-back of it between
    /// the change and the refresh (reclaim's, kswapd's, another thread's
    /// flush) would put that older copy over the change, in the store and
    /// then, through the refresh, in the region. Flushed first, the page is
    /// clean, and an eviction in between only drops it. (A store through
    /// the mapping to the same page by another thread in between still
    /// dirties it; as with the kernel, writes racing to one page have no
    /// defined order, but here the change behind the engine can lose to
    /// the whole page.) Pages the kernel would not write-protect while an
    /// unmap or remap elsewhere on the descriptor was on its way are
    /// written again once it is applied; where a hundred tries left such
    /// pages (each waiting for the events, or 10 ms where none of the
    /// pager's is on its way yet), the range is not clean and this fails
    /// with [`Error::Store`](crate::Error::Store) `EAGAIN`. A dirty page
    /// under a residency guard ([`lock_resident`](Self::lock_resident)) is
    /// written but stays dirty (a system call may be writing into it): the
    /// range is not clean either, and this fails with `EBUSY`; drop the
    /// guard first. So does a dirty page the engine cannot write-protect
    /// at all: one of a store mapped in more than four pieces at once (the
    /// application's own `munmap`s or `mremap`s cut its regions; the
    /// engine keeps the addresses of four), whose address it does not
    /// know. Its bytes reach the store all the same.
    pub fn flush_range(&self, offset: u64, len: u64) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        let mm = &self.owner.mm;
        mm.check_owner()?;
        let Some(obj) = mm.pieces(self.id).first().map(|v| v.object.clone()) else {
            // Unmapped by the application meanwhile: written, or kept with
            // what its store refused, which must reach the store before
            // the change this flush comes before (else a later write-back
            // puts the older copy over it). As in `flush`.
            return self.flush_unmapped_object();
        };
        // A map of the store waits while this writes (the application may
        // unmap the region meanwhile, and the rest of its dirty pages are
        // written only when this gives its reference back).
        let _writing = mm.kept.writing(obj.store_key);
        let shift = obj.page_shift();
        let first = (offset >> shift) as usize;
        let end = offset.saturating_add(len).div_ceil(1 << shift) as usize;
        // A page whose write protection the kernel refused with EAGAIN (an
        // unmap or remap of any region on the descriptor is on its way,
        // whose event waits for this write-back's gate section) is written
        // from a copy and stays dirty, and a later write-back would put
        // that copy over the change: the event is let in and the range
        // written again, until no such page is left (before, this said Ok
        // with them dirty).
        let mut tries = 0;
        let r = loop {
            let r = mm.writeback_pages_changing(&obj, first..end, crate::writeback::Gate::Sections);
            match r {
                // A page left dirty that no later pass will clean (found
                // by review: this said Ok).
                Ok(left) if left.stuck => {
                    break Err(crate::store::StoreError(libc::EBUSY).into());
                }
                // Still changing after every try: pages are left dirty,
                // which is not Ok (a later write-back could put them over
                // the change this flush comes before).
                Ok(left) if left.changing && tries == FLUSH_RANGE_TRIES => {
                    break Err(crate::store::StoreError(libc::EAGAIN).into());
                }
                Ok(left) if left.changing => {
                    mm.events.wait_applied();
                    // An event not posted yet (held up behind another
                    // userfaultfd's reader): nothing to wait for here, so
                    // a short sleep, not a rewrite in a loop.
                    if !mm.events.pending() && mm.uffd_for(&obj).mmap_changing() {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    tries += 1;
                }
                r => break r.map(|_| ()),
            }
        };
        // A page under a residency guard is written from a copy and stays
        // dirty (see `Mm::writeback_pages_changing`): the range is not
        // clean, and a later write-back would put that copy over the
        // change (found by review: this said Ok). Only where dirty pages
        // are the store's: an anonymous object's are a private copy, which
        // no write-back puts in its store (it said EBUSY there).
        let owes_store = obj.kind == crate::object::InstallKind::Shared && obj.store_writes();
        let guarded = owes_store
            && (first..end.min(obj.npages())).any(|i| {
                let w = obj.cache.load(i);
                w & (UPTODATE | DIRTY) == UPTODATE | DIRTY && w & GUARDS != 0
            });
        let r = match r {
            Ok(()) if guarded => Err(crate::store::StoreError(libc::EBUSY).into()),
            r => r,
        };
        r.and(mm.release_object(obj))
    }

    /// Tells the engine that bytes `[offset, offset + len)` of the region's
    /// store changed behind its back (the application wrote the mapped
    /// file with `write(2)`): cached pages that hold them are updated from
    /// the store, keeping the region's own unflushed writes to the rest of
    /// each page, so the mapping never shows the old bytes. Offsets are the
    /// store's (the file's, for [`Pager::map_file`](crate::Pager::map_file)).
    /// Shared regions only: an anonymous region is a private copy and gets
    /// [`Error::Config`](crate::Error::Config). Where the region may have written these pages,
    /// call [`flush_range`](Self::flush_range) before the change (see
    /// there). A page whose store read fails is dropped if clean (its next
    /// fault reads the store again) and kept if dirty; the rest of the
    /// range is still refreshed, and the first error is returned.
    ///
    /// ```
    /// use std::os::unix::fs::FileExt;
    /// use uffd_pager::{MapOptions, Pager, PAGE_SIZE};
    ///
    /// let path = std::env::temp_dir().join(format!("refresh-doc-{}", std::process::id()));
    /// std::fs::write(&path, vec![1u8; 2 * PAGE_SIZE]).unwrap();
    /// let pager = Pager::builder().build()?;
    /// // SAFETY: the write behind the engine below comes while no slice
    /// // of the region is alive, and `refresh` covers it before the next.
    /// let mut region = unsafe { pager.map_file(&path, None, &MapOptions::default()) }?;
    /// assert_eq!(region.as_slice()[10], 1); // cached now
    /// let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    /// file.write_all_at(&[2; 4], 8).unwrap(); // behind the engine's back
    /// region.refresh(8, 4)?;
    /// assert_eq!(&region.as_slice()[7..13], &[1, 2, 2, 2, 2, 1]);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    ///
    /// Takes `&mut self`: the bytes change under any slice of the region.
    pub fn refresh(&mut self, offset: u64, len: u64) -> Result<()> {
        // SAFETY: `&mut self` means no slice of the region is alive.
        unsafe { self.refresh_unchecked(offset, len) }
    }

    /// [`refresh`](Self::refresh) through a shared reference, for callers
    /// outside Rust's borrow rules (the C API, the `LD_PRELOAD` shim).
    ///
    /// # Safety
    /// No Rust reference to the region's bytes (a slice from
    /// [`as_slice`](Self::as_slice)) is alive during the call: the bytes
    /// of the refreshed pages change under it.
    pub unsafe fn refresh_unchecked(&self, offset: u64, len: u64) -> Result<()> {
        // Signals wait from before the gate section to after it: a handler
        // that faulted inside the section would wait for an event being
        // applied, which waits for the section (see `Deferred`).
        let _deferred = crate::sys::thread::Deferred::new();
        let mm = &self.owner.mm;
        let _section = mm.events.section();
        mm.refresh(self.id, offset, len)
    }
}
