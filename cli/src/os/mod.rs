//! The command line's own raw layer: what its kernel floors, its probe and
//! the kernel baseline (`random`, `scan`, `filemap`) need from the kernel,
//! below the engine's public API.
//!
//! It is built on the stock crates: `userfaultfd` for descriptors and their
//! ioctls, `memmap2` for mappings, `nix` for memfds, `madvise`, signals,
//! `eventfd` and `poll`. Where those have no API for something (UFFDIO_MOVE,
//! the `UFFDIO_API` probe, the newer feature bits, `process_madvise`), it is
//! written here against the kernel ABI with `libc`, each piece documented
//! where it is defined. [`interrupt`] cleans up after SIGINT, SIGTERM, SIGHUP and SIGQUIT.

pub mod cgroup;
pub mod interrupt;
pub mod mem;
pub mod signal;
pub mod uffd;
