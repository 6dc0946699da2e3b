//! `uffd-pager bench filemap|swap|populate-churn …`: runs a workload under
//! each policy (or drain/shard variant) over a swept knob and prints the
//! seed-style comparison.

use super::report::Sweep;
use super::workload_plan::plan;
use super::{CliError, CliResult};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use uffd_pager::store::LatencyModel;
use uffd_pager::{Delivery, DrainPolicy, InstallKind, Policy, PolicyKind};
use uffd_pager_cli::far::StoreUrl;
use uffd_pager_cli::workload::{churn, filemap, launch, random, scan, swap, Knobs, RunResult};

/// Knobs shared by the workload subcommands. Lists are comma-separated;
/// at most one of `--threads` / `--writers` may list several values (the
/// swept knob).
#[derive(Debug, Args, Clone)]
pub struct WorkloadArgs {
    /// Policies to compare; the first is the baseline of the % column.
    /// Each may carry `+uptodate-no-retry`. [default: vanilla,retry-once;
    /// populate-churn, which compares drain policies, takes one: vanilla]
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<Policy>,
    /// Worker threads (several values: sweep): filemap, swap,
    /// populate-churn, random (scan has one scanner, launch one app).
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Extra global-lock writer threads (several values: sweep).
    #[arg(long, value_delimiter = ',')]
    pub writers: Vec<usize>,
    /// Region size in pages (per worker for filemap): filemap, swap and
    /// scan (random's file is 4x --budget; launch's is its trace's).
    #[arg(long)]
    pub pages: Option<usize>,
    /// Memory budget in pages (0: none, nothing is evicted; random needs
    /// one, as its file is 4x the budget; scan raises it to hold its file,
    /// so that its passes are warm).
    #[arg(long)]
    pub budget: Option<u64>,
    /// Simulated store latency: none, fixed:50us, uniform:10us-100us, exp:50us.
    #[arg(long, default_value = "fixed:50us")]
    pub latency: LatencyModel,
    /// Simulated I/Os in flight at most (0: unbounded).
    #[arg(long, default_value_t = 0)]
    pub max_inflight: u32,
    /// Far memory (filemap, swap, launch): the store lives in Redis
    /// (`redis://HOST:PORT[/DB]` or `redis-cluster://HOST:PORT,...`)
    /// instead of the simulated store, so the latency is the network's
    /// (`--latency` and `--max-inflight` do not apply), and anonymous
    /// regions swap there. Each run uses a key namespace of its own and
    /// deletes it.
    #[arg(long, value_name = "URL")]
    pub store: Option<StoreUrl>,
    /// Seconds per run [default: 2]; a run stops within one access of it
    /// (not for launch, which runs --launches launches).
    #[arg(long)]
    pub duration: Option<f64>,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Delivery: in-thread, threads\[:N\[:spinUS\]\] (N defaults to one per
    /// CPU), or per-region.
    #[arg(long, default_value = "in-thread")]
    pub delivery: Delivery,
    /// Install kind (filemap, random, scan, launch; swap is anonymous by
    /// definition). Default: the engine's choice (`MapOptions::install_kind`):
    /// anonymous for a read-only `random` (it advises random access),
    /// shared for the rest.
    #[arg(long)]
    pub kind: Option<InstallKind>,
    /// Largest readahead window in pages (0: off).
    #[arg(long, default_value_t = 32)]
    pub readahead: u32,
    /// Fault-around base cluster in pages (0: off; at most 16384, rounded
    /// down to a power of two); a sequential reader's grows to 8x.
    #[arg(long, default_value_t = 64)]
    pub fault_around: usize,
    /// No background reclaimer: faulting threads reclaim for themselves
    /// (direct reclaim only). On a 2-vCPU machine this avoids a TLB
    /// shootdown per eviction while a worker runs on the other vCPU.
    #[arg(long)]
    pub no_kswapd: bool,
    /// Read-only shared regions are registered MISSING only and the kernel
    /// maps the pages the engine cached (`MapOptions::kernel_maps`):
    /// filemap, random (without --write-pct), scan and launch, shared
    /// kind, 4 KiB pages.
    #[arg(long)]
    pub kernel_maps: bool,
    /// random: percentage of accesses that also write the word they read
    /// (back unchanged, so the page turns dirty and reclaim writes it back)
    #[arg(long, default_value_t = 0)]
    pub write_pct: u32,
    /// Microseconds each writer pauses between map/unmap loops (between
    /// bursts, with --writer-burst-us).
    #[arg(long)]
    pub writer_pause_us: Option<u64>,
    /// Microseconds each writer maps and unmaps back to back before each
    /// pause (0: one map/unmap per pause).
    #[arg(long)]
    pub writer_burst_us: Option<u64>,
    /// launch: think time of each trace access multiplied by this (an app
    /// computes between faults)
    #[arg(long)]
    pub think_scale: Option<u32>,
    /// launch: every N accesses the app maps a small anonymous region and
    /// touches it (its first fault needs the global lock, as the kernel's
    /// `__vmf_anon_prepare` needs mmap_lock: 0 = none)
    #[arg(long)]
    pub heap_every: Option<usize>,
    /// filemap, swap: scheduler-noise threads, seed 000's noise variant:
    /// each pinned to a CPU in turn at nice -10 with a 10 µs EEVDF slice,
    /// spinning 5 µs and sleeping 50 µs in a loop (priority needs root)
    #[arg(long, default_value_t = 0)]
    pub noise: usize,
    /// random, scan, filemap: `kernel` runs the kernel's own mmap of the
    /// same files beside the engine, each side in a memory cgroup of the
    /// budget plus the fixed overhead, on a disk file system
    /// (`--baseline-dir`); needs root
    #[arg(long, value_parser = ["kernel"])]
    pub baseline: Option<String>,
    /// --baseline kernel: where the files go (a disk file system)
    #[arg(long, default_value = "/var/tmp")]
    pub baseline_dir: PathBuf,
    /// Page size of the engine's regions: 4K or 2M (hugetlb; root reserves
    /// the pages with `sysctl vm.nr_hugepages=N`). `--pages` and `--budget`
    /// then count pages of this size; their defaults keep their bytes (a
    /// budget at least two pages).
    /// Not for populate-churn (its regions are one page each).
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    pub page_size: usize,
    /// populate-churn: drain policies to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "always,locked-only,never"
    )]
    pub drain: Vec<DrainPolicy>,
    /// launch: launches per run (about 3.2 s each with the calibrated model).
    #[arg(long, default_value_t = 10)]
    pub launches: usize,
    /// launch: a recorded trace file (default: the shipped synthetic one).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// populate-churn: LRU shard counts to compare.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub shards: Vec<usize>,
    /// Print JSON instead of tables.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV instead of tables.
    #[arg(long)]
    pub csv: bool,
    /// Write an SVG plot of throughput against the swept knob (FILE ends
    /// in .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

impl WorkloadArgs {
    /// `--duration`, or its default.
    pub fn duration(&self) -> f64 {
        self.duration.unwrap_or(2.0)
    }

    /// The policies to run: those given, or the workload's default.
    pub fn policies(&self, w: Which) -> Vec<Policy> {
        if !self.policy.is_empty() {
            return self.policy.clone();
        }
        let of = |kind| Policy {
            kind,
            uptodate_no_retry: false,
        };
        if w == Which::Churn {
            vec![of(PolicyKind::Vanilla)]
        } else {
            vec![of(PolicyKind::Vanilla), of(PolicyKind::RetryOnce)]
        }
    }
}

/// Which workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `filemap`.
    Filemap,
    /// `swap`.
    Swap,
    /// `populate-churn`.
    Churn,
    /// `random`.
    Random,
    /// `scan`.
    Scan,
    /// `launch`.
    Launch,
}

impl Which {
    pub(super) fn name(self) -> &'static str {
        match self {
            Which::Filemap => "filemap",
            Which::Swap => "swap",
            Which::Churn => "populate-churn",
            Which::Random => "random",
            Which::Scan => "scan",
            Which::Launch => "launch",
        }
    }

    /// Default writer model: (pause µs, burst µs). `launch`'s writers come
    /// in bursts, calibrated against seed 003 (see `launch.rs`).
    pub(super) fn writer_model(self) -> (u64, u64) {
        match self {
            Which::Launch => (launch::WRITER_PAUSE_US, launch::WRITER_BURST_US),
            _ => (0, 0),
        }
    }

    /// Default (threads, writers, pages, budget).
    pub(super) fn defaults(self) -> (usize, usize, usize, u64) {
        match self {
            Which::Filemap => (16, 0, 256, 128),
            Which::Swap => (8, 0, 8192, 4096),
            Which::Churn => (1, 0, 1, 1 << 16),
            Which::Random => (1, 0, 0, 4096),
            Which::Scan => (1, 0, 16384, 1 << 15),
            Which::Launch => (1, 2, 4096, 1 << 12),
        }
    }
}

/// Runs one workload once.
fn run_once(
    w: Which,
    k: &Knobs,
    a: &WorkloadArgs,
    drain: DrainPolicy,
    shards: usize,
) -> Result<RunResult, CliError> {
    let rt = |e: uffd_pager::Error| CliError::Runtime(e.to_string());
    match w {
        Which::Filemap => filemap::run(k).map_err(rt),
        Which::Swap => swap::run(k).map_err(rt),
        Which::Churn => churn::run(k, drain, shards).map_err(rt),
        Which::Random => random::run(k).map_err(rt),
        Which::Scan => scan::run(k).map_err(rt),
        Which::Launch => {
            let trace = match &a.trace {
                Some(p) => launch::Trace::load(p)
                    .map_err(|e| CliError::Usage(format!("--trace {}: {e}", p.display())))?,
                None => launch::default_trace(),
            };
            if a.launches == 0 || a.launches > 10_000 {
                return Err(CliError::Usage("--launches must be in 1..=10000".into()));
            }
            let model = launch::Model {
                think_scale: a.think_scale.unwrap_or(launch::THINK_SCALE),
                heap_every: a.heap_every.unwrap_or(launch::HEAP_EVERY),
            };
            // The app's think time, scaled: bounded, so a launch ends.
            let scale = u64::from(model.think_scale);
            let longest = trace.longest_think_us().saturating_mul(scale);
            let total = (trace.think_time().as_micros() as u64).saturating_mul(scale);
            if longest > 10_000_000 || total > 600_000_000 {
                return Err(CliError::Usage(format!(
                    "the trace's think times × --think-scale {scale} come to {:.1} s for one \
                     access and {:.1} s for a launch: at most 10 s and 600 s",
                    longest as f64 / 1e6,
                    total as f64 / 1e6
                )));
            }
            // The trace's region lives in a memory store.
            let bytes = (trace.pages() as u64).saturating_mul(uffd_pager::PAGE_SIZE as u64);
            if super::phys_mem().is_some_and(|mem| bytes > mem / 2) {
                return Err(CliError::Usage(format!(
                    "the trace addresses {} MiB, more than half of this machine's memory",
                    bytes >> 20
                )));
            }
            launch::run(k, &trace, a.launches, model).map_err(rt)
        }
    }
}

/// Runs the sweep: every knob value × every label.
pub fn sweep(w: Which, a: &WorkloadArgs) -> Result<Sweep, CliError> {
    let (knob, values, base) = plan(w, a)?;
    let labels: Vec<(String, Policy, DrainPolicy, usize)> = if w == Which::Churn {
        let mut v = Vec::new();
        for &s in &a.shards {
            for &d in &a.drain {
                v.push((
                    format!("{d}/{s} shard{}", if s == 1 { "" } else { "s" }),
                    base.policy,
                    d,
                    s,
                ));
            }
        }
        v
    } else {
        a.policies(w)
            .iter()
            .map(|&p| (p.to_string(), p, DrainPolicy::Always, 1))
            .collect()
    };
    let total = (values.len() * labels.len()) as u64;
    let bar = progress(total, a.duration() * total as f64);
    let mut sw = Sweep {
        workload: w.name(),
        knob,
        values: values.clone(),
        labels: labels.iter().map(|l| l.0.clone()).collect(),
        runs: Vec::new(),
    };
    for (vi, &v) in values.iter().enumerate() {
        for (li, (label, policy, drain, shards)) in labels.iter().enumerate() {
            let mut k = base.clone();
            k.policy = *policy;
            match knob {
                "writers" => k.writers = v,
                _ => k.threads = v,
            }
            bar.set_message(format!("{knob}={v} {label}"));
            tracing::info!(workload = w.name(), knob, v, %label, "run");
            let r = run_once(w, &k, a, *drain, *shards).map_err(|e| match e {
                CliError::Runtime(e) => {
                    CliError::Runtime(format!("{} {knob}={v} {label}: {e}", w.name()))
                }
                usage => usage,
            })?;
            if r.extra("mismatches").unwrap_or(0.0) > 0.0 {
                return Err(CliError::Runtime(format!(
                    "{} {knob}={v} {label}: {} pages read back wrong",
                    w.name(),
                    r.extra("mismatches").unwrap_or(0.0)
                )));
            }
            sw.runs.push((vi, li, r));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(sw)
}

/// A progress bar on stderr for runs longer than a couple of seconds,
/// hidden when stdout is not a terminal.
pub fn progress(total: u64, seconds: f64) -> indicatif::ProgressBar {
    if seconds < 2.0 || !std::io::stdout().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} runs, {elapsed} {msg}")
    {
        bar.set_style(style);
    }
    bar
}

/// `uffd-pager bench <workload>`.
pub fn run(w: Which, a: &WorkloadArgs) -> CliResult {
    if a.baseline.is_some() {
        return run_kernel_baseline(w, a);
    }
    let sw = sweep(w, a)?;
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| CliError::Runtime(format!("writing output: {e}"));
    if a.json {
        writeln!(out, "{}", sw.json()).map_err(io)?;
    } else if a.csv {
        write!(out, "{}", sw.csv()).map_err(io)?;
    } else {
        writeln!(out, "{}", sw.table()).map_err(io)?;
        write!(out, "{}", sw.counters()).map_err(io)?;
    }
    if let Some(p) = &a.plot {
        sw.plot(p, &format!("{} throughput", sw.workload))
            .map_err(CliError::Runtime)?;
        if !a.json && !a.csv {
            writeln!(out, "plot written to {}", p.display()).map_err(io)?;
        }
    }
    Ok(())
}

/// `--baseline kernel`: the engine and the kernel's mmap, each in a memory
/// cgroup of the same limit (see [`uffd_pager_cli::bench::kernel_baseline`]).
fn run_kernel_baseline(w: Which, a: &WorkloadArgs) -> CliResult {
    use uffd_pager_cli::bench::kernel_baseline::{self as kb, access::Workload};
    let workload = match w {
        Which::Random => Workload::Random,
        Which::Scan => Workload::Scan,
        Which::Filemap => Workload::Filemap,
        _ => {
            return Err(CliError::Usage(
                "--baseline kernel is for `bench random`, `bench scan` and `bench filemap`".into(),
            ))
        }
    };
    if a.threads.len() > 1 || a.policies(w).len() > 1 {
        return Err(CliError::Usage(
            "--baseline kernel runs one configuration: give one --policy and --threads".into(),
        ));
    }
    super::workload_plan::baseline_applies(a)?;
    let (_, _, k) = plan(w, a)?;
    kb::check(workload, &k, &a.baseline_dir).map_err(CliError::Usage)?;
    let report = kb::run(workload, &k, &a.baseline_dir).map_err(CliError::Runtime)?;
    let mut out = std::io::stdout().lock();
    write!(out, "{}", report.table(&k, &a.baseline_dir))
        .map_err(|e| CliError::Runtime(format!("writing output: {e}")))?;
    if report.sides.iter().any(|s| s.mismatches > 0) {
        return Err(CliError::Runtime(
            "a side read a word that differs from the file".into(),
        ));
    }
    Ok(())
}
