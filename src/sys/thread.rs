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

/// Starts an engine thread named `name` running `f`, with every
/// asynchronous signal blocked: the application's handlers run on its own
/// threads, never in the middle of engine work that holds engine locks (a
/// handler that touches region memory would fault into those locks).
pub(crate) fn spawn<T, F>(name: String, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // Blocked here, so that the new thread starts with them blocked (a
    // thread inherits its creator's mask); this thread's comes back below.
    let deferred = Deferred::new();
    // Returns once the thread runs: Rust's std maps each new thread's
    // signal stack (a guard page and the stack) as the thread starts, and
    // a thread still starting after `build()` or a map returned put that
    // mapping wherever the kernel found room, a range the application had
    // just unmapped to map again among them (its map then failed with
    // `Overlap`: `tests/install_after_unmap.rs`, under load).
    //
    // Hazard: bounded (`START_PATIENCE`). That mapping is made before the
    // thread is marked as the engine's, so an interposer (the LD_PRELOAD
    // shim) takes it for the application's and may take a lock its caller,
    // the spawner, holds while it waits here (a Rust program under the
    // shim with a small `UFFD_PAGER_ANON_MIN`): the wait ends, and the
    // thread finishes starting once the spawner lets go.
    let started = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let tell = started.clone();
    let t = std::thread::Builder::new().name(name).spawn(move || {
        ENGINE.with(|e| e.set(true));
        *tell.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        tell.1.notify_all();
        drop(tell);
        f()
    });
    drop(deferred);
    if t.is_ok() {
        let deadline = std::time::Instant::now() + START_PATIENCE;
        let (lock, cv) = &*started;
        let mut up = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !*up {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            up = cv
                .wait_timeout(up, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
    t
}

/// How long [`spawn`] waits for its thread to run.
const START_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// The signals the kernel raises for the thread's own instruction. Never
/// blocked by the engine: blocked, the kernel forces them (default action,
/// the process dies), where unblocked they reach the application's handler
/// as without the engine.
const SYNCHRONOUS: [libc::c_int; 6] = [
    libc::SIGBUS,
    libc::SIGSEGV,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

extern "C-unwind" {
    // glibc's; the `libc` crate does not declare it. "C-unwind": with the
    // asynchronous cancel type, putting the state back acts on a pending
    // cancel at once, by unwinding out of it.
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
    // As the `libc` crate's, but "C-unwind": putting the mask back runs the
    // handlers of the signals held back, on this thread, inside the call,
    // and a cancellation acting in one unwinds out of it.
    #[link_name = "pthread_sigmask"]
    fn pthread_sigmask_unwind(
        how: libc::c_int,
        set: *const libc::sigset_t,
        old: *mut libc::sigset_t,
    ) -> libc::c_int;
}

/// `PTHREAD_CANCEL_DISABLE` (glibc's and musl's value).
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

/// Cancellation (`pthread_cancel`) turned off on this thread until
/// dropped, which puts its state back: around engine work on an
/// application's thread. The engine's own I/O there (a store's `pread`, a
/// sleep between tries) calls functions glibc makes cancellation points,
/// and a cancel pending on the thread acted inside them: it unwound out of
/// the SIGBUS handler with a page lock held (the process died, SIGABRT;
/// `tests/cancel_during_fault.rs`). Now the thread is cancelled at its
/// next cancellation point after the engine's work, as a thread whose
/// page fault the kernel served would be. One call each way: glibc's is
/// atomic operations on the thread's own descriptor, no lock, so the
/// handler may make it (POSIX does not list it as async-signal-safe). With
/// the asynchronous cancel type, a cancel that came meanwhile acts as the
/// state is put back, unwinding through the engine's frames, which the
/// SIGBUS handler's and the C API's entry points turn into an abort: a
/// program that cancels asynchronously must not call into the engine, or
/// touch paged memory, with a cancel in flight (asynchronous cancellation
/// is only safe in code that calls nothing).
pub(crate) struct NoCancel(libc::c_int);

impl NoCancel {
    pub(crate) fn new() -> NoCancel {
        let mut old = 0;
        // SAFETY: sets this thread's cancel state; `old` is writable.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        NoCancel(old)
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        let mut old = 0;
        // SAFETY: as above; puts back the state `new` saw.
        unsafe { pthread_setcancelstate(self.0, &mut old) };
    }
}

/// Asynchronous signals blocked on this thread until dropped, which puts
/// the thread's mask back: around engine work on an application thread
/// (`prefault`, `map`, a flush...) that holds engine locks, so that an
/// application handler that touches region memory never runs inside it and
/// faults into a lock its own thread holds. Signals that arrive meanwhile
/// are delivered at the drop, as the kernel delivers them once a page
/// fault is done. Cancellation is off meanwhile ([`NoCancel`]), and is put
/// back first: a signal held back runs its handler with the thread's own
/// cancel state (one that leaves with `siglongjmp` left the thread
/// uncancellable for good when the mask went first). Two `pthread_sigmask`
/// calls and two `pthread_setcancelstate`. Async-signal-safe.
pub(crate) struct Deferred {
    mask: libc::sigset_t,
    cancel: std::mem::ManuallyDrop<NoCancel>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Deferred {
    pub(crate) fn new() -> Deferred {
        // SAFETY: sigfillset/sigdelset fill a local set; pthread_sigmask
        // gets valid pointers and changes only this thread's mask.
        unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut block);
            for s in SYNCHRONOUS {
                libc::sigdelset(&mut block, s);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
            Deferred {
                mask: old,
                cancel: std::mem::ManuallyDrop::new(NoCancel::new()),
                _not_send: std::marker::PhantomData,
            }
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, before the mask (see the type's docs).
        unsafe { std::mem::ManuallyDrop::drop(&mut self.cancel) };
        // SAFETY: restores the mask saved by `new`, on the same thread (a
        // `Deferred` is not `Send`).
        unsafe { pthread_sigmask_unwind(libc::SIG_SETMASK, &self.mask, std::ptr::null_mut()) };
    }
}

/// Marks the calling thread as running engine code until dropped (the
/// SIGBUS handler, on the faulting thread, which turns cancellation off
/// itself: [`NoCancel`]). Async-signal-safe: a thread-local flag with a
/// constant initialiser, no allocation.
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
