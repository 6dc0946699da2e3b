//! Syscall buffers in pager memory, where the pager cannot serve a fault
//! taken inside a system call: in-thread delivery, or a user-mode-only
//! descriptor (an ordinary user's, where `/dev/userfaultfd` is root's).
//! The kernel answers such a fault with `EFAULT`, so the read and write
//! calls the shim interposes keep the buffer's pager pages resident for
//! the call ([`resident_for_call`]), as `Region::lock_resident` does for
//! a program of the engine's own.

use super::{any, spans, state};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The pager serves a fault taken inside a system call (set when it is
/// made; true until then: nothing is paged before).
static SERVES_SYSCALLS: AtomicBool = AtomicBool::new(true);

/// Notes whether the pager just made serves faults inside system calls.
pub(super) fn serves_syscalls(yes: bool) {
    SERVES_SYSCALLS.store(yes, Relaxed);
}

/// Whether a system call's buffer in pager memory needs guards
/// ([`resident_for_call`]): the pager cannot serve a fault inside the
/// call. One load; false until a pager is made.
pub fn needed() -> bool {
    !SERVES_SYSCALLS.load(Relaxed)
}

/// Guards keeping the pager pages in `[buf, buf + len)` resident while a
/// system call reads them (`writes` false: `write(2)`, faulted in for a
/// read, so clean pages stay clean) or writes them (`read(2)`), where the
/// pager cannot serve a fault inside the call; none elsewhere (no lock for
/// a buffer that is not the pager's). A piece that cannot be guarded (larger than
/// the budget; a page of a region the program made read-only, which a
/// read into it would fault on for a write) gets none: the call may then
/// fail with `EFAULT`, as it would without the shim. The table's lock is
/// held only while the guards are taken, not across the call.
///
/// Not for the vectored calls: their `iovec`s are the program's memory,
/// which the shim does not read (the kernel answers a bad one with
/// `EFAULT`; the shim would crash).
pub fn resident_for_call(
    buf: usize,
    len: usize,
    writes: bool,
) -> Vec<engine::ResidentGuard<'static>> {
    let end = buf.saturating_add(len);
    if len == 0 || !needed() || !any() || !spans::may_be_ours(buf, end) {
        return Vec::new();
    }
    let mut st = state();
    let Some(st) = st.as_mut() else {
        return Vec::new();
    };
    let mut guards = Vec::new();
    for e in &st.maps {
        let base = e.region.as_ptr() as usize;
        // (Only the regions whose span meets the buffer are asked for
        // their pieces: that takes an engine lock and allocates.)
        if base >= end || buf >= base.saturating_add(e.region.len()) {
            continue;
        }
        for piece in e.region.mapped() {
            let (a, b) = (piece.start.max(buf), piece.end.min(end));
            if a < b && a >= base {
                if let Ok(g) = e.region.lock_resident_owned(a - base, b - a, writes) {
                    guards.push(g);
                }
            }
        }
    }
    guards
}
