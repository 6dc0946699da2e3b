//! The benches against raw floors of their own: `fault-cost`, `evict`,
//! `scale` and `wakeup`, their arguments and runners.

use super::json::Json;
use super::{at_least_one, CliError, CliResult};
use clap::Args;
use std::io::Write;
use uffd_pager::{Delivery, InstallKind, PAGE_SIZE};
use uffd_pager_cli::bench::{fault_cost, FaultCostConfig, FaultCostReport};

#[derive(Debug, Args)]
pub(super) struct ScaleArgs {
    /// Regions in the small configuration.
    #[arg(long, default_value_t = 10, value_parser = at_least_one)]
    few: u64,
    /// Regions in the large configuration.
    #[arg(long, default_value_t = 100_000, value_parser = at_least_one)]
    many: u64,
    /// Faults timed in each, at distinct pages [default: 16384 (64 MiB)].
    #[arg(long, value_parser = at_least_one)]
    faults: Option<u64>,
    /// Passes; the best counts (at most 20).
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    passes: u64,
    /// Page size: 4K or 2M (hugetlb on both sides; root reserves the pages
    /// with `sysctl vm.nr_hugepages=N`, one per fault). `--faults` then
    /// counts pages of this size; its default keeps its bytes.
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    page_size: usize,
}

#[derive(Debug, Args)]
pub(super) struct WakeupArgs {
    /// Faulting threads, each over its own pages (default: the CPU count).
    #[arg(long, value_parser = at_least_one)]
    faulters: Option<u64>,
    /// Pages each faulter touches per pass [default: 2048 (8 MiB)].
    #[arg(long, value_parser = at_least_one)]
    pages: Option<u64>,
    /// Passes; the best counts (at most 100).
    #[arg(long, default_value_t = 9, value_parser = at_least_one)]
    passes: u64,
    /// Install kind; repeatable; default both.
    #[arg(long, value_name = "KIND")]
    kind: Vec<InstallKind>,
    /// Page size: 4K or 2M (hugetlb on both sides; root reserves the pages
    /// with `sysctl vm.nr_hugepages=N`). `--pages` then counts pages of
    /// this size; its default keeps its bytes.
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    page_size: usize,
}

#[derive(Debug, Args)]
pub(super) struct EvictArgs {
    /// Pages evicted per pass [default: 8192 (32 MiB)].
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pages: Option<u64>,
    /// Passes per side; the best counts (at most 100).
    #[arg(long, value_name = "R", default_value_t = 3, value_parser = at_least_one)]
    passes: u64,
    /// Install kind; repeatable; default both.
    #[arg(long, value_name = "KIND")]
    kind: Vec<InstallKind>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Page size: 4K or 2M (hugetlb on both sides; root reserves the pages
    /// with `sysctl vm.nr_hugepages=N`). `--pages` then counts pages of
    /// this size; its default keeps its bytes.
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    page_size: usize,
}

#[derive(Debug, Args)]
pub(super) struct FaultCostArgs {
    /// Pages faulted per pass (each touched once, one read per page)
    /// [default: 4096 (16 MiB)].
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pages: Option<u64>,
    /// Timed passes per side; the best pass counts.
    #[arg(long, value_name = "R", default_value_t = 5, value_parser = at_least_one)]
    passes: u64,
    /// Install kind: anonymous (MISSING + UFFDIO_COPY) or shared (memfd,
    /// MINOR + UFFDIO_CONTINUE). Repeatable; default: both.
    #[arg(long, value_name = "KIND")]
    kind: Vec<InstallKind>,
    /// Delivery: in-thread, threads\[:N\[:spinUS\]\] (N defaults to one per
    /// CPU; e.g. threads:1:spin50), or per-region.
    /// Repeatable; default: in-thread and threads:1.
    #[arg(long, value_name = "DELIVERY")]
    delivery: Vec<Delivery>,
    /// The worker hop: the engine's store is ordinary Rust (not
    /// signal-safe, so each read goes through an I/O worker) and the floor
    /// hands each page copy to a thread of its own with a raw futex
    /// ping-pong before its install. In-thread and threads:1 only.
    #[arg(long)]
    hop: bool,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Page size: 4K or 2M (hugetlb on both sides; root reserves the pages
    /// with `sysctl vm.nr_hugepages=N`). `--pages` then counts pages of
    /// this size; its default keeps its bytes.
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    page_size: usize,
}

/// Both install kinds, the default of `--kind`.
const BOTH_KINDS: [InstallKind; 2] = [InstallKind::Anonymous, InstallKind::Shared];

/// A repeatable flag's values, or `default` where none is given; one
/// given twice is refused (it would run twice), as the workloads do.
fn given_or<T: PartialEq + Copy + std::fmt::Display>(
    flag: &str,
    v: &[T],
    default: &[T],
) -> Result<Vec<T>, CliError> {
    super::twice(flag, v)?;
    Ok(if v.is_empty() { default } else { v }.to_vec())
}

/// Rejects runs that cannot fit: the floor and the engine each hold the
/// source data plus the installed pages (and a memfd for shared runs),
/// about five times the pass size at once.
fn check_pages(pages: u64, page_size: usize) -> Result<usize, CliError> {
    let bytes = pages
        .checked_mul(page_size as u64)
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or_else(|| CliError::Usage(format!("--pages {pages} is too large")))?;
    super::fits_in_memory(&format!("--pages {pages}"), bytes.saturating_mul(5))?;
    Ok(pages as usize)
}

pub(super) fn run_fault_cost(a: &FaultCostArgs) -> CliResult {
    let pages = check_pages(super::pages_of(a.pages, 4096, a.page_size), a.page_size)?;
    if a.hop && a.page_size != PAGE_SIZE {
        return Err(CliError::Usage(
            "--hop is measured with 4 KiB pages only".into(),
        ));
    }
    let one_handler =
        |d: &Delivery| matches!(d, Delivery::InThread | Delivery::Threads { threads: 1, .. });
    if a.hop && !a.delivery.iter().all(one_handler) {
        return Err(CliError::Usage(
            "--hop is measured with --delivery in-thread or threads:1 only".into(),
        ));
    }
    if a.passes > 1000 {
        return Err(CliError::Usage(format!(
            "--passes {} is more than 1000",
            a.passes
        )));
    }
    let passes = a.passes as usize;
    let kinds = given_or("--kind", &a.kind, &BOTH_KINDS)?;
    let deliveries = given_or(
        "--delivery",
        &a.delivery,
        &[
            Delivery::InThread,
            Delivery::Threads {
                threads: 1,
                spin_us: 0,
            },
        ],
    )?;
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| CliError::Runtime(format!("writing output: {e}"));
    if !a.json {
        writeln!(
            out,
            "fault cost{}: {pages} pages of {} per pass, best of {passes} passes, µs per fault \
             (ratio = engine / floor)",
            if a.hop {
                " with the worker hop (an ordinary store; the floor: futex ping-pong + install)"
            } else {
                ""
            },
            size_name(a.page_size),
        )
        .map_err(io)?;
        writeln!(
            out,
            "{:<10} {:<18} {:>13} {:>14} {:>7} {:>13}",
            "kind", "delivery", "floor µs/page", "engine µs/page", "ratio", "median ratio"
        )
        .map_err(io)?;
    }
    let mut reports = Vec::new();
    for &delivery in &deliveries {
        for &kind in &kinds {
            let cfg = FaultCostConfig {
                pages,
                passes,
                kind,
                delivery,
                hop: a.hop,
                page_size: a.page_size,
            };
            tracing::info!(%kind, %delivery, pages, passes, "fault-cost run");
            let r = fault_cost(&cfg)
                .map_err(|e| CliError::Runtime(format!("fault-cost {kind} {delivery}: {e}")))?;
            if !a.json {
                writeln!(
                    out,
                    "{:<10} {:<18} {:>13.3} {:>14.3} {:>7.2} {:>13.2}",
                    kind.to_string(),
                    delivery.to_string(),
                    r.floor_us_per_page,
                    r.engine_us_per_page,
                    r.ratio,
                    r.median_ratio
                )
                .map_err(io)?;
                out.flush().map_err(io)?;
            }
            reports.push(r);
        }
    }
    if a.json {
        let rows = reports.iter().map(report_json).collect();
        writeln!(out, "{}", Json::Arr(rows)).map_err(io)?;
    }
    Ok(())
}

pub(super) fn run_scale(a: &ScaleArgs) -> CliResult {
    let faults = super::pages_of(a.faults, 16384, a.page_size);
    if a.many > 1_000_000 || a.few >= a.many || faults > 10_000_000 || a.passes > 20 {
        return Err(CliError::Usage(
            "--few fewer than --many, --many at most 1000000 regions, --faults at most \
             10000000, --passes at most 20"
                .into(),
        ));
    }
    // Each side holds every faulted page at once, with the fault list's
    // addresses and a little bookkeeping beside each.
    super::fits_in_memory(
        &format!("--faults {faults}"),
        faults.saturating_mul(a.page_size as u64 + 256),
    )?;
    let r = uffd_pager_cli::bench::scale(
        a.few as usize,
        a.many as usize,
        faults as usize,
        a.passes as usize,
        a.page_size,
    )
    .map_err(|e| CliError::Runtime(format!("scale: {e}")))?;
    let mut o = String::new();
    outln!(
        o,
        "scale: {} faults at random pages of {}, best of {} passes \
         (kernel = the same faults on plain mappings, no engine)\n\
         {:>8} regions: engine {:>8.0} ns/fault, kernel {:>8.0} ns/fault\n\
         {:>8} regions: engine {:>8.0} ns/fault, kernel {:>8.0} ns/fault \
         (the engine mapped them in {:.2}s)\n\
         ratio many/few: engine {:.2}, kernel {:.2}",
        r.faults,
        size_name(a.page_size),
        a.passes,
        r.few,
        r.few_ns,
        r.kernel_few_ns,
        r.many,
        r.many_ns,
        r.kernel_many_ns,
        r.map_many_s,
        r.ratio(),
        r.kernel_ratio()
    );
    super::emit(&o)
}

pub(super) fn run_wakeup(a: &WakeupArgs) -> CliResult {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let faulters = a.faulters.map_or(cpus, |f| f as usize);
    let pages = super::pages_of(a.pages, 2048, a.page_size);
    if faulters > 256 || pages > 1 << 20 || a.passes > 100 {
        return Err(CliError::Usage(
            "--faulters at most 256, --pages at most 1048576, --passes at most 100".into(),
        ));
    }
    // Every configuration's pages are held at once (three or four
    // configurations of `faulters × pages`), each page with its source and
    // its installed copy, and a memfd's for the shared kind.
    let configs = if faulters > 1 { 4 } else { 3 };
    super::fits_in_memory(
        &format!("--faulters {faulters} × --pages {pages}"),
        (configs * 3 * faulters as u64).saturating_mul(pages.saturating_mul(a.page_size as u64)),
    )?;
    let passes = a.passes as usize;
    let mut o = String::new();
    for kind in given_or("--kind", &a.kind, &BOTH_KINDS)? {
        let r = uffd_pager_cli::bench::wakeup_placement(
            kind,
            faulters,
            pages as usize,
            passes,
            a.page_size,
        )
        .map_err(|e| CliError::Runtime(format!("wakeup: {e}")))?;
        outln!(
            o,
            "wakeup placement, {kind}: {} faulters × {} pages of {}, best of {passes} passes \
             (raw floor, µs per fault over all faulters)",
            r.faulters,
            r.pages,
            size_name(a.page_size)
        );
        let base = r.rows[0].1;
        for (name, us) in &r.rows {
            outln!(
                o,
                "  {name:<48} {us:>8.2} µs  ({:.2}× the first)",
                us / base
            );
        }
    }
    super::emit(&o)
}

pub(super) fn run_evict(a: &EvictArgs) -> CliResult {
    let pages = check_pages(super::pages_of(a.pages, 8192, a.page_size), a.page_size)?;
    if a.passes > 100 {
        return Err(CliError::Usage("--passes is at most 100".into()));
    }
    let passes = a.passes as usize;
    let kinds = given_or("--kind", &a.kind, &BOTH_KINDS)?;
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| CliError::Runtime(format!("writing output: {e}"));
    let mut rows = Vec::new();
    if !a.json {
        writeln!(
            out,
            "eviction: {pages} installed pages of {} per pass, best of {passes}, ns per page \
             (raw = the primitive the engine's eviction rests on)",
            size_name(a.page_size)
        )
        .map_err(io)?;
        writeln!(
            out,
            "{:<10} {:>11} {:>13} {:>8} {:>14} {:>14}",
            "kind", "engine ns", "engine pg/s", "raw ns", "engine/raw", "DONTNEED ns"
        )
        .map_err(io)?;
    }
    for kind in kinds {
        let r = uffd_pager_cli::bench::evict_cost(kind, pages, passes, a.page_size)
            .map_err(|e| CliError::Runtime(format!("evict {kind}: {e}")))?;
        if a.json {
            rows.push(Json::obj([
                ("workload", Json::str("evict")),
                ("kind", Json::str(kind.to_string())),
                ("pages", Json::Int(pages as i64)),
                ("page_size", Json::Int(a.page_size as i64)),
                ("engine_ns_per_page", Json::Num(r.engine_ns)),
                ("engine_pages_per_s", Json::Num(r.engine_pages_per_s())),
                ("raw_ns_per_page", Json::Num(r.raw_ns)),
                ("ratio", Json::Num(r.ratio())),
                ("dontneed_ns_per_page", Json::Num(r.dontneed_ns)),
                ("evicted", Json::Int(r.evicted as i64)),
            ]));
        } else {
            writeln!(
                out,
                "{:<10} {:>11.0} {:>13.0} {:>8.0} {:>14.2} {:>14.0}",
                kind.to_string(),
                r.engine_ns,
                r.engine_pages_per_s(),
                r.raw_ns,
                r.ratio(),
                r.dontneed_ns
            )
            .map_err(io)?;
        }
    }
    if a.json {
        writeln!(out, "{}", Json::Arr(rows)).map_err(io)?;
    }
    Ok(())
}

/// "4 KiB" or "2 MiB".
fn size_name(page_size: usize) -> &'static str {
    if page_size == PAGE_SIZE {
        "4 KiB"
    } else {
        "2 MiB"
    }
}

fn report_json(r: &FaultCostReport) -> Json {
    let nums = |v: &[f64]| Json::Arr(v.iter().map(|&x| Json::Num(x)).collect());
    Json::obj([
        ("workload", Json::str("fault-cost")),
        ("kind", Json::str(r.config.kind.to_string())),
        ("delivery", Json::str(r.config.delivery.to_string())),
        ("pages", Json::Int(r.config.pages as i64)),
        ("page_size", Json::Int(r.config.page_size as i64)),
        ("passes", Json::Int(r.config.passes as i64)),
        ("floor_us_per_page", Json::Num(r.floor_us_per_page)),
        ("engine_us_per_page", Json::Num(r.engine_us_per_page)),
        ("ratio", Json::Num(r.ratio)),
        (
            "floor_median_us_per_page",
            Json::Num(r.floor_median_us_per_page),
        ),
        (
            "engine_median_us_per_page",
            Json::Num(r.engine_median_us_per_page),
        ),
        ("median_ratio", Json::Num(r.median_ratio)),
        ("floor_passes_us_per_page", nums(&r.floor_passes)),
        ("engine_passes_us_per_page", nums(&r.engine_passes)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_duplicates() {
        assert_eq!(given_or("--n", &[], &[1, 2]).unwrap(), vec![1, 2]);
        assert_eq!(given_or("--n", &[2, 1], &[1]).unwrap(), vec![2, 1]);
        assert!(matches!(
            given_or("--n", &[2, 2, 1], &[1]),
            Err(CliError::Usage(_))
        ));
    }

    #[test]
    fn page_limits() {
        assert_eq!(check_pages(16, PAGE_SIZE).unwrap(), 16);
        assert!(matches!(
            check_pages(u64::MAX, PAGE_SIZE),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(
            check_pages(1 << 40, PAGE_SIZE),
            Err(CliError::Usage(_))
        ));
        let huge = uffd_pager::HUGE_PAGE_SIZE;
        assert!(matches!(
            check_pages(1 << 20, huge),
            Err(CliError::Usage(_))
        ));
        assert_eq!(super::super::pages_of(None, 4096, huge), 8);
        assert_eq!(super::super::pages_of(None, 1, huge), 1);
        assert_eq!(super::super::pages_of(Some(3), 4096, huge), 3);
        assert_eq!(super::super::pages_of(None, 4096, PAGE_SIZE), 4096);
    }
}
