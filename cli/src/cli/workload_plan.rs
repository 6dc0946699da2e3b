//! Checking a workload's arguments and planning its sweep: which knob is
//! swept over which values, and the knobs every run shares.

use super::workload_args::{Which, WorkloadArgs};
use super::CliError;
use std::time::Duration;
use uffd_pager::InstallKind;
use uffd_pager_cli::workload::Knobs;

/// Validates the arguments and plans the sweep: (knob name, values, base
/// knobs).
pub(super) fn plan(
    w: Which,
    a: &WorkloadArgs,
) -> Result<(&'static str, Vec<usize>, Knobs), CliError> {
    let (threads, writers, pages, budget) = w.defaults();
    let duration = a.duration();
    if !(super::MIN_DURATION_S..=3600.0).contains(&duration) {
        return Err(CliError::Usage(format!(
            "--duration {duration} must be in [{}, 3600] seconds",
            super::MIN_DURATION_S
        )));
    }
    // A run stops within one access of its deadline; one simulated read
    // longer than the whole run would be most of it.
    if a.latency().max_ns() as f64 > duration * 1e9 {
        return Err(CliError::Usage(format!(
            "--latency {} is longer than --duration {duration} s: a run would be over before \
             its first read came back",
            a.latency()
        )));
    }
    if a.threads.len() > 1 && a.writers.len() > 1 {
        return Err(CliError::Usage(
            "sweep one knob at a time: --threads or --writers may list several values, not both"
                .into(),
        ));
    }
    if a.threads.contains(&0) || a.shards.contains(&0) {
        return Err(CliError::Usage(
            "--threads and --shards must be at least 1".into(),
        ));
    }
    applies_here(w, a)?;
    if a.store.is_some() && !matches!(w, Which::Filemap | Which::Swap | Which::Launch) {
        return Err(CliError::Usage(format!(
            "--store applies to the workloads that read a store (filemap, swap, launch), not {}",
            w.name()
        )));
    }
    if a.no_floor && w != Which::Random {
        return Err(CliError::Usage(format!(
            "--no-floor applies to random only, not {}",
            w.name()
        )));
    }
    if a.write_pct > 100 || (a.write_pct > 0 && w != Which::Random) {
        return Err(CliError::Usage(format!(
            "--write-pct {} must be 0..=100, and applies to random only",
            a.write_pct
        )));
    }
    // `random` sizes its file from the budget (4x) and compares against a
    // floor that keeps the same budget: it needs one.
    if w == Which::Random && a.budget == Some(0) {
        return Err(CliError::Usage(
            "--budget must be at least 1 page for random (its file is 4x the budget)".into(),
        ));
    }
    if a.kernel_maps
        && (matches!(w, Which::Swap | Which::Churn)
            || a.write_pct > 0
            || a.kind == Some(InstallKind::Anonymous)
            || a.page_size != uffd_pager::PAGE_SIZE)
    {
        return Err(CliError::Usage(
            "--kernel-maps needs read-only shared regions of 4 KiB pages: filemap, random \
             (without --write-pct), scan or launch, without --kind anonymous or --page-size 2M"
                .into(),
        ));
    }
    if a.page_size != uffd_pager::PAGE_SIZE && w == Which::Churn {
        return Err(CliError::Usage(
            "--page-size 2M does not apply to populate-churn (its regions are one 4 KiB page each)"
                .into(),
        ));
    }
    // The workloads count 4 KiB pages: a 2 MiB page is 512 of them.
    // Explicit counts are in pages of --page-size; defaults keep their
    // bytes (rounded up to whole pages).
    let units = a.page_size / uffd_pager::PAGE_SIZE;
    let pages = match a.pages {
        Some(p) => p.saturating_mul(units),
        None => pages.div_ceil(units) * units,
    };
    // The engine's budget holds two pages at least (or is 0, none): a
    // default keeps its bytes but not below that.
    let budget = match a.budget {
        Some(b) => b.saturating_mul(units as u64),
        None => budget.div_ceil(units as u64).max(2) * units as u64,
    };
    // The counts as given, for messages (the products above saturate).
    let (shown_pages, shown_budget) = (
        a.pages.unwrap_or(pages / units),
        a.budget.unwrap_or(budget / units as u64),
    );
    if let Some(e) = super::under_the_least_budget(budget / units as u64, units as u64, true) {
        return Err(e);
    }
    if budget > uffd_pager::limits::MAX_BUDGET_PAGES {
        return Err(CliError::Usage(format!(
            "--budget {} is more than {} pages of {} bytes (128 TiB)",
            shown_budget,
            uffd_pager::limits::MAX_BUDGET_PAGES / units as u64,
            a.page_size
        )));
    }
    // `random` and `scan` keep their files in tmpfs (`/dev/shm`), whose
    // pages are memory: random's file (4x the budget) and its floor's as
    // large, scan's file (--pages) and its kernel side's copy. Each side
    // caches up to its budget beside them (random's engine and floor one
    // budget each; scan's engine the whole file, its budget raised to hold
    // it). Checked against the file system's room and the memory (the
    // process's cgroup too) before anything is written: a run that filled
    // /dev/shm failed after gigabytes of writing, or was OOM-killed.
    let page = uffd_pager::PAGE_SIZE as u64;
    let (files, cached) = match w {
        // (`--no-floor`: the engine's alone.)
        Which::Random if a.no_floor => (budget.saturating_mul(4), budget),
        Which::Random => (budget.saturating_mul(8), budget.saturating_mul(2)),
        Which::Scan => ((pages as u64).saturating_mul(2), pages as u64),
        _ => (0, 0),
    };
    if files > 0 && a.baseline.is_none() {
        let (files, cached) = (files.saturating_mul(page), cached.saturating_mul(page));
        let what = format!(
            "{}'s files ({} MiB: {})",
            w.name(),
            files >> 20,
            if w == Which::Random && a.no_floor {
                "4x --budget"
            } else if w == Which::Random {
                "8x --budget, its own and its floor's"
            } else {
                "2x --pages, its own and the kernel side's"
            }
        );
        let with_caches = format!("{what} with the caches beside them");
        super::fits_in_memory(&with_caches, files.saturating_add(cached))?;
        let dir = uffd_pager_cli::workload::pattern_file::default_dir();
        if let Ok(free) = uffd_pager_cli::os::mem::free_bytes(&dir) {
            if files > free {
                return Err(CliError::Usage(format!(
                    "{what} do not fit in the {} MiB free on {}",
                    free >> 20,
                    dir.display()
                )));
            }
        }
    }
    if (pages == 0 && w != Which::Random) || pages > (1 << 24) {
        return Err(CliError::Usage(format!(
            "--pages {} must be in 1..={} ({} bytes at most)",
            shown_pages,
            (1 << 24) / units,
            1u64 << 36
        )));
    }
    // filemap and swap fill their simulated store up front (one shared by
    // filemap's threads) and cache up to the budget of what they map.
    if matches!(w, Which::Filemap | Which::Swap) {
        let mapped = if w == Which::Filemap {
            (pages as u64).saturating_mul(a.threads.iter().copied().max().unwrap_or(threads) as u64)
        } else {
            pages as u64
        };
        let cached = if budget == 0 {
            mapped
        } else {
            budget.min(mapped)
        };
        // (Not with a store in Redis, nor with --baseline kernel, whose
        // files are on a disk file system and whose sides each run in a
        // memory cgroup of the budget.)
        let store = if a.store.is_some() || a.baseline.is_some() {
            0
        } else {
            pages as u64
        };
        super::fits_in_memory(
            &format!(
                "--pages {shown_pages}{}",
                a.budget
                    .map_or(String::new(), |b| format!(" with --budget {b}"))
            ),
            (store + cached).saturating_mul(uffd_pager::PAGE_SIZE as u64),
        )?;
    }
    if units > 1
        && matches!(
            w,
            Which::Filemap | Which::Swap | Which::Random | Which::Scan
        )
    {
        // Before files and stores are filled (seconds for a large region),
        // not at the first map after them: the least any run of this
        // workload holds at once (random's file is 4x the budget; launch's
        // region is its trace's, not --pages).
        let region = if w == Which::Random {
            budget * 4
        } else {
            pages as u64
        };
        // (Scan raises its budget to hold its file: the pool must hold
        // that, not what --budget says; found by review.)
        let budget = match w {
            Which::Scan if budget > 0 => {
                budget.max(uffd_pager_cli::workload::scan::budget_holding(pages))
            }
            _ => budget,
        };
        let needed = uffd_pager::HugePagePool::needed_for(region / units as u64, budget);
        uffd_pager::HugePagePool::require(needed)
            .map_err(|e| CliError::Runtime(format!("{}: {e}", w.name())))?;
    }
    let k = Knobs {
        threads: a.threads.first().copied().unwrap_or(threads),
        writers: a.writers.first().copied().unwrap_or(writers),
        writer_pause: Duration::from_micros(a.writer_pause_us.unwrap_or(w.writer_model().0)),
        writer_burst: Duration::from_micros(a.writer_burst_us.unwrap_or(w.writer_model().1)),
        noise: a.noise,
        duration: Duration::from_secs_f64(duration),
        seed: a.seed,
        policy: a.policies(w)[0],
        delivery: a.delivery,
        install: a.kind,
        budget_pages: budget,
        latency: a.latency(),
        max_inflight: a.max_inflight(),
        pages,
        readahead_pages: a.readahead.unwrap_or(32),
        fault_around_pages: a.fault_around.unwrap_or(64),
        kswapd: !a.no_kswapd,
        write_pct: a.write_pct,
        store: a.store.clone(),
        page_size: a.page_size,
        kernel_maps: a.kernel_maps,
        floor: !a.no_floor,
    };
    let (knob, values) = if a.writers.len() > 1 {
        ("writers", a.writers.clone())
    } else if a.threads.len() > 1 {
        ("threads", a.threads.clone())
    } else if w == Which::Swap {
        ("writers", vec![k.writers])
    } else {
        ("threads", vec![k.threads])
    };
    Ok((knob, values, k))
}

/// Refuses what the workload would ignore or could not honour: a flag of
/// another workload, a list with an entry twice, a flag that contradicts
/// another, a value too large to run.
fn applies_here(w: Which, a: &WorkloadArgs) -> Result<(), CliError> {
    use Which::*;
    let only = |flag: &str, given: bool, to: &[Which]| {
        if given && !to.contains(&w) {
            let names: Vec<&str> = to.iter().map(|w| w.name()).collect();
            return Err(CliError::Usage(format!(
                "{flag} applies to {} only, not {}",
                names.join(", "),
                w.name()
            )));
        }
        Ok(())
    };
    // `random` sizes its file from the budget; `launch` from its trace;
    // `populate-churn` maps one page at a time.
    only("--pages", a.pages.is_some(), &[Filemap, Swap, Scan])?;
    // `scan` has one scanner; `launch` one app.
    only(
        "--threads",
        !a.threads.is_empty(),
        &[Filemap, Swap, Churn, Random],
    )?;
    only(
        "--writers",
        !a.writers.is_empty(),
        &[Filemap, Swap, Random, Scan, Launch],
    )?;
    only("--noise", a.noise > 0, &[Filemap, Swap])?;
    // (Only filemap, swap and launch read a simulated store; the others
    // read files, so the latency was accepted and had no effect.)
    only(
        "--latency or --max-inflight",
        shapes_the_simulated_store(a),
        &[Filemap, Swap, Launch],
    )?;
    let writes = [Filemap, Swap, Random, Scan, Launch];
    only("--writer-pause-us", a.writer_pause_us.is_some(), &writes)?;
    only("--writer-burst-us", a.writer_burst_us.is_some(), &writes)?;
    only("--kind", a.kind.is_some(), &[Filemap, Random, Scan, Launch])?;
    // (It ran, and its "warm" passes each read the whole file again from
    // the store: found by review.)
    if w == Scan && a.kind == Some(InstallKind::Anonymous) {
        return Err(CliError::Usage(
            "scan measures warm passes, which need the shared kind: an anonymous region's \
             pages go with MADV_DONTNEED, so every pass would read the store again"
                .into(),
        ));
    }
    only("--drain", !a.drain.is_empty(), &[Churn])?;
    only("--shards", !a.shards.is_empty(), &[Churn])?;
    // populate-churn holds a page per thread and runs with a budget that
    // never evicts (`workload::churn`): a budget given was raised to it.
    only(
        "--budget",
        a.budget.is_some(),
        &[Filemap, Swap, Random, Scan, Launch],
    )?;
    // Engine settings the run would never use (found by review: taken
    // and ignored). `random` advises random access, whose faults request
    // no readahead; a populate-churn region is one page, with none past
    // it to read ahead or map around, and runs no kswapd.
    only(
        "--readahead",
        a.readahead.is_some(),
        &[Filemap, Swap, Scan, Launch],
    )?;
    only(
        "--no-kswapd",
        a.no_kswapd,
        &[Filemap, Swap, Random, Scan, Launch],
    )?;
    if a.no_kswapd && a.budget == Some(0) {
        return Err(CliError::Usage(
            "--no-kswapd: with --budget 0 (none) there is no kswapd to turn off".into(),
        ));
    }
    // Fault-around maps a read fault's cached neighbours in a shared
    // region of 4 KiB pages that the engine maps itself.
    let anonymous = matches!(w, Swap | Churn)
        || a.kind == Some(InstallKind::Anonymous)
        || (w == Random && a.kind.is_none() && a.write_pct == 0);
    if a.fault_around.is_some()
        && (anonymous || a.kernel_maps || a.page_size != uffd_pager::PAGE_SIZE)
    {
        return Err(CliError::Usage(
            "--fault-around applies to read faults of shared regions of 4 KiB pages the engine              maps: not to swap or populate-churn, an anonymous kind (read-only random's default),              --kernel-maps or --page-size 2M"
                .into(),
        ));
    }
    only("--trace", a.trace.is_some(), &[Launch])?;
    only("--launches", a.launches.is_some(), &[Launch])?;
    only("--think-scale", a.think_scale.is_some(), &[Launch])?;
    only("--heap-every", a.heap_every.is_some(), &[Launch])?;
    // A launch replays its whole trace: it runs --launches launches.
    only(
        "--duration",
        a.duration.is_some(),
        &[Filemap, Swap, Churn, Random, Scan],
    )?;
    if w == Churn && a.policy.len() > 1 {
        return Err(CliError::Usage(
            "populate-churn compares drain policies and shard counts (--drain, --shards), \
             under one --policy"
                .into(),
        ));
    }
    if a.store.is_some() && shapes_the_simulated_store(a) {
        return Err(CliError::Usage(
            "--latency and --max-inflight shape the simulated store; with --store the latency \
             is the network's"
                .into(),
        ));
    }
    if a.baseline.is_none() && a.baseline_dir.is_some() {
        return Err(CliError::Usage(
            "--baseline-dir applies to --baseline kernel only".into(),
        ));
    }
    // Writer knobs shape writers: with none running they did nothing.
    let writers = if a.writers.is_empty() {
        vec![w.defaults().1]
    } else {
        a.writers.clone()
    };
    if writers.iter().all(|&n| n == 0)
        && (a.writer_pause_us.is_some() || a.writer_burst_us.is_some())
    {
        return Err(CliError::Usage(format!(
            "--writer-pause-us and --writer-burst-us shape the writers: {} runs none \
             (add --writers N)",
            w.name()
        )));
    }
    if a.baseline.is_some() && (a.json || a.csv || a.plot.is_some()) {
        return Err(CliError::Usage(
            "--baseline kernel prints its own table: no --json, --csv or --plot".into(),
        ));
    }
    use super::twice;
    twice("--policy", &a.policy)?;
    twice("--threads", &a.threads)?;
    twice("--writers", &a.writers)?;
    twice("--drain", &a.drain)?;
    twice("--shards", &a.shards)?;
    let max = uffd_pager::limits::MAX_THREADS;
    let most = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
    if most(&a.threads) > max || most(&a.writers) > max || a.noise > max {
        return Err(CliError::Usage(format!(
            "--threads, --writers and --noise are at most {max}"
        )));
    }
    if most(&a.shards) > uffd_pager::limits::MAX_LRU_SHARDS {
        return Err(CliError::Usage(format!(
            "--shards is at most {}",
            uffd_pager::limits::MAX_LRU_SHARDS
        )));
    }
    if a.latency().max_ns() > 1_000_000_000 {
        return Err(CliError::Usage(format!(
            "--latency {}: a simulated I/O is at most 1 s (an exponential model draws up to \
             37x its mean)",
            a.latency()
        )));
    }
    let max_fault_around = uffd_pager::PagerBuilder::MAX_FAULT_AROUND;
    if let Some(n) = a.fault_around.filter(|&n| n > max_fault_around) {
        return Err(CliError::Usage(format!(
            "--fault-around {n} is more than {max_fault_around} pages"
        )));
    }
    if a.think_scale.is_some_and(|t| t > 10_000) {
        return Err(CliError::Usage("--think-scale is at most 10000".into()));
    }
    if let Some(p) = &a.plot {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return Err(CliError::Usage(format!(
                "--plot {}: no such directory",
                p.display()
            )));
        }
        if !p.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
            return Err(CliError::Usage(format!(
                "--plot {}: the plot is SVG, so its name ends in .svg",
                p.display()
            )));
        }
        super::output_file("--plot", p)?;
    }
    Ok(())
}

/// Whether `--latency` or `--max-inflight` is given (with its default
/// value too), which only the simulated store uses.
fn shapes_the_simulated_store(a: &WorkloadArgs) -> bool {
    a.latency.is_some() || a.max_inflight.is_some()
}

/// Refuses what `--baseline kernel` would ignore: both sides run the
/// workload's accesses alone, on files of a disk file system.
pub(super) fn baseline_applies(a: &WorkloadArgs) -> Result<(), CliError> {
    let given = [
        ("--store", a.store.is_some()),
        ("--writers", a.writers.iter().any(|&w| w > 0)),
        ("--noise", a.noise > 0),
        ("--latency or --max-inflight", shapes_the_simulated_store(a)),
        ("--writer-pause-us", a.writer_pause_us.is_some()),
        ("--writer-burst-us", a.writer_burst_us.is_some()),
        ("--no-floor", a.no_floor),
    ];
    let ignored: Vec<&str> = given.iter().filter(|g| g.1).map(|g| g.0).collect();
    if ignored.is_empty() {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "--baseline kernel runs the workload's accesses alone on files of --baseline-dir \
         (no simulated or Redis store, writers, noise or raw floor): {} does not apply",
        ignored.join(", ")
    )))
}
