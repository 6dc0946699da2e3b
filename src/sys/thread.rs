//! The engine's own threads: started through [`spawn`], which marks them so
//! that code interposing on the application's calls (the LD_PRELOAD shim)
//! can tell the engine's `mmap`s from the application's
//! ([`crate::in_engine_thread`]).

use std::cell::Cell;

thread_local! {
    /// Set once at the start of every thread [`spawn`] makes.
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

/// Whether the calling thread is one of the engine's own (a handler,
/// I/O, readahead or reclaim thread of any pager in the process).
///
/// Cost: one thread-local read; no allocation, async-signal-safe.
///
/// ```
/// assert!(!uffd_pager::in_engine_thread());
/// ```
pub fn in_engine_thread() -> bool {
    ENGINE.with(|e| e.get())
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_spawned_threads_are_marked() {
        assert!(!super::in_engine_thread());
        let t = super::spawn("t".into(), super::in_engine_thread).unwrap();
        assert!(t.join().unwrap());
        assert!(!std::thread::spawn(super::in_engine_thread).join().unwrap());
    }
}
