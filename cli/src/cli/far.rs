//! `uffd-pager bench far --store URL`: far memory over a real Redis server
//! or cluster ([`uffd_pager_cli::bench::far_miss`] and
//! [`uffd_pager_cli::bench::far_scan`]).

use super::json::Json;
use super::{at_least_one, CliError, CliResult};
use clap::Args;
use uffd_pager::{Delivery, InstallKind};
use uffd_pager_cli::bench::{far_miss, far_scan, FarScanReport};
use uffd_pager_cli::far::{Far, StoreUrl};

#[derive(Debug, Args)]
pub struct FarArgs {
    /// The server or cluster (`redis://HOST:PORT[/DB]`,
    /// `redis-cluster://HOST:PORT,...`); the run uses a namespace of its
    /// own and deletes it.
    #[arg(long, value_name = "URL")]
    store: StoreUrl,
    /// Pages per miss pass (each faulted once) [default: 2048 (8 MiB)].
    #[arg(long, value_parser = at_least_one)]
    pages: Option<u64>,
    /// Pages per scan pass [default: 8192] (4 KiB pages only).
    #[arg(long, value_parser = at_least_one)]
    scan_pages: Option<u64>,
    /// Timed passes per side; the best counts.
    #[arg(long, default_value_t = 5, value_parser = at_least_one)]
    passes: u64,
    /// The scan's readahead window in pages (at most 32 go in one MGET)
    /// [default: 32] (4 KiB pages only).
    #[arg(long, value_parser = at_least_one)]
    readahead: Option<u64>,
    /// Install kind of the miss pass.
    #[arg(long, default_value = "anonymous")]
    kind: InstallKind,
    /// Delivery of the miss pass: in-thread, threads\[:N\[:spinUS\]\] or
    /// per-region.
    #[arg(long, default_value = "in-thread")]
    delivery: Delivery,
    /// Microseconds a thread waiting on an I/O worker, and an idle worker,
    /// spin before they sleep (`PagerBuilder::io_spin`; 0: none; at most
    /// 1000).
    #[arg(long, default_value_t = 0)]
    io_spin_us: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Page size of the miss pass: 4K or 2M (hugetlb; root reserves the
    /// pages with `sysctl vm.nr_hugepages=N`; a 2 MiB miss reads 512 keys,
    /// and its floor is one plain MGET of them). `--pages` then counts
    /// pages of this size; its default keeps its bytes. The scan compares
    /// readahead, which 2 MiB regions do not have: it runs with 4 KiB
    /// pages only and is left out with 2M.
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    page_size: usize,
}

/// Runs `bench far`.
pub fn run(a: &FarArgs) -> CliResult {
    let pages = super::pages_of(a.pages, 2048, a.page_size);
    let huge = a.page_size != uffd_pager::PAGE_SIZE;
    // (In 4 KiB pages: a 2 MiB page is 512 keys in the store and 512
    // pages of the region.)
    let units = (a.page_size / uffd_pager::PAGE_SIZE) as u64;
    // (Given with 2 MiB pages, they were taken and ignored.)
    if huge && (a.scan_pages.is_some() || a.readahead.is_some()) {
        return Err(CliError::Usage(
            "--scan-pages and --readahead apply to the scan, which runs with 4 KiB pages only \
             (2 MiB regions have no readahead): not with --page-size 2M"
                .into(),
        ));
    }
    let (scan_pages, readahead) = (a.scan_pages.unwrap_or(8192), a.readahead.unwrap_or(32));
    if pages.saturating_mul(units) > 1 << 20
        || scan_pages > 1 << 20
        || a.passes > 50
        || readahead > 1024
        || a.io_spin_us > 1000
    {
        return Err(CliError::Usage(
            "--pages/--scan-pages at most 1048576 (4 GiB; --pages at most 2048 with --page-size 2M), \
             --passes at most 50, --readahead at most 1024, --io-spin-us at most 1000"
                .into(),
        ));
    }
    // Before the store is filled (seconds, and as many bytes in the
    // server), not at the miss pass's first map after it: its region
    // holds every page at once.
    let bytes = pages * units * uffd_pager::PAGE_SIZE as u64;
    super::fits_in_memory(&format!("--pages {pages}"), bytes)?;
    // The scan's region, under no budget, ends holding every page too (it
    // was not asked: found by review).
    let scan_bytes = scan_pages * uffd_pager::PAGE_SIZE as u64;
    super::fits_in_memory(&format!("--scan-pages {scan_pages}"), scan_bytes)?;
    if huge {
        uffd_pager::HugePagePool::require(uffd_pager::HugePagePool::needed_for(pages, 0))
            .map_err(|e| CliError::Runtime(format!("bench far: {e}")))?;
    }
    let rt =
        |what: &'static str| move |e: uffd_pager::Error| CliError::Runtime(format!("{what}: {e}"));
    let far = Far::open(&a.store, "bench").map_err(rt("bench far"))?;
    let spin = std::time::Duration::from_micros(a.io_spin_us);
    let miss = far_miss(
        &far,
        pages as usize,
        a.passes as usize,
        a.kind,
        a.delivery,
        spin,
        a.page_size,
    )
    .map_err(rt("bench far (miss)"))?;
    let scan = if huge {
        None
    } else {
        Some(
            far_scan(
                &far,
                scan_pages as usize,
                a.passes as usize,
                readahead as u32,
                spin,
            )
            .map_err(rt("bench far (scan)"))?,
        )
    };
    if a.json {
        let num =
            |f: fn(&FarScanReport) -> f64| scan.as_ref().map_or(Json::Null, |s| Json::Num(f(s)));
        let int =
            |f: fn(&FarScanReport) -> i64| scan.as_ref().map_or(Json::Null, |s| Json::Int(f(s)));
        let j = Json::obj([
            ("store", Json::str(a.store.0.clone())),
            ("io_spin_us", Json::Int(a.io_spin_us as i64)),
            ("page_size", Json::Int(a.page_size as i64)),
            ("miss_pages", Json::Int(miss.pages as i64)),
            ("miss_floor_get_us", Json::Num(miss.floor_us)),
            ("miss_engine_us", Json::Num(miss.engine_us)),
            ("miss_ratio", Json::Num(miss.ratio)),
            (
                "miss_spinning_floor_us",
                miss.spinning_floor_us.map_or(Json::Null, Json::Num),
            ),
            (
                "miss_spinning_ratio",
                miss.spinning_ratio.map_or(Json::Null, Json::Num),
            ),
            (
                "miss_spinning_left_out",
                miss.spinning_left_out.map_or(Json::Null, Json::str),
            ),
            ("scan_pages", int(|s| s.pages as i64)),
            ("scan_readahead", int(|s| s.readahead as i64)),
            ("scan_batched_pages_per_s", num(|s| s.batched_pages_per_s)),
            ("scan_single_pages_per_s", num(|s| s.single_pages_per_s)),
            ("scan_ratio", num(|s| s.ratio)),
        ]);
        return super::emit(&format!("{j}\n"));
    }
    let mut o = String::new();
    outln!(o,
        "far memory on {}: best of {} passes, io spin {} µs\n\
         miss ({} {}, {} pages of {}): engine {:.1} µs per fault, plain {} {:.1} µs: ratio {:.2} (goal <= 1.3)",
        a.store,
        a.passes,
        a.io_spin_us,
        a.kind,
        a.delivery,
        miss.pages,
        if huge { "2 MiB" } else { "4 KiB" },
        miss.engine_us,
        if huge { "MGET of its 512 keys" } else { "GET" },
        miss.floor_us,
        miss.ratio,
    );
    // Below the miss line it qualifies (it came first, before the header).
    if let (Some(f), Some(r)) = (miss.spinning_floor_us, miss.spinning_ratio) {
        outln!(o,
            "a raw GET that busy-polls as long as the engine spins: {f:.1} µs; engine against it: {r:.2}"
        );
    } else if let Some(why) = miss.spinning_left_out {
        outln!(
            o,
            "a raw GET that busy-polls as long as the engine spins: left out ({why})"
        );
    }
    match scan {
        Some(scan) => outln!(o,
            "scan ({} pages): readahead {} (MGET) {:.0} pages/s, one GET per fault {:.0} pages/s: ratio {:.1} (goal >= 5)",
            scan.pages,
            scan.readahead,
            scan.batched_pages_per_s,
            scan.single_pages_per_s,
            scan.ratio
        ),
        None => outln!(o, "scan: left out with 2 MiB pages (their regions have no readahead to compare)"),
    }
    super::emit(&o)
}
