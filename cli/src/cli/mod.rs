//! The command line: `uffd-pager probe`, `bench <workload>`, `demo` and
//! `torture`.
//!
//! Exit codes: 0 success; 2 bad arguments (clap's own errors, and the
//! validation done here); 1 runtime errors; 130, 143, 129 or 131 stopped
//! by SIGINT, SIGTERM, SIGHUP or SIGQUIT (what the run made removed first).

/// `println!` into a `String` (which cannot fail), for [`emit`] to write
/// out in one go.
macro_rules! outln {
    ($o:expr) => {
        $o.push('\n')
    };
    ($o:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o, $($t)*);
    }};
}

mod bench;
mod demo;
mod far;
mod json;
mod metadata;
mod metadata_proc;
mod probe;
mod raw_benches;
mod report;
mod torture;
mod workload_args;
mod workload_plan;
mod workloads;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Services real page faults in userspace through userfaultfd.
#[derive(Debug, Parser)]
#[command(name = "uffd-pager", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reports what this kernel and process allow: userfaultfd features,
    /// ioctls, privileges and the delivery modes that work.
    Probe(probe::ProbeArgs),
    /// Runs a benchmark workload.
    Bench(Box<bench::BenchArgs>),
    /// Reproduces the seeds' tables (filemap, swap, populate-churn) with
    /// the seeds' figures beside ours; about a minute on 2 vCPUs.
    Demo(demo::DemoArgs),
    /// Reclaim torture: threads read and write random words of a region at
    /// least 4x the budget while reclaim and write-back run; every read and
    /// the final contents are checked against an exact model (exit 1 on a
    /// mismatch).
    Torture(Box<torture::TortureArgs>),
}

/// A failure, with the exit code it maps to.
#[derive(Debug)]
pub enum CliError {
    /// Invalid arguments that clap could not catch (exit 2).
    Usage(String),
    /// Anything that went wrong while running (exit 1).
    Runtime(String),
}

impl From<uffd_pager::Error> for CliError {
    fn from(e: uffd_pager::Error) -> Self {
        CliError::Runtime(e.to_string())
    }
}

/// `Result` for subcommands.
pub type CliResult = Result<(), CliError>;

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A second initialisation (never in this binary) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Parses the command line, runs the subcommand and maps its outcome to an
/// exit code.
pub fn main() -> ExitCode {
    // Exits with code 2 on bad arguments (0 for --help / --version).
    let cli = Cli::parse();
    // Before any thread starts: SIGINT, SIGTERM, SIGHUP and SIGQUIT go to
    // a thread that removes what the run made and exits with 128 + signal.
    uffd_pager_cli::os::interrupt::install();
    init_logging();
    let r = match cli.command {
        Command::Probe(a) => probe::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Demo(a) => demo::run(&a),
        Command::Torture(a) => torture::run(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(m)) => {
            eprintln!("uffd-pager: error: {m}");
            eprintln!("Run 'uffd-pager --help' for usage.");
            ExitCode::from(2)
        }
        Err(CliError::Runtime(m)) => {
            eprintln!("uffd-pager: error: {m}");
            ExitCode::from(1)
        }
    }
}

/// Writes `text` to standard output: a runtime error (exit 1), not a
/// panic, where it cannot be written (a full disk, a closed pipe).
fn emit(text: &str) -> CliResult {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| CliError::Runtime(format!("writing output: {e}")))
}

/// The shortest `--duration` taken, in seconds: a run shorter than a
/// millisecond may end before its first operation (and report none).
const MIN_DURATION_S: f64 = 0.001;

/// Physical memory in bytes, if the system says.
fn phys_mem() -> Option<u64> {
    // SAFETY: sysconf has no preconditions; -1 means unknown.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && size > 0).then(|| pages as u64 * size as u64)
}

/// Refuses a run that would need more memory than the machine has, or
/// than the memory cgroup it runs in allows (the smallest limit on the
/// way up): `what` (the flags that size it, as given) needs about `bytes`.
/// A usage error (exit 2) before the run, not the OOM killer during it.
fn fits_in_memory(what: &str, bytes: u64) -> Result<(), CliError> {
    let refuse = |has: String| {
        Err(CliError::Usage(format!(
            "{what} needs about {} MiB of memory; {has}",
            bytes >> 20
        )))
    };
    match (phys_mem(), uffd_pager_cli::os::cgroup::own_memory_limit()) {
        (_, Some(limit)) if bytes > limit => refuse(format!(
            "this process's memory cgroup allows {} MiB",
            limit >> 20
        )),
        (Some(mem), _) if bytes > mem => refuse(format!("this machine has {} MiB", mem >> 20)),
        _ => Ok(()),
    }
}

/// The refusal of a budget under the least the engine's budget holds, if
/// it is: `budget` pages of `units` 4 KiB pages each, at least two 2 MiB
/// pages or [`uffd_pager::limits::MIN_BUDGET_PAGES`] 4 KiB pages. 0 is
/// let through (`none`: it means none there, said in the message).
fn under_the_least_budget(budget: u64, units: u64, none: bool) -> Option<CliError> {
    let zero = if none { " (0 is none)" } else { "" };
    let least = uffd_pager::limits::MIN_BUDGET_PAGES;
    match budget.saturating_mul(units) {
        0 => None,
        b if units > 1 && b < 2 * units => Some(CliError::Usage(format!(
            "--budget {budget} is under two 2 MiB pages, the least a budget of them holds{zero}"
        ))),
        b if b < least => Some(CliError::Usage(format!(
            "--budget {budget} is under {least} pages, the least a budget holds (one access \
             may need that many resident at once){zero}"
        ))),
        _ => None,
    }
}

/// Checks before the run that `path` can take an output file (`flag`): a
/// regular file it may write, or a new one it may create (made and
/// removed again). Exit 2, not a failure after the work is done.
fn output_file(flag: &str, path: &std::path::Path) -> Result<(), CliError> {
    use std::fs::OpenOptions;
    let refuse = |why: String| CliError::Usage(format!("{flag} {}: {why}", path.display()));
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(refuse("not a regular file".into())),
        Ok(_) => OpenOptions::new()
            .append(true)
            .open(path)
            .map(drop)
            .map_err(|e| refuse(format!("cannot write it ({e})"))),
        Err(_) => {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| refuse(format!("cannot create it ({e})")))?;
            let _ = std::fs::remove_file(path);
            Ok(())
        }
    }
}

/// Refuses a list that names one value twice (it would run twice).
fn twice<T: PartialEq + std::fmt::Display>(flag: &str, v: &[T]) -> Result<(), CliError> {
    for (i, x) in v.iter().enumerate() {
        if v[..i].contains(x) {
            return Err(CliError::Usage(format!("{flag} lists {x} twice")));
        }
    }
    Ok(())
}

/// `--page-size`: `4K` (4096) or `2M` (2097152), in bytes.
fn page_size(s: &str) -> Result<usize, String> {
    match s {
        "4K" | "4k" | "4096" => Ok(uffd_pager::PAGE_SIZE),
        "2M" | "2m" | "2097152" => Ok(uffd_pager::HUGE_PAGE_SIZE),
        _ => Err(format!("{s:?}: the page size is 4K or 2M")),
    }
}

/// A count of pages of `page_size` for a flag whose default is
/// `default_4k` 4 KiB pages: the explicit count as given, or the default's
/// bytes in pages of `page_size` (at least one).
fn pages_of(explicit: Option<u64>, default_4k: u64, page_size: usize) -> u64 {
    explicit.unwrap_or_else(|| {
        (default_4k * uffd_pager::PAGE_SIZE as u64)
            .div_ceil(page_size as u64)
            .max(1)
    })
}

/// A count of at least one.
fn at_least_one(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a count: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_bench_fault_cost() {
        let cli = Cli::try_parse_from([
            "uffd-pager",
            "bench",
            "fault-cost",
            "--pages",
            "64",
            "--kind",
            "shared",
            "--delivery",
            "threads:2:spin10",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Bench(_)));
        for bad in [
            &["uffd-pager", "bench", "fault-cost", "--kind", "bogus"][..],
            &[
                "uffd-pager",
                "bench",
                "fault-cost",
                "--delivery",
                "threads:0",
            ],
            &["uffd-pager", "bench", "fault-cost", "--pages", "0"],
            &["uffd-pager", "bench", "nope"],
        ] {
            let e = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
