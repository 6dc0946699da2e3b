//! An in-memory store: an anonymous mapping made on the first write, so
//! that pages never written cost nothing and a store never written costs
//! no mapping at all.

use super::zero::{in_bounds, round_up_to_page};
use super::{Store, StoreError};
use crate::sys::mem::LazyMapping;

/// A store held in memory: `read` and `write` are plain memcpys.
///
/// The contents live in a private anonymous mapping (`MAP_NORESERVE`), so
/// untouched pages are never allocated. Nothing in `read`/`write` allocates
/// or locks, so both are async-signal-safe.
///
/// ```
/// use uffd_pager::store::{MemoryStore, Store};
///
/// let s = MemoryStore::new(2 * uffd_pager::PAGE_SIZE as u64)?;
/// s.write(0, &[5; uffd_pager::PAGE_SIZE])?;
/// let mut page = [0; uffd_pager::PAGE_SIZE];
/// s.read(0, &mut page)?;
/// assert_eq!(page[100], 5);
/// # Ok::<(), uffd_pager::store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    /// Made on the first write (never for an empty store: mmap refuses
    /// zero lengths, and empty writes return early).
    map: LazyMapping,
    len: u64,
    writable: bool,
    /// Writes so far: [`Store::contents_stamp`].
    writes: std::sync::atomic::AtomicU64,
}

impl MemoryStore {
    /// A zero-filled, writable store of `len_bytes`, rounded up to whole
    /// pages.
    ///
    /// Example: [`MemoryStore`](crate::store::MemoryStore).
    pub fn new(len_bytes: u64) -> Result<Self, StoreError> {
        Self::advised(len_bytes, 0)
    }

    /// [`MemoryStore::new`] whose mapping asks for transparent huge pages:
    /// the swap of a region of 2 MiB pages, written 2 MiB at a time, so
    /// each write is one fault rather than 512.
    pub(crate) fn for_huge_pages(len_bytes: u64) -> Result<Self, StoreError> {
        Self::advised(len_bytes, libc::MADV_HUGEPAGE)
    }

    fn advised(len_bytes: u64, advice: i32) -> Result<Self, StoreError> {
        let len = round_up_to_page(len_bytes);
        let n = usize::try_from(len).map_err(|_| StoreError(libc::ENOMEM))?;
        Ok(MemoryStore {
            map: LazyMapping::new(n, advice),
            len,
            writable: true,
            writes: Default::default(),
        })
    }

    /// A writable store holding a copy of `data`; the length is rounded up to
    /// whole pages and the tail zero-padded.
    ///
    /// Example: [`MemoryStore`](crate::store::MemoryStore).
    pub fn from_bytes(data: &[u8]) -> Result<Self, StoreError> {
        let s = Self::new(data.len() as u64)?;
        if !data.is_empty() {
            // SAFETY: the mapping is at least `data.len()` bytes, freshly
            // created and not yet shared, and cannot overlap `data`.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), s.made()?, data.len());
            }
        }
        Ok(s)
    }

    /// A read-only store holding a copy of `data` (zero-padded to whole
    /// pages); writes return `EROFS`.
    ///
    /// Example: [`MemoryStore`](crate::store::MemoryStore).
    pub fn read_only(data: &[u8]) -> Result<Self, StoreError> {
        Ok(Self::from_bytes(data)?.with_writable(false))
    }

    /// Sets whether [`Store::write`] is accepted.
    ///
    /// Example: [`MemoryStore`](crate::store::MemoryStore).
    pub fn with_writable(mut self, writable: bool) -> Self {
        self.writable = writable;
        self
    }

    /// A copy of the whole contents. Allocates; for tests and reports. Must
    /// not race with writes (the result could be torn).
    ///
    /// Example: [`MemoryStore`](crate::store::MemoryStore).
    pub fn snapshot(&self) -> Vec<u8> {
        let n = self.len as usize;
        let mut out = vec![0u8; n];
        if let Some(base) = self.base() {
            // SAFETY: the mapping holds `n` readable bytes; `out` is a fresh,
            // distinct allocation of `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(base, out.as_mut_ptr(), n) };
        }
        out
    }

    /// Start of the mapping, if it was made (by a write).
    #[inline]
    fn base(&self) -> Option<*mut u8> {
        self.map.peek().map(|a| a as *mut u8)
    }

    /// Start of the mapping, making it now if needed. Async-signal-safe.
    fn made(&self) -> Result<*mut u8, StoreError> {
        self.map.get().map(|a| a as *mut u8).map_err(StoreError)
    }
}

impl Store for MemoryStore {
    fn memory_bytes(&self) -> u64 {
        self.map.resident()
    }

    fn len(&self) -> u64 {
        self.len
    }

    /// The page in the store's own memory, once it has been made (before
    /// the first write every page reads as zeros, from nowhere).
    fn page_in_memory(&self, offset: u64) -> Option<usize> {
        let off = usize::try_from(offset).ok()?;
        (offset < self.len)
            .then(|| self.base().map(|b| b as usize + off))
            .flatten()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if !in_bounds(offset, buf.len(), self.len) {
            return Err(StoreError(libc::EINVAL));
        }
        if buf.is_empty() {
            return Ok(());
        }
        match self.base() {
            // SAFETY: `[offset, offset + buf.len())` is within the mapping
            // (checked above), which lives as long as `self`, and `buf` is a
            // distinct caller-owned buffer, so the ranges do not overlap. The
            // mapping is not borrowed as a Rust reference anywhere: it is
            // only ever touched by these raw copies. Concurrent calls on
            // *distinct* pages touch disjoint bytes; the engine's page lock
            // serialises calls on the same page (see the `Store` contract),
            // so no bytes are read while being written.
            Some(base) => unsafe {
                std::ptr::copy_nonoverlapping(
                    base.add(offset as usize),
                    buf.as_mut_ptr(),
                    buf.len(),
                );
            },
            // Never written: all zeros.
            None => buf.fill(0),
        }
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        if !self.writable {
            return Err(StoreError(libc::EROFS));
        }
        if !in_bounds(offset, buf.len(), self.len) {
            return Err(StoreError(libc::EINVAL));
        }
        if buf.is_empty() {
            return Ok(());
        }
        // SAFETY: bounds checked above; the mapping is writable and outlives
        // the call; `buf` is a distinct caller-owned buffer. Writing through
        // `&self` is sound because the contents are never exposed as Rust
        // references, only through raw copies, and the engine serialises
        // calls per page while calls on distinct pages touch disjoint bytes.
        let base = self.made()?;
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), base.add(offset as usize), buf.len());
        }
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The number of writes so far: the contents change only through
    /// [`Store::write`].
    fn contents_stamp(&self) -> Option<u64> {
        Some(self.writes.load(std::sync::atomic::Ordering::Acquire))
    }

    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: std::os::fd::RawFd,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        if !in_bounds(offset, len, self.len) {
            return Err(StoreError(libc::EINVAL));
        }
        if len == 0 {
            return Ok(());
        }
        let Some(base) = self.base() else {
            // Never written: `read` gives zeros without making the mapping.
            return super::read_to_fd_buffered(self, offset, len, fd, fd_offset);
        };
        // SAFETY: bounds checked above; the mapping outlives the call and the
        // engine serialises calls per page, so the bytes are not being
        // written while the kernel copies them.
        let src = unsafe { std::slice::from_raw_parts(base.add(offset as usize), len) };
        crate::sys::mem::pwrite_all(fd, src, fd_offset).map_err(StoreError)
    }

    fn writable(&self) -> bool {
        self.writable
    }

    /// Plain syscalls and copies: async-signal-safe.
    fn signal_safe(&self) -> bool {
        true
    }

    fn synchronous(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::PAGE_SIZE;
    use std::sync::Arc;

    #[test]
    fn round_trip() {
        let s = MemoryStore::new(4 * PAGE_SIZE as u64).unwrap();
        assert_eq!(s.len(), 4 * PAGE_SIZE as u64);
        assert!(s.writable());
        assert_eq!(s.name(), "memory");
        let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7) as u8).collect();
        s.write(2 * PAGE_SIZE as u64, &page).unwrap();
        let mut back = vec![0u8; PAGE_SIZE];
        s.read(2 * PAGE_SIZE as u64, &mut back).unwrap();
        assert_eq!(back, page);
        // Untouched pages read as zeros.
        s.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        let snap = s.snapshot();
        assert_eq!(snap.len(), 4 * PAGE_SIZE);
        assert_eq!(&snap[2 * PAGE_SIZE..3 * PAGE_SIZE], &page[..]);
    }

    #[test]
    fn never_written_store_reads_zeros_without_a_mapping() {
        let s = MemoryStore::new(2 * PAGE_SIZE as u64).unwrap();
        let mut back = vec![1u8; PAGE_SIZE];
        s.read(PAGE_SIZE as u64, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert!(s.base().is_none(), "a read made the mapping");
        assert_eq!(s.page_in_memory(0), None, "no memory to read in place yet");
        // read_to_fd writes zeros too (into a memfd, read back with pread).
        let m = crate::sys::mem::Memfd::new("memstore-test", 2 * PAGE_SIZE).unwrap();
        crate::sys::mem::pwrite_all(m.fd(), &[7u8; PAGE_SIZE], 0).unwrap();
        s.read_to_fd(0, PAGE_SIZE, m.fd(), 0).unwrap();
        let mut out = vec![1u8; PAGE_SIZE];
        // SAFETY: pread into a live buffer from our memfd.
        let n = unsafe { libc::pread(m.fd(), out.as_mut_ptr().cast(), PAGE_SIZE, 0) };
        assert_eq!(n, PAGE_SIZE as isize);
        assert!(out.iter().all(|&b| b == 0));
        // After a write, read_to_fd copies the written bytes.
        s.write(PAGE_SIZE as u64, &[9u8; PAGE_SIZE]).unwrap();
        s.read_to_fd(PAGE_SIZE as u64, PAGE_SIZE, m.fd(), 0)
            .unwrap();
        // SAFETY: as above.
        unsafe { libc::pread(m.fd(), out.as_mut_ptr().cast(), PAGE_SIZE, 0) };
        assert!(out.iter().all(|&b| b == 9));
        // Now the page can be read in place, and only inside the store.
        let at = s.page_in_memory(PAGE_SIZE as u64).unwrap();
        // SAFETY: the store's own mapping, alive with `s`; nothing writes.
        assert_eq!(unsafe { *(at as *const u8) }, 9);
        assert_eq!(s.page_in_memory(2 * PAGE_SIZE as u64), None);
    }

    #[test]
    fn from_bytes_pads_to_pages() {
        let data: Vec<u8> = (0..PAGE_SIZE + 10).map(|i| i as u8 | 1).collect();
        let s = MemoryStore::from_bytes(&data).unwrap();
        assert_eq!(s.len(), 2 * PAGE_SIZE as u64);
        let snap = s.snapshot();
        assert_eq!(&snap[..data.len()], &data[..]);
        assert!(snap[data.len()..].iter().all(|&b| b == 0));
    }

    #[test]
    fn read_only_refuses_writes() {
        let s = MemoryStore::read_only(b"hello").unwrap();
        assert!(!s.writable());
        let page = vec![1u8; PAGE_SIZE];
        assert_eq!(s.write(0, &page), Err(StoreError(libc::EROFS)));
        let mut back = vec![0u8; PAGE_SIZE];
        s.read(0, &mut back).unwrap();
        assert_eq!(&back[..5], b"hello");
    }

    #[test]
    fn out_of_bounds_is_einval() {
        let s = MemoryStore::new(PAGE_SIZE as u64).unwrap();
        let mut buf = vec![0u8; PAGE_SIZE];
        assert_eq!(
            s.read(PAGE_SIZE as u64, &mut buf),
            Err(StoreError(libc::EINVAL))
        );
        assert_eq!(s.write(1, &buf), Err(StoreError(libc::EINVAL)));
        assert_eq!(s.read(u64::MAX, &mut buf), Err(StoreError(libc::EINVAL)));
    }

    #[test]
    fn empty_store() {
        let s = MemoryStore::new(0).unwrap();
        assert!(s.is_empty());
        assert!(s.snapshot().is_empty());
        s.read(0, &mut []).unwrap();
        s.write(0, &[]).unwrap();
        let s = MemoryStore::from_bytes(&[]).unwrap();
        assert!(s.is_empty());
    }

    #[test]
    fn concurrent_distinct_pages() {
        let pages = 64u64;
        let s = Arc::new(MemoryStore::new(pages * PAGE_SIZE as u64).unwrap());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    let mut back = vec![0u8; PAGE_SIZE];
                    for p in (t..pages).step_by(4) {
                        let page = vec![p as u8 + 1; PAGE_SIZE];
                        s.write(p * PAGE_SIZE as u64, &page).unwrap();
                        s.read(p * PAGE_SIZE as u64, &mut back).unwrap();
                        assert_eq!(back, page);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let snap = s.snapshot();
        for p in 0..pages as usize {
            assert!(snap[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]
                .iter()
                .all(|&b| b == p as u8 + 1));
        }
    }
}
