//! A store over the caller's open file descriptor, checked as `mmap`
//! checks it (`EBADF`, `EACCES`, `ENODEV`, `EPERM`, `EINVAL`), with the file
//! opened again or the descriptor duplicated, so the caller keeps its own:
//! for `uffd_pager_map_fd` and UMap's `umap`.

use crate::fail;
use engine::store::{FileStore, SliceStore, Store};
use std::sync::Arc;

/// The file open at `fd` opened again, read-write, as an open file of its
/// own (`/proc/thread-self/fd`, the calling thread's table), if it is the
/// same file (device and inode). Opened, not duplicated: a duplicate
/// closed at once would drop the caller's POSIX record locks on the file.
fn reopen(fd: i32, flags: i32) -> Option<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | flags & libc::O_DIRECT)
        .open(format!("/proc/thread-self/fd/{fd}"))
        .ok()?;
    // SAFETY: a zeroed stat is a valid out-parameter; fstat writes only it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on the caller's descriptor number.
    let same = unsafe { libc::fstat(fd, &mut st) } == 0
        && f.metadata()
            .is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino);
    same.then_some(f)
}

/// A store over `len` bytes of the open file `fd` from `offset` on (the
/// file is opened again, or the descriptor duplicated; the caller keeps
/// its own).
pub(crate) fn fd_store(
    fd: i32,
    offset: u64,
    len: usize,
    writable: bool,
) -> Result<Arc<dyn Store>, i32> {
    let bad = |e: std::io::Error| {
        fail(
            e.raw_os_error().unwrap_or(libc::EBADF),
            format_args!("fd {fd}: {e}"),
        )
    };
    // A descriptor the mapping may not use is mmap's EACCES: one not open
    // for reading, or not for writing where the mapping writes. (The
    // store's own checks answered EBADF, which says the number is bad.)
    // SAFETY: F_GETFL on a descriptor number; a bad one is EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(bad(std::io::Error::last_os_error()));
    }
    // A path-only descriptor reads nothing: mmap's EBADF. (F_GETFL and a
    // duplicate work on it, so the map went through and every read
    // failed: the first touch was SIGBUS.)
    if flags & libc::O_PATH != 0 {
        return Err(fail(
            libc::EBADF,
            format_args!("fd {fd} is a path-only descriptor (O_PATH)"),
        ));
    }
    // Checked before anything is opened: a descriptor of the file this
    // call opens and closes again on failure would drop the caller's
    // POSIX record locks on it.
    // SAFETY: a zeroed stat is a valid out-parameter; fstat writes only it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(bad(std::io::Error::last_os_error()));
    }
    // A directory, a pipe, a device: mmap's ENODEV (a store reads whole
    // pages at offsets of a file whose length it knows).
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(fail(
            libc::ENODEV,
            format_args!("fd {fd} is not a regular file"),
        ));
    }
    check_window(offset, len, st.st_size as u64)?;
    let mode = flags & libc::O_ACCMODE;
    if mode == libc::O_WRONLY || writable && mode != libc::O_RDWR {
        let need = if writable {
            "reading and writing"
        } else {
            "reading"
        };
        return Err(fail(
            libc::EACCES,
            format_args!("fd {fd} is not open for {need}"),
        ));
    }
    // Appending: mmap refuses a shared writable mapping of it (EACCES),
    // and a write-back through it would append.
    if writable && flags & libc::O_APPEND != 0 {
        return Err(fail(
            libc::EACCES,
            format_args!("fd {fd} is open for appending"),
        ));
    }
    // A file sealed against writes (a memfd): mmap's EPERM for a writable
    // mapping. Its store, an open file of its own, took the writes until
    // every write-back failed.
    // SAFETY: F_GET_SEALS reads the file's seals (EINVAL: a file that takes
    // none).
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if writable && seals > 0 && seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0 {
        return Err(fail(
            libc::EPERM,
            format_args!("fd {fd} is sealed against writes"),
        ));
    }
    // A writable store writes through an open file of its own: the
    // caller's may be set to append later (`fcntl(F_SETFL, O_APPEND)`), and
    // Linux's `pwrite` then appends. Otherwise (or where it cannot be
    // opened again), a duplicate of the caller's descriptor: the store
    // writes with `RWF_NOAPPEND`, so an `O_APPEND` set on it later leaves
    // the write-backs in place (kernels before 6.9, which lack the flag,
    // would append them).
    let file = match writable.then(|| reopen(fd, flags)).flatten() {
        Some(f) => f,
        None => {
            // SAFETY: F_DUPFD_CLOEXEC on a descriptor number; a bad one is
            // EBADF.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
            if dup < 0 {
                return Err(bad(std::io::Error::last_os_error()));
            }
            // SAFETY: `dup` is a fresh descriptor that nothing else owns.
            unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(dup) }
        }
    };
    let whole = FileStore::from_file(file, writable).map_err(|e| {
        fail(
            e.raw_os_error().unwrap_or(libc::EIO),
            format_args!("fd {fd}: {e}"),
        )
    })?;
    // (Again: the file may have changed since the look above.)
    check_window(offset, len, whole.file_len())?;
    SliceStore::new(Arc::new(whole), offset, len as u64)
        .map(|s| Arc::new(s) as Arc<dyn Store>)
        .map_err(|e| fail(e.0, "slicing the file"))
}

/// Whether `len` bytes at `offset` are whole pages inside a file of
/// `file_len` bytes (its last page counted whole, as mmap maps it); EINVAL
/// with a message if not.
fn check_window(offset: u64, len: usize, file_len: u64) -> Result<(), i32> {
    let page = engine::PAGE_SIZE as u64;
    let len = len as u64;
    let pages_len = file_len.div_ceil(page).saturating_mul(page);
    let fits = offset.checked_add(len).is_some_and(|end| end <= pages_len);
    // (An empty length too, as mmap(2) refuses it: refused here, before
    // the file is opened again, whose close would drop the caller's
    // record locks.)
    if !offset.is_multiple_of(page) || !len.is_multiple_of(page) || !fits || len == 0 {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "{len} bytes at offset {offset} of a {file_len}-byte file: offset and length \
                 must be whole pages inside the file, at least one"
            ),
        ));
    }
    Ok(())
}
