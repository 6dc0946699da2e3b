//! A window of another store: the pages of `inner` from `base` on, as the
//! pages of a store of their own (an `mmap` of a file at an offset).

use super::zero::in_bounds;
use super::{LatencyReport, Store, StoreError, MAX_BATCH};
use crate::sys::PAGE_SIZE;
use std::sync::Arc;

/// `len` bytes of `inner` starting at `base`, presented from offset 0.
///
/// Every call is the inner store's call at `offset + base`, so the slice is
/// as signal-safe, synchronous and writable as the store it looks into and
/// adds no copy. Cost: one add per call. Its `memory_bytes` is 0: the
/// inner store's memory is the inner store's to report (several windows of
/// one store would each count all of it).
///
/// ```
/// use std::sync::Arc;
/// use uffd_pager::store::{MemoryStore, SliceStore, Store};
/// use uffd_pager::PAGE_SIZE;
///
/// let whole = Arc::new(MemoryStore::new(4 * PAGE_SIZE as u64)?);
/// whole.write(2 * PAGE_SIZE as u64, &[7; PAGE_SIZE])?;
/// let tail = SliceStore::new(whole, 2 * PAGE_SIZE as u64, 2 * PAGE_SIZE as u64)?;
/// let mut page = [0; PAGE_SIZE];
/// tail.read(0, &mut page)?; // page 2 of the whole store
/// assert_eq!(page[0], 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SliceStore {
    inner: Arc<dyn Store>,
    base: u64,
    len: u64,
}

impl std::fmt::Debug for SliceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceStore")
            .field("inner", &self.inner.name())
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

impl SliceStore {
    /// The `len` bytes of `inner` from `base` on. Both must be whole pages
    /// and the window must lie inside `inner` (else `EINVAL`).
    ///
    /// Example: [`SliceStore`](crate::store::SliceStore).
    pub fn new(inner: Arc<dyn Store>, base: u64, len: u64) -> Result<SliceStore, StoreError> {
        let page = PAGE_SIZE as u64;
        if !base.is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(StoreError(libc::EINVAL));
        }
        match base.checked_add(len) {
            Some(end) if end <= inner.len() => Ok(SliceStore { inner, base, len }),
            _ => Err(StoreError(libc::EINVAL)),
        }
    }

    /// Where the window starts in the inner store.
    ///
    /// Example: [`SliceStore`](crate::store::SliceStore).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The store the window looks into.
    ///
    /// Example: [`SliceStore`](crate::store::SliceStore).
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// `offset` in the inner store, if `[offset, offset+n)` is inside the
    /// window.
    #[inline]
    fn at(&self, offset: u64, n: usize) -> Result<u64, StoreError> {
        if in_bounds(offset, n, self.len) {
            Ok(offset + self.base)
        } else {
            Err(StoreError(libc::EINVAL))
        }
    }
}

impl Store for SliceStore {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read(self.at(offset, buf.len())?, buf)
    }

    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        self.inner
            .read_to_fd(self.at(offset, len)?, len, fd, fd_offset)
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(self.at(offset, buf.len())?, buf)
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn read_many(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_many(self.at(offset, buf.len())?, buf)
    }

    /// The batch with every offset moved, built on the stack (no
    /// allocation: as signal-safe as the inner store).
    fn write_many(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        for chunk in pages.chunks(MAX_BATCH) {
            let mut moved: [(u64, &[u8]); MAX_BATCH] = [(0, &[]); MAX_BATCH];
            for (m, &(off, page)) in moved.iter_mut().zip(chunk) {
                *m = (self.at(off, page.len())?, page);
            }
            self.inner.write_many(&moved[..chunk.len()])?;
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync()
    }

    /// The inner store's: a window of a file counts as the file (any two
    /// windows of it as one store, which errs on the safe side).
    fn identity(&self) -> Option<(u64, u64)> {
        self.inner.identity()
    }

    fn signal_safe(&self) -> bool {
        self.inner.signal_safe()
    }

    fn synchronous(&self) -> bool {
        self.inner.synchronous()
    }

    fn page_in_memory(&self, offset: u64) -> Option<usize> {
        self.inner.page_in_memory(self.at(offset, PAGE_SIZE).ok()?)
    }

    /// The inner store's discard of the same bytes, where they lie inside
    /// the window (a swap store from `PagerBuilder::swap_to` may be a
    /// window of a larger one: its dropped pages' memory or blocks go back
    /// as the whole store's would).
    fn discard(&self, offset: u64, len: u64) {
        if let Some(at) = usize::try_from(len)
            .ok()
            .and_then(|n| self.at(offset, n).ok())
        {
            self.inner.discard(at, len)
        }
    }

    /// Whether the inner store reads a batch in one request: a window of a
    /// file on a disk is read as the file is.
    fn batches_reads(&self) -> bool {
        self.inner.batches_reads()
    }

    /// The inner store's stamp: any change to it may be a change to the
    /// window (one outside the window only costs a re-read).
    fn contents_stamp(&self) -> Option<u64> {
        self.inner.contents_stamp()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn latency_report(&self) -> Option<LatencyReport> {
        self.inner.latency_report()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    const P: u64 = PAGE_SIZE as u64;

    fn numbered(pages: u64) -> Arc<dyn Store> {
        let s = MemoryStore::new(pages * P).unwrap();
        for i in 0..pages {
            s.write(i * P, &[i as u8; PAGE_SIZE]).unwrap();
        }
        Arc::new(s)
    }

    #[test]
    fn every_call_lands_at_its_offset_plus_base() {
        let whole = numbered(8);
        let s = SliceStore::new(whole.clone(), 3 * P, 4 * P).unwrap();
        assert_eq!(s.len(), 4 * P);
        let mut two = vec![0u8; 2 * PAGE_SIZE];
        s.read_many(P, &mut two).unwrap();
        assert_eq!((two[0], two[PAGE_SIZE]), (4, 5));
        s.write_many(&[(0, &[9; PAGE_SIZE]), (3 * P, &[8; PAGE_SIZE])])
            .unwrap();
        let mut page = [0u8; PAGE_SIZE];
        whole.read(3 * P, &mut page).unwrap();
        assert_eq!(page[0], 9);
        whole.read(6 * P, &mut page).unwrap();
        assert_eq!(page[0], 8);
        whole.read(7 * P, &mut page).unwrap();
        assert_eq!(page[0], 7, "the page past the window is untouched");
    }

    #[test]
    fn a_window_of_a_file_is_that_file() {
        let path = std::env::temp_dir().join(format!("slice-id-{}", std::process::id()));
        let opts = crate::store::FileStoreOptions {
            create_len: Some(4 * P),
            ..Default::default()
        };
        let file: Arc<dyn Store> = Arc::new(crate::store::FileStore::open(&path, &opts).unwrap());
        let _ = std::fs::remove_file(&path);
        let s = SliceStore::new(file.clone(), P, P).unwrap();
        assert!(s.identity().is_some());
        assert_eq!(s.identity(), file.identity());
        assert_eq!(SliceStore::new(numbered(2), 0, P).unwrap().identity(), None);
    }

    /// `discard`, `batches_reads` and `contents_stamp` were the trait's
    /// defaults: a window used as a swap store kept its dropped pages'
    /// memory, and one of a disk file was read a page per request.
    #[test]
    fn a_window_passes_on_discard_batching_and_the_stamp() {
        let whole = Arc::new(MemoryStore::new(8 * P).unwrap());
        for i in 0..8 {
            whole.write(i * P, &[1; PAGE_SIZE]).unwrap();
        }
        let s = SliceStore::new(whole.clone(), 4 * P, 4 * P).unwrap();
        let (held, stamp) = (whole.memory_bytes(), s.contents_stamp());
        assert_eq!(held, 8 * P);
        assert!(stamp.is_some() && stamp == whole.contents_stamp());
        s.discard(P, 2 * P);
        assert_eq!(
            whole.memory_bytes(),
            6 * P,
            "the window's two pages went back"
        );
        s.discard(3 * P, 2 * P);
        assert_eq!(
            whole.memory_bytes(),
            6 * P,
            "past the window's end: nothing"
        );
        let mut page = [9u8; PAGE_SIZE];
        whole.read(5 * P, &mut page).unwrap();
        assert_eq!(page[0], 0);
        whole.read(P, &mut page).unwrap();
        assert_eq!(page[0], 1, "outside the window, kept");
        s.write(0, &[2; PAGE_SIZE]).unwrap();
        assert_ne!(s.contents_stamp(), stamp);

        let path = std::env::temp_dir().join(format!("slice-batch-{}", std::process::id()));
        let opts = crate::store::FileStoreOptions {
            create_len: Some(4 * P),
            ..Default::default()
        };
        let file: Arc<dyn Store> = Arc::new(crate::store::FileStore::open(&path, &opts).unwrap());
        let _ = std::fs::remove_file(&path);
        let w = SliceStore::new(file.clone(), P, P).unwrap();
        assert_eq!(w.batches_reads(), file.batches_reads());
    }

    #[test]
    fn nothing_outside_the_window_is_reachable() {
        let s = SliceStore::new(numbered(8), 4 * P, 4 * P).unwrap();
        let mut page = [0u8; PAGE_SIZE];
        assert_eq!(s.read(4 * P, &mut page), Err(StoreError(libc::EINVAL)));
        assert_eq!(
            s.write_many(&[(0, &[1; PAGE_SIZE]), (4 * P, &[1; PAGE_SIZE])]),
            Err(StoreError(libc::EINVAL))
        );
        assert!(s.page_in_memory(4 * P).is_none());
    }

    #[test]
    fn a_window_must_be_whole_pages_inside_the_store() {
        let whole = numbered(4);
        for (base, len) in [
            (1, P),
            (0, 5 * P),
            (4 * P, P),
            (P, 1),
            (u64::MAX - P + 1, P),
        ] {
            assert!(
                SliceStore::new(whole.clone(), base, len).is_err(),
                "{base} {len}"
            );
        }
        assert!(SliceStore::new(whole, 4 * P, 0).is_ok());
    }
}
