//! How handler threads read their descriptors: up to two userfaultfds
//! and a stop eventfd per thread, read in turn (every one at least every
//! [`SWEEP_NS`]), spinning on the non-blocking descriptors before blocking
//! in poll(2), and reading what they hold before leaving when told to stop.
//!
//! A region's own reader (per-region delivery) told that its region is
//! gone lingers instead ([`LINGER`]): it goes on serving its descriptor
//! until it holds the last reference to it, and then leaves, which closes
//! it. The kernel can keep ranges registered on that descriptor that the
//! engine never listed: the tail of a region the application grew in place
//! with its own `mremap` (no event reports that), or a source it kept with
//! `MREMAP_DONTUNMAP`. A touch of such a range, or the application's
//! `munmap` of it, waits until someone reads the descriptor, or until it
//! closes: for ever, while a residency guard or the unwritten list held
//! the region's object, when its reader left with its region.

use crate::address_space::Mm;
use crate::sys::now_ns;
use crate::sys::uffd::{Msg, Uffd};
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::Arc;

/// What a pool's threads are told ([`Stop::told`]): serve.
pub(super) const SERVE: u8 = 0;
/// A region's own reader: its region is gone; serve until the descriptor
/// is the reader's alone, then leave.
pub(super) const LINGER: u8 = 1;
/// Read what the descriptors hold (up to [`STOP_DRAIN`] batches) and leave.
pub(super) const STOP: u8 = 2;

/// How long a lingering reader blocks in poll(2) before it looks again
/// whether its descriptor is its alone (the wake from the object that
/// lets it go normally comes first, see
/// [`OwnDescriptor`](crate::sys::uffd::OwnDescriptor)).
const LINGER_POLL_MS: i32 = 100;

/// How a handler thread is told what to do: an eventfd that wakes its
/// poll(2), and what it is told ([`SERVE`], [`LINGER`], [`STOP`]), stored
/// before the eventfd is written.
pub(super) struct Stop<'a> {
    /// The eventfd (non-blocking).
    pub fd: i32,
    /// What the thread is told.
    pub told: &'a AtomicU8,
    /// The region's own descriptor, for a region's reader: [`LINGER`]
    /// ends once this is its last reference.
    pub own: Option<&'a Arc<Uffd>>,
}

impl Stop<'_> {
    /// What the thread is told. `woken`: poll(2) found the eventfd
    /// readable. Short of [`STOP`], what woke it (a linger order, or the
    /// object letting the descriptor go) is read, so that poll(2) blocks
    /// again; a stop order written meanwhile is written back, as the stop
    /// path relies on the eventfd staying readable.
    fn told(&self, woken: bool) -> u8 {
        let t = self.told.load(SeqCst);
        if !woken || t == STOP {
            return t;
        }
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a live u64 from our eventfd.
        unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
        let t = self.told.load(SeqCst);
        if t == STOP {
            let one = 1u64;
            // SAFETY: writing 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
        }
        t
    }

    /// Whether the reader holds the last reference to its own descriptor.
    fn alone(&self) -> bool {
        self.own.is_some_and(|u| Arc::strong_count(u) == 1)
    }
}

/// How often a handler thread reads every descriptor, whatever poll(2)
/// last said (see `read_batch`).
pub(super) const SWEEP_NS: u64 = 1_000_000;

/// What poll(2) found readable: the stop eventfd, and each descriptor.
pub(super) struct Ready {
    stop: bool,
    fds: [bool; 2],
}

/// Blocks in poll(2) until one of `fds` or `stop` (an eventfd) is
/// readable, or for `timeout_ms` (-1: no limit). EINTR is retried.
pub(super) fn wait_ready(fds: &[&Uffd], stop: i32, timeout_ms: i32) -> Ready {
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
        let rc = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
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
    wait_ready(fds, stop, -1).stop
}

/// Reads a batch from whichever descriptor has one, spinning for
/// `spin_us` then blocking in poll. `None` when the pool is stopping and
/// its descriptors hold nothing more (or [`STOP_DRAIN`] batches later), or
/// when a lingering reader's descriptor is its alone and holds nothing (or
/// fails for good); a
/// descriptor that fails for good is logged and the thread goes on with the
/// others (a handler thread that left silently would strand its faults).
pub(super) fn read_batch(
    mm: &Mm,
    fds: &[&Uffd],
    stop: &Stop<'_>,
    spin_us: u32,
    msgs: &mut [Msg],
    at: &mut ReadState,
) -> Option<(usize, usize)> {
    let ReadState {
        ready,
        swept,
        drained,
        lingering,
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
            // Nothing left to read: wait for the stop signal only. A reader
            // told to linger leaves too (it can serve nothing), or the
            // object's wake, consumed, would leave it waiting here until
            // the pager goes.
            return if *lingering || wait_readable(&[], stop.fd) {
                None
            } else {
                Some((0, 0))
            };
        }
        if spin_us > 0 && now_ns() < deadline {
            std::hint::spin_loop();
            continue;
        }
        let r = wait_ready(fds, stop.fd, if *lingering { LINGER_POLL_MS } else { -1 });
        let readable = r.fds.iter().any(|&f| f);
        match stop.told(r.stop) {
            // Told to stop (the pager goes): what the descriptors hold is
            // read first. Bounded: a descriptor that stays readable and
            // yields nothing does not keep the thread.
            STOP if !readable || *drained >= STOP_DRAIN => return None,
            STOP => *drained += 1,
            // Its region is gone (see the module docs): it leaves once
            // nothing else holds its descriptor and it holds nothing, the
            // region's own unmap among what it reads first.
            LINGER => {
                *lingering = true;
                if !readable && stop.alone() {
                    return None;
                }
            }
            _ => {}
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
    /// Told to [`LINGER`].
    lingering: bool,
}

impl ReadState {
    /// A reader's state before its first batch: every descriptor may hold
    /// messages.
    pub(super) fn new() -> ReadState {
        ReadState {
            ready: [true; 2],
            swept: 0,
            drained: 0,
            lingering: false,
        }
    }
}

/// How many more reads a reader told to stop makes of descriptors that
/// poll(2) reports readable ([`read_batch`]).
const STOP_DRAIN: u32 = 64;
