//! [`Pins`]: a count of users of an object that may outlive the read
//! section they found it in, and a sleeping wait for the last to go.
//!
//! The SIGBUS handler finds a fault's address space in an [`Rcu`] snapshot,
//! but a fault can last as long as its store takes (a hung store: up to its
//! timeouts, tens of seconds). Held in the read section, that fault would
//! hold every writer of the snapshot (every other pager's build and drop)
//! in a spinning grace period. So the handler pins the address space's
//! entry inside the read section and leaves it; the entry's owner, having
//! removed it from the snapshot (after which no new pin can be taken),
//! sleeps in [`Pins::wait_unpinned`] until the running faults are done.
//! SRCU's split of one long read side from the short lookup, in miniature.
//!
//! # Contract and cost
//! - [`Pins::pin`]: async-signal-safe, never blocks: one atomic add on the
//!   current CPU's own counter (faulting threads on different CPUs write no
//!   line in common). Its guard's drop is one atomic subtract on the same
//!   counter and one load; it makes a `futex` wake only while someone
//!   waits.
//! - [`Pins::wait_unpinned`]: only after nothing can take a new pin (the
//!   caller removed every way to find the object); sleeps on a futex, and
//!   re-checks every 50 ms in case a wake is lost to a signal.
//!
//! # Hazard: freeing the `Pins`
//! [`Pins::wait_unpinned`] returns once the count is zero, which the last
//! unpin makes with its first step: that unpin then still reads
//! `draining` and bumps `wakes`. The owner must not free the `Pins` until
//! every unpin has left its drop. The SIGBUS handler drops its pin inside
//! a read section of the registry, and the owner waits out a grace period
//! of the registry before it frees the entry (an unpin that ran on freed
//! memory bumped a word of whatever the allocator handed out next).
//!
//! [`Rcu`]: crate::sync::rcu::Rcu

use crate::sync::model::{cpu_count, futex, this_cpu, AtomicU32, AtomicU64};
use std::sync::atomic::Ordering::SeqCst;

/// One CPU's pin count, on a cache line of its own.
#[repr(align(64))]
#[derive(Debug, Default)]
struct CpuPins(AtomicU64);

/// See the module docs.
#[derive(Debug)]
pub struct Pins {
    cpus: Box<[CpuPins]>,
    /// Set once the owner waits: unpinning then wakes it.
    draining: AtomicU32,
    /// The futex word the owner sleeps on; bumped by every unpin while
    /// `draining` is set.
    wakes: AtomicU32,
}

impl Default for Pins {
    fn default() -> Self {
        Pins {
            cpus: (0..cpu_count()).map(|_| CpuPins::default()).collect(),
            draining: AtomicU32::new(0),
            wakes: AtomicU32::new(0),
        }
    }
}

/// A pin taken by [`Pins::pin`]; dropping it unpins.
#[derive(Debug)]
pub struct Pin<'a> {
    pins: &'a Pins,
    cpu: usize,
}

impl Pins {
    /// Takes a pin (see the module docs). Async-signal-safe.
    #[inline]
    pub fn pin(&self) -> Pin<'_> {
        let cpu = this_cpu() % self.cpus.len();
        self.cpus[cpu].0.fetch_add(1, SeqCst);
        Pin { pins: self, cpu }
    }

    /// How many pins are held now.
    pub fn count(&self) -> u64 {
        self.cpus
            .iter()
            .map(|c| c.0.load(SeqCst))
            .fold(0u64, u64::wrapping_add)
    }

    /// Sleeps until no pin is held. The caller guarantees that no new pin
    /// can be taken (counts only fall), so a zero sum read once is final.
    pub fn wait_unpinned(&self) {
        self.draining.store(1, SeqCst);
        // (Store, then load of the other side's word: see `model`.)
        #[cfg(loom)]
        crate::sync::model::loom_store_load_fence();
        loop {
            let seen = self.wakes.load(SeqCst);
            if self.count() == 0 {
                return;
            }
            // An unpin after the load above bumps `wakes` (it sees
            // `draining`: both are SeqCst, and `draining` was set first), so
            // the wait returns at once or is woken.
            futex::wait_timeout(&self.wakes, seen, 50_000_000);
        }
    }
}

impl Drop for Pin<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pins.cpus[self.cpu].0.fetch_sub(1, SeqCst);
        // (The owner may see the count at zero from here: see the module
        // docs' hazard.)
        #[cfg(feature = "fault-inject")]
        hook::after_unpin();
        #[cfg(loom)]
        crate::sync::model::loom_store_load_fence();
        if self.pins.draining.load(SeqCst) != 0 {
            self.pins.wakes.fetch_add(1, SeqCst);
            futex::wake_all(&self.pins.wakes);
        }
    }
}

/// A test hook (feature `fault-inject`): runs in every unpin, right after
/// the count went down.
#[cfg(feature = "fault-inject")]
pub mod hook {
    use std::sync::atomic::{AtomicUsize, Ordering::*};

    static AFTER_UNPIN: AtomicUsize = AtomicUsize::new(0);

    /// Sets the function every unpin calls once its count went down (it
    /// runs in the SIGBUS handler: it must be async-signal-safe). `None`
    /// clears it.
    pub fn set_after_unpin(h: Option<fn()>) {
        AFTER_UNPIN.store(h.map_or(0, |f| f as usize), Release);
    }

    pub(super) fn after_unpin() {
        let p = AFTER_UNPIN.load(Acquire);
        if p != 0 {
            // SAFETY: only `set_after_unpin` stores here, and it stores a
            // valid `fn()`.
            let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(p) };
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn the_wait_returns_when_the_last_pin_goes() {
        let pins = Arc::new(Pins::default());
        let released = Arc::new(AtomicBool::new(false));
        let held = {
            let (pins, released) = (pins.clone(), released.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            let t = std::thread::spawn(move || {
                let a = pins.pin();
                let b = pins.pin();
                tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(30));
                drop(a);
                std::thread::sleep(Duration::from_millis(30));
                released.store(true, Relaxed);
                drop(b);
            });
            rx.recv().unwrap();
            t
        };
        assert_eq!(pins.count(), 2);
        let t0 = Instant::now();
        pins.wait_unpinned();
        assert!(released.load(Relaxed), "the wait returned with a pin held");
        assert_eq!(pins.count(), 0);
        // Woken, not found by the 50 ms re-check alone (loosely: a loaded
        // machine may be slow either way).
        assert!(t0.elapsed() < Duration::from_secs(5));
        held.join().unwrap();
    }

    #[test]
    fn with_no_pins_the_wait_returns_at_once() {
        let pins = Pins::default();
        drop(pins.pin());
        pins.wait_unpinned();
        assert_eq!(pins.count(), 0);
    }
}
