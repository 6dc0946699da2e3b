//! Benchmarks that put the engine next to the floor the kernel sets.
//!
//! [`fault_cost`] measures the per-fault cost of the engine against a *raw
//! floor loop* ([`FloorLoop`]): the same userfaultfd ioctls, driven by the
//! smallest possible handler, with no engine in between. Figures on these
//! machines are noisy (see `limits.md`), so the result that matters is the
//! ratio of the two measured in the same run.
//!
//! What both sides do per fault (one page, one volatile read per page):
//!
//! | kind | floor | engine |
//! |---|---|---|
//! | anonymous | one UFFDIO_COPY of 4 KiB straight from the source buffer | store read into a buffer, lookup, locks, one UFFDIO_COPY (the engine's regions here are read-only; a writable one's page goes through the cache area and UFFDIO_MOVE) |
//! | shared | `pwrite` of 4 KiB from the source into a punched-out memfd page, UFFDIO_CONTINUE | store read into its punched-out memfd page (`Store::read_to_fd`), lookup, locks, UFFDIO_CONTINUE |
//!
//! (With 2 MiB pages the anonymous floor copies 2 MiB with UFFDIO_COPY and
//! the shared one copies into a hugetlbfs memfd through a second mapping:
//! see [`FloorLoop`].)
//!
//! The engine side maps a fresh region over a pre-filled
//! [`MemoryStore`](uffd_pager::store::MemoryStore) per pass, so every page is a
//! major fault; map and unmap are outside the timed loop. The floor's pages
//! are made absent again with `MADV_DONTNEED` between passes (also untimed).
//!
//! # Floor and engine must not overlap in time
//! In in-thread delivery the floor installs its own process-wide SIGBUS
//! handler for the duration of each floor pass and restores the previous
//! one afterwards (faults at addresses it does not own are passed on to
//! that previous handler, so other pagers keep working meanwhile). Floor
//! passes are serialised process-wide; [`fault_cost`] runs floor and engine
//! passes one after the other, never concurrently.

mod engine;
mod evict;
mod far;
mod floor;
pub mod kernel_baseline;
mod random_floor;
mod scale;
pub mod verdict;
mod wakeup;

pub use engine::EngineLoop;
pub use evict::{evict_cost, EvictReport};
pub use far::{far_miss, far_scan, FarMissReport, FarScanReport};
pub use floor::FloorLoop;
pub use random_floor::{random_floor, RandomFloor, RandomFloorReport};
pub use scale::{scale, ScaleReport};
pub use wakeup::{wakeup_placement, WakeupReport};

use std::time::{Duration, Instant};
use uffd_pager::{Delivery, Error, InstallKind, Result, PAGE_SIZE};

/// What [`fault_cost`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultCostConfig {
    /// Pages faulted per pass (each touched once).
    pub pages: usize,
    /// Timed passes per side (after one untimed warm-up pass each).
    pub passes: usize,
    /// How pages are installed.
    pub kind: InstallKind,
    /// How faults are delivered, to the floor's handler and to the engine.
    pub delivery: Delivery,
    /// The worker hop: the engine's store is ordinary Rust (not
    /// signal-safe), so each read goes through an I/O worker; the floor
    /// hands each page copy to a worker thread of its own with a raw futex
    /// ping-pong ([`FloorLoop::with_hop`]).
    pub hop: bool,
    /// Page size of both sides: [`PAGE_SIZE`] or
    /// [`HUGE_PAGE_SIZE`](uffd_pager::HUGE_PAGE_SIZE) (hugetlb on both;
    /// `pages` then counts 2 MiB pages, and each side takes `pages` from
    /// the pool while its pass's pages are in).
    pub page_size: usize,
}

impl Default for FaultCostConfig {
    fn default() -> Self {
        FaultCostConfig {
            pages: 4096,
            passes: 5,
            kind: InstallKind::Anonymous,
            delivery: Delivery::InThread,
            hop: false,
            page_size: PAGE_SIZE,
        }
    }
}

/// The result of [`fault_cost`]. Every figure is microseconds per page
/// (per fault) of the timed touch loop.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultCostReport {
    /// The configuration measured.
    pub config: FaultCostConfig,
    /// The floor's best pass.
    pub floor_us_per_page: f64,
    /// The engine's best pass.
    pub engine_us_per_page: f64,
    /// `engine_us_per_page / floor_us_per_page`: best-of against best-of,
    /// the least noise-sensitive comparison on a shared machine.
    pub ratio: f64,
    /// The floor's median pass.
    pub floor_median_us_per_page: f64,
    /// The engine's median pass.
    pub engine_median_us_per_page: f64,
    /// Median against median.
    pub median_ratio: f64,
    /// Every timed floor pass, in order.
    pub floor_passes: Vec<f64>,
    /// Every timed engine pass, in order.
    pub engine_passes: Vec<f64>,
}

/// Measures the engine's per-fault cost against the raw floor loop.
///
/// Builds both sides (the engine first, so that its process-wide SIGBUS
/// handler is in place before the floor saves and restores it), runs one
/// untimed warm-up pass of each, then `passes` timed passes interleaved
/// floor, engine, floor, engine… so that machine drift affects both alike.
/// The floor and engine passes never overlap in time.
pub fn fault_cost(cfg: &FaultCostConfig) -> Result<FaultCostReport> {
    if cfg.pages == 0 {
        return Err(Error::Config("fault-cost needs at least one page".into()));
    }
    if cfg.passes == 0 {
        return Err(Error::Config("fault-cost needs at least one pass".into()));
    }
    if cfg.hop && cfg.page_size != PAGE_SIZE {
        return Err(Error::Config(
            "the worker hop is measured with 4 KiB pages only".into(),
        ));
    }
    let mut engine = if cfg.hop {
        EngineLoop::with_hop(cfg.pages, cfg.kind, cfg.delivery)?
    } else {
        EngineLoop::new(cfg.pages, cfg.kind, cfg.delivery, cfg.page_size)?
    };
    // The floor has one range: with one descriptor per region, that is one
    // descriptor and one handler thread.
    let floor_delivery = match cfg.delivery {
        Delivery::PerRegion => Delivery::Threads {
            threads: 1,
            spin_us: 0,
        },
        d => d,
    };
    let mut floor = if cfg.hop {
        FloorLoop::with_hop(cfg.pages, cfg.kind, floor_delivery)?
    } else {
        FloorLoop::new(cfg.pages, cfg.kind, floor_delivery, cfg.page_size)?
    };
    floor.pass(cfg.pages)?;
    engine.pass(cfg.pages)?;
    let per_page = |d: Duration| d.as_secs_f64() * 1e6 / cfg.pages as f64;
    let mut floor_passes = Vec::with_capacity(cfg.passes);
    let mut engine_passes = Vec::with_capacity(cfg.passes);
    for _ in 0..cfg.passes {
        floor_passes.push(per_page(floor.pass(cfg.pages)?));
        engine_passes.push(per_page(engine.pass(cfg.pages)?));
    }
    let floor_best = min(&floor_passes);
    let engine_best = min(&engine_passes);
    let floor_median = median(&floor_passes);
    let engine_median = median(&engine_passes);
    Ok(FaultCostReport {
        config: *cfg,
        floor_us_per_page: floor_best,
        engine_us_per_page: engine_best,
        ratio: engine_best / floor_best,
        floor_median_us_per_page: floor_median,
        engine_median_us_per_page: engine_median,
        median_ratio: engine_median / floor_median,
        floor_passes,
        engine_passes,
    })
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The byte every byte of page `i` holds on both sides (never zero, so a
/// page installed as zeros is caught).
#[inline]
pub(crate) fn pattern(i: usize) -> u8 {
    (i % 251) as u8 + 1
}

/// The timed loop: one volatile read of the first byte of each of the first
/// `n` pages (of `page_size` bytes) at `base`. Returns the elapsed time,
/// after checking that every page held its pattern.
pub(crate) fn touch(base: usize, n: usize, page_size: usize) -> Result<Duration> {
    touch_from(base, 0, n, page_size)
}

/// [`touch`] over pages `first..first + n` of the mapping at `base`.
pub(crate) fn touch_from(
    base: usize,
    first: usize,
    n: usize,
    page_size: usize,
) -> Result<Duration> {
    // Each page's byte is kept and checked after the clock stops (a sum
    // would pass two pages that came back swapped).
    let mut seen = vec![0u8; n];
    let t0 = Instant::now();
    for (k, b) in seen.iter_mut().enumerate() {
        // SAFETY: callers pass a live mapping of at least `first + n` pages
        // whose faults are served (by the floor's handler or the engine).
        *b = unsafe { std::ptr::read_volatile((base + (first + k) * page_size) as *const u8) };
    }
    let elapsed = t0.elapsed();
    // And each page's last byte, untimed (the page is mapped now): a page
    // filled short, zeros at its end, passed the first byte's look (found
    // by review).
    let last = |k: usize| {
        // SAFETY: as above; the page was just read, so it is mapped.
        unsafe { std::ptr::read_volatile((base + (first + k + 1) * page_size - 1) as *const u8) }
    };
    let wrong = |k: usize| {
        let want = pattern(first + k);
        [seen[k], last(k)].into_iter().find(|&b| b != want)
    };
    if let Some((k, got)) = (0..n).find_map(|k| wrong(k).map(|b| (k, b))) {
        let i = first + k;
        return Err(Error::Io {
            context: "fault-cost pass".into(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "pages read back wrong contents (page {i} holds {got}, expected {})",
                    pattern(i)
                ),
            ),
        });
    }
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages that came back swapped are wrong contents, though the sum of
    /// their bytes is right.
    #[test]
    fn touch_catches_pages_that_came_back_swapped() {
        let ps = 64;
        let mut mem = vec![0u8; 4 * ps];
        for (i, p) in mem.chunks_mut(ps).enumerate() {
            p.fill(pattern(i));
        }
        let base = mem.as_ptr() as usize;
        assert!(touch(base, 4, ps).is_ok());
        assert!(touch_from(base, 1, 3, ps).is_ok());
        mem[0] = pattern(1);
        mem[ps] = pattern(0);
        let base = mem.as_ptr() as usize;
        assert!(touch(base, 4, ps).is_err(), "pages 0 and 1 swapped");
        assert!(touch_from(base, 1, 3, ps).is_err(), "page 1 wrong");
        assert!(touch_from(base, 2, 2, ps).is_ok());
        // A page filled short: its last byte is zero.
        mem[ps - 1] = pattern(1);
        mem[0] = pattern(0);
        mem[ps] = pattern(1);
        mem[2 * ps - 1] = 0;
        let base = mem.as_ptr() as usize;
        assert!(touch_from(base, 0, 1, ps).is_err(), "page 0's last byte");
        mem[ps - 1] = pattern(0);
        let base = mem.as_ptr() as usize;
        assert!(touch_from(base, 0, 1, ps).is_ok());
        assert!(touch_from(base, 1, 1, ps).is_err(), "page 1 filled short");
    }

    fn small(kind: InstallKind, delivery: Delivery) {
        let cfg = FaultCostConfig {
            pages: 256,
            passes: 2,
            kind,
            delivery,
            hop: false,
            page_size: PAGE_SIZE,
        };
        let r = fault_cost(&cfg).unwrap_or_else(|e| panic!("{kind} {delivery}: {e}"));
        for v in [
            r.floor_us_per_page,
            r.engine_us_per_page,
            r.ratio,
            r.floor_median_us_per_page,
            r.engine_median_us_per_page,
            r.median_ratio,
        ] {
            assert!(v.is_finite() && v > 0.0, "{kind} {delivery}: {r:?}");
        }
        assert_eq!(r.floor_passes.len(), 2);
        assert_eq!(r.engine_passes.len(), 2);
    }

    #[test]
    fn fault_cost_in_thread() {
        small(InstallKind::Anonymous, Delivery::InThread);
        small(InstallKind::Shared, Delivery::InThread);
    }

    #[test]
    fn fault_cost_threads() {
        let d = Delivery::Threads {
            threads: 1,
            spin_us: 0,
        };
        small(InstallKind::Anonymous, d);
        small(InstallKind::Shared, d);
    }

    #[test]
    fn fault_cost_per_region() {
        small(InstallKind::Anonymous, Delivery::PerRegion);
        small(InstallKind::Shared, Delivery::PerRegion);
    }

    #[test]
    fn rejects_empty_runs() {
        let cfg = FaultCostConfig {
            pages: 0,
            ..FaultCostConfig::default()
        };
        assert!(fault_cost(&cfg).is_err());
        let cfg = FaultCostConfig {
            passes: 0,
            ..FaultCostConfig::default()
        };
        assert!(fault_cost(&cfg).is_err());
    }

    #[test]
    fn statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(min(&[4.0, 1.5, 2.0]), 1.5);
        assert!((1..1000).all(|i| pattern(i) != 0));
    }
}
