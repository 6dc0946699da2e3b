//! Opening a [`FileStore`]: the descriptor's flags, the tmpfs view and
//! the `O_DIRECT` tail descriptor.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::AtomicU64;

use super::{FileStore, FileStoreOptions};
use crate::store::zero::round_up_to_page;

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

/// `Ok` for a regular file: a directory is `EISDIR`, anything else
/// (a FIFO, a socket, a device, whose length is not its data's)
/// `ENODEV`, as `mmap` answers for it.
fn regular(file: &File) -> io::Result<()> {
    let t = file.metadata()?.file_type();
    match () {
        _ if t.is_file() => Ok(()),
        _ if t.is_dir() => Err(io::Error::from_raw_os_error(libc::EISDIR)),
        _ => Err(io::Error::from_raw_os_error(libc::ENODEV)),
    }
}

impl FileStore {
    /// Opens `path` as described by `opts`: a regular file (otherwise
    /// `EISDIR` or `ENODEV`, without waiting for a FIFO's writer).
    ///
    /// Example: [`FileStore`](crate::store::FileStore).
    pub fn open(path: &Path, opts: &FileStoreOptions) -> io::Result<FileStore> {
        let mut oo = OpenOptions::new();
        oo.read(true);
        if opts.writable || opts.create_len.is_some() {
            oo.write(true);
        }
        if opts.create_len.is_some() {
            oo.create(true);
        }
        // Hazard: the open of a FIFO waits for a writer, for ever if none
        // comes: opened without waiting (`O_NONBLOCK`), refused as not a
        // regular file below, and the flag taken off again for a file
        // that is one.
        let mut flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        oo.custom_flags(flags);
        let file = oo.open(path)?;
        regular(&file)?;
        // SAFETY: F_GETFL and F_SETFL on a descriptor we hold open; no
        // memory involved.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0
            || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK) } < 0
        {
            return Err(io::Error::last_os_error());
        }
        if let Some(want) = opts.create_len {
            if file.metadata()?.len() < want {
                file.set_len(want)?;
            }
        }
        Self::with_flags(file, opts.writable, opts.direct)
    }

    /// Wraps an open file. The descriptor must be open for reading (an
    /// `O_WRONLY` or `O_PATH` one fails with `EBADF`) and name a regular
    /// file (a directory fails with `EISDIR`, anything else with `ENODEV`,
    /// as `mmap` answers). `writable` needs a descriptor opened for writing
    /// (otherwise this fails with `EBADF`) and not for appending (`EINVAL`:
    /// on Linux, `pwrite` to an `O_APPEND` descriptor ignores its offset and
    /// appends, so every write-back would land at the end of the file).
    /// `O_DIRECT` on the descriptor is detected and honoured.
    ///
    /// Example: [`FileStore`](crate::store::FileStore).
    pub fn from_file(file: File, writable: bool) -> io::Result<Self> {
        // SAFETY: F_GETFL on a descriptor we hold open; no memory involved.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(io::Error::last_os_error());
        }
        // (Every read would fail: each touch of a mapping a SIGBUS.)
        if fl & libc::O_PATH != 0 || fl & libc::O_ACCMODE == libc::O_WRONLY {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        regular(&file)?;
        if writable && fl & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        if writable && fl & libc::O_APPEND != 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
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
            Ok(n) if in_memory && n > 0 => {
                // A raw map: the file changes under it (this store's own
                // writes, other processes), so no slice of it is ever made
                // (as `Mmap`'s `Deref` would). The store hands out
                // addresses that the kernel reads (a `UFFDIO_COPY` or
                // `pwrite` source), where a page the file lost (truncated
                // by someone else) fails with `EFAULT` and the store falls
                // back to `pread`, and no signal is raised.
                memmap2::MmapOptions::new()
                    .len(n)
                    .map_raw_read_only(&file)
                    .ok()
            }
            _ => None,
        };
        // Any page can become the last one (the file may be truncated), so
        // the plain descriptor is there whenever O_DIRECT writes are.
        // Opened through the calling thread's own table (`thread-self`:
        // `/proc/self/fd` is the first thread's, which a thread that
        // unshared its table does not use, and where the same number can
        // be another file), and checked to be the same file.
        let tail = if direct && writable {
            let t = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(format!("/proc/thread-self/fd/{}", file.as_raw_fd()))?;
            let (was, is) = (file.metadata()?, t.metadata()?);
            if (was.dev(), was.ino()) != (is.dev(), is.ino()) {
                return Err(io::Error::from_raw_os_error(libc::ESTALE));
            }
            Some(t)
        } else {
            None
        };
        Ok(FileStore {
            file,
            file_len,
            read_len: AtomicU64::new(file_len),
            len,
            writable,
            direct,
            in_memory,
            view,
            tail,
            punch_discards: false,
            plain_pwrite: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// This store as a swap file of the engine's own
    /// ([`PagerBuilder::swap_dir`](crate::PagerBuilder::swap_dir)): a
    /// discarded page's bytes are punched out of the file
    /// (`FALLOC_FL_PUNCH_HOLE`), so that the disk space of pages the
    /// application dropped is given back, as the kernel frees their swap
    /// slots. Never for a file that holds someone's data.
    pub(crate) fn punching_discards(mut self) -> Self {
        self.punch_discards = true;
        self
    }
}
