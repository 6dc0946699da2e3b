//! Thin, async-signal-safe wrappers over the system calls the engine uses.
//!
//! What the fault path calls here is a direct syscall with no allocation,
//! no locking and no tracing, so it may run inside the SIGBUS handler.
//! Some calls made only from ordinary threads, at map time or in a probe,
//! allocate (`pagemap`'s range reads, `huge`'s pool figures, `pipe`'s
//! sysfs read at map time, `uffd`'s error messages, a memfd's name, a
//! thread's spawn): the fault path does not call them.

pub mod futex;
pub mod huge;
pub mod mem;
pub mod pagemap;
pub mod pipe;
pub mod self_file;
pub mod thread;
pub mod uffd;

/// The page size the engine works in. x86-64 base pages.
pub const PAGE_SIZE: usize = 4096;

/// One page-aligned page of bytes, for reading a page on the stack (a
/// signal handler cannot allocate; `O_DIRECT` needs the alignment).
#[repr(C, align(4096))]
pub struct PageBuf(pub [u8; PAGE_SIZE]);

impl PageBuf {
    /// A page of zeros.
    #[inline]
    pub const fn zeroed() -> PageBuf {
        PageBuf([0; PAGE_SIZE])
    }
}
/// Whole pages of zeroed bytes on the heap, page-aligned (`O_DIRECT` needs
/// the alignment, which a `Vec<u8>` does not give): for a run of pages or
/// a 2 MiB page, outside a signal handler (it allocates).
pub struct PagesBuf(Vec<PageBuf>);

impl PagesBuf {
    /// `len` bytes of zeros, rounded up to whole pages.
    pub fn zeroed(len: usize) -> PagesBuf {
        PagesBuf(
            (0..len.div_ceil(PAGE_SIZE))
                .map(|_| PageBuf::zeroed())
                .collect(),
        )
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: contiguous `PageBuf`s are initialised bytes (the type is
        // a byte array with no padding), borrowed for `self`'s life.
        unsafe {
            std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.0.len() * PAGE_SIZE)
        }
    }

    /// The bytes, to fill.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, borrowed mutably for `self`'s life.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.0.as_mut_ptr().cast::<u8>(),
                self.0.len() * PAGE_SIZE,
            )
        }
    }
}

/// `log2(PAGE_SIZE)`.
pub const PAGE_SHIFT: u32 = 12;

/// Runs `step(done)` (a system call that moves up to the rest of `len`
/// bytes from offset `done` and returns how many it moved, or -1 with
/// errno) until all `len` have moved; EINTR runs it again, 0 is `EIO`.
/// Async-signal-safe.
#[inline]
pub fn all_of(len: usize, mut step: impl FnMut(usize) -> isize) -> Result<(), i32> {
    let mut done = 0;
    while done < len {
        match step(done) {
            n if n > 0 => done += n as usize,
            0 => return Err(libc::EIO),
            _ => match errno() {
                libc::EINTR => {}
                e => return Err(e),
            },
        }
    }
    Ok(())
}

/// The calling thread's `errno`.
#[inline]
pub fn errno() -> i32 {
    // SAFETY: `__errno_location` returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno` (the SIGBUS handler restores the
/// interrupted code's). Async-signal-safe.
#[inline]
pub fn set_errno(e: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e };
}

/// Monotonic clock in nanoseconds. `clock_gettime` is async-signal-safe (and
/// served from the vDSO).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps `ns` nanoseconds (less if a signal interrupts it), on the
/// monotonic clock. `clock_nanosleep` is async-signal-safe and returns its
/// error rather than setting errno.
pub fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec; no remainder is asked for.
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, std::ptr::null_mut()) };
}

/// The CPU the calling thread runs on (it may move right after), for
/// picking a per-CPU shard. One load from the rseq area (or a vDSO call);
/// async-signal-safe.
#[inline]
pub fn this_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions (rseq/vDSO backed).
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as usize
}

/// CPUs the machine has (`_SC_NPROCESSORS_CONF`, at least 1): how many
/// per-CPU shards to make. Shards are picked by [`this_cpu`] (the CPU's
/// number) modulo this count, so each CPU has a shard of its own.
///
/// Not the CPUs this process may use (`available_parallelism`): under an
/// affinity of CPUs {0, 2}, or a CPU quota of one on a large host, that
/// count was 2 or 1 while the CPU numbers ran higher, and faulting threads
/// on different CPUs shared one shard's cache lines (found by review).
pub fn cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    /// Shards are one per CPU of the machine, whatever the caller's
    /// affinity: a thread allowed on CPU 0 alone counted one. (On a
    /// one-CPU machine both counts are 1.)
    #[test]
    fn the_shard_count_is_the_machines_cpus_not_the_affinitys() {
        // SAFETY: sysconf has no preconditions.
        let conf = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) } as usize;
        let n = std::thread::spawn(|| {
            // SAFETY: a zeroed cpu_set_t is an empty set; the calls write
            // and read only it, for this thread (pid 0).
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                    0
                );
            }
            super::cpu_count()
        })
        .join()
        .unwrap();
        assert_eq!(n, conf.max(1));
    }
}
