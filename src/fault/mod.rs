//! The fault path: one [`Fault`] value flows through the driver
//! ([`handle_fault`]) into attempts (`attempt.rs`) that consult the page
//! cache, read the store and install the page.
//!
//! ```text
//! delivery ─► handle_fault ─► attempt(Region) ─► page cache / store ─► install
//!                 │  RETRY / abort (per policy)
//!                 └─────────► attempt(Global) ─► …
//! ```

mod around;
pub(crate) use around::GROWTH as FAULT_AROUND_GROWTH;
mod attempt;
mod driver;
mod install;
mod load;

pub use driver::{handle_fault, handle_fault_once, handle_fault_since};
use std::fmt;
use std::str::FromStr;

/// What the driver does after a region attempt returns RETRY (see
/// `kernel-model.md`, "The driver").
///
/// ```
/// use uffd_pager::{Policy, PolicyKind};
///
/// let p: Policy = "retry-once+uptodate-no-retry".parse().unwrap();
/// assert_eq!(p.kind, PolicyKind::RetryOnce);
/// assert!(p.uptodate_no_retry);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Every attempt under the global lock (kernels before 6.4).
    GlobalOnly,
    /// Region attempt, then global attempts on RETRY (mainline today).
    Vanilla,
    /// One more region attempt on RETRY (`tried` only if the first was
    /// major), then the global lock (P1 in seed 004).
    RetryOnce,
    /// As `RetryOnce`, but the second region attempt always has `tried`
    /// set (P2 in seed 004; breaks major-fault accounting).
    RetryOnceTried,
}

impl PolicyKind {
    /// Every policy, in report order.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::GlobalOnly,
        PolicyKind::Vanilla,
        PolicyKind::RetryOnce,
        PolicyKind::RetryOnceTried,
    ];

    /// The CLI spelling.
    ///
    /// Example: [`PolicyKind`](crate::PolicyKind).
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::GlobalOnly => "global-only",
            PolicyKind::Vanilla => "vanilla",
            PolicyKind::RetryOnce => "retry-once",
            PolicyKind::RetryOnceTried => "retry-once-tried",
        }
    }
}

/// A fault-handling policy: the driver kind plus the `uptodate-no-retry`
/// option (P3 in seed 004: a page that is up to date but locked by another
/// faulter is waited for under the lock, without RETRY).
///
/// See [`PolicyKind`] for an example.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// The driver.
    pub kind: PolicyKind,
    /// The `uptodate-no-retry` option.
    pub uptodate_no_retry: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            kind: PolicyKind::RetryOnce,
            uptodate_no_retry: false,
        }
    }
}

impl Policy {
    /// A policy without the option.
    ///
    /// Example: [`Policy`](crate::Policy).
    pub const fn new(kind: PolicyKind) -> Policy {
        Policy {
            kind,
            uptodate_no_retry: false,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        if self.uptodate_no_retry {
            f.write_str("+uptodate-no-retry")?;
        }
        Ok(())
    }
}

/// Parses `vanilla`, `retry-once`, `retry-once-tried`, `global-only`, each
/// optionally followed by `+uptodate-no-retry`.
impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (base, opt) = match s.split_once('+') {
            Some((b, o)) => (b, Some(o)),
            None => (s, None),
        };
        let kind = PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == base)
            .ok_or_else(|| {
                format!(
                    "unknown policy {base:?} (global-only, vanilla, retry-once, retry-once-tried, \
                     optionally +uptodate-no-retry)"
                )
            })?;
        let uptodate_no_retry = match opt {
            None => false,
            Some("uptodate-no-retry") => true,
            Some(o) => return Err(format!("unknown policy option {o:?} (uptodate-no-retry)")),
        };
        Ok(Policy {
            kind,
            uptodate_no_retry,
        })
    }
}

/// What the hardware (or the kernel's fault message) said about an
/// access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// A write.
    pub write: bool,
    /// Whether the page was present: `Some(true)` for a write-protect
    /// fault, `Some(false)` for a missing or minor fault, `None` where the
    /// engine faults a page in itself (prefault, populate) and nobody knows.
    pub present: Option<bool>,
    /// The region the access is for, by id, where the engine makes it
    /// itself for one region's call: another region found at the address
    /// (the application's `munmap` of the range applied since the call
    /// looked, and a new region mapped there) is no region for it.
    pub region: Option<u64>,
}

impl Access {
    /// An access of unknown kind by the engine itself (populate, prefault,
    /// a residency guard) for region `region`.
    pub const fn engine(write: bool, region: u64) -> Access {
        Access {
            write,
            present: None,
            region: Some(region),
        }
    }
}

/// One fault as it flows through the driver: the kernel's `vm_fault` plus
/// its `FAULT_FLAG_TRIED`.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// Faulting address.
    pub addr: usize,
    /// A write access.
    pub write: bool,
    /// Whether the page was present at the access (see [`Access`]).
    pub present: Option<bool>,
    /// The region the access must find (see [`Access`]).
    pub region: Option<u64>,
    /// `FAULT_FLAG_TRIED`: the lock may be held across I/O and waits.
    pub tried: bool,
    /// This fault did store I/O (counted once in `PGMAJFAULT`).
    pub major: bool,
}

impl Fault {
    /// A fresh fault.
    pub fn new(addr: usize, access: Access) -> Fault {
        Fault {
            addr,
            write: access.write,
            present: access.present,
            region: access.region,
            tried: false,
            major: false,
        }
    }
}

/// The result of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The page is installed (or was already).
    Done,
    /// The lock was dropped; try again. `major` if this attempt did I/O.
    Retry {
        /// The attempt did store I/O.
        major: bool,
    },
    /// A region attempt could not start: go to the global lock.
    Abort,
    /// No region at the address.
    Segv,
    /// The region refuses the access: a write to a page of a read-only
    /// store (SIGSEGV).
    Denied,
    /// The page is poisoned (store read failed for good).
    Bus,
    /// No page can be had now and nothing marks the address: the huge
    /// page pool is empty, or the kernel refused the install. The page
    /// stays absent; the access gets SIGBUS, which the delivery raises.
    NoPage,
    /// An event is waiting to be read (an ioctl failed with EAGAIN): the
    /// attempt undid what it had started; restart the fault once the event
    /// is applied.
    Restart,
}

/// What the delivery layer must do for the faulting thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The page is present: let the access run again.
    Resolved,
    /// SIGSEGV semantics: the region refuses the access.
    Segv,
    /// No region at the address: SIGSEGV semantics for an access being
    /// made now (in-thread delivery). A handler thread's fault message can
    /// outlive its fault (the thread left the kernel's wait on a signal or a
    /// spurious wake-up, faulted again, and the other message's wake let it
    /// go on), so for a message this only means "wake the thread": if it
    /// still waits, its access runs again against the kernel's view (which
    /// raises SIGSEGV itself on a range being unmapped or gone).
    NoRegion,
    /// SIGBUS semantics: the page is poisoned (marked with
    /// `UFFDIO_POISON`, so the access run again gets SIGBUS from the
    /// kernel).
    Bus,
    /// SIGBUS semantics with nothing marking the page ([`Outcome::NoPage`]):
    /// the access run again would fault again, so the delivery raises
    /// SIGBUS itself (a handler thread with `tgkill` to the faulting
    /// thread, before the wake).
    NoPage,
    /// Not resolved yet: a non-cooperative event must be read and applied
    /// first (handler threads read it, then call again).
    Restart,
}

/// Which lock an attempt runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// The region (per-VMA) lock, found by lockless lookup.
    Region,
    /// The global lock, held for read.
    Global,
}
