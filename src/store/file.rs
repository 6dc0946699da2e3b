//! A store backed by a file, read and written with `pread`/`pwrite`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::zero::{in_bounds, round_up_to_page};
use super::{Store, StoreError};
use crate::sys::mem::Mapping;
use crate::sys::{errno, PAGE_SIZE};

/// How [`FileStore::open`] opens its file.
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
/// writes of it write only the bytes before the original end of file, so
/// the store never changes the file's length.
#[derive(Debug)]
pub struct FileStore {
    file: File,
    /// The file's exact length at open.
    file_len: u64,
    /// `file_len` rounded up to a page.
    len: u64,
    writable: bool,
    direct: bool,
    /// The file lives in memory (tmpfs): reads never wait on a device.
    in_memory: bool,
    /// A tmpfs file mapped read-only, so that installs can copy straight
    /// from its pages ([`Store::page_in_memory`]).
    view: Option<Mapping>,
    /// Under `O_DIRECT`, a second descriptor of the same file without it:
    /// the final partial page is written through it, byte-exact, so the
    /// file's length never changes (an aligned write would extend it, and
    /// truncating back would cut whatever was appended since the open).
    tail: Option<File>,
}

/// Whether the file is on tmpfs (its pages live in memory).
fn on_tmpfs(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: a zeroed statfs is a valid out-parameter; fstatfs fills it
    // from our open descriptor.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    rc == 0 && st.f_type as i64 == TMPFS_MAGIC
}

impl FileStore {
    /// Opens `path` as described by `opts`.
    pub fn open(path: &Path, opts: &FileStoreOptions) -> io::Result<FileStore> {
        let mut oo = OpenOptions::new();
        oo.read(true);
        if opts.writable || opts.create_len.is_some() {
            oo.write(true);
        }
        if opts.create_len.is_some() {
            oo.create(true);
        }
        let mut flags = libc::O_CLOEXEC;
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        oo.custom_flags(flags);
        let file = oo.open(path)?;
        if let Some(want) = opts.create_len {
            if file.metadata()?.len() < want {
                file.set_len(want)?;
            }
        }
        Self::with_flags(file, opts.writable, opts.direct)
    }

    /// Wraps an open file. `writable` needs a descriptor opened for writing
    /// (otherwise this fails with `EBADF`). `O_DIRECT` on the descriptor is
    /// detected and honoured.
    pub fn from_file(file: File, writable: bool) -> io::Result<Self> {
        // SAFETY: F_GETFL on a descriptor we hold open; no memory involved.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(io::Error::last_os_error());
        }
        if writable && fl & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        Self::with_flags(file, writable, fl & libc::O_DIRECT != 0)
    }

    fn with_flags(file: File, writable: bool, direct: bool) -> io::Result<Self> {
        let file_len = file.metadata()?.len();
        let in_memory = !direct && on_tmpfs(&file);
        let len = round_up_to_page(file_len);
        // Mapping is an optimisation: without the view, reads go through
        // `pread` as for any other file.
        let view = match usize::try_from(len) {
            Ok(n) if in_memory && n > 0 => Mapping::read_only(file.as_raw_fd(), n).ok(),
            _ => None,
        };
        // Any page can become the last one (the file may be truncated), so
        // the plain descriptor is there whenever O_DIRECT writes are.
        let tail = if direct && writable {
            Some(
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(format!("/proc/self/fd/{}", file.as_raw_fd()))?,
            )
        } else {
            None
        };
        Ok(FileStore {
            file,
            file_len,
            len,
            writable,
            direct,
            in_memory,
            view,
            tail,
        })
    }

    /// The underlying file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file's exact length at open (before rounding up to a page).
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Whether the file is open with `O_DIRECT`.
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
        // this read fails (the page is poisoned); in the page that holds the
        // new end, the rest reads as zeros, as in any last page.
        let in_file_at_open = self.file_len.saturating_sub(offset).min(buf.len() as u64) as usize;
        if done < in_file_at_open {
            let now = self.current_len()?;
            if offset >= now.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64 {
                return Err(StoreError(libc::EIO));
            }
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
        // the file again.
        let now = self.current_len()?;
        let in_file = self
            .file_len
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
            let n = unsafe {
                libc::pwrite(
                    fd,
                    rest.as_ptr().cast(),
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

    /// True for a file on tmpfs opened without `O_DIRECT`.
    /// Plain syscalls and copies: async-signal-safe.
    fn signal_safe(&self) -> bool {
        true
    }

    fn synchronous(&self) -> bool {
        self.in_memory
    }

    /// From a tmpfs file's view straight into `fd`: the kernel copies the
    /// file's pages into the engine's memfd, one copy and no buffer. If the
    /// view cannot be read (the file shrank), the buffered way reports
    /// what `pread` sees.
    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: RawFd,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        if let Some(src) = self.page_in_memory(offset) {
            let end = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(len));
            if end.is_some_and(|e| e <= self.view.as_ref().map_or(0, Mapping::len)) {
                // SAFETY: `[src, src + len)` lies inside the view (checked
                // above), which is mapped for the store's life.
                let r = unsafe {
                    crate::sys::mem::pwrite_all_raw(fd, src as *const u8, len, fd_offset)
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
        (off < view.len()).then(|| view.addr() + off)
    }

    fn name(&self) -> &'static str {
        "file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A temp file path removed on drop.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new(tag: &str) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            TempPath(std::env::temp_dir().join(format!(
                "uffd-pager-filestore-{tag}-{}-{n}-{nanos}",
                std::process::id()
            )))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[repr(C, align(4096))]
    struct AlignedPage([u8; PAGE_SIZE]);

    #[test]
    fn round_trip_with_create() {
        let p = TempPath::new("rt");
        let opts = FileStoreOptions {
            writable: true,
            create_len: Some(4 * PAGE_SIZE as u64),
            ..Default::default()
        };
        let s = FileStore::open(&p.0, &opts).unwrap();
        assert_eq!(s.len(), 4 * PAGE_SIZE as u64);
        assert!(s.writable());
        assert_eq!(s.name(), "file");
        let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        s.write(PAGE_SIZE as u64, &page).unwrap();
        let mut back = vec![0xFFu8; PAGE_SIZE];
        s.read(PAGE_SIZE as u64, &mut back).unwrap();
        assert_eq!(back, page);
        s.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        s.sync().unwrap();
        drop(s);

        // Reopen read-only: the data persisted, writes are refused.
        let s = FileStore::open(&p.0, &FileStoreOptions::default()).unwrap();
        assert!(!s.writable());
        s.read(PAGE_SIZE as u64, &mut back).unwrap();
        assert_eq!(back, page);
        assert_eq!(s.write(0, &page), Err(StoreError(libc::EROFS)));
    }

    #[test]
    fn partial_last_page_zero_fills_and_keeps_length() {
        let p = TempPath::new("tail");
        let data: Vec<u8> = (0..PAGE_SIZE + 100).map(|i| (i as u8) | 1).collect();
        File::create(&p.0).unwrap().write_all(&data).unwrap();
        let s = FileStore::open(
            &p.0,
            &FileStoreOptions {
                writable: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(s.len(), 2 * PAGE_SIZE as u64);
        assert_eq!(s.file_len(), data.len() as u64);
        let mut back = vec![0xEEu8; PAGE_SIZE];
        s.read(PAGE_SIZE as u64, &mut back).unwrap();
        assert_eq!(&back[..100], &data[PAGE_SIZE..]);
        assert!(back[100..].iter().all(|&b| b == 0));

        // Writing the last page writes only the in-file bytes.
        let page = vec![7u8; PAGE_SIZE];
        s.write(PAGE_SIZE as u64, &page).unwrap();
        let mut contents = Vec::new();
        File::open(&p.0)
            .unwrap()
            .read_to_end(&mut contents)
            .unwrap();
        assert_eq!(contents.len(), data.len());
        assert!(contents[PAGE_SIZE..].iter().all(|&b| b == 7));
        assert_eq!(&contents[..PAGE_SIZE], &data[..PAGE_SIZE]);
    }

    /// Under O_DIRECT the final partial page is written byte-exact: bytes
    /// another writer appended after the open survive (an aligned write
    /// then a truncate back to the length at open would cut them).
    #[test]
    fn direct_partial_page_write_keeps_what_was_appended() {
        let p = TempPath::new("direct-tail");
        let data: Vec<u8> = (0..PAGE_SIZE + 100).map(|i| (i as u8) | 1).collect();
        File::create(&p.0).unwrap().write_all(&data).unwrap();
        let s = match FileStore::open(
            &p.0,
            &FileStoreOptions {
                writable: true,
                direct: true,
                ..Default::default()
            },
        ) {
            Ok(s) => s,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!(
                    "skipping: O_DIRECT unsupported in {:?}",
                    std::env::temp_dir()
                );
                return;
            }
            Err(e) => panic!("{e}"),
        };
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p.0)
            .unwrap()
            .write_all(&[0xAB; 50])
            .unwrap();
        let page = AlignedPage([7u8; PAGE_SIZE]);
        s.write(PAGE_SIZE as u64, &page.0).unwrap();
        let contents = std::fs::read(&p.0).unwrap();
        assert_eq!(
            contents.len(),
            data.len() + 50,
            "the file kept its new length"
        );
        assert!(contents[PAGE_SIZE..PAGE_SIZE + 100].iter().all(|&b| b == 7));
        assert!(
            contents[PAGE_SIZE + 100..].iter().all(|&b| b == 0xAB),
            "appended bytes survive"
        );
    }

    /// A file truncated behind the store: reads past its new end fail (a
    /// mapping of the file would get SIGBUS there) instead of reading
    /// zeros, and write-back does not extend it again.
    #[test]
    fn truncated_underneath_reads_fail_and_writes_do_not_extend() {
        let p = TempPath::new("truncated");
        let data: Vec<u8> = (0..4 * PAGE_SIZE).map(|i| (i as u8) | 1).collect();
        File::create(&p.0).unwrap().write_all(&data).unwrap();
        let s = FileStore::open(
            &p.0,
            &FileStoreOptions {
                writable: true,
                ..Default::default()
            },
        )
        .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p.0)
            .unwrap()
            .set_len(PAGE_SIZE as u64 + 10)
            .unwrap();
        let mut back = vec![0u8; PAGE_SIZE];
        assert_eq!(
            s.read(3 * PAGE_SIZE as u64, &mut back),
            Err(StoreError(libc::EIO))
        );
        // The page holding the new end reads its bytes, then zeros.
        s.read(PAGE_SIZE as u64, &mut back).unwrap();
        assert_eq!(&back[..10], &data[PAGE_SIZE..PAGE_SIZE + 10]);
        assert!(back[10..].iter().all(|&b| b == 0));
        s.write(3 * PAGE_SIZE as u64, &[9u8; PAGE_SIZE]).unwrap();
        s.write(PAGE_SIZE as u64, &[9u8; PAGE_SIZE]).unwrap();
        let contents = std::fs::read(&p.0).unwrap();
        assert_eq!(contents.len(), PAGE_SIZE + 10, "not extended again");
        assert!(contents[PAGE_SIZE..].iter().all(|&b| b == 9));
    }

    #[test]
    fn create_len_never_truncates() {
        let p = TempPath::new("grow");
        File::create(&p.0)
            .unwrap()
            .write_all(&vec![1u8; 3 * PAGE_SIZE])
            .unwrap();
        let s = FileStore::open(
            &p.0,
            &FileStoreOptions {
                create_len: Some(PAGE_SIZE as u64),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(s.len(), 3 * PAGE_SIZE as u64);
        assert!(!s.writable());
    }

    #[test]
    fn from_file_checks_access_mode() {
        let p = TempPath::new("from");
        File::create(&p.0)
            .unwrap()
            .write_all(&vec![3u8; PAGE_SIZE])
            .unwrap();
        let ro = File::open(&p.0).unwrap();
        let err = FileStore::from_file(ro, true).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        let ro = File::open(&p.0).unwrap();
        let s = FileStore::from_file(ro, false).unwrap();
        assert!(!s.is_direct());
        let mut back = vec![0u8; PAGE_SIZE];
        s.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 3));
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p.0)
            .unwrap();
        let s = FileStore::from_file(rw, true).unwrap();
        s.write(0, &vec![4u8; PAGE_SIZE]).unwrap();
        s.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 4));
    }

    #[test]
    fn missing_file_is_an_error() {
        let p = TempPath::new("missing");
        assert!(FileStore::open(&p.0, &FileStoreOptions::default()).is_err());
    }

    #[test]
    fn out_of_bounds_is_einval() {
        let p = TempPath::new("oob");
        let s = FileStore::open(
            &p.0,
            &FileStoreOptions {
                writable: true,
                create_len: Some(PAGE_SIZE as u64),
                ..Default::default()
            },
        )
        .unwrap();
        let mut buf = vec![0u8; PAGE_SIZE];
        assert_eq!(
            s.read(PAGE_SIZE as u64, &mut buf),
            Err(StoreError(libc::EINVAL))
        );
        assert_eq!(s.write(8, &buf), Err(StoreError(libc::EINVAL)));
    }

    #[test]
    fn direct_io_round_trip_and_alignment() {
        let p = TempPath::new("direct");
        let opts = FileStoreOptions {
            writable: true,
            direct: true,
            create_len: Some(2 * PAGE_SIZE as u64 + 100),
        };
        let s = match FileStore::open(&p.0, &opts) {
            Ok(s) => s,
            // The temp filesystem may not support O_DIRECT (e.g. older tmpfs).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!(
                    "skipping: O_DIRECT unsupported in {:?}",
                    std::env::temp_dir()
                );
                return;
            }
            Err(e) => panic!("open: {e}"),
        };
        assert!(s.is_direct());
        assert_eq!(s.len(), 3 * PAGE_SIZE as u64);
        let mut page = Box::new(AlignedPage([0x5A; PAGE_SIZE]));
        s.write(PAGE_SIZE as u64, &page.0).unwrap();
        // The final partial page: written whole, then the file is trimmed.
        s.write(2 * PAGE_SIZE as u64, &page.0).unwrap();
        assert_eq!(
            std::fs::metadata(&p.0).unwrap().len(),
            2 * PAGE_SIZE as u64 + 100
        );
        page.0.fill(0);
        s.read(PAGE_SIZE as u64, &mut page.0).unwrap();
        assert!(page.0.iter().all(|&b| b == 0x5A));
        s.read(2 * PAGE_SIZE as u64, &mut page.0).unwrap();
        assert!(page.0[..100].iter().all(|&b| b == 0x5A));
        assert!(page.0[100..].iter().all(|&b| b == 0));

        // Misaligned buffers are refused.
        let mut big = Box::new([AlignedPage([0; PAGE_SIZE]), AlignedPage([0; PAGE_SIZE])]);
        // SAFETY: the two pages are contiguous (an array of a repr(C) type
        // whose size equals its alignment), so this is a valid byte view.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(big.as_mut_ptr().cast::<u8>(), 2 * PAGE_SIZE) };
        assert_eq!(
            s.read(0, &mut bytes[1..PAGE_SIZE + 1]),
            Err(StoreError(libc::EINVAL))
        );
        assert_eq!(
            s.write(0, &bytes[8..PAGE_SIZE + 8]),
            Err(StoreError(libc::EINVAL))
        );
    }

    /// A file on tmpfs: its pages can be read in place, through the store's
    /// view, and `read_to_fd` copies from there; elsewhere (or with
    /// `O_DIRECT`) there is no view.
    #[test]
    fn tmpfs_file_is_read_in_place() {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let path = shm.join(format!("uffd-pager-filestore-view-{}", std::process::id()));
        let data: Vec<u8> = (0..3 * PAGE_SIZE - 5).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let s = FileStore::from_file(File::open(&path).unwrap(), false).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(s.synchronous());
        let at = s.page_in_memory(PAGE_SIZE as u64).unwrap();
        // SAFETY: the view maps the whole (rounded-up) file for `s`'s life.
        let view = unsafe { std::slice::from_raw_parts(at as *const u8, PAGE_SIZE) };
        assert_eq!(view, &data[PAGE_SIZE..2 * PAGE_SIZE]);
        assert_eq!(s.page_in_memory(3 * PAGE_SIZE as u64), None);
        // Two pages, the last one partial: zeros past the end of file.
        let m = crate::sys::mem::Memfd::new("filestore-view-test", 2 * PAGE_SIZE).unwrap();
        s.read_to_fd(PAGE_SIZE as u64, 2 * PAGE_SIZE, m.fd(), 0)
            .unwrap();
        let mut out = vec![1u8; 2 * PAGE_SIZE];
        // SAFETY: pread into a live buffer from our memfd.
        let n = unsafe { libc::pread(m.fd(), out.as_mut_ptr().cast(), out.len(), 0) };
        assert_eq!(n, out.len() as isize);
        assert_eq!(&out[..2 * PAGE_SIZE - 5], &data[PAGE_SIZE..]);
        assert!(out[2 * PAGE_SIZE - 5..].iter().all(|&b| b == 0));

        // A file on disk has no view.
        let p = TempPath::new("noview");
        std::fs::write(&p.0, &data).unwrap();
        let s = FileStore::from_file(File::open(&p.0).unwrap(), false).unwrap();
        if !s.synchronous() {
            assert_eq!(s.page_in_memory(0), None);
        }
    }
}
