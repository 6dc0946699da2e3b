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

/// Every file store the shim made, with its file's identity, held here
/// too until [`sweep`] finds it needed by nothing else and its file under
/// no POSIX record lock of the process's.
///
/// Hazard: closing any descriptor of a file drops every POSIX record lock
/// (`fcntl(F_SETLK)`) the process holds on it. A store's descriptor is
/// the shim's own, which the program never sees, and it went with the
/// store at the `munmap` (found by review: sqlite, which remaps its
/// database with `munmap` and `mmap` while it holds its locks, lost them
/// mid-transaction, and another process could write beside it). Under
/// the kernel alone a `munmap` closes nothing. A store needed by nothing
/// else waits here while the file is locked: closed at a later `mmap` or
/// `munmap` of the shim's that finds the locks gone (the program's own
/// `close` of the file dropped them, or it unlocked), or at exit.
static MADE: std::sync::Mutex<Vec<Made>> = std::sync::Mutex::new(Vec::new());

/// A store [`MADE`] holds: its file's (device, inode), and the store.
type Made = ((u64, u64), Arc<engine::store::FileStore>);

/// Closes the stores [`MADE`] alone holds whose file the process holds
/// no POSIX record lock on (all kept where `/proc/locks` cannot be read).
pub fn sweep() {
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if !made.iter().any(|m| Arc::strong_count(&m.1) == 1) {
        return;
    }
    let Some(locked) = locked_files() else {
        return;
    };
    made.retain(|m| Arc::strong_count(&m.1) > 1 || locked.contains(&m.0));
}

/// The files (device, inode) this process holds a POSIX record lock on,
/// from `/proc/locks` (lines `N: POSIX ADVISORY WRITE PID MAJ:MIN:INO
/// START END`, major and minor in hex; a waiter's line has `->` after the
/// number and holds nothing). Open file description locks (`OFDLCK`) and
/// `flock`s are not dropped by another descriptor's close.
fn locked_files() -> Option<Vec<(u64, u64)>> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() }.to_string();
    let mut v = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "POSIX" || f[4] != me {
            continue;
        }
        let mut id = f[5].split(':');
        let (Some(maj), Some(min), Some(ino)) = (id.next(), id.next(), id.next()) else {
            continue;
        };
        let (Ok(maj), Ok(min), Ok(ino)) = (
            u32::from_str_radix(maj, 16),
            u32::from_str_radix(min, 16),
            ino.parse::<u64>(),
        ) else {
            continue;
        };
        v.push((libc::makedev(maj, min), ino));
    }
    Some(v)
}

/// A store over the file behind `fd` at `off`, with the latency model.
pub fn file_store(
    fd: c_int,
    off: u64,
    len: usize,
    writable: bool,
    latency: Option<engine::store::LatencyModel>,
) -> Result<Arc<dyn Store>, String> {
    sweep();
    let file = own_file(fd, writable)?;
    let id = {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().map_err(|e| e.to_string())?;
        (m.dev(), m.ino())
    };
    let store =
        Arc::new(engine::store::FileStore::from_file(file, writable).map_err(|e| e.to_string())?);
    MADE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, store.clone()));
    let whole: Arc<dyn Store> = store;
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
