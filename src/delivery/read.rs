//! How handler threads read their descriptors: up to two userfaultfds
//! and a stop eventfd per thread, read in turn (every one at least every
//! [`SWEEP_NS`]), spinning on the non-blocking descriptors before blocking
//! in poll(2), and reading what they hold before leaving when told to stop.

use crate::address_space::Mm;
use crate::sys::now_ns;
use crate::sys::uffd::{Msg, Uffd};

/// How often a handler thread reads every descriptor, whatever poll(2)
/// last said (see `read_batch`).
pub(super) const SWEEP_NS: u64 = 1_000_000;

/// What poll(2) found readable: the stop eventfd, and each descriptor.
pub(super) struct Ready {
    stop: bool,
    fds: [bool; 2],
}

/// Blocks in poll(2) until one of `fds` or `stop` (an eventfd) is
/// readable. EINTR is retried.
pub(super) fn wait_ready(fds: &[&Uffd], stop: i32) -> Ready {
    let mut p = [libc::pollfd {
        fd: stop,
        events: libc::POLLIN,
        revents: 0,
    }; 3];
    for (k, u) in fds.iter().enumerate().take(2) {
        p[k + 1].fd = u.fd();
    }
    let n = fds.len().min(2) + 1;
    loop {
        // SAFETY: `p` holds `n` valid pollfds.
        let rc = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, -1) };
        if rc >= 0 || crate::sys::errno() != libc::EINTR {
            return Ready {
                stop: p[0].revents != 0,
                fds: [p[1].revents != 0, n > 2 && p[2].revents != 0],
            };
        }
    }
}

/// Blocks until one of `fds` or `stop` is readable; true when `stop` fired.
pub(super) fn wait_readable(fds: &[&Uffd], stop: i32) -> bool {
    wait_ready(fds, stop).stop
}

/// Reads a batch from whichever descriptor has one, spinning for
/// `spin_us` then blocking in poll. `None` when the pool is stopping and
/// its descriptors hold nothing more (or [`STOP_DRAIN`] batches later); a
/// descriptor that fails for good is logged and the thread goes on with the
/// others (a handler thread that left silently would strand its faults).
pub(super) fn read_batch(
    mm: &Mm,
    fds: &[&Uffd],
    stopfd: i32,
    spin_us: u32,
    msgs: &mut [Msg],
    at: &mut ReadState,
) -> Option<(usize, usize)> {
    let ReadState {
        ready,
        swept,
        drained,
    } = at;
    let now = now_ns();
    let deadline = now + spin_us as u64 * 1000;
    let mut failed = [false; 2];
    // The descriptor after the one the last batch came from goes first,
    // and every descriptor is read at least every `SWEEP_NS`: while one
    // always has messages, poll(2) is never called to report the other,
    // whose faults and events (the application's `munmap` waits on them)
    // would wait until the first ran dry.
    let last = ready.iter().position(|&r| r).unwrap_or(fds.len() - 1);
    if now.saturating_sub(*swept) > SWEEP_NS {
        *swept = now;
        ready.iter_mut().for_each(|r| *r = true);
    }
    loop {
        // Only descriptors that may hold messages are read: the one the
        // last batch came from, those poll(2) reports, and all of them
        // once a sweep is due. A read of the other descriptor after every
        // fault would cost a syscall each.
        for j in 1..=fds.len() {
            let k = (last + j) % fds.len();
            let u = fds[k];
            if failed[k] || !(ready[k] || spin_us > 0) {
                continue;
            }
            match mm.events.read(u, msgs) {
                Ok(n) if n > 0 => {
                    *ready = [false; 2];
                    ready[k] = true;
                    return Some((k, n));
                }
                Ok(_) | Err(libc::EINTR) => ready[k] = false,
                Err(e) => {
                    tracing::error!(
                        errno = e,
                        "reading a userfaultfd failed; this handler stops reading it"
                    );
                    failed[k] = true;
                }
            }
        }
        if failed.iter().take(fds.len()).all(|&f| f) {
            // Nothing left to read: wait for the stop signal only.
            return if wait_readable(&[], stopfd) {
                None
            } else {
                Some((0, 0))
            };
        }
        if spin_us > 0 && now_ns() < deadline {
            std::hint::spin_loop();
            continue;
        }
        let r = wait_ready(fds, stopfd);
        // Told to stop (the region is taken for unmapped, or the pager
        // goes): what the descriptors hold is read first. A retired
        // region's own unmap may still be there, unread, and the
        // application's `munmap` waits until it is read (for ever, while
        // anything keeps the descriptor open: a residency guard, a fork()ed
        // child). Bounded: a descriptor that stays readable and yields
        // nothing does not keep the thread.
        if r.stop && (!r.fds.iter().any(|&f| f) || *drained >= STOP_DRAIN) {
            return None;
        }
        if r.stop {
            *drained += 1;
        }
        *ready = r.fds;
    }
}

/// Where a reader is between batches ([`read_batch`]).
pub(super) struct ReadState {
    /// The descriptors that may hold messages.
    ready: [bool; 2],
    /// When every descriptor was last read ([`SWEEP_NS`]).
    swept: u64,
    /// Batches read since the reader was told to stop ([`STOP_DRAIN`]).
    drained: u32,
}

impl ReadState {
    /// A reader's state before its first batch: every descriptor may hold
    /// messages.
    pub(super) fn new() -> ReadState {
        ReadState {
            ready: [true; 2],
            swept: 0,
            drained: 0,
        }
    }
}

/// How many more reads a reader told to stop makes of descriptors that
/// poll(2) reports readable ([`read_batch`]).
const STOP_DRAIN: u32 = 64;
