//! A store backed by a file, read and written with `pread`/`pwrite`.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::zero::in_bounds;
use super::{Store, StoreError};
use crate::sys::{errno, PAGE_SIZE};

/// How [`FileStore::open`] opens its file.
///
/// See [`FileStore`] for an example.
#[derive(Debug, Clone, Default)]
pub struct FileStoreOptions {
    /// Open read-write and accept [`Store::write`]. Otherwise writes return
    /// `EROFS`.
    pub writable: bool,
    /// Open with `O_DIRECT`, bypassing the page cache. Every read and write
    /// must then use a page-aligned buffer whose length and offset are page
    /// multiples (the engine always passes such buffers); anything else is
    /// refused with `EINVAL` before reaching the kernel.
    pub direct: bool,
    /// Create the file if it does not exist, and extend it to this length if
    /// it is shorter (a longer file is never truncated). Implies opening the
    /// descriptor read-write, but writes through the store still need
    /// `writable`.
    pub create_len: Option<u64>,
}

/// A store over a file.
///
/// [`Store::len`] is the file's length at open, rounded up to a whole page.
/// Reads of the final partial page (past end of file) are zero-filled;
/// writes of it write only the bytes before the original end of file (or
/// before the end a read has seen since, where the file grew), so the
/// store never changes the file's length.
///
/// ```
/// use std::sync::Arc;
/// use uffd_pager::store::{FileStore, FileStoreOptions, Store};
/// use uffd_pager::{MapOptions, Pager, PAGE_SIZE};
///
/// let path = std::env::temp_dir().join(format!("filestore-doc-{}", std::process::id()));
/// std::fs::write(&path, vec![7u8; 4 * PAGE_SIZE]).unwrap();
/// let opts = FileStoreOptions { writable: true, ..FileStoreOptions::default() };
/// let store = FileStore::open(&path, &opts).unwrap();
/// assert_eq!(store.len(), 4 * PAGE_SIZE as u64);
/// let pager = Pager::builder().build()?;
/// // SAFETY: the file is this example's own; nothing else writes it.
/// let mut region = unsafe { pager.map_store(Arc::new(store), 4 * PAGE_SIZE, &MapOptions::default()) }?;
/// region.as_mut_slice()[0] = 8;
/// region.flush()?; // written back to the file
/// drop(region);
/// assert_eq!(std::fs::read(&path).unwrap()[0], 8);
/// std::fs::remove_file(&path).unwrap();
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug)]
pub struct FileStore {
    file: File,
    /// The file's exact length at open.
    file_len: u64,
    /// The furthest end of file bytes a read handed out (at least
    /// `file_len`): bytes the file gained since the open (the application's
    /// own `write(2)` past the end, which the shim follows with a refresh)
    /// that a cached page holds, so that its write-back may write them.
    read_len: AtomicU64,
    /// `file_len` rounded up to a page.
    len: u64,
    writable: bool,
    direct: bool,
    /// The file lives in memory (tmpfs): reads never wait on a device.
    in_memory: bool,
    /// A tmpfs file mapped read-only, so that installs can copy straight
    /// from its pages ([`Store::page_in_memory`]).
    view: Option<memmap2::MmapRaw>,
    /// Under `O_DIRECT`, a second descriptor of the same file without it:
    /// the final partial page is written through it, byte-exact, so the
    /// file's length never changes (an aligned write would extend it, and
    /// truncating back would cut whatever was appended since the open).
    tail: Option<File>,
    /// [`Store::discard`] punches the bytes out of the file: set only for
    /// the engine's own swap files ([`FileStore::punching_discards`]).
    punch_discards: bool,
    /// `pwritev2` refused `RWF_NOAPPEND` for this file (a kernel before
    /// 6.9, a file whose writes take no flags, a filter on the call):
    /// plain `pwrite` from then on ([`pwrite_at`]).
    plain_pwrite: std::sync::atomic::AtomicBool,
}

impl FileStore {
    /// The underlying file.
    ///
    /// Example: [`FileStore`](crate::store::FileStore).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file's exact length at open (before rounding up to a page).
    ///
    /// Example: [`FileStore`](crate::store::FileStore).
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Whether the file is open with `O_DIRECT`.
    ///
    /// Example: [`FileStore`](crate::store::FileStore).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    #[inline]
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The file's length now (it may have been truncated since the open).
    /// Async-signal-safe (`fstat`).
    fn current_len(&self) -> Result<u64, StoreError> {
        // SAFETY: a zeroed stat is a valid out-parameter for fstat on our
        // open descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(self.fd(), &mut st) } != 0 {
            return Err(StoreError(errno()));
        }
        Ok(st.st_size as u64)
    }

    /// Under `O_DIRECT`, whether a transfer meets the alignment rules.
    #[inline]
    fn aligned(ptr: *const u8, offset: u64, n: usize) -> bool {
        let page = PAGE_SIZE as u64;
        (ptr as usize).is_multiple_of(PAGE_SIZE)
            && offset.is_multiple_of(page)
            && (n as u64).is_multiple_of(page)
    }
}

impl Store for FileStore {
    fn len(&self) -> u64 {
        self.len
    }

    /// `pread` until `buf` is full; EINTR is retried and the part past end of
    /// file is zero-filled. Async-signal-safe.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if !in_bounds(offset, buf.len(), self.len) {
            return Err(StoreError(libc::EINVAL));
        }
        if self.direct && !Self::aligned(buf.as_ptr(), offset, buf.len()) {
            return Err(StoreError(libc::EINVAL));
        }
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: `rest` is valid for writes of `rest.len()` bytes and the
            // descriptor is open for the lifetime of `self`.
            let n = unsafe {
                libc::pread(
                    self.fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                match errno() {
                    libc::EINTR => continue,
                    e => return Err(StoreError(e)),
                }
            }
            if n == 0 {
                break; // end of file
            }
            done += n as usize;
            if self.direct && !done.is_multiple_of(PAGE_SIZE) {
                // A short O_DIRECT read ends at end of file; continuing would
                // be misaligned.
                break;
            }
        }
        // Short of the bytes the file had at open: it was truncated behind
        // the store. Past its new end a mapping of the file gets SIGBUS, so
        // a read of a page wholly past it fails (the page is poisoned); in
        // the page that holds the new end, the rest reads as zeros, as in
        // any last page. A batch ([`Store::read_many`], readahead) that
        // holds such a page fails whole (its pages stay absent, and each is
        // read alone when touched): before, only its first page was
        // looked at, and the pages past the end read as zeros.
        let in_file_at_open = self.file_len.saturating_sub(offset).min(buf.len() as u64) as usize;
        if done < in_file_at_open {
            let now = self.current_len()?;
            if offset + in_file_at_open as u64 > now.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64 {
                return Err(StoreError(libc::EIO));
            }
        }
        // Bytes the file gained since the open, now in the caller's page:
        // its write-back may write them (see `write`). The last read of the
        // last page decides, not the furthest any read ever saw: after a
        // truncation the page is read again with zeros past the new end,
        // and bytes appended after that read are another writer's.
        if offset + buf.len() as u64 > self.file_len {
            let end = offset + done as u64;
            self.read_len.store(end.max(self.file_len), Relaxed);
        }
        buf[done..].fill(0);
        Ok(())
    }

    /// `pwrite` until done, retrying EINTR; bytes past the original end of
    /// file are not written (see the type's docs). Async-signal-safe.
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        if !self.writable {
            return Err(StoreError(libc::EROFS));
        }
        if !in_bounds(offset, buf.len(), self.len) {
            return Err(StoreError(libc::EINVAL));
        }
        if self.direct && !Self::aligned(buf.as_ptr(), offset, buf.len()) {
            return Err(StoreError(libc::EINVAL));
        }
        // Only the bytes inside the file are written, so its length never
        // changes: the bytes it had at open, or fewer if it was truncated
        // since. A page wholly past a truncation is dropped, as the kernel
        // drops a truncated file's cached pages: writing it would extend
        // the file again. Bytes the file gained since the open are written
        // where a read handed them out (the page holds what the file had
        // there, and what was stored over it since: a mapping of a file the
        // application grew with `write(2)` keeps its stores there, as the
        // kernel's does); bytes another writer appended that no read saw
        // are left alone.
        let now = self.current_len()?;
        let in_file = self
            .read_len
            .load(Relaxed)
            .max(self.file_len)
            .min(now)
            .saturating_sub(offset)
            .min(buf.len() as u64) as usize;
        if in_file == 0 {
            return Ok(());
        }
        // Under O_DIRECT a partial page goes through the plain descriptor
        // (an aligned write could not stop at the end of the file).
        let partial = in_file < buf.len();
        let fd = match (&self.tail, self.direct && partial) {
            (Some(t), true) => t.as_raw_fd(),
            (None, true) => return Err(StoreError(libc::EINVAL)),
            _ => self.fd(),
        };
        let mut done = 0usize;
        while done < in_file {
            let rest = &buf[done..in_file];
            // SAFETY: `rest` is valid for reads of `rest.len()` bytes and the
            // descriptor is open for the lifetime of `self`.
            let n = unsafe { pwrite_at(fd, rest, offset + done as u64, &self.plain_pwrite) };
            if n < 0 {
                match errno() {
                    libc::EINTR => continue,
                    e => return Err(StoreError(e)),
                }
            }
            if n == 0 {
                return Err(StoreError(libc::EIO));
            }
            done += n as usize;
            if self.direct && !partial && done < in_file && !done.is_multiple_of(PAGE_SIZE) {
                return Err(StoreError(libc::EIO));
            }
        }
        Ok(())
    }

    fn writable(&self) -> bool {
        self.writable
    }

    /// `fdatasync`.
    fn sync(&self) -> Result<(), StoreError> {
        loop {
            // SAFETY: fdatasync on our descriptor.
            if unsafe { libc::fdatasync(self.fd()) } == 0 {
                return Ok(());
            }
            match errno() {
                libc::EINTR => continue,
                e => return Err(StoreError(e)),
            }
        }
    }

    /// Punches `[offset, offset + len)` out of an engine swap file
    /// (see `PagerBuilder::swap_dir`); nothing for any other file.
    /// One `fallocate`: async-signal-safe. A file system that cannot punch
    /// keeps the bytes, which the engine never reads again.
    fn discard(&self, offset: u64, len: u64) {
        if !self.punch_discards || !self.writable {
            return;
        }
        // SAFETY: fallocate on the descriptor this store holds open; it
        // touches no memory of this process.
        let _ = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as i64,
                len as i64,
            )
        };
    }

    /// True, for a file on any file system, with or without `O_DIRECT`:
    /// plain syscalls and copies, async-signal-safe (a read from a disk
    /// blocks the faulting thread, which [`Store::synchronous`] tells
    /// apart).
    fn signal_safe(&self) -> bool {
        true
    }

    fn synchronous(&self) -> bool {
        self.in_memory
    }

    /// One `pread` of the whole batch: one request to the device, not one
    /// per page.
    fn read_many(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.read(offset, buf)
    }

    /// A file on a disk: a window costs one request. (A tmpfs file's pages
    /// are read one by one, charged as they come: no device to save.)
    fn batches_reads(&self) -> bool {
        !self.in_memory
    }

    /// From a tmpfs file's view straight into `fd`: the kernel copies the
    /// file's pages into the engine's memfd, one copy and no buffer. If the
    /// view cannot be read (the file shrank), the buffered way reports
    /// what `pread` sees.
    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        // The last page through `read`, which records how much of it the
        // file had (`read_len`): the view shows what the file gained since
        // the open, and its write-back must write it.
        let past_open_end = offset.saturating_add(len as u64) > self.file_len;
        if let Some(src) = self.page_in_memory(offset).filter(|_| !past_open_end) {
            let end = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(len));
            if end.is_some_and(|e| e <= self.view.as_ref().map_or(0, |v| v.len())) {
                // SAFETY: `[src, src + len)` lies inside the view (checked
                // above), which is mapped for the store's life.
                let r = unsafe {
                    crate::sys::mem::pwrite_all_raw(
                        fd.as_raw_fd(),
                        src as *const u8,
                        len,
                        fd_offset,
                    )
                };
                if r.is_ok() {
                    return Ok(());
                }
            }
        }
        super::read_to_fd_buffered(self, offset, len, fd, fd_offset)
    }

    /// A tmpfs file's page, in the store's read-only view of the file.
    fn page_in_memory(&self, offset: u64) -> Option<usize> {
        let view = self.view.as_ref()?;
        let off = usize::try_from(offset).ok()?;
        (off < view.len()).then(|| view.as_ptr() as usize + off)
    }

    fn name(&self) -> &'static str {
        "file"
    }

    /// The file's device and inode number.
    fn identity(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata().ok()?;
        Some((m.dev(), m.ino()))
    }

    /// The file's identity, size and modification and change times
    /// (`fstat`): a write by anyone, a truncate or a replaced inode moves
    /// it. `None` while the last change is under 50 ms old:
    /// a file system with coarse timestamps can give a change made in the
    /// same clock tick as this call the same times, which would hide it.
    fn contents_stamp(&self) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata().ok()?;
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        let (mtime, ctime) = (ns(m.mtime(), m.mtime_nsec()), ns(m.ctime(), m.ctime_nsec()));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos() as i128;
        if now - mtime.max(ctime) < STAMP_SETTLE_NS {
            return None;
        }
        let mut h = std::hash::DefaultHasher::new();
        (m.dev(), m.ino(), m.size(), mtime, ctime).hash(&mut h);
        Some(h.finish())
    }
}

/// How old a file's last change must be for [`FileStore`]'s
/// `contents_stamp` to vouch for it: well above the coarsest timestamp
/// tick (10 ms at `HZ=100`).
const STAMP_SETTLE_NS: i128 = 50_000_000;

/// One `pwrite` of `buf` at `off` that writes there even if the file
/// description was set to append since the store was made
/// (`RWF_NOAPPEND`): a store over a duplicate of a caller's descriptor
/// (the C API's, where the file cannot be opened again) shares its
/// status flags, and Linux's plain `pwrite` on an `O_APPEND` description
/// appends whatever the offset, so every write-back grew the file and
/// left the page as it was. Where `pwritev2` refuses the flag
/// (`EOPNOTSUPP`: a kernel before 6.9, a file whose writes take no
/// flags; `ENOSYS`: a filter on the call), `plain` is set and plain
/// `pwrite` serves from then on. The kernel's count, or -1 with errno
/// set. Async-signal-safe.
///
/// # Safety
/// `fd` is open.
unsafe fn pwrite_at(
    fd: RawFd,
    buf: &[u8],
    off: u64,
    plain: &std::sync::atomic::AtomicBool,
) -> isize {
    if !plain.load(Relaxed) {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: one iovec over `buf`, valid for reads of its length; the
        // kernel only reads it.
        let n = unsafe { libc::pwritev2(fd, &iov, 1, off as libc::off_t, libc::RWF_NOAPPEND) };
        if n >= 0 || !matches!(errno(), libc::EOPNOTSUPP | libc::ENOSYS) {
            return n;
        }
        plain.store(true, Relaxed);
    }
    // SAFETY: as above.
    unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off as libc::off_t) }
}

mod open;

#[cfg(test)]
mod tests;
