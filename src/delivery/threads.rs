//! Handler-thread delivery: a pool of threads reads fault messages (many per
//! read) from the pager's descriptor and resolves them, optionally spinning
//! on the non-blocking descriptor before blocking in poll(2).

use super::read::{read_batch, wait_readable, ReadState, Stop, LINGER, SERVE, STOP};
use crate::address_space::Mm;
use crate::fault::{handle_fault_once, Resolution};
use crate::stats::Counter::UFFD_WAKE;
use crate::sys::uffd::{fault_flag, Msg, Uffd, EVENT_PAGEFAULT};
use crate::sys::{now_ns, PAGE_SIZE};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Messages read per read(2).
const BATCH: usize = 16;

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

/// Faults resolved and waiting to be woken, per descriptor.
struct Done {
    pages: [usize; BATCH],
    n: usize,
    oldest: u64,
    /// The last faults that found no region or were refused: (thread id,
    /// page), how many times it came, and when it last did. Several, not
    /// the last one alone: two threads refused by turns (two of the
    /// application's writes to a read-only region) reset each other's
    /// count, and neither ever got its SIGSEGV (each spun for ever).
    unserved: [((u32, usize), u32, u64); UNSERVED_SLOTS],
}

/// How many faults [`Done::unserved_again`] follows at once: more than
/// the threads an application refuses by turns (with fewer slots than
/// that, each is pushed out before it comes back, and none is signalled).
const UNSERVED_SLOTS: usize = 64;

/// How many times in a row one thread's fault on one page may find no
/// region and be woken before it gets SIGSEGV...
const UNSERVED_WAKES: u32 = 2;
/// ... each within this long of the one before (a thread that faults
/// again at once is stuck, though its wake may wait for the rest of a
/// handler's batch, slow store reads among them; stale messages do not
/// come three in a second).
const UNSERVED_WITHIN_NS: u64 = 1_000_000_000;

impl Done {
    fn new() -> Self {
        Done {
            pages: [0; BATCH],
            n: 0,
            oldest: 0,
            unserved: [((0, usize::MAX), 0, 0); UNSERVED_SLOTS],
        }
    }

    /// Records that thread `tid`'s fault at `addr` found no region (or a
    /// region that refuses it); true if it has come more than
    /// [`UNSERVED_WAKES`] times, each within [`UNSERVED_WITHIN_NS`] of the
    /// one before.
    fn unserved_again(&mut self, tid: u32, addr: usize) -> bool {
        let key = (tid, addr & !(PAGE_SIZE - 1));
        let now = now_ns();
        let e = match self.unserved.iter().position(|e| e.0 == key) {
            Some(k) => &mut self.unserved[k],
            None => {
                // The one heard of longest ago makes room.
                let k = (0..UNSERVED_SLOTS)
                    .min_by_key(|&k| self.unserved[k].2)
                    .unwrap_or(0);
                self.unserved[k] = (key, 0, 0);
                &mut self.unserved[k]
            }
        };
        if e.1 > 0 && now - e.2 < UNSERVED_WITHIN_NS {
            e.1 += 1;
        } else {
            e.1 = 1;
        }
        e.2 = now;
        if e.1 > UNSERVED_WAKES {
            // (Counted afresh after the signal.)
            e.1 = 0;
            return true;
        }
        false
    }

    fn push(&mut self, mm: &Mm, uffd: &Uffd, addr: usize) {
        if self.n == BATCH {
            self.wake(mm, uffd);
        }
        self.pages[self.n] = addr & !(PAGE_SIZE - 1);
        self.n += 1;
        // A slow fault (a store read) must not hold back the wake-ups of
        // the ones handled before it: they are woken before it starts (see
        // `handle_msg`), and here once the first pending one has waited
        // long enough.
        let now = now_ns();
        if self.n == 1 {
            self.oldest = now;
        } else if now - self.oldest > WAKE_DELAY_NS {
            self.wake(mm, uffd);
        }
    }

    fn wake(&mut self, mm: &Mm, uffd: &Uffd) {
        wake_batch(mm, uffd, &mut self.pages[..self.n]);
        self.n = 0;
    }
}

/// Whether anything is mapped at `addr`'s page (`msync` of one page with
/// no flags fails with `ENOMEM` where nothing is; it writes nothing).
fn page_mapped(addr: usize) -> bool {
    let page = addr & !(PAGE_SIZE - 1);
    // SAFETY: msync only looks the range up; with no flags it neither
    // writes nor invalidates anything.
    unsafe { libc::msync(page as *mut libc::c_void, PAGE_SIZE, 0) == 0 }
}

/// Whether thread `tid` of this process sleeps in the kernel's userfault
/// wait now (its `wchan`), or that cannot be told (then true: the caller
/// acts as before). Read only on the rare path of a fault that found no
/// region three times in a row.
///
/// The kernel shows a thread that runs, or waits to run, with a `wchan` of
/// `0`, which was taken for "cannot be told": a thread that had mapped a
/// new region at the address and was reading it got the SIGSEGV (found by
/// review). Its state (`R` in `stat`) tells: a thread that waits on a fault
/// sleeps.
fn waits_on_a_fault(tid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/self/task/{tid}/wchan")) {
        Ok(w) if !w.is_empty() && w != "0" => w.trim() == "handle_userfault",
        _ => !is_running(tid),
    }
}

/// Whether thread `tid` of this process runs or waits to run (state `R` in
/// its `stat`; the state follows the command name, which may hold any
/// byte, so it is read after the last `)`).
fn is_running(tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| Some(s[s.rfind(')')? + 1..].trim_start().starts_with('R')))
        .unwrap_or(false)
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
    };
    // A fault that may wait for a store read first wakes the ones this
    // thread served before it (their pages are in): before, they slept
    // until the slow one was done, up to the I/O timeout per attempt.
    if done.n > 0 && mm.may_read_store(addr) {
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

/// How long a resolved fault may wait for the rest of its batch before its
/// thread is woken anyway.
const WAKE_DELAY_NS: u64 = 10_000;

/// Wakes the faulters of a handled batch. Installs never wake (DONTWAKE),
/// so this is the one place they are woken: one `UFFDIO_WAKE` per run of
/// adjacent pages (several threads faulting one page, or a run of
/// neighbours, take one call). Runs are not merged across gaps: a waiter
/// in a gap may be a fault not handled yet, which a wake would only send
/// back to fault again. A range that was unregistered meanwhile has no
/// waiters left, so errors are ignored.
fn wake_batch(mm: &Mm, uffd: &Uffd, pages: &mut [usize]) {
    pages.sort_unstable();
    for (start, len) in runs(pages) {
        let _ = uffd.wake(start, len);
        mm.counters.inc(UFFD_WAKE);
    }
}

/// The runs of adjacent (or equal) pages in sorted `pages`, as (start,
/// length in bytes).
fn runs(pages: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = *pages.get(i)?;
        let mut end = start + PAGE_SIZE;
        i += 1;
        while i < pages.len() && pages[i] <= end {
            end = pages[i] + PAGE_SIZE;
            i += 1;
        }
        Some((start, end - start))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_runs_merge_equal_and_adjacent_pages_only() {
        let p = PAGE_SIZE;
        let pages = [p, p, 2 * p, 3 * p, 5 * p, 9 * p, 9 * p];
        let got: Vec<_> = runs(&pages).collect();
        assert_eq!(got, vec![(p, 3 * p), (5 * p, p), (9 * p, p)]);
        assert_eq!(runs(&[]).count(), 0);
    }

    /// A thread that runs is not one waiting on a fault: its `wchan` is
    /// `0`, which counted as "cannot be told" (and so as waiting).
    #[test]
    fn a_running_or_sleeping_thread_does_not_wait_on_a_fault() {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
        let stop = AtomicBool::new(false);
        let tid = AtomicU32::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: gettid has no preconditions.
                tid.store(unsafe { libc::gettid() } as u32, SeqCst);
                while !stop.load(Relaxed) {
                    std::hint::spin_loop();
                }
            });
            while tid.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            let t = tid.load(SeqCst);
            let (running, waits) = (is_running(t), waits_on_a_fault(t));
            stop.store(true, Relaxed);
            assert!(running);
            assert!(!waits, "a spinning thread");
        });
        let tid = AtomicU32::new(0);
        let (go, wait) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let tid = &tid;
            s.spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid.store(unsafe { libc::gettid() } as u32, SeqCst);
                let _ = wait.recv();
            });
            while tid.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            let waits = waits_on_a_fault(tid.load(SeqCst));
            go.send(()).unwrap();
            assert!(!waits, "a thread in a futex wait");
        });
    }

    #[test]
    fn only_a_third_unserved_fault_in_quick_succession_is_signalled() {
        let mut d = Done::new();
        let p = PAGE_SIZE;
        assert!(!d.unserved_again(7, p + 1));
        assert!(!d.unserved_again(7, p + 2));
        assert!(d.unserved_again(7, p + 3), "the third");
        // Counted afresh after the signal.
        assert!(!d.unserved_again(7, p));
        // Two threads refused by turns each reach their third (they reset
        // each other's count before, and neither was ever signalled).
        assert!(!d.unserved_again(8, p));
        assert!(!d.unserved_again(7, p));
        assert!(!d.unserved_again(8, p));
        assert!(d.unserved_again(7, p), "7's third, 8's between");
        assert!(d.unserved_again(8, p), "8's third");
        // Stale messages far apart never add up.
        assert!(!d.unserved_again(9, p));
        assert!(!d.unserved_again(9, p));
        for e in d.unserved.iter_mut() {
            e.2 = e.2.saturating_sub(UNSERVED_WITHIN_NS);
        }
        assert!(!d.unserved_again(9, p));
    }
}
