//! Fault cost against the number of regions registered at once: the same
//! number of faults, at random pages spread over `few` regions and over
//! `many` regions, measured in one run.
//!
//! Every fault is a minor anonymous fault (a zero page written for the
//! first time), so the difference between the two is what the region count
//! costs the fault path: the lockless lookup in a bigger table, and less
//! cache-resident per-region state.
//!
//! With 2 MiB pages both sides map hugetlb (each region at least one
//! page) and a fault is a 2 MiB page of zeros; the kernel side holds every
//! faulted page at once, so the pool must hold `faults` pages. The engine
//! side runs under a budget a little over them ([`huge_budget`]): a map
//! checks the pool for what all of the pager's regions may hold at once,
//! which without a budget is every page of every region, mostly never
//! touched; the pool must hold the budget's worth and two.
//!
//! Where `vm.max_map_count` is too low for `many` regions, the bench raises
//! it for the run (root only) and puts the old value back at the end, or
//! when a signal ends the run.

use crate::os::interrupt::{self, OnInterrupt};
use crate::workload::common::Rng;
use std::time::Instant;
use uffd_pager::{Error, HugePagePool, MapOptions, Pager, Result, PAGE_SIZE};

/// The result of [`scale`].
#[derive(Debug, Clone, Copy)]
pub struct ScaleReport {
    /// Regions in the small configuration.
    pub few: usize,
    /// Regions in the large configuration.
    pub many: usize,
    /// Faults timed in each.
    pub faults: usize,
    /// ns per fault with `few` regions.
    pub few_ns: f64,
    /// ns per fault with `many` regions.
    pub many_ns: f64,
    /// Seconds it took to map the `many` regions.
    pub map_many_s: f64,
    /// The kernel alone, same faults on plain anonymous mappings: ns per
    /// fault with `few` mappings.
    pub kernel_few_ns: f64,
    /// The same with `many` mappings.
    pub kernel_many_ns: f64,
}

impl ScaleReport {
    /// `many_ns / few_ns`.
    pub fn ratio(&self) -> f64 {
        self.many_ns / self.few_ns.max(1e-9)
    }

    /// The kernel's own `many / few` ratio for the same fault pattern.
    pub fn kernel_ratio(&self) -> f64 {
        self.kernel_many_ns / self.kernel_few_ns.max(1e-9)
    }
}

const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

/// `vm.max_map_count` as [`ensure_map_count`] found it and as it wrote
/// it, put back on drop (or when a signal ends the run) if it
/// raised it.
#[derive(Debug)]
struct MapCount {
    raised: Option<((usize, usize), OnInterrupt)>,
}

fn read_map_count() -> Option<usize> {
    std::fs::read_to_string(MAX_MAP_COUNT)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Writes `old` back if the limit is still `ours`: another run (or the
/// administrator) that changed it since has the last word. Two runs at
/// once each raising it would otherwise leave it raised: the second read
/// the first's value as the one to put back.
fn put_back((old, ours): (usize, usize)) {
    match read_map_count() {
        Some(now) if now == ours => {
            if let Err(e) = std::fs::write(MAX_MAP_COUNT, old.to_string()) {
                tracing::warn!("could not put vm.max_map_count back to {old}: {e}");
            }
        }
        now => tracing::warn!(
            "vm.max_map_count is {now:?}, not the {ours} this run set: left as it is (it was {old})"
        ),
    }
}

impl Drop for MapCount {
    fn drop(&mut self) {
        if let Some((values, _)) = self.raised {
            put_back(values);
        }
    }
}

/// Mappings the process has now (`/proc/self/maps` lines; 0 if it
/// cannot be read).
fn mappings_now() -> usize {
    std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count())
}

/// Mappings a run of `regions` regions may need: the worst case of three
/// per region (see [`scale`]), what the process maps already, and 4,096
/// for the pager's own (threads' stacks, the cache areas of the few
/// regions, allocations).
fn mappings_for(regions: usize) -> usize {
    regions * 3 + mappings_now() + 4096
}

/// Makes sure the kernel allows `needed` mappings (`vm.max_map_count`),
/// raising the limit when it is too low and we may; the old value comes
/// back when the returned guard drops.
fn ensure_map_count(needed: usize) -> Result<MapCount> {
    let cur: usize = read_map_count().unwrap_or(65530);
    if cur >= needed {
        return Ok(MapCount { raised: None });
    }
    let on_interrupt = interrupt::on_interrupt(move || put_back((cur, needed)));
    std::fs::write(MAX_MAP_COUNT, needed.to_string()).map_err(|e| Error::Io {
        context: format!(
            "this run needs vm.max_map_count ≥ {needed} (it is {cur}); raising it needs root"
        ),
        source: e,
    })?;
    Ok(MapCount {
        raised: Some(((cur, needed), on_interrupt)),
    })
}

/// `faults` write faults at random pages (of `ps` bytes) over `regions`
/// regions; ns per fault, and seconds spent mapping.
/// The budget, in 2 MiB pages, of a run of `faults` faults on 2 MiB pages:
/// the pages it touches, and enough more that kswapd's high watermark (a
/// thirty-second below the budget) stays above them, so nothing is
/// evicted while the faults are timed.
fn huge_budget(faults: usize) -> u64 {
    let f = faults as u64;
    f + f / 16 + 4
}

fn run(regions: usize, faults: usize, seed: u64, ps: usize) -> Result<(f64, f64)> {
    let pages_each = faults.div_ceil(regions).max(1);
    let mut b = Pager::builder()
        .readahead(0, 1)
        .fault_around(0)
        .keep_unmapped(0);
    if ps != PAGE_SIZE {
        b = b.budget_pages(huge_budget(faults) * (ps / PAGE_SIZE) as u64);
    }
    let pager = b.build()?;
    let opts = MapOptions {
        page_size: ps,
        ..MapOptions::default()
    };
    let t = Instant::now();
    let rs = (0..regions)
        .map(|_| pager.map_anonymous_with(pages_each * ps, &opts))
        .collect::<Result<Vec<_>>>()?;
    let map_s = t.elapsed().as_secs_f64();
    let bases: Vec<usize> = rs.iter().map(|r| r.as_ptr() as usize).collect();
    // SAFETY: every base maps `pages_each` writable pages of a live region.
    let ns = unsafe { time_random_writes(&bases, pages_each, faults, seed, ps) };
    drop(rs);
    Ok((ns, map_s))
}

/// Writes one byte at `faults` distinct random pages (of `ps` bytes) of
/// the mappings at `bases` (`pages_each` pages each); returns ns per write.
///
/// # Safety
/// Each base must map `pages_each` writable pages of `ps` bytes for the
/// whole call.
unsafe fn time_random_writes(
    bases: &[usize],
    pages_each: usize,
    faults: usize,
    seed: u64,
    ps: usize,
) -> f64 {
    let mut targets: Vec<usize> = (0..bases.len() * pages_each).collect();
    Rng::new(seed).shuffle(&mut targets);
    targets.truncate(faults);
    let addrs: Vec<usize> = targets
        .iter()
        .map(|&t| bases[t / pages_each] + (t % pages_each) * ps)
        .collect();
    let t = Instant::now();
    for &a in &addrs {
        // SAFETY: `a` is a page of one of the caller's live mappings.
        unsafe { std::ptr::write_volatile(a as *mut u8, 1) };
    }
    t.elapsed().as_nanos() as f64 / addrs.len().max(1) as f64
}

/// The same fault pattern on plain anonymous mappings, faulted by the
/// kernel alone: one mapping per region, made one after the other as the
/// engine makes its regions' (an anonymous region needs no other mapping
/// until it swaps), so adjacent ones may merge into one kernel VMA just as
/// the engine's do.
fn kernel_run(regions: usize, faults: usize, seed: u64, ps: usize) -> Result<f64> {
    let pages_each = faults.div_ceil(regions).max(1);
    let mut keep = Vec::with_capacity(regions);
    for _ in 0..regions {
        keep.push(
            crate::os::mem::anonymous_sized(pages_each * ps, ps)
                .map_err(crate::io_error("mmap"))?,
        );
    }
    let bases: Vec<usize> = keep.iter().map(|m| m.as_ptr() as usize).collect();
    // SAFETY: every base maps `pages_each` writable pages kept in `keep`.
    Ok(unsafe { time_random_writes(&bases, pages_each, faults, seed, ps) })
}

/// Measures fault cost with `few` and with `many` regions of pages of
/// `page_size` (see the module docs), best of `passes` each (interleaved).
pub fn scale(
    few: usize,
    many: usize,
    faults: usize,
    passes: usize,
    page_size: usize,
) -> Result<ScaleReport> {
    if few == 0 || many == 0 || faults == 0 {
        return Err(Error::Config(
            "regions and faults must be at least 1".into(),
        ));
    }
    if page_size != PAGE_SIZE {
        HugePagePool::require(huge_budget(faults) + 2)?;
    }
    let ps = page_size;
    // An anonymous region costs one mapping until it swaps (adjacent ones
    // usually merge); leave room for the worst case, where none merge and
    // each also makes its cache area and in-memory swap. The limit is put
    // back when this returns, with a result or an error.
    let _map_count = ensure_map_count(mappings_for(many))?;
    let (mut few_ns, mut many_ns, mut map_many_s) = (f64::INFINITY, f64::INFINITY, 0.0);
    let (mut kernel_few_ns, mut kernel_many_ns) = (f64::INFINITY, f64::INFINITY);
    for p in 0..passes.max(1) {
        few_ns = few_ns.min(run(few, faults, p as u64, ps)?.0);
        let (ns, m) = run(many, faults, p as u64, ps)?;
        if ns < many_ns {
            many_ns = ns;
            map_many_s = m;
        }
        kernel_few_ns = kernel_few_ns.min(kernel_run(few, faults, p as u64, ps)?);
        kernel_many_ns = kernel_many_ns.min(kernel_run(many, faults, p as u64, ps)?);
    }
    Ok(ScaleReport {
        few,
        many,
        faults,
        few_ns,
        many_ns,
        map_many_s,
        kernel_few_ns,
        kernel_many_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serialises the tests that change `vm.max_map_count`.
    static LIMIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_limit_changed_by_another_run_meanwhile_is_left_alone() {
        let _one = LIMIT.lock().unwrap_or_else(|e| e.into_inner());
        // (Root only: the limit is the machine's.)
        let Some(cur) = read_map_count() else { return };
        let Ok(raised) = ensure_map_count(cur + 10) else {
            return;
        };
        assert_eq!(read_map_count(), Some(cur + 10));
        // Another run raises it further meanwhile.
        std::fs::write(MAX_MAP_COUNT, (cur + 20).to_string()).unwrap();
        drop(raised);
        assert_eq!(
            read_map_count(),
            Some(cur + 20),
            "another run's value was undone"
        );
        std::fs::write(MAX_MAP_COUNT, cur.to_string()).unwrap();
        // Alone, it is put back.
        drop(ensure_map_count(cur + 10).unwrap());
        assert_eq!(read_map_count(), Some(cur));
    }

    #[test]
    fn a_small_run_fits_the_default_map_count() {
        // The kernel's default is 65,530: a run of a few hundred regions
        // must not need root to raise it (it asked for 66,136 for 200).
        assert!(mappings_for(200) < 65_530, "{}", mappings_for(200));
        assert!(mappings_for(10_000) > 30_000);
    }

    #[test]
    fn small_scale_run() {
        let _one = LIMIT.lock().unwrap_or_else(|e| e.into_inner());
        let r = scale(2, 200, 400, 1, PAGE_SIZE).unwrap();
        assert!(r.few_ns > 0.0 && r.many_ns > 0.0 && r.ratio().is_finite());
    }
}
