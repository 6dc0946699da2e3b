//! uffd-pager: services real page faults in userspace through userfaultfd,
//! with the Linux fault path's locking and retry semantics.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod stats;
pub mod store;
pub mod sys;
