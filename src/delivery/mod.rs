//! Fault delivery: how a fault reaches the engine.
//!
//! - **In-thread** ([`sigbus`]): userfaultfd's SIGBUS feature. The faulting
//!   thread runs the fault path itself in its signal handler, as the kernel
//!   runs it in the faulting task. No thread hop, no wake-up. Faults taken
//!   inside syscalls fail with EFAULT (see [`crate::Region::prefault`]).
//! - **Handler threads** ([`threads`]): a pool reads fault messages from the
//!   descriptor and resolves them. Serves faults taken inside syscalls too,
//!   when the descriptor is not user-mode-only.
//! - **One descriptor per region** ([`per_region`]): handler threads again,
//!   but every region is registered with a userfaultfd of its own, served
//!   by a handler thread of its own.

mod chain;
mod done;
pub mod per_region;
mod read;
mod segv;
pub mod sigbus;
mod stack;
pub mod threads;

use std::fmt;
use std::str::FromStr;

/// How faults reach the engine.
///
/// ```
/// use uffd_pager::{Delivery, Pager};
///
/// let d: Delivery = "threads:2".parse().map_err(uffd_pager::Error::Config)?;
/// let pager = Pager::builder().delivery(d).build()?;
/// let region = pager.map_anonymous(4096)?;
/// assert_eq!(region.as_slice()[0], 0); // served by a handler thread
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// The faulting thread handles its own fault (UFFD_FEATURE_SIGBUS).
    #[default]
    InThread,
    /// A pool of handler threads reads fault messages.
    Threads {
        /// Handler threads.
        threads: usize,
        /// Microseconds to poll the descriptor before blocking (0: block at once).
        spin_us: u32,
    },
    /// One userfaultfd per region, each served by its own handler thread:
    /// the kernel's fault wait queue is sharded by region, and a region's
    /// faults wake only its own handler. Costs a descriptor and a thread
    /// per region.
    PerRegion,
}

impl Delivery {
    /// Whether faults are handled in the faulting thread.
    ///
    /// Example: [`Delivery`](crate::Delivery).
    pub fn is_in_thread(&self) -> bool {
        matches!(self, Delivery::InThread)
    }

    /// The default handler-thread count: one per CPU. `uffd-pager bench
    /// wakeup`, `random` and `filemap` with several faulting threads all ran
    /// faster with a handler per CPU than with one; only a lone faulter
    /// touching pages one after another did better with one (README,
    /// "Speed").
    ///
    /// Example: [`Delivery`](crate::Delivery).
    pub fn per_cpu_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    /// Handler threads serving the whole pager (0 for in-thread and
    /// per-region delivery, whose handlers come with the regions).
    ///
    /// Example: [`Delivery`](crate::Delivery).
    pub fn pool_threads(&self) -> usize {
        match self {
            Delivery::Threads { threads, .. } => *threads,
            Delivery::InThread | Delivery::PerRegion => 0,
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Delivery::InThread => f.write_str("in-thread"),
            Delivery::PerRegion => f.write_str("per-region"),
            Delivery::Threads { threads, spin_us } => {
                write!(f, "threads:{threads}")?;
                if *spin_us > 0 {
                    write!(f, ":spin{spin_us}")?;
                }
                Ok(())
            }
        }
    }
}

/// Parses `in-thread` (or `sigbus`), `threads` (one handler per CPU),
/// `threads:N`, `threads:N:spinUS`, `per-region`; N and US within
/// [`crate::limits`].
impl FromStr for Delivery {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "bad delivery {s:?} (in-thread, threads[:N[:spinUS]] with N in 1..={} and US at \
                 most {}, per-region)",
                crate::limits::MAX_THREADS,
                crate::limits::MAX_SPIN_US
            )
        };
        let mut it = s.split(':');
        match it.next() {
            Some("in-thread") | Some("sigbus") if s.find(':').is_none() => Ok(Delivery::InThread),
            Some("per-region") if s.find(':').is_none() => Ok(Delivery::PerRegion),
            Some("threads") => {
                let threads = match it.next() {
                    None => Delivery::per_cpu_threads(),
                    Some(n) => n
                        .parse()
                        .ok()
                        .filter(|&n| n > 0 && n <= crate::limits::MAX_THREADS)
                        .ok_or_else(bad)?,
                };
                let spin_us = match it.next() {
                    None => 0,
                    Some(x) => x
                        .strip_prefix("spin")
                        .and_then(|v| v.parse().ok())
                        .filter(|&us| us <= crate::limits::MAX_SPIN_US)
                        .ok_or_else(bad)?,
                };
                if it.next().is_some() {
                    return Err(bad());
                }
                Ok(Delivery::Threads { threads, spin_us })
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!("in-thread".parse(), Ok(Delivery::InThread));
        assert_eq!(
            "threads:2:spin50".parse(),
            Ok(Delivery::Threads {
                threads: 2,
                spin_us: 50
            })
        );
        assert!("threads:0".parse::<Delivery>().is_err());
        assert_eq!(
            "threads".parse(),
            Ok(Delivery::Threads {
                threads: Delivery::per_cpu_threads(),
                spin_us: 0
            })
        );
        assert_eq!("per-region".parse(), Ok(Delivery::PerRegion));
        assert_eq!(Delivery::PerRegion.to_string(), "per-region");
        assert!("per-region:2".parse::<Delivery>().is_err());
        assert!("bogus".parse::<Delivery>().is_err());
    }
}
