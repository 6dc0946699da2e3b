//! A lock-free copy of the address ranges of the table's mappings, so that
//! a call on memory that is not the pager's goes to the kernel without
//! the table's lock.
//!
//! Why: an allocator of the program's own (jemalloc, tcmalloc, an arena
//! allocator) may call `mmap`, `munmap` or `madvise` while it holds its
//! own lock, and the shim allocates while it holds the table's: one
//! thread in the allocator waiting for the table, another in the shim
//! waiting for the allocator, both waited for ever. The kernel's calls
//! take no lock the program can hold. So those calls decide "not the
//! pager's" from these atomics alone (and an anonymous `mmap` under
//! `UFFD_PAGER_ANON_MIN` from the threshold alone).
//!
//! Each slot holds one entry's range, `[start, end)` (its whole length as
//! mapped or last moved through the shim; parts the program unmapped since
//! still count, which only sends such calls through the lock). Written
//! only under the table's lock (one writer at a time), read by anyone:
//! `end` is stored last with Release and read first with Acquire, so a
//! reader that sees a slot's end sees its start. Entries past [`SLOTS`]
//! have no slot, and while any exists every call takes the lock, as before.
//!
//! Cost: a scan of the slots in use (one or two loads each) per call.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// Slots: entries tracked without the lock.
const SLOTS: usize = 256;

struct Span {
    start: AtomicUsize,
    /// 0: the slot is free.
    end: AtomicUsize,
}

static SPANS: [Span; SLOTS] = [const {
    Span {
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
    }
}; SLOTS];
/// Slots below this have been used (the scan stops there).
static USED: AtomicUsize = AtomicUsize::new(0);
/// Entries with no slot.
static UNTRACKED: AtomicUsize = AtomicUsize::new(0);

/// Records a new entry's range; its slot, `None` if all are taken. Under
/// the table's lock.
pub(super) fn add(r: Range<usize>) -> Option<usize> {
    let k = SPANS.iter().position(|s| s.end.load(Relaxed) == 0);
    match k {
        Some(k) => {
            set(Some(k), r);
            USED.fetch_max(k + 1, Release);
        }
        None => {
            UNTRACKED.fetch_add(1, Relaxed);
        }
    }
    k
}

/// The entry in `slot` covers `r` now (moved through the shim). Under the
/// table's lock.
pub(super) fn set(slot: Option<usize>, r: Range<usize>) {
    if let Some(k) = slot {
        SPANS[k].start.store(r.start, Relaxed);
        SPANS[k].end.store(r.end.max(1), Release);
    }
}

/// The entry in `slot` is gone. Under the table's lock.
pub(super) fn remove(slot: Option<usize>) {
    match slot {
        Some(k) => SPANS[k].end.store(0, Release),
        None => {
            UNTRACKED.fetch_sub(1, Relaxed);
        }
    }
}

/// Whether `[a, b)` may hold pager memory (`false`: it holds none, and
/// the call is the kernel's). Lock-free, allocation-free.
pub fn may_be_ours(a: usize, b: usize) -> bool {
    if UNTRACKED.load(Relaxed) > 0 {
        return true;
    }
    let used = USED.load(Acquire);
    SPANS[..used].iter().any(|s| {
        let end = s.end.load(Acquire);
        end != 0 && a < end && s.start.load(Relaxed) < b
    })
}

/// Whether `/proc/self/maps` lists a shared mapping of a file (not the
/// pager's own memory, which is anonymous or a memfd: any shared file
/// mapping, paged or not) that meets `[a, b)`. Read with a buffer on the
/// stack and no lock, so that `mprotect(PROT_WRITE)` of the program's own
/// memory (an allocator's or a JIT's, under its own lock) decides here,
/// without the table's lock or an allocation, that it is the kernel's
/// (see the module docs). `true` where the file cannot be read: the
/// caller then looks closer, under the lock.
///
/// Cost: a read of `/proc/self/maps`, a few microseconds per hundred
/// mappings.
pub fn shared_file_map_in(a: usize, b: usize) -> bool {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return true;
    }
    let mut buf = [0u8; 4096];
    let mut line = Line::default();
    let mut found = false;
    'read: loop {
        // SAFETY: reads into the buffer on the stack, at most its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            found = true;
            break;
        }
        if n == 0 {
            break;
        }
        for &c in &buf[..n as usize] {
            if line.feed(c) && line.shared && line.inode != 0 && line.start < b && a < line.end {
                found = true;
                break 'read;
            }
        }
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    found
}

/// One line of `/proc/self/maps` as it is read, byte by byte:
/// `start-end perms offset dev inode [path]`.
#[derive(Default)]
struct Line {
    /// The field being read (0: the range, 1: perms, 4: the inode).
    field: u8,
    past_dash: bool,
    start: usize,
    end: usize,
    perm: u8,
    shared: bool,
    inode: u64,
}

impl Line {
    /// Takes byte `c`; `true` at the end of a line, whose fields are then
    /// read (and reset at the next byte).
    fn feed(&mut self, c: u8) -> bool {
        if self.field == u8::MAX {
            *self = Line::default();
        }
        match (self.field, c) {
            (_, b'\n') => {
                self.field = u8::MAX;
                return true;
            }
            (0, b'-') => self.past_dash = true,
            (0, b' ') => self.field = 1,
            (0, _) => {
                let v = (c as char).to_digit(16).unwrap_or(0) as usize;
                let x = if self.past_dash {
                    &mut self.end
                } else {
                    &mut self.start
                };
                *x = x.wrapping_mul(16).wrapping_add(v);
            }
            (1..=4, b' ') => self.field += 1,
            (1, _) => {
                if self.perm == 3 {
                    self.shared = c == b's';
                }
                self.perm += 1;
            }
            (4, b'0'..=b'9') => {
                self.inode = self.inode.wrapping_mul(10) + u64::from(c - b'0');
            }
            _ => {}
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maps_line_is_read_byte_by_byte() {
        let mut l = Line::default();
        let text = b"7f00a000-7f00c000 r--s 00001000 fd:01 1234   /tmp/x y\n";
        let ends: Vec<bool> = text.iter().map(|&c| l.feed(c)).collect();
        assert_eq!(ends.iter().filter(|&&e| e).count(), 1);
        assert_eq!(
            (l.start, l.end, l.shared, l.inode),
            (0x7f00a000, 0x7f00c000, true, 1234)
        );
        let text = b"7f00c000-7f00d000 rw-p 00000000 00:00 0 \n";
        for &c in text.iter() {
            l.feed(c);
        }
        assert_eq!(
            (l.start, l.end, l.shared, l.inode),
            (0x7f00c000, 0x7f00d000, false, 0)
        );
    }

    #[test]
    fn a_shared_file_mapping_is_found_and_private_memory_is_not() {
        let f = std::env::temp_dir().join(format!("spans-{}", std::process::id()));
        std::fs::write(&f, [1u8; 8192]).unwrap();
        let file = std::fs::File::open(&f).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: new mappings of our own, unmapped below.
        let (s, p) = unsafe {
            let s = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            (s as usize, p as usize)
        };
        assert!(shared_file_map_in(s, s + 8192));
        assert!(shared_file_map_in(s + 4096, s + 4097));
        assert!(!shared_file_map_in(p, p + 8192));
        // SAFETY: ours, from above.
        unsafe {
            libc::munmap(s as *mut _, 8192);
            libc::munmap(p as *mut _, 8192);
        }
        let _ = std::fs::remove_file(&f);
    }
}
