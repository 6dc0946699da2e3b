//! Faults a handler thread has resolved and not yet woken ([`Done`]),
//! and the ones it could not serve: batched wake-ups (one `UFFDIO_WAKE`
//! per run of adjacent pages), and the count that turns a fault that
//! keeps finding no region into a SIGSEGV once its thread is seen waiting
//! on it.

use crate::address_space::Mm;
use crate::stats::Counter::UFFD_WAKE;
use crate::sys::uffd::Uffd;
use crate::sys::{now_ns, PAGE_SIZE};

/// Messages read per read(2), and faults a batch wakes at most.
pub(super) const BATCH: usize = 16;

/// Faults resolved and waiting to be woken, per descriptor.
pub(super) struct Done {
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
    pub(super) fn new() -> Self {
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
    pub(super) fn unserved_again(&mut self, tid: u32, addr: usize) -> bool {
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

    pub(super) fn push(&mut self, mm: &Mm, uffd: &Uffd, addr: usize) {
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

    /// Whether faults wait to be woken.
    pub(super) fn pending(&self) -> bool {
        self.n > 0
    }

    pub(super) fn wake(&mut self, mm: &Mm, uffd: &Uffd) {
        wake_batch(mm, uffd, &mut self.pages[..self.n]);
        self.n = 0;
    }
}

/// Whether anything is mapped at `addr`'s page (`msync` of one page with
/// no flags fails with `ENOMEM` where nothing is; it writes nothing).
pub(super) fn page_mapped(addr: usize) -> bool {
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
pub(super) fn waits_on_a_fault(tid: u32) -> bool {
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
