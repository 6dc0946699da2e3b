//! A run's deadline as a flag: a thread of its own sets it when the time
//! comes, so that a workload's hot loop checks it with one relaxed load per
//! access (no clock read), and stops within one access of it.

use super::common::spawn;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

#[derive(Default)]
struct Shared {
    passed: AtomicBool,
    /// Set when the [`Deadline`] drops: its thread ends early.
    done: Mutex<bool>,
    wake: Condvar,
}

/// A flag that turns true at an instant; see the module docs.
pub struct Deadline {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Deadline {
    /// Starts the thread that sets the flag at `at`.
    pub fn start(at: Instant) -> uffd_pager::Result<Deadline> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = spawn(move || {
            let mut done = s.done.lock().unwrap_or_else(|e| e.into_inner());
            while !*done {
                let now = Instant::now();
                if now >= at {
                    s.passed.store(true, Relaxed);
                    return;
                }
                done = match s.wake.wait_timeout(done, at - now) {
                    Ok((g, _)) => g,
                    Err(e) => e.into_inner().0,
                };
            }
        })?;
        Ok(Deadline {
            shared,
            thread: Some(thread),
        })
    }

    /// Whether the deadline has passed.
    #[inline]
    pub fn passed(&self) -> bool {
        self.shared.passed.load(Relaxed)
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        *self.shared.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn turns_at_its_instant_and_drops_early() {
        let d = Deadline::start(Instant::now() + Duration::from_millis(20)).unwrap();
        assert!(!d.passed());
        let t = Instant::now();
        while !d.passed() {
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        drop(Deadline::start(Instant::now() + Duration::from_secs(3600)).unwrap());
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
