//! A tiny read-copy-update cell: lockless, wait-free-ish reads of an
//! immutable snapshot, with writers that publish a new snapshot and wait for
//! a grace period before freeing the old one.
//!
//! This is what region lookup stands on (the engine's `lock_vma_under_rcu`).
//! General-purpose crates such as arc-swap keep per-thread state that is set
//! up lazily (allocation), which is not allowed in a signal handler; this
//! cell's read side is two atomic RMWs on the current CPU's own counter
//! and three loads of lines that only writers change (the epoch before and
//! after the count, then the pointer).
//!
//! # Contract and cost
//! - [`Rcu::read`]: async-signal-safe, never blocks; the reference it passes
//!   is valid only inside the closure. Its counter is per CPU, as SRCU's
//!   are: faulting threads on different CPUs share no written cache line
//!   (with one shared counter, every fault bounced it between CPUs). A
//!   reader that moves to another CPU mid-read still decrements the counter
//!   it incremented.
//! - [`Rcu::replace`]: serialised internally; spins (yielding) until every
//!   reader that could see the old snapshot has left (the old parity's
//!   counters of every CPU sum to zero), then returns it. Readers are short
//!   (a lookup and a trylock), so the wait is short; it reads one line per
//!   CPU.

use crate::sync::model::{
    cpu_count, spin_loop, this_cpu, yield_now, AtomicPtr, AtomicU32, AtomicU64,
};
use std::sync::atomic::Ordering::*;

/// One CPU's reader counts, one per epoch parity, on a line of their own.
#[repr(align(64))]
#[derive(Debug, Default)]
struct CpuReaders([AtomicU64; 2]);

/// See the module docs.
#[derive(Debug)]
pub struct Rcu<T> {
    ptr: AtomicPtr<T>,
    epoch: AtomicU64,
    readers: Box<[CpuReaders]>,
    /// Writers' lock: 1 while one updates. A plain word, not a mutex, so
    /// that a `fork()`ed child can clear it ([`Rcu::reset_in_child`]);
    /// writers are few, and wait (yielding) only for each other.
    writer: AtomicU32,
}

/// Holds [`Rcu::writer`]; releases it on drop (a panic in an update's
/// closure too).
struct WriterGuard<'a>(&'a AtomicU32);

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.0.store(0, Release);
    }
}

// SAFETY: the cell hands out only shared references to `T` (readers) and
// moves `T` between threads (writers), so `T: Send + Sync` suffices.
unsafe impl<T: Send + Sync> Send for Rcu<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Rcu<T> {}

impl<T> Rcu<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> Self {
        Rcu {
            ptr: AtomicPtr::new(Box::into_raw(Box::new(value))),
            epoch: AtomicU64::new(0),
            readers: (0..cpu_count()).map(|_| CpuReaders::default()).collect(),
            writer: AtomicU32::new(0),
        }
    }

    /// Runs `f` on the current snapshot. Async-signal-safe.
    #[inline]
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let cpu = &self.readers[this_cpu() % self.readers.len()];
        let slot = loop {
            let e = self.epoch.load(SeqCst);
            let slot = &cpu.0[(e & 1) as usize];
            slot.fetch_add(1, SeqCst);
            #[cfg(loom)]
            crate::sync::model::loom_store_load_fence();
            if self.epoch.load(SeqCst) == e {
                break slot;
            }
            slot.fetch_sub(1, SeqCst);
        };
        let p = self.ptr.load(SeqCst);
        // SAFETY: `p` came from `Box::into_raw` and is freed only by
        // `replace` after a grace period that waits for this reader (it
        // registered in the slot of the current epoch before loading `p`).
        let r = f(unsafe { &*p });
        slot.fetch_sub(1, Release);
        r
    }

    /// Publishes `value` and returns the previous snapshot once no reader
    /// can still see it.
    pub fn replace(&self, value: T) -> T {
        self.update(|_| value)
    }

    /// Publishes `f(current)` and returns the previous snapshot once no
    /// reader can still see it. Writers are serialised, so `f` sees the
    /// latest snapshot (no lost updates).
    pub fn update(&self, f: impl FnOnce(&T) -> T) -> T {
        while self
            .writer
            .compare_exchange_weak(0, 1, Acquire, Relaxed)
            .is_err()
        {
            yield_now();
        }
        let _w = WriterGuard(&self.writer);
        // SAFETY: writers are serialised by `_w` and only writers free
        // snapshots, so the current one stays valid while we read it.
        let new = f(unsafe { &*self.ptr.load(SeqCst) });
        let old = self.ptr.swap(Box::into_raw(Box::new(new)), SeqCst);
        let e = self.epoch.fetch_add(1, SeqCst);
        let parity = (e & 1) as usize;
        #[cfg(loom)]
        crate::sync::model::loom_store_load_fence();
        // A reader of the old parity that a CPU's count misses because it
        // incremented after we read that count sees the new epoch on its
        // recheck and backs out (all accesses are SeqCst), so a zero sum
        // means no reader can hold `old`.
        let busy = || {
            self.readers
                .iter()
                .map(|c| c.0[parity].load(SeqCst))
                .fold(0u64, u64::wrapping_add)
                != 0
        };
        let mut spins = 0u32;
        while busy() {
            spins += 1;
            if spins < 64 {
                spin_loop();
            } else {
                yield_now();
            }
        }
        // SAFETY: `old` came from `Box::into_raw`; the grace period above
        // ensures no reader holds a reference to it.
        *unsafe { Box::from_raw(old) }
    }

    /// In a `fork()`ed child, from its atfork handler: clears every reader
    /// count and the writers' lock. The threads of the parent's that were
    /// inside a read section or an update at the fork are not in the
    /// child, and what they left set made the child's first update wait
    /// for ever (found by review: a child's first in-thread pager hung in
    /// its registration). Async-signal-safe.
    ///
    /// # Safety
    /// Only in a child just made by `fork`, whose one thread is not inside
    /// a read section or an update of this cell (a `fork` from a signal
    /// handler that interrupted one is not allowed).
    pub unsafe fn reset_in_child(&self) {
        for cpu in self.readers.iter() {
            for slot in &cpu.0 {
                slot.store(0, SeqCst);
            }
        }
        self.writer.store(0, SeqCst);
    }
}

impl<T> Drop for Rcu<T> {
    fn drop(&mut self) {
        #[cfg(not(loom))]
        let p = *self.ptr.get_mut();
        #[cfg(loom)]
        let p = self.ptr.with_mut(|p| *p);
        // SAFETY: `&mut self`: no readers remain, and `p` came from
        // `Box::into_raw`.
        drop(unsafe { Box::from_raw(p) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_see_a_whole_snapshot() {
        let c = Arc::new(Rcu::new(vec![0u64; 64]));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let r = {
            let (c, stop, reads) = (c.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    c.read(|v| {
                        let first = v[0];
                        assert!(v.iter().all(|&x| x == first));
                    });
                    reads.fetch_add(1, Relaxed);
                }
            })
        };
        // Let the reader get going before the writer races it.
        while reads.load(Relaxed) == 0 {
            std::thread::yield_now();
        }
        for i in 1..2000u64 {
            let old = c.replace(vec![i; 64]);
            assert_eq!(old[0], i - 1);
        }
        stop.store(true, Relaxed);
        r.join().unwrap();
        assert!(reads.load(Relaxed) > 0);
    }

    /// Pins the calling thread to `cpu`; false if it cannot run there.
    fn pin_to(cpu: usize) -> bool {
        // SAFETY: a zeroed cpu_set_t is empty; we set one CPU and pass its
        // size; sched_setaffinity(0, ..) applies to the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) == 0
        }
    }

    /// A reader that moves to another CPU inside its read section still
    /// holds the grace period: the writer returns only after it left.
    #[test]
    fn a_reader_that_changes_cpu_holds_the_grace_period() {
        if crate::sys::cpu_count() < 2 {
            return;
        }
        let c = Arc::new(Rcu::new(1u64));
        let inside = Arc::new(std::sync::Barrier::new(2));
        let left = Arc::new(AtomicU64::new(0));
        let r = {
            let (c, inside, left) = (c.clone(), inside.clone(), left.clone());
            std::thread::spawn(move || {
                assert!(pin_to(0));
                c.read(|v| {
                    assert_eq!(*v, 1);
                    inside.wait();
                    // Move, so the decrement lands on another CPU's line
                    // than the one the increment's CPU would use.
                    assert!(pin_to(1));
                    assert_eq!(crate::sys::this_cpu(), 1);
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    left.store(crate::sys::now_ns(), SeqCst);
                });
            })
        };
        inside.wait();
        let old = c.replace(2);
        let returned = crate::sys::now_ns();
        assert_eq!(old, 1);
        r.join().unwrap();
        let left = left.load(SeqCst);
        assert!(left != 0 && returned >= left, "the writer did not wait");
    }
}
