//! A futex mutex that counts its acquisitions and contended acquisitions:
//! the LRU lock (`lruvec->lru_lock`).
//!
//! # Contract and cost
//! Three-state futex mutex: uncontended lock/unlock is one CAS and one swap;
//! a contended lock sleeps. Counting is one relaxed increment (two when
//! contended). It never
//! allocates: async-signal-safe as long as no holder can be interrupted by
//! the engine's SIGBUS (see [`crate::sync`]).

use crate::sys::futex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CountingMutex {
    state: AtomicU32,
    acquisitions: AtomicU64,
    contended: AtomicU64,
}

impl CountingMutex {
    /// An unlocked mutex.
    pub const fn new() -> Self {
        CountingMutex {
            state: AtomicU32::new(0),
            acquisitions: AtomicU64::new(0),
            contended: AtomicU64::new(0),
        }
    }

    #[cfg(test)]
    /// Locks; returns a guard.
    pub fn lock(&self) -> MutexGuard<'_> {
        self.lock_contended().0
    }

    /// Locks; returns a guard and whether the lock had to wait.
    pub fn lock_contended(&self) -> (MutexGuard<'_>, bool) {
        self.acquisitions.fetch_add(1, Relaxed);
        let mut contended = false;
        if self.state.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            contended = true;
            self.contended.fetch_add(1, Relaxed);
            while self.state.swap(2, Acquire) != 0 {
                futex::wait(&self.state, 2);
            }
        }
        (MutexGuard { m: self }, contended)
    }

    /// (acquisitions, contended acquisitions) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.acquisitions.load(Relaxed),
            self.contended.load(Relaxed),
        )
    }
}

/// A held [`CountingMutex`].
#[must_use]
#[derive(Debug)]
pub struct MutexGuard<'a> {
    m: &'a CountingMutex,
}

impl Drop for MutexGuard<'_> {
    fn drop(&mut self) {
        if self.m.state.swap(0, Release) == 2 {
            futex::wake(&self.m.state, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_and_excludes() {
        let m = Arc::new(CountingMutex::new());
        let n = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (m, n) = (m.clone(), n.clone());
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let _g = m.lock();
                        let v = n.load(Relaxed);
                        n.store(v + 1, Relaxed);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(n.load(Relaxed), 4000);
        assert_eq!(m.counts().0, 4000);
    }
}
