//! Knowing when engine code runs: the engine's own threads are started
//! through [`spawn`], which marks them, and the SIGBUS handler marks the
//! application thread it runs on ([`Mark`]), so that code interposing on
//! the application's calls (the LD_PRELOAD shim) can tell the engine's
//! `mmap`s and `pwrite`s from the application's ([`crate::in_engine`]).

use std::cell::Cell;

thread_local! {
    /// Set for good at the start of every thread [`spawn`] makes, and for
    /// the length of a [`Mark`].
    static ENGINE: Cell<bool> = const { Cell::new(false) };
}

/// Starts an engine thread named `name` running `f`.
pub(crate) fn spawn<T, F>(name: String, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new().name(name).spawn(move || {
        ENGINE.with(|e| e.set(true));
        f()
    })
}

/// Marks the calling thread as running engine code until dropped (the
/// SIGBUS handler, on the faulting thread). Async-signal-safe: a
/// thread-local flag with a constant initialiser, no allocation.
pub(crate) struct Mark(bool);

impl Mark {
    pub(crate) fn enter() -> Mark {
        Mark(ENGINE.with(|e| e.replace(true)))
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        ENGINE.with(|e| e.set(self.0));
    }
}

/// Whether the calling thread is running engine code: it is one of the
/// engine's own threads (a handler, I/O, readahead or reclaim thread of
/// any pager in the process), or an application thread inside the engine's
/// fault handler (in-thread delivery). Code that interposes on libc calls
/// passes these straight through.
///
/// Cost: one thread-local read; no allocation, async-signal-safe.
///
/// ```
/// assert!(!uffd_pager::in_engine());
/// ```
pub fn in_engine() -> bool {
    ENGINE.with(|e| e.get())
}

#[cfg(test)]
mod tests {
    #[test]
    fn spawned_threads_and_marks_are_engine_code() {
        assert!(!super::in_engine());
        let t = super::spawn("t".into(), super::in_engine).unwrap();
        assert!(t.join().unwrap());
        assert!(!std::thread::spawn(super::in_engine).join().unwrap());
        {
            let _m = super::Mark::enter();
            assert!(super::in_engine());
        }
        assert!(!super::in_engine());
    }
}
