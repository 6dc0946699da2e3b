//! A bounded work queue for engine threads: a lock-free MPMC ring of
//! 64-bit items that any thread may push to (a faulting thread in its
//! signal handler among them), and that worker threads drain, sleeping on a
//! futex when it is empty.
//!
//! # Contract and cost
//! - [`WorkQueue::push`] and [`WorkQueue::kick`]: async-signal-safe, never
//!   block; a push is one CAS and two stores on the ring, a kick one RMW
//!   plus a futex wake only when a worker sleeps. `push` fails when the
//!   ring is full.
//! - [`WorkQueue::next`]: for worker threads; blocks until an item or
//!   [`WorkQueue::stop`] ([`WorkQueue::next_within`]: or a timeout).

use crate::sys::futex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

struct Cell {
    seq: AtomicUsize,
    val: AtomicU64,
}

/// What [`WorkQueue::next_within`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// An item.
    Item(u64),
    /// None before the timeout.
    TimedOut,
    /// The queue was stopped.
    Stopped,
}

/// See the module docs.
pub struct WorkQueue {
    cells: Box<[Cell]>,
    head: AtomicUsize,
    tail: AtomicUsize,
    wake: AtomicU32,
    sleepers: AtomicU32,
    stop: AtomicBool,
}

impl std::fmt::Debug for WorkQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("capacity", &self.cells.len())
            .finish_non_exhaustive()
    }
}

impl WorkQueue {
    /// A queue of `capacity` items.
    pub fn new(capacity: usize) -> WorkQueue {
        WorkQueue {
            cells: (0..capacity)
                .map(|i| Cell {
                    seq: AtomicUsize::new(i),
                    val: AtomicU64::new(0),
                })
                .collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            wake: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// Enqueues `v`; false if the queue is full. Lock-free and
    /// async-signal-safe (a bounded MPMC ring with per-cell sequences).
    pub fn push(&self, v: u64) -> bool {
        let n = self.cells.len();
        let mut pos = self.tail.load(Relaxed);
        loop {
            let c = &self.cells[pos % n];
            let seq = c.seq.load(Acquire);
            match seq as isize - pos as isize {
                0 => match self
                    .tail
                    .compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed)
                {
                    Ok(_) => {
                        c.val.store(v, Relaxed);
                        c.seq.store(pos + 1, Release);
                        return true;
                    }
                    Err(p) => pos = p,
                },
                d if d < 0 => return false,
                _ => pos = self.tail.load(Relaxed),
            }
        }
    }

    /// Dequeues an item, if any. Lock-free.
    pub fn pop(&self) -> Option<u64> {
        let n = self.cells.len();
        let mut pos = self.head.load(Relaxed);
        loop {
            let c = &self.cells[pos % n];
            let seq = c.seq.load(Acquire);
            match seq as isize - (pos + 1) as isize {
                0 => match self
                    .head
                    .compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed)
                {
                    Ok(_) => {
                        let v = c.val.load(Relaxed);
                        c.seq.store(pos + n, Release);
                        return Some(v);
                    }
                    Err(p) => pos = p,
                },
                d if d < 0 => return None,
                _ => pos = self.head.load(Relaxed),
            }
        }
    }

    /// Wakes a sleeping worker after pushes. Async-signal-safe.
    pub fn kick(&self) {
        // SeqCst, as the worker's increment of `sleepers` and its load of
        // `wake`: a store-buffering pair, where a Release RMW outside the
        // single total order would let both sides read the old value (the
        // worker sleeps with an item queued). (On x86-64 the same `lock
        // xadd` either way.)
        self.wake.fetch_add(1, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            futex::wake(&self.wake, 1);
        }
    }

    /// The next item for a worker: sleeps while the queue is empty;
    /// `None` once the queue is stopped.
    pub fn next(&self) -> Option<u64> {
        match self.next_within(None) {
            Next::Item(v) => Some(v),
            _ => None,
        }
    }

    /// [`WorkQueue::next`] that sleeps at most `timeout_ns` (`None`: with
    /// no limit), for a worker that has something to do later.
    pub fn next_within(&self, timeout_ns: Option<u64>) -> Next {
        let deadline = timeout_ns.map(|t| crate::sys::now_ns().saturating_add(t));
        while !self.stop.load(Acquire) {
            let seq = self.wake.load(Acquire);
            if let Some(v) = self.pop() {
                return Next::Item(v);
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_sub(crate::sys::now_ns()) {
                    Some(left) if left > 0 => Some(left),
                    _ => return Next::TimedOut,
                },
            };
            self.sleepers.fetch_add(1, SeqCst);
            if self.wake.load(SeqCst) == seq && !self.stop.load(Acquire) {
                match left {
                    None => futex::wait(&self.wake, seq),
                    Some(ns) => futex::wait_timeout(&self.wake, seq, ns),
                }
            }
            self.sleepers.fetch_sub(1, SeqCst);
        }
        Next::Stopped
    }

    /// [`WorkQueue::next`], trying for `spin_ns` nanoseconds before it
    /// sleeps: a worker that spins takes work posted meanwhile with no
    /// wake-up.
    pub fn next_spinning(&self, spin_ns: u64) -> Option<u64> {
        if spin_ns > 0 {
            let until = crate::sys::now_ns().saturating_add(spin_ns);
            loop {
                if let Some(v) = self.pop() {
                    return Some(v);
                }
                if self.stop.load(Acquire) || crate::sys::now_ns() >= until {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        self.next()
    }

    /// Stops the workers: each returns `None` from [`WorkQueue::next`] at
    /// its next wake-up, which this causes.
    pub fn stop(&self) {
        self.stop.store(true, Release);
        self.wake.fetch_add(1, Release);
        futex::wake_all(&self.wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_is_fifo_and_bounded() {
        let q = WorkQueue::new(64);
        for i in 0..64u64 {
            assert!(q.push(i));
        }
        assert!(!q.push(99), "full");
        for i in 0..64u64 {
            assert_eq!(q.pop(), Some(i));
        }
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn a_sleeping_worker_is_woken_and_stopped() {
        let q = std::sync::Arc::new(WorkQueue::new(8));
        let w = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(v) = q.next() {
                    got.push(v);
                }
                got
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(q.push(7));
        q.kick();
        while q.pop().is_some() {}
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.stop();
        let got = w.join().unwrap();
        assert!(got.len() <= 1);
    }

    #[test]
    fn a_worker_waiting_within_a_timeout_times_out_or_takes_an_item() {
        let q = std::sync::Arc::new(WorkQueue::new(8));
        let t0 = std::time::Instant::now();
        assert_eq!(q.next_within(Some(20_000_000)), Next::TimedOut);
        assert!(t0.elapsed() >= std::time::Duration::from_millis(20));
        let w = {
            let q = q.clone();
            std::thread::spawn(move || q.next_within(Some(10_000_000_000)))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(q.push(5));
        q.kick();
        assert_eq!(w.join().unwrap(), Next::Item(5));
        q.stop();
        assert_eq!(q.next_within(Some(1_000_000_000)), Next::Stopped);
    }
}
