//! Coherence between the pager's mappings of a file and the program's own
//! `read`, `write` and `fsync` of it (the kernel has one page cache per
//! file; the pager keeps a cache per mapping).

use super::*;

/// Before a read of at most `len` bytes (None: unknown) of `fd` at `at`
/// (None: the descriptor's position): the pager's writable shared
/// mappings of the file write back their dirty pages that hold those
/// bytes, so that the read sees what was stored through them, as the
/// kernel's one page cache shows it. `Err(errno)` of the first failure
/// (said on stderr): the read must then fail, since it would return the
/// file's older bytes. Only the pages the read can see: a page elsewhere
/// that cannot be written fails no read.
pub fn flush_for_read(fd: c_int, at: Option<i64>, len: Option<u64>) -> Result<(), c_int> {
    match file_of(fd, at, false) {
        Some(t) => write_back(&t, len, "write-back before a read failed"),
        None => Ok(()),
    }
}

/// Before a write of at most `len` bytes (None: unknown) at `t`: the
/// pager's writable shared mappings of the file write back their dirty
/// pages that hold those bytes, so that no write-back of an older copy of
/// them can land between the write and its refresh. Failures are said on
/// stderr (the write itself decides what the program is told).
pub fn flush_before_write(t: &Target, len: Option<u64>) {
    let _ = write_back(t, len, "write-back before a write failed");
}

/// Writes back the dirty pages of the pager's writable shared mappings of
/// `t`'s file that hold the `len` bytes (None: to the end) at `t`;
/// `Err(errno)` of the first failure, each said after `what`.
fn write_back(t: &Target, len: Option<u64>, what: &str) -> Result<(), c_int> {
    t.each_overlap(len.unwrap_or(u64::MAX), what, |e, off, n| {
        match e.writable_shared {
            true => e.region.flush_range(off, n),
            false => Ok(()),
        }
    })
}

/// Writes back the pager's mappings of `fd`'s file that are writable and
/// shared, and with `unmapped` the pages of that file's mappings unmapped
/// while it refused them; `Err(errno)` of the first failure (said on
/// stderr). Another file's failures are not this call's.
pub fn flush_file(fd: c_int, when: &str, unmapped: bool) -> Result<(), c_int> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only `s`.
    if unsafe { libc::fstat(fd, &mut s) } != 0 || s.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    flush_files(Some((s.st_dev, s.st_ino)), when, unmapped)
}

/// [`flush_file`] of every file (`sync`, `syncfs`), unmapped pages
/// included.
pub fn flush_all(when: &str) -> Result<(), c_int> {
    flush_files(None, when, true)
}

/// [`flush_file`] of file `id`, or of every file (`None`).
fn flush_files(id: Option<(u64, u64)>, when: &str, unmapped: bool) -> Result<(), c_int> {
    let mut guard = state();
    let Some(st) = guard.as_mut() else {
        return Ok(());
    };
    let mut failed = Vec::new();
    let mut first = Ok(());
    for e in st
        .maps
        .iter()
        .filter(|e| e.writable_shared && e.file.is_some() && id.is_none_or(|id| e.file == Some(id)))
    {
        if let Err(err) = e.region.flush() {
            first = first.and(Err(err.errno()));
            failed.push(format!("{}: write-back {when} failed: {err}", e.path));
        }
    }
    if unmapped && UNWRITTEN.load(Relaxed) {
        if let Some(p) = &st.pager {
            let r = match id {
                Some(id) => p.flush_unmapped_of(id),
                None => p.flush_unmapped(),
            };
            match r {
                Ok(()) => {
                    if p.unwritten_bytes() == 0 {
                        UNWRITTEN.store(false, Relaxed);
                    }
                }
                Err(err) => {
                    first = first.and(Err(err.errno()));
                    failed.push(format!("write-back of unmapped pages {when} failed: {err}"));
                }
            }
        }
    }
    for m in failed {
        st.say(m);
    }
    first
}

/// A write about to land in a file the pager maps.
pub struct Target {
    id: (u64, u64),
    off: u64,
}

impl Target {
    /// The file bytes `[lo, hi)` that `n` bytes written here would change
    /// in mapping `e`, if any: over its whole store, not only its mapped
    /// length. A mapping the program shrank with `mremap` still holds the
    /// pages it cut off (dirty ones too, written back at its unmap), as
    /// the kernel's page cache does, and may grow over them again: a
    /// write there, looked at over the mapped length, was neither written
    /// back before nor refreshed after, and the old page went over it.
    fn overlap(&self, e: &Entry, n: u64) -> Option<(u64, u64)> {
        let lo = self.off.max(e.base);
        let hi = self
            .off
            .saturating_add(n)
            .min(e.base + e.cap.max(e.region.len()) as u64);
        (e.file == Some(self.id) && lo < hi).then_some((lo, hi))
    }

    /// Runs `op(entry, store offset, length)` on each pager mapping of the
    /// file over the bytes that `n` bytes written here change, saying each
    /// failure on stderr after `what`; `Err(errno)` of the first.
    fn each_overlap(
        &self,
        n: u64,
        what: &str,
        mut op: impl FnMut(&mut Entry, u64, u64) -> Result<(), engine::Error>,
    ) -> Result<(), c_int> {
        let mut guard = state();
        let Some(st) = guard.as_mut() else {
            return Ok(());
        };
        let mut failed = Vec::new();
        let mut first = Ok(());
        for e in st.maps.iter_mut() {
            let Some((lo, hi)) = self.overlap(e, n) else {
                continue;
            };
            if let Err(err) = op(e, lo - e.base, hi - lo) {
                first = first.and(Err(err.errno()));
                failed.push(format!("{}: {what}: {err}", e.path));
            }
        }
        for m in failed {
            st.say(m);
        }
        first
    }
}

/// The target of a write on `fd` at `at` (None: the descriptor's
/// position), if the pager maps its file. On a descriptor opened with
/// `O_APPEND` every write lands at the end of the file, `pwrite`'s too
/// (Linux ignores its offset there), unless `append` is false: a
/// `pwritev2` with `RWF_NOAPPEND` writes at its offset (or position).
pub fn file_of(fd: c_int, at: Option<i64>, append: bool) -> Option<Target> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only `s`.
    if unsafe { libc::fstat(fd, &mut s) } != 0 || s.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let id = (s.st_dev, s.st_ino);
    if !state().as_ref()?.maps.iter().any(|e| e.file == Some(id)) {
        return None;
    }
    // SAFETY: F_GETFL reads the descriptor's flags.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    let off = match at {
        _ if append && fl >= 0 && fl & libc::O_APPEND != 0 => s.st_size,
        Some(o) => o,
        // SAFETY: lseek on the program's descriptor, not moving it.
        None => unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) },
    };
    (off >= 0).then_some(Target {
        id,
        off: off as u64,
    })
}

/// `n` bytes were written at the target: every pager mapping of the file
/// refreshes the pages they touched.
///
/// A read-only mapping of the anonymous install kind (`UFFD_PAGER_KIND=
/// anonymous`) holds a private copy the engine cannot refresh: its pages
/// there are dropped instead, and the next touch reads the file. Nothing
/// is lost: the shim never makes such a mapping writable, and one the
/// kernel's `mprotect` made writable (`kernel_writable`), whose written
/// pages would be the program's own, is left as it is (said on stderr).
pub fn refresh(t: Target, n: u64) {
    let _ = t.each_overlap(n, "keeping the mapping coherent failed", |e, off, n| {
        REFRESHED.fetch_add(1, Relaxed);
        if e.region.kind() != InstallKind::Anonymous || e.kernel_writable {
            return e.region.refresh(off, n);
        }
        // Piece by piece: the program may have unmapped part of it (a
        // drop over a hole is refused whole).
        let start = e.region.as_ptr() as usize;
        let end = start + e.region.len();
        let lo = start + off as usize / PAGE * PAGE;
        let hi = (start + (off + n) as usize).next_multiple_of(PAGE).min(end);
        for p in e.region.mapped() {
            let (a, b) = (lo.max(p.start), hi.min(p.end));
            if a < b && p.start >= start && p.end <= end {
                e.region.dontneed(a - start, b - a)?;
            }
        }
        Ok(())
    });
}
