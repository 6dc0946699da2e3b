//! The global lock: the engine's `mmap_lock`.
//!
//! A writer-preferring reader/writer semaphore, as the kernel's rwsem: once a
//! writer is waiting, new readers queue behind it. Faults that fall back take
//! it for read; map, unmap, remap and protect take it for write.
//!
//! Like the rwsem, it does not let a stream of writers starve readers that
//! are already waiting: a reader that has waited longer than
//! [`HANDOFF_NS`] (the rwsem's `RWSEM_WAIT_TIMEOUT`, 4 ms) sets a handoff
//! bit; while it is set, waiting readers may enter past waiting writers,
//! and writers do not take the lock until those readers are through.
//!
//! # Contract and cost
//! - `read`/`write` block (futex) until granted; `try_read` never blocks.
//! - Uncontended read lock/unlock: a load and a CAS of the state word, a
//!   relaxed increment of the acquisition count (likely on the same line),
//!   and one atomic RMW to unlock.
//! - Every acquisition that had to wait is counted, with its wait time, for
//!   reads and writes separately ([`GlobalLock::contention`]).
//! - Async-signal-safe (see [`crate::sync`]).

use crate::sync::model::{const_fn_unless_loom, futex, now_ns, AtomicU32, AtomicU64};
use std::sync::atomic::Ordering::*;

const READERS: u32 = (1 << 20) - 1;
/// Readers that waited too long and asked for the handoff, and are not in
/// yet: while any is out, readers may pass waiting writers and writers do
/// not take the lock. A count, in the lock word itself, so that the first
/// reader in cannot end the handoff for the others.
const ASKER_ONE: u32 = 1 << 20;
const ASKERS: u32 = 0xFF << 20;

/// How long a reader waits behind writers before it asks for a handoff.
pub const HANDOFF_NS: u64 = 4_000_000;
const READER_PARKED: u32 = 1 << 29;
const WRITER_WAITING: u32 = 1 << 30;
const WRITER_HELD: u32 = 1 << 31;

/// The handoff threshold: [`HANDOFF_NS`], or the model test's choice under
/// loom (whose clock stands still).
#[cfg(not(loom))]
#[inline(always)]
fn handoff_after() -> u64 {
    HANDOFF_NS
}
#[cfg(loom)]
fn handoff_after() -> u64 {
    crate::sync::model::handoff_ns()
}

/// Global-lock contention figures: a [`Stats`](crate::Stats) field (`global`;
/// see [`Counter`](crate::Counter) for an example).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contention {
    /// Read acquisitions (all).
    pub read_acquisitions: u64,
    /// Read acquisitions that had to wait.
    pub read_contended: u64,
    /// Total time read acquisitions waited, ns.
    pub read_wait_ns: u64,
    /// Write acquisitions (all).
    pub write_acquisitions: u64,
    /// Write acquisitions that had to wait.
    pub write_contended: u64,
    /// Total time write acquisitions waited, ns.
    pub write_wait_ns: u64,
}

/// The global reader/writer lock. See the module docs.
#[derive(Debug, Default)]
pub struct GlobalLock {
    state: AtomicU32,
    /// Bumped whenever the last reader leaves while a writer waits; writers
    /// sleep on it.
    writer_seq: AtomicU32,
    /// Serialises writers, so one writer at a time drains readers.
    writer_mutex: AtomicU32,
    /// Writers inside `write()` (waiting or holding).
    writers_pending: AtomicU32,
    /// Readers currently sleeping (for scripted tests and reports).
    readers_sleeping: AtomicU32,
    read_acq: AtomicU64,
    read_cont: AtomicU64,
    read_wait: AtomicU64,
    write_acq: AtomicU64,
    write_cont: AtomicU64,
    write_wait: AtomicU64,
}

impl GlobalLock {
    const_fn_unless_loom! {
        /// An unlocked lock.
        pub fn new() -> Self {
            GlobalLock {
                state: AtomicU32::new(0),
                writer_seq: AtomicU32::new(0),
                writer_mutex: AtomicU32::new(0),
                writers_pending: AtomicU32::new(0),
                readers_sleeping: AtomicU32::new(0),
                read_acq: AtomicU64::new(0),
                read_cont: AtomicU64::new(0),
                read_wait: AtomicU64::new(0),
                write_acq: AtomicU64::new(0),
                write_cont: AtomicU64::new(0),
                write_wait: AtomicU64::new(0),
            }
        }
    }

    /// Takes the lock for read without waiting: fails only while a writer
    /// holds the lock or waits for it (`down_read_trylock`), not when
    /// another reader gets in or out at the same moment (that only repeats
    /// the compare-and-swap). Not counted as contended. Lock-free.
    pub fn try_read(&self) -> Option<ReadGuard<'_>> {
        let mut s = self.state.load(Relaxed);
        while s & (WRITER_HELD | WRITER_WAITING) == 0 {
            match self.state.compare_exchange_weak(s, s + 1, Acquire, Relaxed) {
                Ok(_) => {
                    self.read_acq.fetch_add(1, Relaxed);
                    return Some(ReadGuard { lock: self });
                }
                Err(now) => s = now,
            }
        }
        None
    }

    /// Takes the lock for read, waiting behind writers.
    pub fn read(&self) -> ReadGuard<'_> {
        if let Some(g) = self.try_read() {
            return g;
        }
        self.read_slow()
    }

    #[cold]
    fn read_slow(&self) -> ReadGuard<'_> {
        let t0 = now_ns();
        let mut handoff = false;
        loop {
            let s = self.state.load(Relaxed);
            // New readers queue behind waiting writers, except during a
            // handoff to the readers that waited too long.
            let blocked = s & WRITER_HELD != 0 || (s & WRITER_WAITING != 0 && s & ASKERS == 0);
            if !blocked {
                // A reader that asked takes itself off the count as it
                // gets in, in the same step.
                let new = if handoff { s + 1 - ASKER_ONE } else { s + 1 };
                if self
                    .state
                    .compare_exchange_weak(s, new, Acquire, Relaxed)
                    .is_ok()
                {
                    break;
                }
                continue;
            }
            if !handoff && s & ASKERS != ASKERS && now_ns() - t0 >= handoff_after() {
                if self
                    .state
                    .compare_exchange_weak(s, s + ASKER_ONE, Relaxed, Relaxed)
                    .is_ok()
                {
                    handoff = true;
                }
                continue;
            }
            if s & READER_PARKED == 0
                && self
                    .state
                    .compare_exchange_weak(s, s | READER_PARKED, Relaxed, Relaxed)
                    .is_err()
            {
                continue;
            }
            self.readers_sleeping.fetch_add(1, Relaxed);
            // Bounded, so that a reader that writers keep overtaking wakes
            // up to ask for the handoff.
            futex::wait_timeout(&self.state, s | READER_PARKED, HANDOFF_NS);
            self.readers_sleeping.fetch_sub(1, Relaxed);
        }
        if handoff {
            // Served; if this was the last that asked, writers may go again.
            self.writer_seq.fetch_add(1, Release);
            futex::wake(&self.writer_seq, 1);
        }
        self.read_acq.fetch_add(1, Relaxed);
        // A read that found a writer in the way counts as contended even if it
        // got in on a retry without sleeping.
        self.read_cont.fetch_add(1, Relaxed);
        self.read_wait.fetch_add(now_ns() - t0, Relaxed);
        ReadGuard { lock: self }
    }

    fn read_unlock(&self) {
        let prev = self.state.fetch_sub(1, Release);
        if prev & READERS == 1 && prev & WRITER_WAITING != 0 {
            self.writer_seq.fetch_add(1, Release);
            futex::wake(&self.writer_seq, 1);
        }
    }

    /// Takes the lock for write. New readers queue behind a waiting writer.
    pub fn write(&self) -> WriteGuard<'_> {
        self.writers_pending.fetch_add(1, Relaxed);
        if self
            .writer_mutex
            .compare_exchange(0, 1, Acquire, Relaxed)
            .is_ok()
        {
            if self
                .state
                .compare_exchange(0, WRITER_HELD, Acquire, Relaxed)
                .is_ok()
            {
                self.write_acq.fetch_add(1, Relaxed);
                return WriteGuard { lock: self };
            }
            return self.write_slow(true);
        }
        self.write_slow(false)
    }

    #[cold]
    fn write_slow(&self, have_mutex: bool) -> WriteGuard<'_> {
        let t0 = now_ns();
        // Announce ourselves first so that new readers queue behind us.
        self.state.fetch_or(WRITER_WAITING, Relaxed);
        if !have_mutex {
            // Writers take turns (a three-state futex mutex: 0 free, 1 held,
            // 2 held with sleepers).
            while self.writer_mutex.swap(2, Acquire) != 0 {
                futex::wait(&self.writer_mutex, 2);
            }
        }
        // Holding the writer mutex, nobody else sets WRITER_HELD: wait for the
        // readers to drain.
        loop {
            let seq = self.writer_seq.load(Acquire);
            let s = self.state.fetch_or(WRITER_WAITING, Acquire) | WRITER_WAITING;
            if s & READERS == 0 && s & ASKERS == 0 {
                let more = self.writers_pending.load(Relaxed) > 1;
                let new = (s & READER_PARKED) | WRITER_HELD | if more { WRITER_WAITING } else { 0 };
                if self
                    .state
                    .compare_exchange(s, new, Acquire, Relaxed)
                    .is_ok()
                {
                    break;
                }
                continue;
            }
            // During a handoff, poll: the handing-off reader wakes us, but a
            // reader that gave up waiting must not leave us asleep.
            if s & ASKERS != 0 {
                futex::wait_timeout(&self.writer_seq, seq, HANDOFF_NS);
            } else {
                futex::wait(&self.writer_seq, seq);
            }
        }
        self.write_acq.fetch_add(1, Relaxed);
        self.write_cont.fetch_add(1, Relaxed);
        self.write_wait.fetch_add(now_ns() - t0, Relaxed);
        WriteGuard { lock: self }
    }

    fn write_unlock(&self) {
        let more = self.writers_pending.fetch_sub(1, Relaxed) > 1;
        if more {
            // Hand over to the next writer: readers stay queued (and
            // parked), unless they asked for a handoff.
            let prev = self
                .state
                .fetch_update(Release, Relaxed, |s| {
                    Some((s & !WRITER_HELD) | WRITER_WAITING)
                })
                .unwrap_or_else(|s| s);
            if prev & ASKERS != 0 && prev & READER_PARKED != 0 {
                futex::wake_all(&self.state);
            }
        } else {
            // Free; readers that asked for the handoff stay counted until
            // they are in.
            let prev = self.state.fetch_and(ASKERS, Release);
            if prev & READER_PARKED != 0 {
                futex::wake_all(&self.state);
            }
        }
        if self.writer_mutex.swap(0, Release) == 2 {
            futex::wake(&self.writer_mutex, 1);
        }
    }

    #[cfg(any(test, loom, feature = "fault-inject"))]
    /// Readers sleeping on the lock right now.
    pub fn readers_sleeping(&self) -> u32 {
        self.readers_sleeping.load(Relaxed)
    }

    /// Writers inside `write()`, waiting or holding (for model tests).
    #[cfg(loom)]
    pub fn writers_pending(&self) -> u32 {
        self.writers_pending.load(Relaxed)
    }

    /// Whether a reader has asked for the handoff (for model tests).
    #[cfg(loom)]
    pub fn handoff_requested(&self) -> bool {
        self.state.load(Relaxed) & ASKERS != 0
    }

    /// Acquisition and contention counts since creation or the last reset.
    pub fn contention(&self) -> Contention {
        Contention {
            read_acquisitions: self.read_acq.load(Relaxed),
            read_contended: self.read_cont.load(Relaxed),
            read_wait_ns: self.read_wait.load(Relaxed),
            write_acquisitions: self.write_acq.load(Relaxed),
            write_contended: self.write_cont.load(Relaxed),
            write_wait_ns: self.write_wait.load(Relaxed),
        }
    }

    /// Zeroes the counters.
    pub fn reset_counters(&self) {
        for c in [
            &self.read_acq,
            &self.read_cont,
            &self.read_wait,
            &self.write_acq,
            &self.write_cont,
            &self.write_wait,
        ] {
            c.store(0, Relaxed);
        }
    }
}

/// A held read lock; released on drop.
#[must_use]
#[derive(Debug)]
pub struct ReadGuard<'a> {
    lock: &'a GlobalLock,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.lock.read_unlock();
    }
}

/// A held write lock; released on drop.
#[must_use]
#[derive(Debug)]
pub struct WriteGuard<'a> {
    lock: &'a GlobalLock,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.lock.write_unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn readers_share_writers_exclude() {
        let l = GlobalLock::new();
        let a = l.read();
        let b = l.try_read().expect("second reader");
        drop((a, b));
        let w = l.write();
        assert!(l.try_read().is_none());
        drop(w);
        assert!(l.try_read().is_some());
        let c = l.contention();
        assert_eq!(c.write_acquisitions, 1);
        assert_eq!(c.read_contended, 0);
    }

    #[test]
    fn waiting_writer_blocks_new_readers() {
        let l = Arc::new(GlobalLock::new());
        let r = l.read();
        let l2 = l.clone();
        let w = std::thread::spawn(move || {
            let _g = l2.write();
        });
        while l.state.load(Relaxed) & WRITER_WAITING == 0 {
            std::thread::yield_now();
        }
        assert!(l.try_read().is_none(), "writer waiting: readers must queue");
        drop(r);
        w.join().unwrap();
        assert_eq!(l.contention().write_contended, 1);
        assert!(l.try_read().is_some());
    }

    #[test]
    fn contended_read_is_counted_with_wait_time() {
        let l = Arc::new(GlobalLock::new());
        let w = l.write();
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let _g = l2.read();
        });
        while l.readers_sleeping() == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(2));
        drop(w);
        t.join().unwrap();
        let c = l.contention();
        assert_eq!(c.read_contended, 1);
        assert!(c.read_wait_ns >= 1_000_000, "{c:?}");
    }

    #[test]
    fn waiting_readers_are_not_starved_by_a_stream_of_writers() {
        let l = Arc::new(GlobalLock::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(SeqCst) {
                        let _g = l.write();
                        // Hold on until another writer queues, so that every
                        // unlock hands over to a writer: the worst case.
                        while l.writers_pending.load(SeqCst) < 2 && !stop.load(SeqCst) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        // Each read must get in despite the writers never letting go of the
        // queue; without the handoff this hangs.
        for _ in 0..20 {
            drop(l.read());
        }
        stop.store(true, SeqCst);
        for w in writers {
            w.join().unwrap();
        }
    }

    #[test]
    fn stress_mutual_exclusion() {
        let l = Arc::new(GlobalLock::new());
        let inside = Arc::new(AtomicU32::new(0));
        let mut hs = vec![];
        for i in 0..4 {
            let (l, inside) = (l.clone(), inside.clone());
            hs.push(std::thread::spawn(move || {
                for _ in 0..2000 {
                    if i % 2 == 0 {
                        let _g = l.write();
                        assert_eq!(inside.swap(1000, SeqCst), 0);
                        inside.store(0, SeqCst);
                    } else {
                        let _g = l.read();
                        let v = inside.fetch_add(1, SeqCst);
                        assert!(v < 1000);
                        inside.fetch_sub(1, SeqCst);
                    }
                }
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
    }
}
