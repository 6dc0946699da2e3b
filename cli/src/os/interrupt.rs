//! What a run leaves behind when SIGINT, SIGTERM, SIGHUP or SIGQUIT stops
//! it: nothing.
//!
//! [`install`] blocks these signals in the calling thread, and so in every
//! thread started after it, and starts one thread that waits for them with
//! `sigwait` (no signal handler runs, so nothing needs to be
//! async-signal-safe). When one comes, that thread runs the cleanups
//! registered with [`on_interrupt`] (newest first: a temporary file, a
//! memory cgroup and the processes in it, a Redis namespace, a kernel
//! setting to put back) and ends the process with 128 + the signal's
//! number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP: a closed
//! terminal, 131 for SIGQUIT: Ctrl-\\, which then leaves no core dump).
//!
//! Whatever registers a cleanup undoes the same thing itself on the normal
//! path; the [`OnInterrupt`] it gets back unregisters the cleanup when it
//! drops. Without [`install`] (the library used from elsewhere) the
//! cleanups are kept and never run.

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};

type Cleanup = Box<dyn FnOnce() + Send>;

/// The registered cleanups, oldest first, each with its id.
static CLEANUPS: Mutex<Vec<(u64, Cleanup)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Whether the waiting thread runs.
static WAITING: AtomicBool = AtomicBool::new(false);

fn signals() -> SigSet {
    let mut s = SigSet::empty();
    s.add(Signal::SIGINT);
    s.add(Signal::SIGTERM);
    s.add(Signal::SIGHUP);
    s.add(Signal::SIGQUIT);
    s
}

fn cleanups() -> MutexGuard<'static, Vec<(u64, Cleanup)>> {
    CLEANUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks the signals that end a run (see the module docs) and starts the thread that waits for them
/// (see the module docs). Call it first thing in `main`, before any other
/// thread starts: a thread started earlier keeps its own signal mask, and
/// the kernel could deliver a signal to it with the default action. If
/// the thread cannot start, the signals are unblocked again and kill the
/// process as before.
pub fn install() {
    let set = signals();
    if set.thread_block().is_err() {
        return;
    }
    let waiter = std::thread::Builder::new()
        .name("uffd-pager-signals".into())
        .spawn(move || loop {
            if let Ok(sig) = set.wait() {
                run_cleanups_and_exit(sig);
            }
        });
    match waiter {
        Ok(_) => WAITING.store(true, Release),
        Err(_) => {
            let _ = set.thread_unblock();
        }
    }
}

/// The threads [`install`] started (0 or 1): the kernel baseline, which
/// forks, counts the process's threads without it. It holds no lock while
/// it waits, so a child forked meanwhile inherits none held.
pub fn helper_threads() -> usize {
    usize::from(WAITING.load(Acquire))
}

/// For a forked child, which has no waiting thread: gives the signals
/// [`install`] blocked their default action back (they end it, as before [`install`]).
pub fn unblock_in_child() {
    let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&signals()), None);
}

fn run_cleanups_and_exit(sig: Signal) -> ! {
    // A second signal ends the process at once, cleanups or not (they can
    // take long: a stalled store's timeouts): unblocked on this thread, it
    // comes here with its default action.
    let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&signals()), None);
    // Held to the end: a thread that would register or unregister a
    // cleanup now waits for the exit instead.
    let mut list = cleanups();
    while let Some((_, cleanup)) = list.pop() {
        cleanup();
    }
    eprintln!("uffd-pager: stopped by {sig}; what the run had made is removed");
    // SAFETY: ends the process at once, without running destructors or
    // exit handlers while the other threads still run.
    unsafe { libc::_exit(128 + sig as i32) }
}

/// A cleanup registered with [`on_interrupt`]; dropping it unregisters the
/// cleanup without running it.
#[must_use = "the cleanup is unregistered when this drops"]
#[derive(Debug)]
pub struct OnInterrupt(u64);

/// Registers `cleanup` to run if one of the signals [`install`] blocked
/// ends the process before
/// the returned [`OnInterrupt`] drops. It runs on the waiting thread while
/// the others go on, so it must not wait for them.
pub fn on_interrupt(cleanup: impl FnOnce() + Send + 'static) -> OnInterrupt {
    let id = NEXT_ID.fetch_add(1, Relaxed);
    cleanups().push((id, Box::new(cleanup)));
    OnInterrupt(id)
}

impl Drop for OnInterrupt {
    fn drop(&mut self) {
        cleanups().retain(|(id, _)| *id != self.0);
    }
}

/// A file of the run's own, removed when this drops or a signal ends the
/// run (see the module docs), whichever comes first.
#[derive(Debug)]
pub struct TempPath {
    path: std::path::PathBuf,
    _on_interrupt: OnInterrupt,
}

impl TempPath {
    /// Takes charge of `path`. Call it before the file is created: a
    /// signal that comes while this registers is then handled before the
    /// file exists, not after.
    pub fn new(path: std::path::PathBuf) -> TempPath {
        let p = path.clone();
        TempPath {
            path,
            _on_interrupt: on_interrupt(move || {
                let _ = std::fs::remove_file(p);
            }),
        }
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_registration_is_gone() {
        let a = on_interrupt(|| {});
        let b = on_interrupt(|| {});
        let ids = |l: &[(u64, Cleanup)]| l.iter().map(|(id, _)| *id).collect::<Vec<_>>();
        assert!(ids(&cleanups()).contains(&a.0));
        let gone = a.0;
        drop(a);
        let left = ids(&cleanups());
        assert!(!left.contains(&gone) && left.contains(&b.0));
    }
}
