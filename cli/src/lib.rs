//! The command line's library half: the seed workloads and the benches
//! (with their kernel floors), shared by the `uffd-pager` binary, the
//! benches in `benches/` and the tests in `cli/tests/`.
//!
//! It reaches the engine only through `uffd_pager`'s public API.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod bench;
pub mod workload;

use uffd_pager::Error;

/// The engine's error for a failed system call `op` with `errno`.
pub(crate) fn sys_error(op: &'static str, errno: i32) -> Error {
    Error::Sys { op, errno }
}
