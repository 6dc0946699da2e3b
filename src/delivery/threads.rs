//! Handler-thread delivery: a pool of threads reads fault messages (many per
//! read) from the pager's descriptor and resolves them, optionally spinning
//! on the non-blocking descriptor before blocking in poll(2).

use super::done::{page_mapped, waits_on_a_fault, Done, BATCH};
use super::read::{read_batch, wait_readable, ReadState, Stop, LINGER, SERVE, STOP};
use crate::address_space::Mm;
use crate::fault::{handle_fault_once, Resolution};
use crate::sys::uffd::{fault_flag, Msg, Uffd, EVENT_PAGEFAULT};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A running pool; stops and joins its threads on drop.
#[derive(Debug)]
pub struct HandlerPool {
    /// The eventfd that wakes the threads (shared with a region's
    /// [`OwnDescriptor`](crate::sys::uffd::OwnDescriptor)).
    stop: Arc<OwnedFd>,
    /// What they are told (`read::SERVE`, `LINGER` or `STOP`).
    told: Arc<AtomicU8>,
    threads: Vec<JoinHandle<()>>,
}

/// What a pool serves.
#[derive(Debug, Clone)]
pub enum Serve {
    /// Fault messages and events on the pager's two descriptors.
    Faults,
    /// Fault messages and events on one region's own descriptor.
    Region(Arc<Uffd>),
    /// Events only, on the pager's two descriptors (in-thread delivery:
    /// faults arrive as SIGBUS, so the descriptors carry nothing else).
    Events,
}

impl HandlerPool {
    /// Starts `n` handler threads for `mm`, serving its descriptors.
    pub fn start(mm: &Arc<Mm>, n: usize, spin_us: u32) -> std::io::Result<HandlerPool> {
        Self::start_on(mm, Serve::Faults, n, spin_us, "uffd-handler")
    }

    /// Starts `n` threads for `mm` serving `what`.
    pub fn start_on(
        mm: &Arc<Mm>,
        what: Serve,
        n: usize,
        spin_us: u32,
        name: &str,
    ) -> std::io::Result<HandlerPool> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that we now own.
        let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut pool = HandlerPool {
            stop,
            told: Arc::new(AtomicU8::new(SERVE)),
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let mm = mm.clone();
            let what = what.clone();
            let stopfd = pool.stop.as_raw_fd();
            let told = pool.told.clone();
            // Dropping `pool` on a failed spawn stops the threads started.
            pool.threads.push(crate::sys::thread::spawn(
                format!("{name}-{i}"),
                move || {
                    let (fds, own): (Vec<&Uffd>, _) = match &what {
                        Serve::Faults | Serve::Events => (vec![&mm.uffd, &mm.uffd_quiet], None),
                        Serve::Region(u) => (vec![u], Some(u)),
                    };
                    let stop = Stop {
                        fd: stopfd,
                        told: &told,
                        own,
                    };
                    if matches!(what, Serve::Events) {
                        serve_events(&mm, &fds, stopfd)
                    } else {
                        serve(&mm, &fds, &stop, spin_us)
                    }
                },
            )?);
        }
        Ok(pool)
    }
}

impl HandlerPool {
    /// Tells the threads to stop, without waiting for them.
    pub fn signal_stop(&self) {
        self.told.store(STOP, SeqCst);
        wake(&self.stop);
    }

    /// Tells a region's own reader that its region is gone: it serves
    /// its descriptor until that is its alone, then leaves (see
    /// `read`'s module docs). A pool told to stop stays stopping.
    pub fn signal_linger(&self) {
        let _ = self.told.compare_exchange(SERVE, LINGER, SeqCst, SeqCst);
        wake(&self.stop);
    }

    /// The eventfd that wakes the threads, for whoever lets a lingering
    /// reader's descriptor go.
    pub fn waker(&self) -> Arc<OwnedFd> {
        self.stop.clone()
    }

    /// Whether every thread has returned (so dropping the pool waits for
    /// nothing).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }
}

impl Drop for HandlerPool {
    fn drop(&mut self) {
        self.signal_stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Wakes the threads of a pool through its eventfd `fd`. Async-signal-safe.
pub(super) fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a live u64 to an eventfd we hold.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// In-thread delivery's event reader: when a descriptor becomes readable,
/// takes the event gate *first* (faults and reclaim leave their sections),
/// then reads and applies every event. The application's call stays
/// blocked until the read, so nothing acts on the range before the engine
/// knows what happened to it.
fn serve_events(mm: &Mm, fds: &[&Uffd], stopfd: i32) {
    let mut msgs = [Msg::default(); BATCH];
    loop {
        if wait_readable(fds, stopfd) {
            return;
        }
        let gate = mm.events.gate.write();
        for u in fds {
            while let Ok(n) = mm.events.read(u, &mut msgs) {
                if n == 0 {
                    break;
                }
            }
        }
        let released = crate::events::apply::queued_locked(mm, &gate);
        // (Objects the events left are released outside the gate.)
        drop(gate);
        drop(released);
    }
}

/// Handles one fault message; returns false if it must be retried after
/// the events waiting are applied. `since`: when this message was first
/// tried ([`crate::sys::now_ns`]), which its latency counts from.
fn handle_msg(mm: &Mm, uffd: &Uffd, m: &Msg, done: &mut Done, since: u64) -> bool {
    let addr = m.arg1 as usize;
    crate::inject::before_message(addr, m.arg2 as u32);
    let access = crate::fault::Access {
        write: m.arg0 & fault_flag::WRITE != 0,
        present: Some(m.arg0 & fault_flag::WP != 0),
        region: None,
    };
    // A fault that may wait for a store read first wakes the ones this
    // thread served before it (their pages are in): before, they slept
    // until the slow one was done, up to the I/O timeout per attempt.
    if done.pending() && mm.may_read_store(addr) {
        done.wake(mm, uffd);
    }
    let signal_thread = |sig: libc::c_int| {
        // SAFETY: plain syscalls; the thread id came from the kernel
        // (UFFD_FEATURE_THREAD_ID).
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), m.arg2 as libc::c_int, sig) };
    };
    // A panic here is an engine bug (a store's is caught where it is
    // called: on the I/O workers, or by `io::caught` for a signal-safe
    // store called here): the faulting thread gets SIGBUS instead of
    // waiting forever for a handler that left.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        handle_fault_once(mm, addr, access, since)
    }));
    match r {
        Ok(Resolution::Restart) => return false,
        // A poisoned page's access gets SIGBUS from the kernel when it runs
        // again; one with no page and no mark would fault again at once, for
        // ever (an empty huge page pool): it gets the signal from here.
        Ok(Resolution::Resolved) | Ok(Resolution::Bus) => {}
        Ok(Resolution::NoPage) => signal_thread(libc::SIGBUS),
        // No region: the message may be stale (its thread left the kernel's
        // wait early, on a signal or a spurious wake-up, faulted again, was
        // woken when the other message for the page was served, and has
        // since unmapped the region and gone on, perhaps into a new region
        // at the same address). A signal would kill it at whatever it does
        // now; a wake lets a thread that really waits run its access again,
        // and the kernel answers it (SIGSEGV on the PROT_NONE or unmapped
        // range, a new fault in a region mapped there since). But a range
        // the kernel still has registered while no region covers it (the
        // part of a region the application grew with its own `mremap`: the
        // event reports the old length only) faults again at once, for
        // ever: the same thread at the same page a third time in a row,
        // with the events applied (the driver restarts while they are
        // not), gets SIGSEGV, as in-thread delivery answers it.
        // Only where the page is still mapped and the thread waits in the
        // kernel's userfault wait now, though: a thread whose
        // stale messages came three times in a row (it maps, reads and
        // unmaps at one address in a loop while signals interrupt its
        // faults) was killed at whatever it did next, and an unmapped page
        // needs no signal from here (the kernel answers a thread that
        // really waits when its access runs again).
        Ok(Resolution::NoRegion) => {
            // (And not where a region has been mapped since the look: the
            // thread's new region, which it may be reading now.)
            if done.unserved_again(m.arg2 as u32, addr)
                && page_mapped(addr)
                && waits_on_a_fault(m.arg2 as u32)
                && !mm.owns_live(addr)
            {
                mm.counters.inc(crate::stats::Counter::SEGV);
                signal_thread(libc::SIGSEGV);
            }
        }
        // The region refuses the access (a write to a page of a read-only
        // store, or to a kernel-mapped region). The message may be stale
        // too: a write the thread made to a region it has since unmapped,
        // with a read-only region mapped at the address now, which the
        // thread may be reading; a signal at once killed it there. As for
        // no region: the thread gets SIGSEGV only when the same fault
        // comes a third time in a row and it waits in the kernel's
        // userfault wait (a refused access run again faults again at
        // once).
        Ok(Resolution::Segv) => {
            if done.unserved_again(m.arg2 as u32, addr) && waits_on_a_fault(m.arg2 as u32) {
                mm.counters.inc(crate::stats::Counter::SEGV);
                signal_thread(libc::SIGSEGV);
            }
        }
        Err(_) => {
            tracing::error!(
                addr,
                "the fault handler panicked; the faulting thread gets SIGBUS"
            );
            signal_thread(libc::SIGBUS);
        }
    }
    done.push(mm, uffd, addr);
    true
}

fn serve(mm: &Mm, fds: &[&Uffd], stop: &Stop<'_>, spin_us: u32) {
    let mut msgs = [Msg::default(); BATCH];
    let mut done = [Done::new(), Done::new()];
    // Faults that met an unread event, with the descriptor they came from
    // and when they were first tried.
    let mut again: Vec<(usize, Msg, u64)> = Vec::new();
    let mut at = ReadState::new();
    loop {
        let Some((k, n)) = read_batch(mm, fds, stop, spin_us, &mut msgs, &mut at) else {
            return;
        };
        // Events first (in read order, under the gate), then the faults: a
        // fault that raced the application's call on its page may be
        // served either side of it.
        crate::events::apply::queued(mm);
        for m in &msgs[..n] {
            let since = crate::sys::now_ns();
            if m.event == EVENT_PAGEFAULT && !handle_msg(mm, fds[k], m, &mut done[k], since) {
                again.push((k, *m, since));
            }
        }
        for (j, u) in fds.iter().enumerate() {
            done[j].wake(mm, u);
        }
        // Faults that met an event: read what is waiting (the event among
        // it), apply it, and try them again.
        while !again.is_empty() {
            for (j, u) in fds.iter().enumerate() {
                while let Ok(n) = mm.events.read(u, &mut msgs) {
                    if n == 0 {
                        break;
                    }
                    again.extend(
                        msgs[..n]
                            .iter()
                            .filter(|m| m.event == EVENT_PAGEFAULT)
                            .map(|m| (j, *m, crate::sys::now_ns())),
                    );
                }
            }
            crate::events::apply::queued(mm);
            again.retain(|(j, m, since)| !handle_msg(mm, fds[*j], m, &mut done[*j], *since));
            for (j, u) in fds.iter().enumerate() {
                done[j].wake(mm, u);
            }
            if !again.is_empty() {
                std::thread::yield_now();
            }
        }
    }
}
