//! The store changed under the page cache: someone wrote the mapped file
//! with `write(2)`. The kernel has one page cache per file, so such a write
//! lands in the very pages a mapping shows; the engine keeps its own copy
//! (the shared object's memfd), so it copies the written bytes into every
//! cached page they touch, as `generic_perform_write` copies into the
//! folio. Pages not cached read the new bytes at their next fault.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::object::{InstallKind, Object};
use crate::page_cache::{DIRTY, GUARDS, LOCKED, SYNCING, UPTODATE};
use crate::sys::{PageBuf, PAGE_SIZE};
use std::sync::Arc;

impl Mm {
    /// Brings the cached pages of region `id` that hold store bytes
    /// `[offset, offset + len)` up to date with the store.
    ///
    /// Each touched page is locked (a fault or an eviction of it waits),
    /// read whole from the store, and only the written bytes are copied
    /// into the memfd: the rest of the page keeps the application's own
    /// unflushed writes, and a dirty page stays dirty. A write racing
    /// with a store through the mapping to the same bytes has no defined
    /// order, as with the kernel.
    pub fn refresh(&self, id: u64, offset: u64, len: u64) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        self.check_owner()?;
        let Some(obj) = self.pieces(id).first().map(|v| v.object.clone()) else {
            return Ok(()); // unmapped by the application meanwhile
        };
        let r = self.refresh_object(&obj, offset, len);
        // (The application may have unmapped it all meanwhile.)
        r.and(self.release_object(obj))
    }

    fn refresh_object(&self, obj: &Arc<Object>, offset: u64, len: u64) -> Result<()> {
        let memfd = match (obj.kind, obj.memfd()) {
            (InstallKind::Shared, Some(m)) => m.fd(),
            _ => {
                return Err(Error::Config(
                    "only a shared region's pages can be refreshed from its store \
                     (an anonymous region holds a private copy)"
                        .into(),
                ))
            }
        };
        if obj.is_huge() {
            // Hugetlbfs has no `pwrite` to copy the bytes in with.
            return Err(Error::Config(
                "a region of 2 MiB pages cannot be refreshed from its store".into(),
            ));
        }
        // Within the object's pages: a store whose length is not a page
        // multiple (the `Store` contract asks for one, but nothing checks
        // it) has a partial last page the object does not hold.
        let held = obj.npages() as u64 * PAGE_SIZE as u64;
        let end = offset.saturating_add(len).min(obj.store.len()).min(held);
        if offset >= end {
            return Ok(());
        }
        let page = PAGE_SIZE as u64;
        let mut buf = PageBuf::zeroed();
        let mut first_error = Ok(());
        for i in (offset / page) as usize..end.div_ceil(page) as usize {
            // Neither cached nor being read: its next fault reads the
            // store, changed already. A page being read (locked, not yet
            // up to date) may hold bytes read before the change, so the
            // lock waits for that read and the page is refreshed after it.
            if obj.cache.load(i) & (UPTODATE | LOCKED) == 0 {
                continue;
            }
            let w = obj.cache.lock(i);
            let r = if w & UPTODATE == 0 {
                Ok(())
            } else {
                let at = i as u64 * page;
                // A page the application punched out of the memfd
                // (`MADV_REMOVE`) comes back from the store whole: the
                // written bytes alone would fill the hole with zeros
                // around them, which the next fault would map.
                let (lo, hi) = if crate::sys::mem::hole_at(memfd, at) {
                    (0, page)
                } else {
                    (offset.max(at) - at, end.min(at + page) - at)
                };
                crate::io::read(&self.io, &obj.store, at, &mut buf.0)
                    .map_err(|e| Error::sys("reading the store", e.0))
                    .and_then(|()| {
                        crate::sys::mem::pwrite_all(
                            memfd,
                            &buf.0[lo as usize..hi as usize],
                            at + lo,
                        )
                        .map_err(|e| Error::sys("pwrite to the page cache", e))
                    })
            };
            // The store could not be read: a clean page is dropped, so
            // that its next fault reads the store again (or poisons it),
            // rather than showing the old bytes for good; a dirty one keeps
            // its writes, and the error says the refresh did not happen. So
            // does one whose write-back's sync is still running
            // (`SYNCING`): if that sync fails it must go dirty again, which
            // a dropped page cannot. And so does one under a residency
            // guard (`GUARDS`): a system call may be using it, where a
            // fault on it would be `EFAULT`.
            // A page of a huge folio, too: it leaves only with its whole
            // extent (`collapse`).
            let clear = if r.is_err() && w & (DIRTY | SYNCING | GUARDS) == 0 && !obj.collapsed(i) {
                crate::discard::discard_page(self, obj, i, w)
            } else {
                0
            };
            obj.cache.unlock(i, 0, clear);
            // On to the rest of the range even so: stopping here left the
            // pages after this one showing the store's old bytes, with no
            // way for the caller to tell which. The first error is the
            // call's.
            if let (Err(e), Ok(())) = (r, &first_error) {
                first_error = Err(e);
            }
        }
        first_error
    }
}
