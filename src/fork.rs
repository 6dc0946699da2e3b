//! `fork()`: region memory is not copied into a child, and the engine
//! refuses to work in one.
//!
//! Without `UFFD_FEATURE_EVENT_FORK` (which needs `CAP_SYS_PTRACE` and a
//! monitor for every child) a child's copy of a registered range is not
//! registered: its absent anonymous pages would read as zeros, and every
//! ioctl the child issued on the inherited descriptor would act on the
//! *parent's* address space. So regions are mapped `MADV_DONTFORK`: the
//! child gets no mapping there (a touch is a clean SIGSEGV), and every
//! engine entry point in a child is refused (`Error::ForkedChild`) or, for
//! drops, does nothing. The engine's threads do not exist in a child, so a
//! pager dropped there leaks its state instead of joining them. The
//! child's copies of the engine's userfaultfds are replaced with
//! `/dev/null` where `/proc` and `/dev/null` allow
//! (`crate::sys::uffd::inherit`), so that they do not keep the parent's
//! registrations alive. Children made without the atfork handlers
//! (`vfork`, `posix_spawn`, a raw `clone`) keep them until they exec,
//! which closes them (`O_CLOEXEC`).
//!
//! A child is recognised by a `pthread_atfork` handler that marks the
//! process, then by its pid: one load on every path that checks, a
//! `getpid` only in a child, or while a fork is under way. A child made by a raw `clone` system call
//! that skips the atfork handlers is not recognised.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Once;

/// [`FORKED`] and [`FORKING`]: one word, so that the check is one load.
static MARKS: AtomicU8 = AtomicU8::new(0);
/// Set in a child by the atfork handler.
const FORKED: u8 = 1;
/// Set by the atfork prepare handler, cleared by the parent's: a fork is
/// under way. Prepare handlers run in the reverse of the order they were
/// registered, so ours runs before those registered earlier (by libraries
/// loaded before the first pager was built), and child handlers in that
/// order, so theirs run before ours marks the child: one that called the
/// engine there was served as in the parent, its ioctls on the parent's
/// address space (found by review). With this set, a child is told by its
/// pid until ours has run.
const FORKING: u8 = 2;
static INSTALL: Once = Once::new();

extern "C" fn mark_child() {
    MARKS.fetch_or(FORKED, SeqCst);
    crate::sys::uffd::inherit::cover_in_child();
}

extern "C" fn forking() {
    MARKS.fetch_or(FORKING, SeqCst);
}

extern "C" fn forked_parent() {
    MARKS.fetch_and(!FORKING, SeqCst);
}

/// Installs the atfork handlers (once per process).
pub fn watch() {
    INSTALL.call_once(|| {
        // SAFETY: registers handlers that store to atomics and cover the
        // engine's userfaultfds with system calls on the stack
        // (`cover_in_child`), which is async-signal-safe as a fork child
        // handler must be.
        unsafe { libc::pthread_atfork(Some(forking), Some(forked_parent), Some(mark_child)) };
    });
}

/// The calling process's pid.
pub fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Whether this process is a `fork()`ed child of process `owner` (the one
/// that made a pager). Async-signal-safe: one load, and `getpid` in a
/// child only.
#[inline]
pub fn is_child_of(owner: i32) -> bool {
    MARKS.load(Relaxed) != 0 && pid() != owner
}
