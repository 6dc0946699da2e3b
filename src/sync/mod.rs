//! The engine's locking primitives, futex-based. The sides a fault takes
//! are async-signal-safe: they never allocate and never touch
//! thread-local runtime state, so a faulting thread may take them inside
//! the SIGBUS handler. Not so the writer sides that allocate or take a
//! `std` mutex ([`rcu::Rcu::update`], [`percpu_rwsem::PercpuRwsem::write`])
//! and the worker queue's wait: each says so, and none runs in a handler.
//!
//! Two rules make that sound. **No engine lock is ever held while the
//! holder touches a region's user mapping:** the engine fills pages
//! through its own aliases and installs them with ioctls, so its own code
//! never faults while it holds one. **No application signal handler runs
//! while a thread holds one:** such a handler may touch region memory, and
//! its SIGBUS would wait on a lock its own thread holds. So the engine's
//! threads block asynchronous signals for good, its SIGBUS handler blocks
//! every signal while it runs, and the calls that take engine locks on an
//! application thread block asynchronous signals meanwhile
//! (`sys::thread::Deferred`). The one exception is a pager's drop, which
//! takes page locks and the LRU lock with signals open: no region of the
//! pager is left by then, so no handler can fault on one of its pages.

pub mod global_lock;
#[cfg(loom)]
pub mod model;
#[cfg(not(loom))]
pub(crate) mod model;
pub mod mutex;
pub mod percpu_rwsem;
pub mod pins;
pub mod rcu;
pub mod region_lock;
pub mod work_queue;
