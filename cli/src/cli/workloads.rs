//! `uffd-pager bench filemap|swap|populate-churn|random|scan|launch …`:
//! runs a workload under each policy (or drain/shard variant) over a swept
//! knob and prints the seed-style comparison.

use super::report::Sweep;
use super::workload_args::{Which, WorkloadArgs};
use super::workload_plan::plan;
use super::{CliError, CliResult};
use std::io::{IsTerminal, Write};
use uffd_pager::{DrainPolicy, Policy};
use uffd_pager_cli::workload::{churn, filemap, launch, random, scan, swap, Knobs, RunResult};

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
            if a.launches() == 0 || a.launches() > 10_000 {
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
            // (The memory cgroup's limit too: only the machine's was
            // asked, and a run over the limit was OOM-killed.)
            super::fits_in_memory("the trace's region", bytes)?;
            if super::phys_mem().is_some_and(|mem| bytes > mem / 2) {
                return Err(CliError::Usage(format!(
                    "the trace addresses {} MiB, more than half of this machine's memory",
                    bytes >> 20
                )));
            }
            launch::run(k, &trace, a.launches(), model).map_err(rt)
        }
    }
}

/// Runs the sweep: every knob value × every label.
pub fn sweep(w: Which, a: &WorkloadArgs) -> Result<Sweep, CliError> {
    let (knob, values, base) = plan(w, a)?;
    let labels: Vec<(String, Policy, DrainPolicy, usize)> = if w == Which::Churn {
        let mut v = Vec::new();
        for s in a.shard_counts() {
            for d in a.drains() {
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
    let dir = a
        .baseline_dir
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("/var/tmp"));
    kb::check(workload, &k, &dir).map_err(CliError::Usage)?;
    let report = kb::run(workload, &k, &dir).map_err(CliError::Runtime)?;
    let mut out = std::io::stdout().lock();
    write!(out, "{}", report.table(&k, &dir))
        .map_err(|e| CliError::Runtime(format!("writing output: {e}")))?;
    if report.sides.iter().any(|s| s.mismatches > 0) {
        return Err(CliError::Runtime(
            "a side read a word that differs from the file".into(),
        ));
    }
    Ok(())
}
