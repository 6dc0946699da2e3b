//! `uffd-pager torture`: the reclaim torture of
//! [`uffd_pager_cli::workload::torture`] from the command line. Several threads
//! read and write random words of a region at least four times the memory
//! budget while reclaim and write-back run; every read is checked against
//! an exact model, and so is the whole region (and file) at the end.
//!
//! Exit codes: 0 clean, 1 mismatches (or a runtime error), 2 bad arguments.

use super::{CliError, CliResult};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use uffd_pager::{Delivery, HugePagePool, InstallKind, Policy};
use uffd_pager_cli::far::StoreUrl;
use uffd_pager_cli::os::interrupt::TempPath;
use uffd_pager_cli::workload::torture::{self, TortureConfig, TortureKind};

mod report;
use report::{report_json, report_text};

/// What backs the tortured region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// A file in `--dir`, filled with a pattern, removed afterwards.
    File,
    /// Anonymous memory swapped to memory.
    Anonymous,
    /// Anonymous memory swapped to an unlinked file in `--dir`.
    Swapfile,
}

#[derive(Debug, Args)]
pub struct TortureArgs {
    /// Operations in total, split evenly over the threads (rounded up to a
    /// multiple of the thread count). Default 1000000, or as many as fit
    /// in --duration.
    #[arg(long, value_name = "N")]
    ops: Option<u64>,
    /// Run for this long (a soak): `90s`, `30m`, `2h`, or seconds. The
    /// threads stop at --ops or at the deadline, whichever comes first.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    duration: Option<std::time::Duration>,
    /// One more thread maps, remaps, protects, drops and unmaps side
    /// regions of the same pager all along, checking every byte of them.
    #[arg(long)]
    churn: bool,
    /// Application threads.
    #[arg(long, value_name = "T", default_value_t = 2)]
    threads: usize,
    /// Pages in the region; at least four times the budget.
    #[arg(long, value_name = "P", default_value_t = 4096)]
    pages: usize,
    /// Memory budget in pages; at most a quarter of --pages.
    #[arg(long, value_name = "B", default_value_t = 1024)]
    budget: u64,
    /// Page size of the region: 4K or 2M (hugetlb; root reserves the pages
    /// with `sysctl vm.nr_hugepages=N`). --pages and --budget count pages
    /// of this size.
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    page_size: usize,
    /// What backs the region.
    #[arg(long, value_enum, default_value_t = Kind::File)]
    kind: Kind,
    /// How file pages are installed (file kind only): shared (memfd,
    /// MINOR + CONTINUE; the file is checked against the model at the
    /// end) or anonymous (a private copy whose writes go to swap: the file
    /// must still hold its initial pattern at the end).
    /// Default: shared.
    #[arg(long, value_name = "KIND")]
    install: Option<InstallKind>,
    /// Delivery: in-thread, threads\[:N\[:spinUS\]\] (N defaults to one per
    /// CPU), or per-region.
    #[arg(long, default_value = "in-thread")]
    delivery: Delivery,
    /// Fault-handling policy (global-only, vanilla, retry-once,
    /// retry-once-tried, optionally +uptodate-no-retry).
    #[arg(long, default_value = "retry-once")]
    policy: Policy,
    /// Percentage of operations that write.
    #[arg(long, value_name = "PCT", default_value_t = 40)]
    write_pct: u32,
    /// Seed of the operation streams and the data pattern.
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// Far memory: the file kind's object lives in Redis, the anonymous
    /// kind swaps to Redis (`redis://HOST:PORT[/DB]` or
    /// `redis-cluster://HOST:PORT,...`). The run uses a key namespace of
    /// its own and deletes it at the end; at the end a plain client reads
    /// the object back from Redis and checks it.
    #[arg(long, value_name = "URL")]
    store: Option<StoreUrl>,
    /// Directory for the file (file kind) or the swap file (swapfile kind);
    /// default: the system's temporary directory.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Parses `90s`, `30m`, `2h` or plain seconds (at most a day).
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("bad duration {s:?} (90s, 30m, 2h, or seconds)")),
    };
    let secs: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (90s, 30m, 2h, or seconds)"))?;
    let secs = secs * scale;
    if !(super::MIN_DURATION_S..=86_400.0).contains(&secs) {
        return Err(format!("duration {s:?} must be in [1 ms, 24h]"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// The largest region accepted, in pages (64 GiB).
const MAX_PAGES: usize = 1 << 24;

/// Checks the arguments and builds the configuration (the file path, for
/// the file kind, is a fresh name in the directory).
fn config(a: &TortureArgs) -> Result<TortureConfig, CliError> {
    let usage = |m: String| Err(CliError::Usage(m));
    if a.threads == 0 {
        return usage("--threads must be at least 1".into());
    }
    // (Before the ops below are counted from it: a --threads near 2^32
    // underflowed there, a panic in a debug build.)
    let max = uffd_pager::limits::MAX_THREADS;
    if a.threads > max {
        return usage(format!("--threads {} is more than {max}", a.threads));
    }
    // With a duration and no --ops, as many as 32-bit sequence numbers
    // allow.
    let ops = match (a.ops, a.duration) {
        (Some(n), _) => n,
        (None, Some(_)) => u64::from(u32::MAX) - 1 - a.threads as u64,
        (None, None) => 1_000_000,
    };
    if ops == 0 {
        return usage("--ops must be at least 1".into());
    }
    if a.budget == 0 {
        return usage("--budget must be at least 1 page (the run must evict)".into());
    }
    // The torture counts 4 KiB pages: a 2 MiB page is 512 of them.
    let units = a.page_size / uffd_pager::PAGE_SIZE;
    // (Before, the engine refused it at the map, after the model was made
    // and the file written: exit 1.)
    if let Some(e) = super::under_the_least_budget(a.budget, units as u64, false) {
        return Err(e);
    }
    if a.pages == 0 || a.pages > MAX_PAGES / units {
        return usage(format!(
            "--pages {} must be in 1..={} (64 GiB)",
            a.pages,
            MAX_PAGES / units
        ));
    }
    // The model holds a word for every word of the region, and the file
    // kind writes the region's initial contents from a buffer of its size.
    let bytes = (a.pages * a.page_size) as u64;
    super::fits_in_memory(&format!("--pages {}", a.pages), bytes.saturating_mul(2))?;
    if a.budget > (a.pages / 4) as u64 {
        // Only the ways out that exist: a budget the engine takes (at
        // least four pages, or two 2 MiB pages), a region of at most
        // MAX_PAGES.
        let mut ways = Vec::new();
        if super::under_the_least_budget((a.pages / 4) as u64, units as u64, false).is_none()
            && a.pages >= 4
        {
            ways.push(format!("--budget {} or less", a.pages / 4));
        }
        match a.budget.checked_mul(4) {
            Some(p) if p <= (MAX_PAGES / units) as u64 => ways.push(format!("--pages {p} or more")),
            _ => {}
        }
        let ways = if ways.is_empty() {
            String::new()
        } else {
            format!(" (use {})", ways.join(", or "))
        };
        return usage(format!(
            "--budget {} is more than a quarter of --pages {}: the region must be at least \
             4x the budget{ways}",
            a.budget, a.pages,
        ));
    }
    if a.threads > a.pages {
        return usage(format!(
            "--threads {} is more than --pages {}: each thread owns at least one page",
            a.threads, a.pages
        ));
    }
    if a.write_pct > 100 {
        return usage(format!("--write-pct {} is over 100", a.write_pct));
    }
    // Anonymous memory nobody writes reads as zeros whatever the engine
    // does with it: such a run checks nothing, and reported PASS.
    if a.write_pct == 0 && a.kind != Kind::File {
        return usage(format!(
            "--write-pct 0 with --kind {}: memory nobody writes reads as zeros, so the run \
             would check nothing (use --write-pct 1 or more, or --kind file)",
            kind_flag(a.kind)
        ));
    }
    let ops_per_thread = ops.div_ceil(a.threads as u64);
    if ops_per_thread.saturating_mul(a.threads as u64) >= u64::from(u32::MAX) {
        return usage(format!(
            "--ops {} is too many: sequence numbers are 32-bit (fewer than {})",
            ops,
            u32::MAX
        ));
    }
    if a.page_size == uffd_pager::HUGE_PAGE_SIZE {
        // Before the model and the file are written (seconds for a large
        // region), not at the map after them.
        let needed = HugePagePool::needed_for(a.pages as u64, a.budget * units as u64);
        HugePagePool::require(needed).map_err(|e| CliError::Runtime(format!("torture: {e}")))?;
    }
    // Flags that would be accepted and then ignored are refused: a run
    // that did not do what was asked must not report as if it had.
    let file_kind = matches!(a.kind, Kind::File);
    if a.install.is_some() && !file_kind {
        return usage(format!(
            "--install applies to --kind file only (not --kind {})",
            kind_flag(a.kind)
        ));
    }
    if a.dir.is_some() && (a.kind == Kind::Anonymous || a.store.is_some()) {
        return usage(
            "--dir applies to --kind file or swapfile without --store (nothing here is made on disk)"
                .into(),
        );
    }
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    if a.kind != Kind::Anonymous && a.store.is_none() {
        if !dir.is_dir() {
            return usage(format!("--dir {}: not a directory", dir.display()));
        }
        // One it can make files in (not /proc, nor read-only): a file
        // made and removed again, or exit 1 after the model is built.
        super::output_file("--dir", &unique_name(&dir))?;
    }
    let kind = match (a.kind, &a.store) {
        (Kind::File, None) => TortureKind::File {
            path: unique_name(&dir),
        },
        (Kind::Anonymous, None) => TortureKind::Anonymous,
        (Kind::Swapfile, None) => TortureKind::Swapfile { dir },
        (Kind::File, Some(url)) => TortureKind::Far { url: url.clone() },
        (Kind::Anonymous, Some(url)) => TortureKind::FarSwap { url: url.clone() },
        (Kind::Swapfile, Some(_)) => {
            return usage("--store and --kind swapfile: the swap goes to one or the other".into())
        }
    };
    Ok(TortureConfig {
        threads: a.threads,
        pages: a.pages * units,
        budget_pages: a.budget * units as u64,
        page_size: a.page_size,
        ops_per_thread,
        write_pct: a.write_pct,
        seed: a.seed,
        kind,
        install: a.install.unwrap_or(InstallKind::Shared),
        delivery: a.delivery,
        policy: a.policy,
        duration: a.duration,
        churn: a.churn,
    })
}

/// The `--kind` value as typed.
fn kind_flag(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Anonymous => "anonymous",
        Kind::Swapfile => "swapfile",
    }
}

/// A file name in `dir` that no other run uses.
fn unique_name(dir: &Path) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    dir.join(format!(
        "uffd-pager-torture-{}-{nanos:09}",
        std::process::id()
    ))
}

/// Runs the torture and prints the report.
pub fn run(a: &TortureArgs) -> CliResult {
    let cfg = config(a)?;
    // The file goes when the run ends, or when a signal ends it (`os::interrupt`).
    let _cleanup = match &cfg.kind {
        TortureKind::File { path } => Some(TempPath::new(path.clone())),
        _ => None,
    };
    tracing::info!(?cfg, "torture");
    let r = torture::run(&cfg).map_err(|e| CliError::Runtime(format!("torture: {e}")))?;
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| CliError::Runtime(format!("writing output: {e}"));
    if a.json {
        writeln!(out, "{}", report_json(&cfg, &r)).map_err(io)?;
    } else {
        write!(out, "{}", report_text(&cfg, &r)).map_err(io)?;
    }
    out.flush().map_err(io)?;
    if r.is_clean() {
        Ok(())
    } else {
        Err(CliError::Runtime(format!(
            "torture: {} words did not match the model, {} bytes of the churn's side regions",
            r.mismatches, r.churn_mismatches
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        a: TortureArgs,
    }

    fn args(extra: &[&str]) -> TortureArgs {
        let mut v = vec!["torture"];
        v.extend_from_slice(extra);
        T::try_parse_from(v).unwrap().a
    }

    #[test]
    fn budget_must_be_a_quarter_of_the_region() {
        assert!(matches!(
            config(&args(&["--budget", "2048", "--pages", "4096"])),
            Err(CliError::Usage(_))
        ));
        let c = config(&args(&["--budget", "1024", "--pages", "4096"])).unwrap();
        assert_eq!(c.budget_pages, 1024);
        assert!(matches!(c.kind, TortureKind::File { .. }));
    }

    #[test]
    fn ops_split_over_threads() {
        let c = config(&args(&[
            "--ops",
            "11",
            "--threads",
            "2",
            "--kind",
            "anonymous",
        ]))
        .unwrap();
        assert_eq!(c.ops_per_thread, 6);
        assert!(matches!(
            config(&args(&["--threads", "0"])),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(
            config(&args(&["--write-pct", "101"])),
            Err(CliError::Usage(_))
        ));
    }
}
