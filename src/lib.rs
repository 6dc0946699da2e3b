//! uffd-pager: services real page faults in userspace through userfaultfd,
//! with the Linux fault path's locking and retry semantics.
//!
//! ```no_run
//! use uffd_pager::{Pager, Policy, PolicyKind};
//!
//! let pager = Pager::builder()
//!     .policy(Policy::new(PolicyKind::RetryOnce))
//!     .build()?;
//! let mut region = pager.map_anonymous(16 << 20)?;
//! region.as_mut_slice()[4096] = 7; // a real page fault, served by the engine
//! assert_eq!(region.as_slice()[4096], 7);
//! println!("{}", pager.stats());
//! # Ok::<(), uffd_pager::Error>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![deny(unnameable_types)]

mod address_space;
mod collapse;
mod delivery;
mod discard;
mod durability;
mod error;
mod events;
mod fault;
mod footprint;
mod fork;
mod hold;
mod inject;
mod io;
mod kept;
mod lru;
mod madvise;
mod mmap;
mod mprotect;
mod mremap;
mod munmap;
mod object;
#[cfg(loom)]
pub mod page_cache;
#[cfg(not(loom))]
mod page_cache;
mod pager;
mod readahead;
mod reclaim;
mod refresh;
mod region;
mod region_table;
mod resident;
mod rmap;
mod stats;
pub mod store;
#[cfg(loom)]
pub mod sync;
#[cfg(not(loom))]
mod sync;
mod sys;
mod unwritten;
mod vma;
mod write_error;
mod writeback;

pub use delivery::Delivery;
pub use error::{Error, Result};
pub use fault::{Policy, PolicyKind};
pub use footprint::{Footprint, MemoryUse};
pub use hold::AddressHold;
pub use lru::DrainPolicy;
pub use object::InstallKind;
pub use pager::{limits, Access, MapOptions, Pager, PagerBuilder};
pub use reclaim::watermarks;
pub use region::Region;
pub use resident::ResidentGuard;
pub use stats::histogram::{AtomicHistogram, Percentiles};
pub use stats::{Counter, Stats};
pub use sync::global_lock::Contention;
pub use sys::huge::{Pool as HugePagePool, HUGE_PAGE_SIZE};
pub use sys::pipe::PipePool;
pub use sys::thread::in_engine;
pub use sys::uffd::Descriptor;
/// The page size the engine works in (bytes): x86-64's base page.
pub use sys::PAGE_SIZE;

/// Test hooks for the scripted scenario tests (feature `fault-inject`,
/// never on in a normal build): functions called at chosen points of the
/// fault path and of unmap, and holds on a pager's locks.
#[cfg(feature = "fault-inject")]
pub mod testing {
    pub use crate::inject::{
        fail_next_remap, fail_next_reprotect, fail_next_reregister, set_after_detach,
        set_after_event, set_after_listed, set_after_lookup, set_after_published,
        set_after_reprotect, set_before_map, set_before_message, set_before_own_range,
        set_before_range_change, skip_next_remap_wait, Hook, MapHook, Site,
    };
    pub use crate::pager::inject::{GlobalWriteHold, RegionWriteHold};
    pub use crate::sync::pins::hook::set_after_unpin;
}

/// The README's examples, compiled and run as doc tests (with the `redis`
/// feature, which its far-memory example needs; `make test` turns it on).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "redis"))]
pub struct ReadmeDoctests;
