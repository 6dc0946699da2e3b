//! The stores the shim pages a program's file by: its own descriptor for
//! the file behind the program's (opened again through the calling
//! thread's descriptor table, checked to be the same file), and the store
//! over it at the mapping's offset.

use super::kernel::open_flags;
use engine::store::{SimulatedStore, Store};
use std::ffi::c_int;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;

/// The resolved path of descriptor `fd`, and its identity and size.
pub(super) fn fd_file(fd: c_int) -> Option<(std::ffi::CString, (u64, u64), u64)> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    // The calling thread's table (`thread-self`): `/proc/self/fd` is the
    // first thread's, which a thread that unshared its table does not
    // use, and where `fd` can be another file.
    let link = std::fs::read_link(format!("/proc/thread-self/fd/{fd}")).ok()?;
    let path = std::ffi::CString::new(link.into_os_string().into_encoded_bytes()).ok()?;
    Some((path, (st.st_dev, st.st_ino), st.st_size as u64))
}

/// A store over the file behind `fd` at `off`, with the latency model.
pub fn file_store(
    fd: c_int,
    off: u64,
    len: usize,
    writable: bool,
    latency: Option<engine::store::LatencyModel>,
) -> Result<Arc<dyn Store>, String> {
    let file = own_file(fd, writable)?;
    let whole: Arc<dyn Store> =
        Arc::new(engine::store::FileStore::from_file(file, writable).map_err(|e| e.to_string())?);
    let whole: Arc<dyn Store> = match latency {
        Some(m) => Arc::new(SimulatedStore::new(whole, m, 0, off ^ len as u64)),
        None => whole,
    };
    let s = engine::store::SliceStore::new(whole, off, len as u64).map_err(|e| e.to_string())?;
    Ok(Arc::new(s))
}

/// A descriptor of the store's own for the file behind the program's `fd`:
/// the file opened again through `/proc/thread-self/fd` (the calling
/// thread's table) and checked to be the same file, an open file of its
/// own.
/// A `dup` would share the program's open file, and with it `O_APPEND`
/// (which Linux honours in `pwrite`: every write-back would land at the
/// end of the file, not at its page) whether the program opened it so or
/// sets it later with `fcntl(F_SETFL)`. Where the file cannot be opened
/// again (its permissions changed since the program opened it), a `dup`,
/// for reading only: a writable store's `pwrite`s through a `dup` would
/// follow the `O_APPEND` the program may set on its descriptor at any time
/// (the mapping is then the kernel's).
fn own_file(fd: c_int, writable: bool) -> Result<std::fs::File, String> {
    let fl = open_flags(fd);
    if fl < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // Never more than the descriptor allows: the reopen checks the file's
    // mode, not how the program opened it.
    if writable && fl & libc::O_ACCMODE != libc::O_RDWR {
        return Err("a writable store over a descriptor not opened O_RDWR".into());
    }
    let again = std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/thread-self/fd/{fd}"));
    if let Ok(f) = again {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: a zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes only `st`, on the program's descriptor
        // number.
        let same = unsafe { libc::fstat(fd, &mut st) } == 0
            && f.metadata()
                .is_ok_and(|m| (m.dev(), m.ino()) == (st.st_dev, st.st_ino));
        if !same {
            return Err("the descriptor's file changed while it was opened again".into());
        }
        return Ok(f);
    }
    if writable {
        // A dup shares the program's open file, and with it the O_APPEND
        // that a later fcntl(F_SETFL) may set: every write-back would land
        // at the end of the file.
        return Err("a file the store cannot open again for writing".into());
    }
    // SAFETY: F_DUPFD_CLOEXEC on the program's descriptor; a bad one fails.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: `dup` is ours alone.
    Ok(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(dup) })
}
