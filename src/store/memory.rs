//! An in-memory store: an anonymous mapping made on the first write, so
//! that pages never written cost nothing and a store never written costs
//! no mapping at all.

use super::zero::{in_bounds, round_up_to_page};
use super::{Store, StoreError};
use crate::sys::mem::LazyMapping;

/// A store held in memory: `read` and `write` are copies (of relaxed
/// atomic words, so that calls from any threads at once are sound).
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

    /// A copy of the whole contents. Allocates; for tests and reports. A
    /// write that runs meanwhile may be half in the copy.
    ///
    /// # Panics
    /// If a buffer of the store's length cannot be allocated.
    ///
    /// Example: [`MemoryStore`](crate::store::MemoryStore).
    pub fn snapshot(&self) -> Vec<u8> {
        let n = self.len as usize;
        let mut out = vec![0u8; n];
        if let Some(base) = self.base() {
            // SAFETY: the mapping holds `n` readable bytes; `out` is a fresh,
            // distinct allocation of `n` bytes.
            unsafe { load_words(base, &mut out) };
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

// The store's bytes are shared by every thread that holds the store, and
// nothing stops two of them calling `read` and `write` on one page at once
// (the engine's page lock serialises only its own calls). A plain memcpy
// would then be a data race, undefined behaviour; so the store's side of
// every copy is made of relaxed atomic accesses (8 bytes at a time where
// aligned), which race with defined, if torn, results. On x86-64 they are
// the same plain loads and stores, only not merged into vector moves.

/// Copies `dst.len()` bytes from the store's memory at `src` into `dst`.
///
/// # Safety
/// `[src, src + dst.len())` is mapped and readable for the call, and every
/// concurrent access to it is atomic (this module's only).
unsafe fn load_words(src: *const u8, dst: &mut [u8]) {
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
    let n = dst.len();
    let head = src.align_offset(8).min(n);
    let words = (n - head) / 8;
    for (i, d) in dst[..head].iter_mut().enumerate() {
        // SAFETY: within the caller's range; a byte is always aligned.
        *d = unsafe { AtomicU8::from_ptr(src.add(i) as *mut u8) }.load(Relaxed);
    }
    for w in 0..words {
        let at = head + 8 * w;
        // SAFETY: within the caller's range, and 8-aligned (`head`).
        let v = unsafe { AtomicU64::from_ptr(src.add(at) as *mut u64) }.load(Relaxed);
        dst[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
    for (i, d) in dst.iter_mut().enumerate().skip(head + 8 * words) {
        // SAFETY: as the head.
        *d = unsafe { AtomicU8::from_ptr(src.add(i) as *mut u8) }.load(Relaxed);
    }
}

/// Copies `src` into the store's memory at `dst`.
///
/// # Safety
/// `[dst, dst + src.len())` is mapped and writable for the call, and every
/// concurrent access to it is atomic (this module's only).
unsafe fn store_words(src: &[u8], dst: *mut u8) {
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
    let n = src.len();
    let head = dst.align_offset(8).min(n);
    let words = (n - head) / 8;
    for (i, &b) in src[..head].iter().enumerate() {
        // SAFETY: within the caller's range; a byte is always aligned.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Relaxed);
    }
    for w in 0..words {
        let at = head + 8 * w;
        let v = u64::from_ne_bytes(src[at..at + 8].try_into().expect("8 bytes"));
        // SAFETY: within the caller's range, and 8-aligned (`head`).
        unsafe { AtomicU64::from_ptr(dst.add(at) as *mut u64) }.store(v, Relaxed);
    }
    for (i, &b) in src.iter().enumerate().skip(head + 8 * words) {
        // SAFETY: as the head.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Relaxed);
    }
}

impl Store for MemoryStore {
    fn memory_bytes(&self) -> u64 {
        self.map.resident()
    }

    /// Gives the pages' memory back (`MADV_DONTNEED`): they read as zeros
    /// again. Whole pages of a writable store only: `madvise` rounds a
    /// length up to a page, so a part of a page dropped all of it, and a
    /// read-only store's contents are not its to forget.
    fn discard(&self, offset: u64, len: u64) {
        let page = crate::sys::PAGE_SIZE as u64;
        let whole = offset.is_multiple_of(page) && len.is_multiple_of(page);
        if !whole || !self.writable {
            return;
        }
        if let (Some(base), true) = (self.base(), in_bounds(offset, len as usize, self.len)) {
            let _ = crate::sys::mem::madvise(
                base as usize + offset as usize,
                len as usize,
                libc::MADV_DONTNEED,
            );
            // The pages read as zeros now: a change, which the stamp says
            // (an object kept over the store is not mapped again).
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Release);
        }
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
            // (checked above), which lives as long as `self`; `buf` is a
            // distinct caller-owned buffer.
            Some(base) => unsafe { load_words(base.add(offset as usize), buf) },
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
        // the call; `buf` is a distinct caller-owned buffer.
        let base = self.made()?;
        unsafe { store_words(buf, base.add(offset as usize)) };
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The number of writes and discards so far: the contents change only
    /// through [`Store::write`] and [`Store::discard`].
    fn contents_stamp(&self) -> Option<u64> {
        Some(self.writes.load(std::sync::atomic::Ordering::Acquire))
    }

    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        use std::os::fd::AsRawFd;
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
        // SAFETY: bounds checked above, and the mapping outlives the call.
        // Only the kernel reads the bytes: no Rust reference to them is made
        // (a concurrent `write` may change them meanwhile).
        unsafe {
            crate::sys::mem::pwrite_all_raw(
                fd.as_raw_fd(),
                base.add(offset as usize),
                len,
                fd_offset,
            )
        }
        .map_err(StoreError)
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

    /// The word copies at every alignment of start and end, against a
    /// byte-for-byte model; and two threads at one page at once (sound now:
    /// each read sees, per aligned word, one of the values written).
    /// `discard` forgets whole pages of a writable store only: before, a
    /// byte's discard dropped its whole page (`madvise` rounds the length
    /// up), and a read-only store's contents could be dropped.
    #[test]
    fn discard_drops_whole_pages_of_a_writable_store_only() {
        let page = crate::sys::PAGE_SIZE;
        let s = MemoryStore::from_bytes(&vec![7u8; 2 * page]).unwrap();
        s.discard(0, 1);
        s.discard(page as u64 + 8, page as u64);
        assert!(s.snapshot().iter().all(|&b| b == 7), "part of a page");
        s.discard(page as u64, page as u64);
        let got = s.snapshot();
        assert!(got[..page].iter().all(|&b| b == 7));
        assert!(got[page..].iter().all(|&b| b == 0));
        let ro = MemoryStore::read_only(&vec![7u8; page]).unwrap();
        ro.discard(0, page as u64);
        assert!(ro.snapshot().iter().all(|&b| b == 7), "read-only");
    }

    #[test]
    fn copies_at_any_alignment_and_from_threads_at_once() {
        let s = Arc::new(MemoryStore::new(2 * PAGE_SIZE as u64).unwrap());
        let mut model = vec![0u8; 2 * PAGE_SIZE];
        for off in 0..17usize {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 100, PAGE_SIZE - off] {
                let data: Vec<u8> = (0..len).map(|i| (i * 31 + off * 7 + len) as u8).collect();
                s.write(off as u64, &data).unwrap();
                model[off..off + len].copy_from_slice(&data);
                let mut back = vec![0xeeu8; len + off];
                s.read(0, &mut back).unwrap();
                assert_eq!(back, model[..len + off], "off {off} len {len}");
            }
        }
        assert_eq!(s.snapshot(), model);
        let w = {
            let s = s.clone();
            std::thread::spawn(move || {
                for k in 0..2000u64 {
                    s.write(PAGE_SIZE as u64, &[(k % 2) as u8 * 0xff; PAGE_SIZE])
                        .unwrap();
                }
            })
        };
        let mut buf = [0u8; PAGE_SIZE];
        for _ in 0..2000 {
            s.read(PAGE_SIZE as u64, &mut buf).unwrap();
            for word in buf.chunks(8) {
                assert!(word == [0; 8] || word == [0xff; 8], "torn word {word:?}");
            }
        }
        w.join().unwrap();
    }

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
        s.read_to_fd(0, PAGE_SIZE, m.as_fd(), 0).unwrap();
        let mut out = vec![1u8; PAGE_SIZE];
        // SAFETY: pread into a live buffer from our memfd.
        let n = unsafe { libc::pread(m.fd(), out.as_mut_ptr().cast(), PAGE_SIZE, 0) };
        assert_eq!(n, PAGE_SIZE as isize);
        assert!(out.iter().all(|&b| b == 0));
        // After a write, read_to_fd copies the written bytes.
        s.write(PAGE_SIZE as u64, &[9u8; PAGE_SIZE]).unwrap();
        s.read_to_fd(PAGE_SIZE as u64, PAGE_SIZE, m.as_fd(), 0)
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

    /// A discard changes what the store reads (zeros), so it moves the
    /// stamp as a write does: a kept object's older copy would be mapped
    /// again otherwise.
    #[test]
    fn a_discard_moves_the_stamp() {
        let s = MemoryStore::from_bytes(&[7u8; 2 * PAGE_SIZE]).unwrap();
        let before = s.contents_stamp();
        s.discard(0, PAGE_SIZE as u64);
        let mut page = vec![1u8; PAGE_SIZE];
        s.read(0, &mut page).unwrap();
        assert!(page.iter().all(|&b| b == 0));
        assert_ne!(s.contents_stamp(), before);
        // A discard that does nothing (part of a page) leaves it.
        let now = s.contents_stamp();
        s.discard(0, 100);
        assert_eq!(s.contents_stamp(), now);
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
