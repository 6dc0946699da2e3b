//! Filling an object's page cache from its store: [`Object::fill`] for one
//! page, [`Object::fill_run`] for a readahead window.

use super::{Backing, Object};
use crate::store::Store;
use std::sync::Arc;

impl Object {
    /// Reads page `i` from its source into the cache (through the I/O
    /// workers for a store that is not signal-safe, see [`crate::io`]).
    /// Async-signal-safe.
    ///
    /// Shared objects are filled through the memfd ([`Store::read_to_fd`];
    /// a kernel-mapped one's through a pipe, [`crate::sys::pipe`], since
    /// the kernel maps what the memfd holds), never by writing through the
    /// alias: a page written through the
    /// alias is dirty in the alias's page table, and the kernel flushes the
    /// TLB on its own for every dirty shared-file PTE it zaps (before it
    /// drops the page's rmap), so evicting it would cost a shootdown of its
    /// own instead of sharing one with its batch.
    ///
    /// # Safety
    /// The caller holds page `i`'s lock and the page is neither cached nor
    /// installed, so nobody else reads or writes its cached contents.
    pub unsafe fn fill(
        &self,
        i: usize,
        io: &crate::io::Io,
    ) -> Result<(), crate::store::StoreError> {
        let src = self.source(self.cache.load(i));
        // SAFETY: the caller's contract.
        unsafe { self.fill_run(i, 1, src, io) }
    }

    /// Reads the `n` pages from `i` on (at most [`crate::store::MAX_BATCH`])
    /// from `src` into the cache in one store call: [`Object::fill`] for a
    /// run, as readahead reads a window. Async-signal-safe when `n` is 1;
    /// a longer run of a shared object whose store is not signal-safe
    /// allocates its buffer (readahead threads only).
    ///
    /// # Safety
    /// The caller holds the lock of every page of the run, none of them is
    /// cached or installed, and `src` is each page's [`Object::source`].
    ///
    /// A run that fails leaves none of its pages' memory behind: what a
    /// read wrote before it failed (the first pages of a short read, in
    /// the cache area or the memfd) is freed, since the caller takes the
    /// pages for absent and uncharges them (found by review: the memory
    /// stayed, outside the budget, until a later fault of the same page or
    /// the object's release).
    pub unsafe fn fill_run(
        &self,
        i: usize,
        n: usize,
        src: &Arc<dyn Store>,
        io: &crate::io::Io,
    ) -> Result<(), crate::store::StoreError> {
        if n == 0 || i + n > self.npages() {
            return Err(crate::store::StoreError(libc::EINVAL));
        }
        // SAFETY: the caller's contract; the run is in range.
        let r = unsafe { self.fill_run_in_range(i, n, src, io) };
        if r.is_err() {
            let _ = self.free_data(i, n);
        }
        r
    }

    /// [`Object::fill_run`] of a run in range, leaving what a failed read
    /// wrote.
    ///
    /// # Safety
    /// As [`Object::fill_run`].
    unsafe fn fill_run_in_range(
        &self,
        i: usize,
        n: usize,
        src: &Arc<dyn Store>,
        io: &crate::io::Io,
    ) -> Result<(), crate::store::StoreError> {
        use crate::store::StoreError;
        let (off, len) = ((i << self.shift) as u64, n << self.shift);
        match &self.backing {
            // Hugetlbfs has no `write`: take the page from the pool, then
            // read into it through the alias.
            Backing::Shared {
                memfd, huge: true, ..
            } => {
                crate::sys::huge::allocate(memfd.fd(), off as usize, len).map_err(StoreError)?;
                let p = self.data(i).map_err(StoreError)?;
                // SAFETY: the run lies in the alias (checked above) and its
                // pages exist now; exclusivity is the caller's contract.
                let buf = unsafe { std::slice::from_raw_parts_mut(p, len) };
                // (Failed, the pool gets its pages back: see `fill_run`.)
                crate::io::read(io, src, off, buf)
            }
            Backing::Shared { memfd, .. }
                if src.signal_safe() && !(n > 1 && src.batches_reads()) && !self.kernel_maps =>
            {
                crate::io::caught(|| src.read_to_fd(off, len, memfd.as_fd(), off))
            }
            Backing::Shared { memfd, .. } => {
                // The kernel maps a kernel-mapped object's pages as soon as
                // the memfd holds them, so none may be seen half written:
                // through a pipe (`sys::pipe`), not `pwrite`.
                let put = |p: *const u8| {
                    // SAFETY: every caller below passes `len` bytes mapped
                    // for the call (a buffer of its own, or the store's
                    // page in memory, which the kernel reads or reports).
                    let r = unsafe {
                        if self.kernel_maps {
                            io.pipes.write_at(memfd.fd(), p, len, off)
                        } else {
                            crate::sys::mem::pwrite_all_raw(memfd.fd(), p, len, off)
                        }
                    };
                    // (Pages of a run written before an error are in the
                    // memfd, where the kernel would map a kernel-mapped
                    // object's with no fault while the engine takes them
                    // for absent: out again, in `fill_run`.)
                    r.map_err(StoreError)
                };
                // A kernel-mapped page the store holds in memory goes into
                // the pipe from there (what `read_to_fd` does for the other
                // shared objects); the rest, as before, through a buffer.
                if let Some(p) = (n == 1 && self.kernel_maps)
                    .then(|| crate::io::page_in_memory(&**src, off))
                    .flatten()
                {
                    // (Not readable after all, a file shrunk behind the
                    // store: the buffered read below reports it.)
                    if put(p as *const u8).is_ok() {
                        return Ok(());
                    }
                }
                let through = |buf: &mut [u8]| {
                    crate::io::read(io, src, off, buf)?;
                    put(buf.as_ptr())
                };
                if n == 1 {
                    // (A shared object of 2 MiB pages is on hugetlbfs, the
                    // branch above: one page here is a base page.)
                    debug_assert_eq!(len, crate::sys::PAGE_SIZE);
                    through(&mut crate::sys::PageBuf::zeroed().0)
                } else {
                    // Page-aligned (an `O_DIRECT` file needs it), one call.
                    let mut pages = crate::sys::PagesBuf::zeroed(len);
                    through(&mut pages.as_mut_bytes()[..len])
                }
            }
            Backing::Anonymous { .. } => {
                let p = self.data(i).map_err(StoreError)?;
                // SAFETY: the run lies in the object's cache area (checked
                // above), which `data` made; exclusivity is the caller's
                // contract.
                let buf = unsafe { std::slice::from_raw_parts_mut(p, len) };
                crate::io::read(io, src, off, buf)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::InstallKind;
    use crate::store::MemoryStore;
    use crate::sys::PAGE_SIZE;

    /// A store whose reads write the first half of what they were asked
    /// for, then fail (a short read at an error).
    struct HalfThenFails;

    impl Store for HalfThenFails {
        fn len(&self) -> u64 {
            (64 * PAGE_SIZE) as u64
        }
        fn read(&self, _: u64, buf: &mut [u8]) -> Result<(), crate::store::StoreError> {
            let half = buf.len() / 2;
            buf[..half].fill(0x77);
            Err(crate::store::StoreError(libc::EIO))
        }
        fn read_to_fd(
            &self,
            offset: u64,
            len: usize,
            fd: std::os::fd::BorrowedFd<'_>,
            fd_offset: u64,
        ) -> Result<(), crate::store::StoreError> {
            use std::os::fd::AsRawFd;
            let _ = offset;
            let half = vec![0x77u8; len / 2];
            crate::sys::mem::pwrite_all(fd.as_raw_fd(), &half, fd_offset)
                .map_err(crate::store::StoreError)?;
            Err(crate::store::StoreError(libc::EIO))
        }
        fn write(&self, _: u64, _: &[u8]) -> Result<(), crate::store::StoreError> {
            Err(crate::store::StoreError(libc::EROFS))
        }
        fn writable(&self) -> bool {
            false
        }
        fn signal_safe(&self) -> bool {
            true
        }
        fn name(&self) -> &'static str {
            "half-then-fails"
        }
    }

    /// A run whose read fails after it wrote half the run leaves none of
    /// the run's memory behind, in an anonymous object's cache area or a
    /// shared one's memfd: the caller takes the pages for absent and
    /// uncharges them, and the memory stayed outside the budget.
    #[test]
    fn a_run_that_fails_half_read_leaves_no_memory() {
        let store: Arc<dyn Store> = Arc::new(HalfThenFails);
        let io = crate::io::Io::new(1_000_000_000, 0).unwrap();
        for kind in [InstallKind::Anonymous, InstallKind::Shared] {
            let swap = (kind == InstallKind::Anonymous).then(|| {
                Arc::new(MemoryStore::new((8 * PAGE_SIZE) as u64).unwrap()) as Arc<dyn Store>
            });
            let obj = Object::new(kind, store.clone(), swap, 8, false, 12).unwrap();
            // SAFETY: nothing else uses the object's pages (a test's own).
            assert!(unsafe { obj.fill_run(0, 8, &store, &io) }.is_err());
            let (memfd, area, ..) = obj.memory();
            assert_eq!(
                (memfd, area),
                (0, 0),
                "{kind:?}: (memfd, cache area) bytes left"
            );
        }
    }

    /// A kernel-mapped object's run that fails half written leaves none of
    /// its pages in the memfd: the kernel would map them with no fault
    /// while the engine takes them for absent.
    #[test]
    fn a_kernel_mapped_run_that_fails_half_written_leaves_no_page() {
        let data: Vec<u8> = (0..4 * PAGE_SIZE).map(|i| (i % 253) as u8).collect();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        let mut obj = Object::new(InstallKind::Shared, store.clone(), None, 4, false, 12).unwrap();
        obj.kernel_maps = true;
        let io = crate::io::Io::new(1_000_000_000, 0).unwrap();
        io.pipes.prepare().unwrap();
        crate::sys::pipe::tests::FAIL_AFTER.with(|f| f.set(2 * PAGE_SIZE));
        // SAFETY: nothing else uses the object's pages (a test's own).
        let r = unsafe { obj.fill_run(0, 4, &store, &io) };
        crate::sys::pipe::tests::FAIL_AFTER.with(|f| f.set(usize::MAX));
        assert!(r.is_err());
        assert_eq!(
            obj.memfd().unwrap().allocated(),
            0,
            "pages left in the memfd"
        );
        // The same run whole: all four there.
        // SAFETY: as above.
        unsafe { obj.fill_run(0, 4, &store, &io) }.unwrap();
        assert_eq!(obj.memfd().unwrap().allocated(), 4 * PAGE_SIZE as u64);
    }
}
