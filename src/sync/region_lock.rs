//! The region lock: the engine's per-VMA lock (`vma_start_read` /
//! `vma_start_write`).
//!
//! Faults take it for read with a **try-lock only**: a fault never waits for
//! a region writer, it aborts to the global lock instead (as
//! `lock_vma_under_rcu` does). A writer (map/unmap/remap/protect, holding the
//! global lock for write) marks the region write-locked, which fails new
//! read-trylocks at once, then waits for the readers inside to leave. A
//! detached region (removed from the address space) fails every trylock for
//! good.
//!
//! # Cost
//! Read trylock: one load and one CAS. Read unlock: one atomic RMW, plus a
//! futex wake only when a writer sleeps. Async-signal-safe.

use crate::sync::model::{const_fn_unless_loom, futex, AtomicU32};
use std::sync::atomic::Ordering::*;

const READERS: u32 = (1 << 28) - 1;
const WRITER_SLEEPING: u32 = 1 << 29;
const WRITE_LOCKED: u32 = 1 << 30;
const DETACHED: u32 = 1 << 31;

/// Why a read-trylock failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryReadError {
    /// A writer holds (or is taking) the region: `VMA_LOCK_ABORT`.
    WriteLocked,
    /// The region was removed from the address space: `VMA_LOCK_MISS`.
    Detached,
}

/// The per-region lock. See the module docs.
#[derive(Debug, Default)]
pub struct RegionLock {
    state: AtomicU32,
    /// Number of write-lock epochs so far (`vm_lock_seq`).
    seq: AtomicU32,
}

impl RegionLock {
    const_fn_unless_loom! {
        /// An unlocked, attached lock.
        pub fn new() -> Self {
            RegionLock {
                state: AtomicU32::new(0),
                seq: AtomicU32::new(0),
            }
        }
    }

    /// Read-trylock. On success the caller must call [`RegionLock::read_unlock`].
    #[inline]
    pub fn try_read(&self) -> Result<(), TryReadError> {
        let mut s = self.state.load(Relaxed);
        loop {
            if s & DETACHED != 0 {
                return Err(TryReadError::Detached);
            }
            if s & WRITE_LOCKED != 0 {
                return Err(TryReadError::WriteLocked);
            }
            match self.state.compare_exchange_weak(s, s + 1, Acquire, Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => s = now,
            }
        }
    }

    /// Drops a read lock taken by [`RegionLock::try_read`].
    #[inline]
    pub fn read_unlock(&self) {
        let prev = self.state.fetch_sub(1, Release);
        if prev & READERS == 1 && prev & WRITER_SLEEPING != 0 {
            futex::wake_all(&self.state);
        }
    }

    /// Write-locks the region and waits for its readers to leave. The caller
    /// holds the global lock for write, so writers never race each other.
    pub fn write_lock(&self) {
        self.state.fetch_or(WRITE_LOCKED, Acquire);
        self.seq.fetch_add(1, Relaxed);
        loop {
            let s = self.state.load(Acquire);
            if s & READERS == 0 {
                return;
            }
            if s & WRITER_SLEEPING == 0
                && self
                    .state
                    .compare_exchange(s, s | WRITER_SLEEPING, Relaxed, Relaxed)
                    .is_err()
            {
                continue;
            }
            futex::wait(&self.state, s | WRITER_SLEEPING);
        }
    }

    /// Releases the write lock (a detached region stays detached).
    pub fn write_unlock(&self) {
        self.state
            .fetch_and(!(WRITE_LOCKED | WRITER_SLEEPING), Release);
    }

    /// Marks the region detached. Call while write-locked.
    pub fn mark_detached(&self) {
        debug_assert!(self.is_write_locked());
        self.state.fetch_or(DETACHED, Release);
    }

    /// Whether the region is detached.
    pub fn is_detached(&self) -> bool {
        self.state.load(Acquire) & DETACHED != 0
    }

    /// Whether a writer holds the region.
    pub fn is_write_locked(&self) -> bool {
        self.state.load(Acquire) & WRITE_LOCKED != 0
    }

    #[cfg(any(test, loom))]
    /// Readers inside right now.
    pub fn readers(&self) -> u32 {
        self.state.load(Relaxed) & READERS
    }

    #[cfg(any(test, loom))]
    /// Write-lock epochs so far.
    pub fn seq(&self) -> u32 {
        self.seq.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn trylock_fails_on_writer_and_detach() {
        let l = RegionLock::new();
        l.try_read().unwrap();
        l.read_unlock();
        l.write_lock();
        assert_eq!(l.try_read(), Err(TryReadError::WriteLocked));
        l.mark_detached();
        l.write_unlock();
        assert_eq!(l.try_read(), Err(TryReadError::Detached));
        assert_eq!(l.seq(), 1);
    }

    #[test]
    fn writer_waits_for_readers() {
        let l = Arc::new(RegionLock::new());
        l.try_read().unwrap();
        let l2 = l.clone();
        let w = std::thread::spawn(move || {
            l2.write_lock();
            l2.write_unlock();
        });
        while !l.is_write_locked() {
            std::thread::yield_now();
        }
        assert_eq!(l.try_read(), Err(TryReadError::WriteLocked));
        l.read_unlock();
        w.join().unwrap();
        assert_eq!(l.readers(), 0);
        l.try_read().unwrap();
        l.read_unlock();
    }
}
