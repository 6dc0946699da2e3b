//! `uffd-pager torture`: the reclaim torture of
//! [`uffd_pager_cli::workload::torture`] from the command line. Several threads
//! read and write random words of a region at least four times the memory
//! budget while reclaim and write-back run; every read is checked against
//! an exact model, and so is the whole region (and file) at the end.
//!
//! Exit codes: 0 clean, 1 mismatches (or a runtime error), 2 bad arguments.

use super::json::Json;
use super::{CliError, CliResult};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use uffd_pager::{Counter, Delivery, HugePagePool, InstallKind, Policy, PAGE_SIZE};
use uffd_pager_cli::far::StoreUrl;
use uffd_pager_cli::os::interrupt::TempPath;
use uffd_pager_cli::workload::torture::{self, TortureConfig, TortureKind, TortureReport};

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
        // Only the ways out that exist: a budget of at least one page, a
        // region of at most MAX_PAGES.
        let mut ways = Vec::new();
        if a.pages >= 4 {
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
    let max = uffd_pager::limits::MAX_THREADS;
    if a.threads > max {
        return usage(format!("--threads {} is more than {max}", a.threads));
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

fn kind_name(k: &TortureKind) -> &'static str {
    match k {
        TortureKind::File { .. } => "file",
        TortureKind::Anonymous => "anonymous",
        TortureKind::Swapfile { .. } => "swapfile",
        TortureKind::Far { .. } => "file (redis)",
        TortureKind::FarSwap { .. } => "anonymous (swap to redis)",
    }
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
            "torture: {} words did not match the model",
            r.mismatches
        )))
    }
}

fn ops_per_s(r: &TortureReport) -> f64 {
    let s = r.elapsed.as_secs_f64();
    if s > 0.0 {
        r.ops as f64 / s
    } else {
        0.0
    }
}

/// `units` 4 KiB units (what the torture counts) as pages of the run's
/// size, as its arguments gave them: "32 2 MiB" for 16384 units of a
/// 2 MiB run, the plain count for 4 KiB pages.
fn in_pages(units: u64, page_size: usize) -> String {
    let per = (page_size / PAGE_SIZE).max(1) as u64;
    if per == 1 {
        units.to_string()
    } else {
        format!("{} {} MiB", units / per, page_size >> 20)
    }
}

fn report_text(cfg: &TortureConfig, r: &TortureReport) -> String {
    use std::fmt::Write as _;
    let st = &r.stats;
    let mut s = String::new();
    let install = match cfg.kind {
        TortureKind::File { .. } | TortureKind::Far { .. } => format!(", install {}", cfg.install),
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "torture: kind {}{install}, {} threads, {} pages ({} MiB) over a budget of {} pages, \
         {}% writes, delivery {}, policy {}, seed {}",
        kind_name(&cfg.kind),
        cfg.threads,
        in_pages(cfg.pages as u64, cfg.page_size),
        (cfg.pages * PAGE_SIZE) >> 20,
        in_pages(cfg.budget_pages, cfg.page_size),
        cfg.write_pct,
        cfg.delivery,
        cfg.policy,
        cfg.seed
    );
    let _ = writeln!(
        s,
        "  ops             {} (reads {}, writes {})",
        r.ops, r.reads, r.writes
    );
    let _ = writeln!(s, "  mismatches      {}", r.mismatches);
    let _ = writeln!(s, "  words verified  {}", r.words_verified);
    let _ = writeln!(
        s,
        "  elapsed         {:.3} s ({:.0} ops/s)",
        r.elapsed.as_secs_f64(),
        ops_per_s(r)
    );
    let _ = writeln!(
        s,
        "  reclaim         pgsteal {} pgscan {} writeback {} direct_reclaim {} kswapd_wake {}",
        st.get(Counter::PGSTEAL),
        st.get(Counter::PGSCAN),
        st.get(Counter::WRITEBACK),
        st.get(Counter::DIRECT_RECLAIM),
        st.get(Counter::KSWAPD_WAKE)
    );
    let _ = writeln!(
        s,
        "  faults          pgfault {} pgmajfault {} wp_fault {} retry_mmap_drop {} retry_io_miss {}",
        st.get(Counter::PGFAULT),
        st.get(Counter::PGMAJFAULT),
        st.get(Counter::WP_FAULT),
        st.get(Counter::RETRY_MMAP_DROP),
        st.get(Counter::RETRY_IO_MISS)
    );
    let _ = writeln!(
        s,
        "  background      flushes {} reclaimed {} pages",
        r.background_flushes, r.background_reclaimed
    );
    if cfg.churn {
        let _ = writeln!(
            s,
            "  churn           {} address-space operations on side regions",
            r.churn_ops
        );
    }
    let over = if st.peak_resident_pages > st.budget_pages {
        format!(
            " (over by {} in flight)",
            st.peak_resident_pages - st.budget_pages
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  peak resident   {} / budget {} pages{over}",
        st.peak_resident_pages, st.budget_pages
    );
    if !r.first_mismatches.is_empty() {
        let _ = writeln!(s, "  first mismatches:");
        for m in &r.first_mismatches {
            let _ = writeln!(s, "    {m}");
        }
    }
    let _ = writeln!(
        s,
        "{}",
        if r.is_clean() {
            "PASS: every read and every final word matched the model"
        } else {
            "FAIL: data did not match the model"
        }
    );
    s
}

fn report_json(cfg: &TortureConfig, r: &TortureReport) -> Json {
    let st = &r.stats;
    let counters = Json::Obj(
        Counter::ALL
            .iter()
            .map(|&c| (c.name().to_string(), Json::Int(st.get(c) as i64)))
            .collect(),
    );
    let mismatches = Json::Arr(
        r.first_mismatches
            .iter()
            .map(|m| Json::str(m.to_string()))
            .collect(),
    );
    Json::obj([
        ("workload", Json::str("torture")),
        ("kind", Json::str(kind_name(&cfg.kind))),
        (
            "install",
            // As the text report: the install kind of the kinds that map
            // a file or object (the far one too).
            match cfg.kind {
                TortureKind::File { .. } | TortureKind::Far { .. } => {
                    Json::str(cfg.install.to_string())
                }
                _ => Json::Null,
            },
        ),
        ("threads", Json::Int(cfg.threads as i64)),
        // In 4 KiB units whatever the page size (page_size_bytes says it).
        ("pages", Json::Int(cfg.pages as i64)),
        ("budget_pages", Json::Int(cfg.budget_pages as i64)),
        ("page_size_bytes", Json::Int(cfg.page_size as i64)),
        ("write_pct", Json::Int(i64::from(cfg.write_pct))),
        ("delivery", Json::str(cfg.delivery.to_string())),
        ("policy", Json::str(cfg.policy.to_string())),
        ("seed", Json::UInt(cfg.seed)),
        ("ops", Json::Int(r.ops as i64)),
        ("reads", Json::Int(r.reads as i64)),
        ("writes", Json::Int(r.writes as i64)),
        ("mismatches", Json::Int(r.mismatches as i64)),
        ("first_mismatches", mismatches),
        ("words_verified", Json::Int(r.words_verified as i64)),
        ("elapsed_s", Json::Num(r.elapsed.as_secs_f64())),
        ("ops_per_s", Json::Num(ops_per_s(r))),
        ("background_flushes", Json::Int(r.background_flushes as i64)),
        (
            "background_reclaimed",
            Json::Int(r.background_reclaimed as i64),
        ),
        (
            "peak_resident_pages",
            Json::Int(st.peak_resident_pages as i64),
        ),
        ("counters", counters),
        ("clean", Json::Bool(r.is_clean())),
    ])
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

    /// A report of nothing done, for the report's formatting.
    fn empty_report() -> TortureReport {
        let pager = uffd_pager::Pager::builder().build().unwrap();
        TortureReport {
            ops: 0,
            reads: 0,
            writes: 0,
            mismatches: 0,
            first_mismatches: Vec::new(),
            words_verified: 0,
            background_flushes: 0,
            background_reclaimed: 0,
            churn_ops: 0,
            elapsed: std::time::Duration::ZERO,
            stats: pager.stats(),
        }
    }

    /// The JSON report names the install kind wherever the text one does:
    /// a file in Redis too.
    #[test]
    fn json_names_the_install_kind_of_a_far_object() {
        let r = empty_report();
        for (kind, want) in [
            (
                TortureKind::Far {
                    url: StoreUrl("redis://127.0.0.1:6379".into()),
                },
                "\"install\":\"anonymous\"",
            ),
            (
                TortureKind::File {
                    path: "/nonexistent".into(),
                },
                "\"install\":\"anonymous\"",
            ),
            (TortureKind::Anonymous, "\"install\":null"),
        ] {
            let cfg = TortureConfig {
                kind,
                install: InstallKind::Anonymous,
                ..TortureConfig::default()
            };
            let text = report_text(&cfg, &r);
            let json = report_json(&cfg, &r).to_string();
            assert!(json.contains(want), "{json}");
            assert_eq!(
                text.contains("install anonymous"),
                want.contains("anonymous"),
                "{text}"
            );
        }
    }

    /// With 2 MiB pages the report counts pages as the arguments did (it
    /// gave 4 KiB units: "16384 pages" for `--pages 32`), and the JSON
    /// says the unit of its counts.
    #[test]
    fn a_2_mib_run_reports_pages_as_its_arguments_count_them() {
        let r = empty_report();
        let cfg = TortureConfig {
            pages: 32 * 512,
            budget_pages: 8 * 512,
            page_size: uffd_pager::HUGE_PAGE_SIZE,
            ..TortureConfig::default()
        };
        let text = report_text(&cfg, &r);
        assert!(
            text.contains("32 2 MiB pages (64 MiB) over a budget of 8 2 MiB pages"),
            "{text}"
        );
        let json = report_json(&cfg, &r).to_string();
        assert!(json.contains("\"page_size_bytes\":2097152"), "{json}");
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
