//! The engine's locking primitives, all futex-based and async-signal-safe:
//! they never allocate and never touch thread-local runtime state, so a
//! faulting thread may take them inside the SIGBUS handler.
//!
//! The one rule that makes that sound: **no engine lock is ever held while
//! the holder touches a region's user mapping.** The engine fills pages
//! through its own aliases and installs them with ioctls, so a SIGBUS can
//! never interrupt code that holds one of these locks.

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
