//! Backing stores: where a page comes from on a miss and where a dirty page
//! goes before it is dropped.
//!
//! # Contract
//!
//! A store is called in one of two ways, as [`Store::signal_safe`] says:
//!
//! - **Ordinary Rust (the default).** The engine calls the store only from
//!   its own I/O worker threads, never from a signal handler or with a lock
//!   that application code could hold. The store may allocate, take
//!   `std::sync::Mutex`es, log through `tracing`, open sockets and block.
//!   The faulting thread posts the request and sleeps on the page, as the
//!   kernel's `filemap_fault` sleeps on the folio after submitting the
//!   read. A call that has not returned within
//!   [`PagerBuilder::io_timeout`](crate::PagerBuilder::io_timeout) counts
//!   as failed (the access that needed the page gets SIGBUS; a failed
//!   write keeps the page dirty); a panic counts as a failed call.
//! - **Signal-safe.** A store whose every method is async-signal-safe and
//!   finishes in bounded time (no allocation, no locks, no logging; plain
//!   syscalls such as `pread`, `pwrite`, `clock_nanosleep`, `futex`,
//!   `memcpy` and atomics are fine) says so, and the engine calls it in the
//!   faulting thread itself, in in-thread delivery from its SIGBUS handler:
//!   no thread hop. The memory, zero and file stores are; the simulated
//!   and slice stores are when the store they wrap is; `RedisStore` is
//!   not.
//!
//! Either way:
//!
//! - the methods that describe the store ([`Store::writable`],
//!   [`Store::signal_safe`], [`Store::synchronous`],
//!   [`Store::page_in_memory`]) may be called in the faulting thread,
//!   inside the SIGBUS handler, whatever `signal_safe` says: each must
//!   answer from what the store holds (a field, a constant), without
//!   allocating or locking;
//! - the per-method notes "async-signal-safe" below hold for a store that
//!   says it is signal-safe; an ordinary one is called from workers;
//! - [`Store::sync`] always runs on an I/O worker, within the I/O timeout
//!   (a panic fails it), whatever `signal_safe` says;
//! - a store never touches the memory of a region (of any pager in the
//!   process) in its methods: a fault there waits for a fault the store is
//!   itself serving, and inside the handler, where SIGBUS is blocked, the
//!   kernel kills the process;
//! - nor does it call a pager (map, unmap, flush, refresh, a residency
//!   guard) in its methods: the call that is waiting for the store may
//!   hold what that call waits for. A flush holds its store's write-back
//!   mark while it calls the store, and an unmap or a map over the same
//!   store waits for that mark: in the flushing thread itself (a
//!   signal-safe store) for ever, from an I/O worker until the flush's
//!   call times out.
//!
//! The engine never issues two concurrent calls for the same
//! page (the page lock serialises them); calls for different pages may run
//! concurrently. Offsets and lengths are always whole pages and within
//! [`Store::len`]. Readahead windows and write-back batches arrive as one
//! [`Store::read_many`] or [`Store::write_many`] call of at most
//! [`MAX_BATCH`] pages; their defaults loop over `read` and `write`.

mod file;
mod latency;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod simulated;
mod slice;
mod zero;

pub use file::{FileStore, FileStoreOptions};
pub use latency::LatencyModel;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{page_key, RedisOptions, RedisStore, RedisStoreError, RedisUrl};
pub use simulated::{LatencyReport, SimulatedStore};
pub use slice::SliceStore;
pub use zero::ZeroStore;

/// The most pages one [`Store::read_many`] or [`Store::write_many`] call
/// carries.
pub const MAX_BATCH: usize = 32;

/// A store error: a plain errno, so that building one never allocates.
///
/// See [`Store`] for an example.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("store I/O failed: {}", std::io::Error::from_raw_os_error(*.0))]
pub struct StoreError(pub i32);

impl From<StoreError> for std::io::Error {
    /// The errno as an `io::Error` (for [`crate::PagerBuilder::swap_to`]
    /// makers and other `io::Result` code).
    fn from(e: StoreError) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0)
    }
}

/// A backing store of whole pages.
///
/// A store of your own: pages come from wherever `read` gets them. The
/// provided methods have defaults; a store whose calls are
/// async-signal-safe says so with `signal_safe` and is called from the
/// faulting thread itself.
///
/// ```
/// use std::sync::Arc;
/// use uffd_pager::store::{Store, StoreError};
/// use uffd_pager::{MapOptions, Pager};
///
/// /// Every byte of page `n` is `n as u8`.
/// struct Numbered(u64);
///
/// impl Store for Numbered {
///     fn len(&self) -> u64 {
///         self.0
///     }
///     fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
///         buf.fill((offset / uffd_pager::PAGE_SIZE as u64) as u8);
///         Ok(())
///     }
///     fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
///         Err(StoreError(libc::EROFS))
///     }
///     fn writable(&self) -> bool {
///         false
///     }
///     fn name(&self) -> &'static str {
///         "numbered"
///     }
/// }
///
/// let pager = Pager::builder().build()?;
/// let len = 4 * uffd_pager::PAGE_SIZE;
/// let opts = MapOptions { writable: false, ..MapOptions::default() };
/// // SAFETY: `Numbered`'s reads always return the same bytes.
/// let region = unsafe { pager.map_store(Arc::new(Numbered(len as u64)), len, &opts) }?;
/// assert_eq!(region.as_slice()[3 * uffd_pager::PAGE_SIZE], 3);
/// # Ok::<(), uffd_pager::Error>(())
/// ```
pub trait Store: Send + Sync + 'static {
    /// Length in bytes; a multiple of the page size.
    fn len(&self) -> u64;

    /// Whether the store has no pages.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the bytes at `offset`. Async-signal-safe if
    /// [`signal_safe`](Store::signal_safe).
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// Copies the `len` bytes at `offset` into the file `fd` at `fd_offset`
    /// (the engine's memfd page cache), so the engine never maps the
    /// destination to fill it. Async-signal-safe if
    /// [`signal_safe`](Store::signal_safe).
    ///
    /// It writes those `len` bytes of `fd` and no others: the descriptor is
    /// the engine's page cache, whose other pages regions map, maybe under
    /// live slices (part of [`Pager::map_store`](crate::Pager::map_store)'s
    /// safety contract; a write elsewhere, say at the descriptor's file
    /// position, changed them behind the engine).
    ///
    /// The default reads one page at a time into a page-aligned buffer on
    /// the stack and `pwrite`s it: two copies and two syscalls per page, no
    /// allocation. Stores that hold their contents in memory override it to
    /// write straight from there.
    ///
    /// The descriptor is borrowed, so a safe caller cannot name one it
    /// does not own (a number it found in `/proc/self/fd`, say the memfd
    /// under another region's live slice):
    ///
    /// ```compile_fail,E0308
    /// use uffd_pager::store::{MemoryStore, Store};
    /// let s = MemoryStore::from_bytes(&[0xaa; 4096]).unwrap();
    /// s.read_to_fd(0, 4096, 7, 0).unwrap();
    /// ```
    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        read_to_fd_buffered(self, offset, len, fd, fd_offset)
    }

    /// Writes `buf` at `offset`. Async-signal-safe if
    /// [`signal_safe`](Store::signal_safe). Stores that are read-only
    /// return `Err(StoreError(libc::EROFS))`.
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError>;

    /// Whether [`Store::write`] can succeed. Asked once when a region is
    /// mapped over the store (and decides whether writes to a shared
    /// region are allowed and its dirty pages owed a write): a store that
    /// can no longer write later says so by failing [`Store::write`], and
    /// its dirty pages stay dirty and are reported, never dropped.
    fn writable(&self) -> bool;

    /// Fills `buf` (whole pages, at most [`MAX_BATCH`] of them) with the
    /// bytes at `offset`: a readahead window in one call, so that a store
    /// on a network can fetch it in one round trip (`MGET`). On an error
    /// the engine treats every page of the batch as unread (a fault reads
    /// each again on its own), so a store may fail a batch it filled in
    /// part.
    ///
    /// The default calls [`Store::read`] once per page. Same
    /// signal-safety as [`Store::read`].
    fn read_many(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        for (k, page) in buf.chunks_mut(crate::sys::PAGE_SIZE).enumerate() {
            self.read(past(offset, k * crate::sys::PAGE_SIZE)?, page)?;
        }
        Ok(())
    }

    /// Whether a [`Store::read_many`] of a batch costs about what one
    /// page's read does (one device request, one round trip) rather than
    /// one read per page. Readahead batches its window for a store that is
    /// not [`Store::signal_safe`] anyway (a thread hop per call); for a
    /// signal-safe one only if this says so, since a batch is charged to
    /// the budget whole before its call. Default false; a file on a disk
    /// says true (one `pread` of the window, one request).
    fn batches_reads(&self) -> bool {
        false
    }

    /// Writes each `(offset, page)` of `pages` (at most [`MAX_BATCH`],
    /// offsets distinct and in no particular order): a write-back batch in
    /// one call, so that a networked store can pipeline it. On an error the
    /// engine keeps every page of the batch dirty and writes it again
    /// later, so a store may fail a batch it wrote in part (writes must be
    /// idempotent, as any page write is).
    ///
    /// The default calls [`Store::write`] once per page. Same
    /// signal-safety as [`Store::write`].
    fn write_many(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        for (off, page) in pages {
            self.write(*off, page)?;
        }
        Ok(())
    }

    /// Makes earlier writes durable (fsync for files). Called on an I/O
    /// worker, whatever [`signal_safe`](Store::signal_safe) says, and
    /// counted failed on a panic or past the I/O timeout (while one given
    /// up on still runs, the next sync of the store fails at once, and if
    /// it fails, the next one after it does: the kernel reports a failed
    /// write-back once); only after a write: a write-back that finds
    /// nothing written since the last successful sync does not call it.
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Forgets the bytes of `[offset, offset + len)` (whole pages, in
    /// bounds): the engine will not read them again before it writes
    /// them. A hint that lets a swap store give their memory back, as the
    /// kernel frees the swap slot of a page the application dropped
    /// (`MADV_DONTNEED`, `munmap`, a shrinking `mremap`). The engine calls
    /// it only on an anonymous object's swap store (the in-memory default,
    /// a file of [`PagerBuilder::swap_dir`](crate::PagerBuilder::swap_dir),
    /// or one from [`PagerBuilder::swap_to`](crate::PagerBuilder::swap_to)):
    /// on one that is [`Store::signal_safe`] for each page as it goes,
    /// holding the page's lock (so async-signal-safe there); on any other
    /// once, when the object is released (its region unmapped), over the
    /// pages from the first to the last that went to swap, on an I/O
    /// worker, bounded by [`PagerBuilder::io_timeout`](crate::PagerBuilder::io_timeout).
    /// Default: nothing.
    fn discard(&self, offset: u64, len: u64) {
        let _ = (offset, len);
    }

    /// Bytes of this process's memory the store's contents take (an
    /// in-memory store's written pages); 0 for stores whose contents live
    /// elsewhere (a file, a server). Reported in
    /// [`Pager::memory_use`](crate::Pager::memory_use) for swap stores,
    /// which calls it under the global lock's read side: it must not wait
    /// for the pager (nor call `memory_use` itself).
    fn memory_bytes(&self) -> u64 {
        0
    }

    /// Whether the engine may call this store in the faulting thread, that
    /// is inside its SIGBUS handler: every method async-signal-safe (no
    /// allocation, no locks application code could hold, no logging) and
    /// finishing in bounded time. Default false: the store is called only
    /// from the engine's I/O worker threads, as ordinary
    /// Rust (it may allocate, lock, log and block), and a call that takes
    /// longer than [`crate::PagerBuilder::io_timeout`] counts as failed.
    /// The memory, zero and file stores are signal-safe; the simulated
    /// and slice stores are when the store they wrap is; `RedisStore` is
    /// not.
    fn signal_safe(&self) -> bool {
        false
    }

    /// Whether a read completes without waiting on a device (memory,
    /// tmpfs): the engine may then read an anonymous page under the region
    /// lock and install it at once, as the kernel swaps in from a
    /// `SWP_SYNCHRONOUS_IO` device (zram) in `do_swap_page` without
    /// dropping the lock. Default false.
    fn synchronous(&self) -> bool {
        false
    }

    /// Where the page at `offset` can be read in place, for a store whose
    /// contents already sit in this process's memory: a memory store, or a
    /// file on tmpfs, which the store maps read-only. The engine then
    /// installs an anonymous page with one `UFFDIO_COPY` straight from
    /// there: one copy, where [`Store::read`] and a copy make two.
    ///
    /// The address must stay mapped for the store's life, and must not be
    /// memory a pager serves (a region's): the engine's copy from it would
    /// fault there, and with handler threads wait for the reader that the
    /// copy itself holds off (about a second). Reading it may
    /// fail (a file shrunk behind the store's back): the kernel's copy then
    /// fails with `EFAULT`, no signal is raised, and the engine falls back
    /// to [`Store::read`]. Async-signal-safe. Default: `None`.
    fn page_in_memory(&self, offset: u64) -> Option<usize> {
        let _ = offset;
        None
    }

    /// A value that changes whenever the store's contents change, by a
    /// write through it or behind it; `None` where the store cannot tell.
    ///
    /// While it is `Some` and unchanged, the pager keeps a shared object's
    /// pages cached after the last region over the store is unmapped (the
    /// kernel's page cache outlives its mappings too): a region mapped
    /// again over the same store (the same `Arc`) finds them there instead
    /// of reading the store. Default `None`: every new region reads the
    /// store afresh. Called at map and unmap, never in a signal handler.
    fn contents_stamp(&self) -> Option<u64> {
        None
    }

    /// What the store reads and writes, where two stores can reach the same
    /// bytes: a file's device and inode number. Two stores with the same
    /// identity count as one store when the pager keeps pages it could not
    /// write back ([`Pager::flush_unmapped`](crate::Pager::flush_unmapped)):
    /// a region mapped over either is refused while those pages wait.
    /// Default `None`: only the same `Arc` is the same store. Called at map
    /// and by [`Pager::unwritten_bytes`](crate::Pager::unwritten_bytes),
    /// only while such pages wait, never in a signal handler.
    fn identity(&self) -> Option<(u64, u64)> {
        None
    }

    /// A short name for reports.
    fn name(&self) -> &'static str;

    /// For stores that model I/O: the latencies actually delivered.
    fn latency_report(&self) -> Option<LatencyReport> {
        None
    }
}

/// A store as [`crate::kept::KeptObjects::writing`] knows it: its
/// address, and its [`Store::identity`] (a file's device and inode), by
/// which two stores over one file are one, as [`crate::unwritten`] counts
/// them. Made once per object, at map (`Object::store_key`): asked again
/// later, a store's identity may differ (a file's `fstat` failing once),
/// and a mark made with one key would never be undone with another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreKey(usize, Option<(u64, u64)>);

impl StoreKey {
    pub(crate) fn of(s: &std::sync::Arc<dyn Store>) -> StoreKey {
        StoreKey(
            std::sync::Arc::as_ptr(s) as *const () as usize,
            s.identity(),
        )
    }

    /// Whether the two are the same store, or stores of one file.
    pub(crate) fn same(&self, o: &StoreKey) -> bool {
        self.0 == o.0 || (self.1.is_some() && self.1 == o.1)
    }
}

/// `offset + n`, or `EINVAL` past `u64::MAX` (a store need not check its
/// bounds: the engine's own calls are within [`Store::len`], a caller's
/// through these defaults may not be).
fn past(offset: u64, n: usize) -> Result<u64, StoreError> {
    offset.checked_add(n as u64).ok_or(StoreError(libc::EINVAL))
}

/// [`Store::read_to_fd`]'s default: one page at a time through a
/// page-aligned buffer on the stack. Async-signal-safe.
///
/// A [`Store`] implementation calls it from its `read_to_fd` (see [`Store`]
/// for a store of your own).
pub fn read_to_fd_buffered<S: Store + ?Sized>(
    store: &S,
    offset: u64,
    len: usize,
    fd: std::os::fd::BorrowedFd<'_>,
    fd_offset: u64,
) -> Result<(), StoreError> {
    use std::os::fd::AsRawFd;
    let mut buf = crate::sys::PageBuf::zeroed();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.0.len());
        store.read(past(offset, done)?, &mut buf.0[..n])?;
        crate::sys::mem::pwrite_all(fd.as_raw_fd(), &buf.0[..n], past(fd_offset, done)?)
            .map_err(StoreError)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::PAGE_SIZE;

    /// A store that checks no bounds (the README's example store does
    /// not): every byte of page `n` is `n as u8`.
    struct Unchecked;

    impl Store for Unchecked {
        fn len(&self) -> u64 {
            u64::MAX
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
            buf.fill((offset / PAGE_SIZE as u64) as u8);
            Ok(())
        }
        fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
            Err(StoreError(libc::EROFS))
        }
        fn writable(&self) -> bool {
            false
        }
        fn name(&self) -> &'static str {
            "unchecked"
        }
    }

    /// The defaults' offsets past `u64::MAX` are `EINVAL`: before, they
    /// overflowed (a panic in a debug build, a read at a small offset in a
    /// release one).
    #[test]
    fn default_batches_past_the_largest_offset_are_einval() {
        let s = Unchecked;
        let near = u64::MAX - 100;
        let mut buf = vec![0u8; 2 * PAGE_SIZE];
        assert_eq!(s.read_many(near, &mut buf), Err(StoreError(libc::EINVAL)));
        let fd = crate::sys::mem::Memfd::new("default-batches", 0).unwrap();
        assert_eq!(
            s.read_to_fd(near, 2 * PAGE_SIZE, fd.as_fd(), 0),
            Err(StoreError(libc::EINVAL))
        );
        assert_eq!(
            s.read_to_fd(0, 2 * PAGE_SIZE, fd.as_fd(), u64::MAX - 100),
            Err(StoreError(libc::EINVAL))
        );
        // In range, they read.
        s.read_many(PAGE_SIZE as u64, &mut buf).unwrap();
        assert_eq!((buf[0], buf[PAGE_SIZE]), (1, 2));
    }
}
