//! `uffd-pager bench <workload>`. Each workload is one variant of
//! [`Workload`] with its own arguments and runner; add new ones there.

use super::raw_benches::{
    run_evict, run_fault_cost, run_scale, run_wakeup, EvictArgs, FaultCostArgs, ScaleArgs,
    WakeupArgs,
};
use super::workload_args::{Which, WorkloadArgs};
use super::workloads;
use super::CliResult;
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Debug, Subcommand)]
enum Workload {
    /// Per-fault cost of the engine against the raw floor loop (the same
    /// userfaultfd ioctls with no engine), as a ratio measured in one run.
    FaultCost(FaultCostArgs),
    /// Per-thread file regions: rounds of map → read every page → unmap
    /// under a budget (seeds 000, 003).
    Filemap(WorkloadArgs),
    /// An anonymous region under pressure with readers and global-lock
    /// writers (seeds 003, 004).
    Swap(WorkloadArgs),
    /// Single-page populate/unmap: LRU-lock cost per drain policy and
    /// shard count (seed 002).
    PopulateChurn(WorkloadArgs),
    /// Random 4 KiB reads, one word per page, over a file 4× the budget
    /// (UMap's pfbenchmark-read shape).
    Random(WorkloadArgs),
    /// A sequential scan, side by side with the kernel's own mmap of the
    /// same tmpfs file (both warm).
    Scan(WorkloadArgs),
    /// A recorded page-access trace replayed against a cold cache with
    /// background writers (the cold app launch of seed 003).
    Launch(WorkloadArgs),
    /// Eviction throughput (pages/s) against the raw primitives
    /// (UFFDIO_MOVE, MADV_DONTNEED, hole punch) measured in the same run.
    Evict(EvictArgs),
    /// Fault cost with many regions registered against few, same faults.
    /// Raises vm.max_map_count for the run where it is too low for --many
    /// (root only), and puts it back at the end.
    Scale(ScaleArgs),
    /// Handler-thread wake-up placement on the raw floor: one handler, a
    /// handler per faulter, a spinning handler, one descriptor per region.
    Wakeup(WakeupArgs),
    /// Far memory over a real Redis server or cluster: a miss against a
    /// plain client's GET, and a sequential scan with MGET readahead
    /// against one GET per fault.
    Far(super::far::FarArgs),
    /// Engine metadata per tracked page (state words, LRU ring, region
    /// structs), computed and measured on a lazily mapped region.
    Metadata(super::metadata::MetadataArgs),
}

/// Runs the chosen workload.
pub fn run(a: &BenchArgs) -> CliResult {
    match &a.workload {
        Workload::FaultCost(a) => run_fault_cost(a),
        Workload::Filemap(a) => workloads::run(Which::Filemap, a),
        Workload::Swap(a) => workloads::run(Which::Swap, a),
        Workload::PopulateChurn(a) => workloads::run(Which::Churn, a),
        Workload::Random(a) => workloads::run(Which::Random, a),
        Workload::Scan(a) => workloads::run(Which::Scan, a),
        Workload::Launch(a) => workloads::run(Which::Launch, a),
        Workload::Evict(a) => run_evict(a),
        Workload::Scale(a) => run_scale(a),
        Workload::Wakeup(a) => run_wakeup(a),
        Workload::Metadata(a) => super::metadata::run(a),
        Workload::Far(a) => super::far::run(a),
    }
}
