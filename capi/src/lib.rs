//! The C API of uffd-pager: `libuffd_pager.so` and `libuffd_pager.a`, with
//! the header `include/uffd_pager.h` (generated from this crate by cbindgen)
//! and UMap's C calls (`include/umap/umap.h`, [`umap`]).
//!
//! Every exported function:
//! - returns 0 or a value on success and a **negative errno** on failure,
//!   and leaves a message for [`uffd_pager_last_error`] on the calling
//!   thread;
//! - runs its body under `catch_unwind`, so no panic crosses into C (a
//!   panic is `-EFAULT` with the panic's message);
//! - treats a NULL pointer argument as `-EINVAL`, never as a crash. Other
//!   pointers must point at what the header says; that is the C caller's
//!   half of the contract, as with any C library.
//!
//! Every struct carries the size the program was built with, so the
//! library and a program built against an older or newer header agree on
//! what each byte means (`abi.rs`).

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

mod abi;
mod fd_store;
mod pager;
mod region;
mod resident;
mod stats;
mod store;
pub mod umap;
pub mod umap_cfg;
mod umap_settings;
mod umap_state;

pub use pager::*;
pub use region::*;
pub use stats::*;
pub use store::*;

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error and returns `-errno`.
pub(crate) fn fail(errno: i32, msg: impl std::fmt::Display) -> i32 {
    let text = msg.to_string().replace('\0', " ");
    // (`try_with`: a call from a thread-exit destructor, after this
    // thread's locals are gone, keeps no message but must not panic.)
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = CString::new(text).unwrap_or_default());
    -errno.abs().max(1)
}

/// This thread's last error message, as text.
pub(crate) fn error_text() -> String {
    LAST_ERROR
        .try_with(|e| e.borrow().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// An engine error as `-errno`, its message kept for
/// [`uffd_pager_last_error`].
pub(crate) fn fail_with(e: &engine::Error) -> i32 {
    fail(e.errno(), e)
}

/// Runs `f`, turning a panic into `-EFAULT` with its message.
pub(crate) fn guard(f: impl FnOnce() -> i32) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(rc) => rc,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(libc::EFAULT, format_args!("internal error: {what}"))
        }
    }
}

/// `-EINVAL` unless `p` is non-NULL.
macro_rules! non_null {
    ($p:expr) => {
        if $p.is_null() {
            return $crate::fail(libc::EINVAL, concat!(stringify!($p), " is NULL"));
        }
    };
}
pub(crate) use non_null;

/// The version of the library's binary interface, which its SONAME
/// carries (`libuffd_pager.so.1`, `build.rs`). Structs grow without a new
/// version (see `uffd_pager_config.size`); a changed call or field meaning
/// takes one.
pub const UFFD_PAGER_ABI_VERSION: u32 = 1;

/// The ABI version of the library loaded: [`UFFD_PAGER_ABI_VERSION`] of
/// the header it was built from. A program may compare it with the
/// header's at start-up.
#[no_mangle]
pub extern "C" fn uffd_pager_abi_version() -> u32 {
    UFFD_PAGER_ABI_VERSION
}

/// The message of the calling thread's last failed call ("" if none). The
/// string stays valid until this thread's next failing call.
#[no_mangle]
pub extern "C" fn uffd_pager_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}
