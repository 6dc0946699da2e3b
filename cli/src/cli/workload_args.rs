//! The workload subcommands' arguments ([`WorkloadArgs`]) and which
//! workload runs ([`Which`]), with its defaults.

use clap::Args;
use std::path::PathBuf;
use uffd_pager::store::LatencyModel;
use uffd_pager::{Delivery, DrainPolicy, InstallKind, Policy, PolicyKind};
use uffd_pager_cli::far::StoreUrl;
use uffd_pager_cli::workload::launch;

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
    /// Simulated store latency: none, fixed:50us, uniform:10us-100us, exp:50us
    /// [default: fixed:50us].
    #[arg(long)]
    pub latency: Option<LatencyModel>,
    /// Simulated I/Os in flight at most, per simulated store (0:
    /// unbounded) [default: 0]. filemap has a store per thread's file, so
    /// N threads have up to N times this in flight; swap and launch have
    /// one.
    #[arg(long)]
    pub max_inflight: Option<u32>,
    /// Far memory (filemap, swap, launch): the store lives in Redis
    /// (`redis://HOST:PORT[/DB]` or `redis-cluster://HOST:PORT,...`)
    /// instead of the simulated store, so the latency is the network's
    /// (`--latency` and `--max-inflight` do not apply), and anonymous
    /// regions swap there. Each run uses a key namespace of its own and
    /// deletes it.
    #[arg(long, value_name = "URL")]
    pub store: Option<StoreUrl>,
    /// Seconds per run [default: 2]. swap and filemap stop within one
    /// access of it (a filemap run that finishes no round is an error);
    /// random looks every 64 accesses, scan runs at least one pass of each
    /// side, populate-churn between its ops; not for launch, which runs
    /// --launches launches.
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
    /// Largest readahead window in pages (0: off) [default: 32]. Not for
    /// random (it advises random access) or populate-churn.
    #[arg(long)]
    pub readahead: Option<u32>,
    /// Fault-around base cluster in pages (0: off; at most 16384, rounded
    /// down to a power of two); a sequential reader's grows to 8x
    /// [default: 64]. Read faults of shared regions of 4 KiB pages only,
    /// not kernel-mapped.
    #[arg(long)]
    pub fault_around: Option<usize>,
    /// No background reclaimer: faulting threads reclaim for themselves,
    /// at the budget only (direct reclaim), dirty pages too. With it,
    /// faulting threads free clean pages from the high watermark on and
    /// kswapd writes the dirty ones. Not for populate-churn (it runs
    /// none) or --budget 0.
    #[arg(long)]
    pub no_kswapd: bool,
    /// Read-only shared regions are registered MISSING only and the kernel
    /// maps the pages the engine cached (`MapOptions::kernel_maps`):
    /// filemap, random (without --write-pct), scan and launch, shared
    /// kind, 4 KiB pages.
    #[arg(long)]
    pub kernel_maps: bool,
    /// random: run no raw floor beside the engine. The floor runs in slices
    /// alternated with the engine's and holds its own file and budget of
    /// pages all through the run: without it the run takes half the time
    /// and memory, and its floor figures print as NaN.
    #[arg(long)]
    pub no_floor: bool,
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
    /// --baseline kernel: where the files go (a disk file system;
    /// default /var/tmp)
    #[arg(long)]
    pub baseline_dir: Option<PathBuf>,
    /// Page size of the engine's regions: 4K or 2M (hugetlb; root reserves
    /// the pages with `sysctl vm.nr_hugepages=N`). `--pages` and `--budget`
    /// then count pages of this size; their defaults keep their bytes (a
    /// budget at least two pages).
    /// Not for populate-churn (its regions are one page each).
    #[arg(long, default_value = "4K", value_parser = super::page_size)]
    pub page_size: usize,
    /// populate-churn: drain policies to compare [default:
    /// always,locked-only,never].
    #[arg(long, value_delimiter = ',')]
    pub drain: Vec<DrainPolicy>,
    /// launch: launches per run (about 3.2 s each with the calibrated
    /// model) [default: 10].
    #[arg(long)]
    pub launches: Option<usize>,
    /// launch: a recorded trace file (default: the shipped synthetic one).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// populate-churn: LRU shard counts to compare [default: 1].
    #[arg(long, value_delimiter = ',')]
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

    /// `--latency`, or its default.
    pub fn latency(&self) -> LatencyModel {
        self.latency.unwrap_or(LatencyModel::Fixed { ns: 50_000 })
    }

    /// `--max-inflight`, or its default (0: unbounded).
    pub fn max_inflight(&self) -> u32 {
        self.max_inflight.unwrap_or(0)
    }

    /// `--launches`, or its default.
    pub fn launches(&self) -> usize {
        self.launches.unwrap_or(10)
    }

    /// The drain policies to compare: those given, or all three.
    pub fn drains(&self) -> Vec<DrainPolicy> {
        if self.drain.is_empty() {
            vec![
                DrainPolicy::Always,
                DrainPolicy::LockedOnly,
                DrainPolicy::Never,
            ]
        } else {
            self.drain.clone()
        }
    }

    /// The LRU shard counts to compare: those given, or one.
    pub fn shard_counts(&self) -> Vec<usize> {
        if self.shards.is_empty() {
            vec![1]
        } else {
            self.shards.clone()
        }
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
