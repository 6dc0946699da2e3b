//! Residency guards: a range of a region kept resident for a system call
//! that reads or writes it, where the pager cannot serve a fault inside
//! one (in-thread delivery, the C default, or a user-mode-only
//! descriptor: the call would fail with `EFAULT`).

use crate::region::uffd_pager_region;
use crate::{fail_with, guard, non_null};

/// A residency guard (opaque): its range stays resident until
/// [`uffd_pager_resident_free`].
pub struct uffd_pager_resident {
    _guard: engine::ResidentGuard<'static>,
}

/// Faults `[offset, offset+len)` of `r` in and keeps it resident until
/// `*out` is given to [`uffd_pager_resident_free`] (the `mlock` analog):
/// for a buffer a system call reads or writes while other threads keep the
/// pager at its budget, where `uffd_pager_region_prefault` alone may see
/// the range evicted again before the call. A range larger than the budget
/// is refused (-ENOMEM), as a range outside the region (-EINVAL). The
/// guard may outlive the region and the pager: it keeps what the pager
/// needs to give its pages back until it is freed. As for
/// `uffd_pager_region_prefault`, the pages are faulted in for writing: in a
/// writable shared region they count as written, and are written back.
///
/// # Safety
/// `r` is a live region handle; `out` points at writable memory for a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_lock_resident(
    r: *const uffd_pager_region,
    offset: usize,
    len: usize,
    out: *mut *mut uffd_pager_resident,
) -> i32 {
    guard(|| {
        non_null!(r);
        non_null!(out);
        // SAFETY: a live region handle (the caller's contract).
        match unsafe { &(*r).region }.lock_resident_owned(offset, len, true) {
            Ok(g) => {
                // SAFETY: `out` is non-NULL and points at a pointer (the
                // caller's contract).
                unsafe { out.write(Box::into_raw(Box::new(uffd_pager_resident { _guard: g }))) };
                0
            }
            Err(e) => fail_with(&e),
        }
    })
}

/// Lets the range of a guard made by [`uffd_pager_region_lock_resident`]
/// be evicted again, and frees the guard. NULL: nothing.
///
/// # Safety
/// `g` is NULL or a guard not freed yet.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_resident_free(g: *mut uffd_pager_resident) {
    if g.is_null() {
        return;
    }
    guard(|| {
        // SAFETY: a guard made by `uffd_pager_region_lock_resident` and not
        // freed yet (the caller's contract).
        drop(unsafe { Box::from_raw(g) });
        0
    });
}
