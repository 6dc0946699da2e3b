//! A store whose calls wait at a gate the test opens, for tests that hold
//! a store read or write open while they act (included with
//! `#[path = "gated_store.rs"] mod gated;`). Compiled on its own it is an
//! empty test crate.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use uffd_pager::store::{Store, StoreError};

const PAGE: usize = 4096;

/// What waits at the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The read of page 1, after it took its bytes (the test changes them
    /// behind the engine meanwhile).
    ReadOfPage1,
    /// Every write, before it writes.
    Writes,
    /// Every write, which then fails (EIO) without writing.
    FailingWrites,
}

/// A store of `bytes` whose [`Held`] calls wait until the test opens the
/// gate (at most 20 s).
pub struct Gated {
    pub bytes: Mutex<Vec<u8>>,
    held: Held,
    /// Writes that came (each counted as it reaches the gate).
    pub writes: AtomicUsize,
    /// (a call waits, the gate is open)
    gate: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Gated {
    pub fn new(bytes: Vec<u8>, held: Held) -> Gated {
        Gated {
            bytes: Mutex::new(bytes),
            held,
            writes: AtomicUsize::new(0),
            gate: Mutex::new((false, false)),
            cv: Condvar::new(),
        }
    }

    /// Says a call waits, and waits until the gate opens (at most 20 s).
    fn wait_at_gate(&self) {
        let mut g = self.gate.lock().unwrap();
        g.0 = true;
        self.cv.notify_all();
        let t = Instant::now();
        while !g.1 && t.elapsed() < Duration::from_secs(20) {
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }

    /// Returns once a call waits at the gate; panics if `gone()` says none
    /// will come, or after 20 s.
    pub fn until_a_call_waits(&self, gone: impl Fn() -> bool) {
        let mut g = self.gate.lock().unwrap();
        let t = Instant::now();
        while !g.0 {
            assert!(!gone(), "no call came to the gate");
            assert!(t.elapsed() < Duration::from_secs(20), "no call waits");
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }

    /// Opens the gate after `after`.
    pub fn open_after(&self, after: Duration) {
        std::thread::sleep(after);
        self.gate.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl Store for Gated {
    fn len(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let o = off as usize;
        buf.copy_from_slice(&self.bytes.lock().unwrap()[o..o + buf.len()]);
        if self.held == Held::ReadOfPage1 && o / PAGE == 1 {
            self.wait_at_gate();
        }
        Ok(())
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.writes.fetch_add(1, SeqCst);
        if self.held != Held::ReadOfPage1 {
            self.wait_at_gate();
        }
        if self.held == Held::FailingWrites {
            return Err(StoreError(libc::EIO));
        }
        let o = off as usize;
        self.bytes.lock().unwrap()[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "gated"
    }
}
