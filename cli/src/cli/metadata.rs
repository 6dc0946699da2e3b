//! `uffd-pager bench metadata`: what the engine spends on bookkeeping per
//! tracked page, computed from its data structures and measured on a real
//! (lazily mapped) anonymous region.
//!
//! - Page-state words: [`Footprint::state_bytes_per_page`] per tracked
//!   page, in an anonymous mapping of their own ([`Footprint::state_bytes`]).
//! - The LRU ring: [`Footprint::lru_entry_bytes`] per entry, its capacity
//!   fixed by the budget, not by the region ([`Footprint::lru_bytes`]).
//! - Fixed per-region structs ([`Footprint::region_bytes`]).
//!
//! Then a pager with the budget maps an anonymous region of `--pages` pages
//! and VmRSS (and the region's own Rss from `/proc/self/smaps`) is read
//! before mapping, after mapping and after reading `--touch` pages spread
//! over the region. Goal: at most 16 bytes per tracked page.

use super::json::Json;
use super::metadata_proc::{mappings, mem_now, Map, Mem};
use super::{CliError, CliResult};
use clap::Args;
use std::io::Write;
use uffd_pager::{Footprint, MapOptions, Pager, PAGE_SIZE};

/// The goal: metadata bytes per tracked page.
const GOAL_BYTES_PER_PAGE: f64 = 16.0;
/// Regions at least this large are told apart from every other mapping
/// by size.
const BIG_REGION: usize = 64 << 20;
/// The largest region accepted, in pages (4 TiB of address space).
const MAX_PAGES: u64 = 1 << 30;
/// Pages `--touch` reads, at most (as `scale --faults`).
const MAX_TOUCH: u64 = 10_000_000;

#[derive(Debug, Args)]
pub struct MetadataArgs {
    /// Pages in the (lazily mapped, never fully touched) anonymous region
    /// [default: 10000000 (38 GiB)].
    #[arg(long, value_name = "N")]
    pages: Option<u64>,
    /// The pager's memory budget in pages (sizes the LRU ring)
    /// [default: 65536 (256 MiB)].
    #[arg(long, value_name = "B")]
    budget: Option<u64>,
    /// Pages read, spread evenly over the region, for the RSS measurement
    /// [default: 100000 (391 MiB)].
    #[arg(long, value_name = "N")]
    touch: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Page size of the region: 4K or 2M (hugetlb; root reserves the
    /// pages with `sysctl vm.nr_hugepages=N`, as many as the budget holds
    /// plus two). `--pages`, `--budget` and `--touch` then count pages of
    /// this size; their defaults keep their bytes. Hugetlb pages are not
    /// in the process's Rss, so the region's own pages count zero there.
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    page_size: usize,
}

/// [`MetadataArgs`] with its counts resolved: pages of `page_size`, the
/// budget in the engine's 4 KiB units.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    pages: u64,
    budget_units: u64,
    touch: u64,
    page_size: usize,
}

impl Sizes {
    fn of(a: &MetadataArgs) -> Sizes {
        let ps = a.page_size;
        let units = (ps / PAGE_SIZE) as u64;
        Sizes {
            pages: super::pages_of(a.pages, 10_000_000, ps),
            budget_units: super::pages_of(a.budget, 65_536, ps).saturating_mul(units),
            touch: super::pages_of(a.touch, 100_000, ps),
            page_size: ps,
        }
    }
}

/// The computed and measured figures.
#[derive(Debug, Default)]
struct Report {
    pages: u64,
    page_size: usize,
    /// In 4 KiB units.
    budget: u64,
    words_per_page: usize,
    words_bytes: u64,
    ring_bytes: u64,
    region_bytes: usize,
    ring_entry_bytes: usize,
    touched: u64,
    stride: u64,
    before: Mem,
    mapped: Mem,
    after: Mem,
    /// Rss of the user region itself after the reads (installed pages;
    /// zero pages installed by UFFDIO_ZEROPAGE do not count).
    region_rss: u64,
    /// Rss of the object's cache area and in-memory swap store (the
    /// mappings as large as the region, other than the region): contents
    /// of evicted pages, a 4096-byte page each, not metadata.
    data_rss: u64,
    /// Rss of the page-state words mapping, if it could be told apart.
    words_rss: Option<u64>,
    /// Rss of the LRU ring mapping, if it could be told apart.
    ring_rss: Option<u64>,
    resident_pages: u64,
    pgsteal: u64,
    writeback: u64,
}

impl Report {
    fn per_page(&self, bytes: u64) -> f64 {
        bytes as f64 / self.pages as f64
    }
    fn region_structs(&self) -> u64 {
        self.region_bytes as u64
    }
    /// Computed metadata bytes per tracked page.
    fn computed(&self) -> f64 {
        self.per_page(self.words_bytes + self.ring_bytes + self.region_structs())
    }
    /// Exact RSS growth from mapping to after the reads, less the pages
    /// themselves (in the region, the cache area and the swap store): the
    /// engine's metadata.
    fn metadata_growth(&self) -> i64 {
        self.after.exact as i64
            - self.mapped.exact as i64
            - self.region_rss as i64
            - self.data_rss as i64
    }
    fn measured(&self) -> f64 {
        self.metadata_growth() as f64 / self.pages as f64
    }
    fn per_touched(&self) -> f64 {
        self.metadata_growth() as f64 / self.touched.max(1) as f64
    }
    /// 4 KiB units in one page: the goal is per 4 KiB tracked, so that a
    /// 2 MiB page (one state word, but a ring sized by the budget's 4 KiB
    /// units) is held to the same bytes per byte of memory.
    fn units(&self) -> f64 {
        (self.page_size / PAGE_SIZE) as f64
    }
    fn ok(&self) -> bool {
        let goal = GOAL_BYTES_PER_PAGE * self.units();
        self.computed() <= goal && self.measured() <= goal
    }
}

/// About the most memory a run holds at once (found by review: a run of
/// 2^30 pages touched 10^7 times held some 12 GiB, and none of it was
/// asked for): the pages the budget keeps, and for each touch at most a
/// page of state words and a page table, as many as the region has.
fn memory_held(a: &Sizes) -> Result<u64, CliError> {
    let pages = usize::try_from(a.pages)
        .map_err(|_| CliError::Usage(format!("--pages {} is too large", a.pages)))?;
    let ps = a.page_size as u64;
    let units = ps / PAGE_SIZE as u64;
    let words_per_page = Footprint::of(1, 0)?.state_bytes_per_page as u64;
    let touch = a.touch.min(a.pages);
    let page = PAGE_SIZE as u64;
    // (Pages of `bytes` bytes each, one per `chunk` bytes of them.)
    let spread = |bytes: u64, chunk: u64| {
        touch.min((pages as u64).saturating_mul(bytes).div_ceil(chunk)) * page
    };
    let data = touch.min(a.budget_units / units) * ps;
    Ok(data + spread(words_per_page, page) + spread(ps, 512 * ps))
}

/// Computes and measures; see the module docs.
fn measure(a: &Sizes) -> Result<Report, CliError> {
    let pages = usize::try_from(a.pages)
        .map_err(|_| CliError::Usage(format!("--pages {} is too large", a.pages)))?;
    let ps = a.page_size;
    let len = pages * ps;
    let footprint = Footprint::of(pages, a.budget_units)?;
    let mut r = Report {
        pages: a.pages,
        page_size: ps,
        budget: a.budget_units,
        words_per_page: footprint.state_bytes_per_page,
        region_bytes: footprint.region_bytes,
        ring_entry_bytes: footprint.lru_entry_bytes,
        words_bytes: footprint.state_bytes as u64,
        ring_bytes: footprint.lru_bytes as u64,
        touched: a.touch.min(a.pages),
        ..Report::default()
    };
    r.stride = a.pages / r.touched.max(1);
    // The real thing: no readahead or fault-around, so one read is one
    // page; no kswapd, so nothing changes between the reads and the
    // snapshot (reclaim is direct, in the faults).
    let pager = Pager::builder()
        .budget_pages(a.budget_units)
        .keep_unmapped(0)
        .readahead(0, 1)
        .fault_around(0)
        .kswapd(false)
        .build()?;
    r.before = mem_now()?;
    let region = pager.map_anonymous_with(
        len,
        &MapOptions {
            page_size: ps,
            ..MapOptions::default()
        },
    )?;
    r.mapped = mem_now()?;
    let base = region.as_ptr() as usize;
    let mut sum = 0u64;
    for i in 0..r.touched {
        let addr = base + (i * r.stride) as usize * ps;
        // SAFETY: `addr` is a page of the live region (i * stride < pages);
        // the read faults through the engine, which installs the page.
        sum = sum.wrapping_add(u64::from(unsafe {
            std::ptr::read_volatile(addr as *const u8)
        }));
    }
    std::hint::black_box(sum);
    r.after = mem_now()?;
    let st = pager.stats();
    let maps = mappings()?;
    r.resident_pages = st.resident_pages;
    r.pgsteal = st.get(uffd_pager::Counter::PGSTEAL);
    r.writeback = st.get(uffd_pager::Counter::WRITEBACK);
    let in_region = |m: &Map| m.start >= base && m.end <= base + len;
    r.region_rss = maps.iter().filter(|m| in_region(m)).map(|m| m.rss).sum();
    // The object's cache area and its swap store are as large as the
    // region (or larger, merged with a neighbour); for a large region no
    // other mapping is. Otherwise count one stored page per write-back.
    r.data_rss = if len >= BIG_REGION {
        maps.iter()
            .filter(|m| m.len() >= len && !in_region(m))
            .map(|m| m.rss)
            .sum()
    } else {
        r.writeback * ps as u64
    };
    let sized = |n: u64| {
        let v: Vec<u64> = maps
            .iter()
            .filter(|m| m.len() as u64 == n && !in_region(m))
            .map(|m| m.rss)
            .collect();
        (v.len() == 1).then(|| v[0])
    };
    r.words_rss = sized(r.words_bytes);
    r.ring_rss = sized(r.ring_bytes);
    region.unmap()?;
    Ok(r)
}

/// `uffd-pager bench metadata`.
pub fn run(a: &MetadataArgs) -> CliResult {
    let sizes = Sizes::of(a);
    let units = (a.page_size / PAGE_SIZE) as u64;
    if sizes.pages == 0 || sizes.pages > MAX_PAGES / units {
        return Err(CliError::Usage(format!(
            "--pages {} must be in 1..={}",
            sizes.pages,
            MAX_PAGES / units
        )));
    }
    if sizes.budget_units == 0 || sizes.budget_units > uffd_pager::limits::MAX_BUDGET_PAGES {
        return Err(CliError::Usage(format!(
            "--budget must be in 1..={} pages of {} bytes",
            uffd_pager::limits::MAX_BUDGET_PAGES / units,
            a.page_size
        )));
    }
    // (The engine refuses a budget under two 2 MiB pages, or under four
    // 4 KiB pages: a usage error here, as for the workloads, not a failed
    // run.)
    if let Some(e) = super::under_the_least_budget(sizes.budget_units / units, units, false) {
        return Err(e);
    }
    // (One fault each: 10^7 take about a minute here. Bounded by --pages
    // alone, a billion were accepted: an hour and a half of faults.)
    let most = sizes.pages.min(MAX_TOUCH);
    if sizes.touch == 0 || sizes.touch > most {
        return Err(CliError::Usage(format!(
            "--touch {} must be in 1..={most} (--pages, and at most {MAX_TOUCH})",
            sizes.touch
        )));
    }
    super::fits_in_memory(
        &format!("--pages {} --touch {}", sizes.pages, sizes.touch),
        memory_held(&sizes)?,
    )?;
    let r = measure(&sizes)?;
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| CliError::Runtime(format!("writing output: {e}"));
    if a.json {
        writeln!(out, "{}", json(&r)).map_err(io)?;
    } else {
        write!(out, "{}", table(&r)).map_err(io)?;
    }
    Ok(())
}

fn kib(b: u64) -> String {
    format!("{} KiB", b / 1024)
}

fn delta(a: u64, b: u64) -> i64 {
    b as i64 - a as i64
}

fn opt_kib(v: Option<u64>) -> String {
    v.map_or_else(|| "(merged, not told apart)".into(), kib)
}

fn table(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ =
        writeln!(
        s,
        "engine metadata: anonymous region of {} pages of {} ({:.1} GiB), budget {} pages of 4 KiB",
        r.pages,
        if r.page_size == PAGE_SIZE { "4 KiB" } else { "2 MiB" },
        (r.pages * r.page_size as u64) as f64 / (1u64 << 30) as f64,
        r.budget
    );
    let _ = writeln!(
        s,
        "{:<20} {:>12} {:>14}  note",
        "structure", "bytes", "B/tracked page"
    );
    let _ = writeln!(
        s,
        "{:<20} {:>12} {:>14.3}  {} B/page; address space of the words mapping",
        "page-state words",
        r.words_bytes,
        r.per_page(r.words_bytes),
        r.words_per_page
    );
    let _ = writeln!(
        s,
        "{:<20} {:>12} {:>14.3}  {} entries x {} B: sized by the budget ({:.1} B per budget page), not the region",
        "LRU ring",
        r.ring_bytes,
        r.per_page(r.ring_bytes),
        r.ring_bytes / r.ring_entry_bytes as u64,
        r.ring_entry_bytes,
        r.ring_bytes as f64 / r.budget as f64
    );
    let _ = writeln!(
        s,
        "{:<20} {:>12} {:>14.6}  region and object structs, once per region",
        "per-region structs",
        r.region_structs(),
        r.per_page(r.region_structs()),
    );
    let _ = writeln!(
        s,
        "{:<20} {:>12} {:>14.3}",
        "total (computed)",
        r.words_bytes + r.ring_bytes + r.region_structs(),
        r.computed()
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "measured: VmRSS/VmSize/VmPTE from /proc/self/status, exact Rss from smaps_rollup \
         (page tables, VmPTE, are the kernel's and not in either)"
    );
    let row = |s: &mut String, what: &str, m: &Mem, tail: String| {
        let _ = writeln!(
            s,
            "  {what:<40} VmRSS {:>11}  Rss {:>11}  VmSize {:>15}  VmPTE {:>11}{tail}",
            kib(m.rss),
            kib(m.exact),
            kib(m.size),
            kib(m.pte)
        );
    };
    row(&mut s, "before mapping", &r.before, String::new());
    row(
        &mut s,
        "after mapping (lazy, nothing touched)",
        &r.mapped,
        format!(
            "  VmRSS {:+} B = {:.4} B/tracked page",
            delta(r.before.rss, r.mapped.rss),
            delta(r.before.rss, r.mapped.rss) as f64 / r.pages as f64
        ),
    );
    row(
        &mut s,
        &format!("after reading {} pages (stride {})", r.touched, r.stride),
        &r.after,
        format!(
            "  VmRSS {:+} B, Rss {:+} B",
            delta(r.mapped.rss, r.after.rss),
            delta(r.mapped.exact, r.after.exact)
        ),
    );
    let _ = writeln!(
        s,
        "  of the Rss growth: the region's own pages {} (read-only zero pages are not counted); \
         evicted pages' contents in the cache area and swap store {} ({} pgsteal, {} written back x {} B = {})",
        kib(r.region_rss),
        kib(r.data_rss),
        r.pgsteal,
        r.writeback,
        r.page_size,
        kib(r.writeback * r.page_size as u64)
    );
    let _ = writeln!(
        s,
        "  state-words mapping Rss {}, LRU ring Rss {}; {} pages resident in the engine",
        opt_kib(r.words_rss),
        opt_kib(r.ring_rss),
        r.resident_pages
    );
    let _ = writeln!(
        s,
        "  metadata growth beyond the pages themselves: {} B = {:.1} B per touched page = {:.3} B per tracked page",
        r.metadata_growth(),
        r.per_touched(),
        r.measured()
    );
    if r.stride > 1 {
        let _ = writeln!(
            s,
            "  (reads {} pages apart touch every {}-byte page of state words, so the whole words array is \
             resident: per touched page this is the worst case; per tracked page it is the full cost)",
            r.stride, PAGE_SIZE
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "goal: <= {GOAL_BYTES_PER_PAGE} B of metadata per tracked 4 KiB: computed {:.3} B, measured {:.3} B: {}",
        r.computed() / r.units(),
        r.measured() / r.units(),
        if r.ok() { "MET" } else { "NOT MET" }
    );
    s
}

fn json(r: &Report) -> Json {
    let mem = |m: &Mem| {
        Json::obj([
            ("vm_rss", Json::Int(m.rss as i64)),
            ("rss_exact", Json::Int(m.exact as i64)),
            ("vm_size", Json::Int(m.size as i64)),
            ("vm_pte", Json::Int(m.pte as i64)),
        ])
    };
    let opt = |v: Option<u64>| v.map_or(Json::Null, |v| Json::Int(v as i64));
    Json::obj([
        ("workload", Json::str("metadata")),
        ("pages", Json::Int(r.pages as i64)),
        ("page_size", Json::Int(r.page_size as i64)),
        ("budget_pages", Json::Int(r.budget as i64)),
        (
            "state_word_bytes_per_page",
            Json::Int(r.words_per_page as i64),
        ),
        ("words_mapping_bytes", Json::Int(r.words_bytes as i64)),
        ("words_bytes_per_page", Json::Num(r.per_page(r.words_bytes))),
        ("ring_entry_bytes", Json::Int(r.ring_entry_bytes as i64)),
        ("ring_bytes", Json::Int(r.ring_bytes as i64)),
        ("ring_bytes_per_page", Json::Num(r.per_page(r.ring_bytes))),
        ("region_struct_bytes", Json::Int(r.region_bytes as i64)),
        ("computed_bytes_per_page", Json::Num(r.computed())),
        ("touched_pages", Json::Int(r.touched as i64)),
        ("stride_pages", Json::Int(r.stride as i64)),
        ("before", mem(&r.before)),
        ("after_map", mem(&r.mapped)),
        ("after_touch", mem(&r.after)),
        ("region_rss", Json::Int(r.region_rss as i64)),
        ("data_rss", Json::Int(r.data_rss as i64)),
        ("words_rss", opt(r.words_rss)),
        ("ring_rss", opt(r.ring_rss)),
        ("resident_pages", Json::Int(r.resident_pages as i64)),
        ("pgsteal", Json::Int(r.pgsteal as i64)),
        ("writeback", Json::Int(r.writeback as i64)),
        ("metadata_rss_growth", Json::Int(r.metadata_growth())),
        (
            "metadata_bytes_per_touched_page",
            Json::Num(r.per_touched()),
        ),
        ("measured_bytes_per_page", Json::Num(r.measured())),
        ("goal_bytes_per_page", Json::Num(GOAL_BYTES_PER_PAGE)),
        ("goal_met", Json::Bool(r.ok())),
    ])
}
