//! Wake-up placement in handler-thread mode, measured on the raw floor
//! ([`FloorLoop`]) so that only the placement differs: `k` faulting
//! threads, each touching its own `pages` pages once per pass, served by
//!
//! - **one descriptor, one handler**: every fault goes through one queue and
//!   one thread (the engine's default, `threads:1`);
//! - **one descriptor, one handler per faulter** (`threads:k`; a handler per
//!   CPU when `k` is the CPU count): handlers compete for one queue (left
//!   out when `k` is 1: it is the first configuration then);
//! - **one handler spinning** 50 µs before it blocks (`threads:1:spin50`);
//! - **one descriptor per region**: each faulter's pages are a region of
//!   their own with its own userfaultfd and its own handler, which shards
//!   the kernel's fault wait queue and lets each wake-up go to one thread.
//!
//! The figure is wall time per fault over all faulters (the inverse of
//! throughput), best of the passes, each configuration measured in turn in
//! the same run.

use super::FloorLoop;
use std::time::{Duration, Instant};
use uffd_pager::{Delivery, Error, HugePagePool, InstallKind, Result, PAGE_SIZE};

/// What [`wakeup_placement`] measured.
#[derive(Debug, Clone)]
pub struct WakeupReport {
    /// Faulting threads.
    pub faulters: usize,
    /// Pages each faulter touches per pass.
    pub pages: usize,
    /// (configuration, µs per fault) in the order of the module docs.
    pub rows: Vec<(String, f64)>,
}

/// One configuration: its name, its floor loops, and each faulter's
/// (loop index, first page).
struct Config {
    name: String,
    loops: Vec<FloorLoop>,
    slices: Vec<(usize, usize)>,
}

/// Runs one pass: resets every loop, then `k` threads touch their slices at
/// once; `slices[j]` = (loop index, first page). Returns the wall time.
fn parallel_pass(
    loops: &mut [FloorLoop],
    slices: &[(usize, usize)],
    pages: usize,
) -> Result<Duration> {
    for l in loops.iter_mut() {
        l.reset(l.pages())?;
    }
    let loops = &*loops;
    // A start line the threads wait at: `Some(true)` to go, `Some(false)`
    // where one of them could not be started (those that were leave
    // without touching anything; a barrier would have kept them, and the
    // scope, waiting for ever).
    let start = (
        std::sync::Mutex::new(None::<bool>),
        std::sync::Condvar::new(),
    );
    let wait_start = |start: &(std::sync::Mutex<Option<bool>>, std::sync::Condvar)| {
        let mut go = start.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match *go {
                Some(go) => return go,
                None => go = start.1.wait(go).unwrap_or_else(|e| e.into_inner()),
            }
        }
    };
    let open = |go: bool| {
        *start.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(go);
        start.1.notify_all();
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = slices
            .iter()
            .map(|&(l, first)| {
                let start = &start;
                crate::workload::common::spawn_scoped(s, move || match wait_start(start) {
                    true => loops[l].touch_slice(first, pages).map(drop),
                    false => Ok(()),
                })
            })
            .collect();
        let all_started = hs.iter().all(|h| h.is_ok());
        open(all_started);
        let t0 = Instant::now();
        let mut r = Ok(());
        for h in hs {
            let done = h.and_then(|h| {
                h.join()
                    .map_err(|_| Error::Config("a faulting thread panicked".into()))?
            });
            if r.is_ok() {
                r = done;
            }
        }
        r.map(|()| t0.elapsed())
    })
}

/// Measures the placements of the module docs for `faulters` threads of
/// `pages` faults each (pages of `page_size`: 4 KiB, or 2 MiB from the
/// hugetlb pool, which must then hold every configuration's pages at
/// once), best of `passes`.
pub fn wakeup_placement(
    kind: InstallKind,
    faulters: usize,
    pages: usize,
    passes: usize,
    page_size: usize,
) -> Result<WakeupReport> {
    if faulters == 0 || pages == 0 || passes == 0 {
        return Err(Error::Config(
            "faulters, pages and passes must be at least 1".into(),
        ));
    }
    let k = faulters;
    if page_size != PAGE_SIZE {
        // The loops fill their pages lazily, so each loop's own check
        // cannot see what the others will take.
        let configs = if k > 1 { 4 } else { 3 };
        HugePagePool::require((configs * k * pages) as u64)?;
    }
    let shared = |name: String, handlers: usize, spin_us: u32| -> Result<Config> {
        let d = Delivery::Threads {
            threads: handlers,
            spin_us,
        };
        Ok(Config {
            name,
            loops: vec![FloorLoop::new(k * pages, kind, d, page_size)?],
            slices: (0..k).map(|j| (0, j * pages)).collect(),
        })
    };
    let mut configs = vec![shared("one descriptor, one handler".into(), 1, 0)?];
    if k > 1 {
        configs.push(shared(format!("one descriptor, {k} handlers"), k, 0)?);
    }
    configs.push(shared(
        "one descriptor, one handler spinning 50 µs".into(),
        1,
        50,
    )?);
    let one = Delivery::Threads {
        threads: 1,
        spin_us: 0,
    };
    configs.push(Config {
        name: format!("one descriptor per region ({k}), one handler each"),
        loops: (0..k)
            .map(|_| FloorLoop::new(pages, kind, one, page_size))
            .collect::<Result<Vec<_>>>()?,
        slices: (0..k).map(|j| (j, 0)).collect(),
    });
    let mut best = vec![f64::INFINITY; configs.len()];
    // Interleaved, so that machine drift affects every configuration alike.
    for _ in 0..passes {
        for (c, cfg) in configs.iter_mut().enumerate() {
            let t = parallel_pass(&mut cfg.loops, &cfg.slices, pages)?;
            best[c] = best[c].min(t.as_secs_f64() * 1e6 / (k * pages) as f64);
        }
    }
    Ok(WakeupReport {
        faulters,
        pages,
        rows: configs.into_iter().map(|c| c.name).zip(best).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placement_serves_every_fault() {
        for kind in [InstallKind::Anonymous, InstallKind::Shared] {
            let r = wakeup_placement(kind, 2, 64, 1, PAGE_SIZE).unwrap();
            assert_eq!(r.rows.len(), 4);
            let r = wakeup_placement(kind, 1, 16, 1, PAGE_SIZE).unwrap();
            assert_eq!(r.rows.len(), 3);
            assert!(r.rows.iter().all(|(_, us)| us.is_finite() && *us > 0.0));
        }
    }
}
