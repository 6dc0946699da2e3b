//! The command line's library half: the seed workloads and the benches
//! (with their kernel floors), shared by the `uffd-pager` binary, the
//! benches in `benches/` and the tests in `cli/tests/`.
//!
//! It reaches the engine only through `uffd_pager`'s public API, and the
//! kernel through its own raw layer, [`os`].

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod bench;
pub mod far;
pub mod os;
pub mod workload;

use uffd_pager::Error;

/// The engine's error for a failed system call `op` with `errno`.
pub(crate) fn sys_error(op: &'static str, errno: i32) -> Error {
    Error::Sys { op, errno }
}

/// [`sys_error`] for the `std::io::Error` of a failed call `op` (`EIO` if
/// it carries no errno).
pub(crate) fn io_error(op: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| sys_error(op, e.raw_os_error().unwrap_or(libc::EIO))
}
