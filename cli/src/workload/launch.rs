//! `launch` (seed 003's cold app launch): a recorded page-access [`Trace`]
//! replayed against a cold cache, with `k.writers` background threads
//! mapping and unmapping, `launches` times.
//!
//! Each launch is one new process's worth of state: a fresh
//! [`Pager`](uffd_pager::Pager) (its own address space and global lock), its
//! writer threads, and a fresh region over the app's "binary" — a
//! [`SimulatedStore`](uffd_pager::store::SimulatedStore) (`k.latency`, `k.max_inflight`; or a Redis store with `k.store`) over
//! [`pattern`](super::common::pattern) contents, shared by all launches —
//! so every first touch of a page is a major fault.
//! The main thread maps the region and replays the trace: one `u64` read
//! per access (checked against the pattern), then a busy-wait of the
//! access's think time × [`Model::think_scale`] (an app computes between
//! faults), and every [`Model::heap_every`] accesses a fresh small
//! anonymous region touched once (the heap growing). A launch's time is
//! map + replay; its global-lock wait is the read-side wait of that launch
//! (`Stats::global.read_wait_ns`; only the replaying thread faults). The
//! writers come in bursts (`k.writer_burst`, then `k.writer_pause`); the
//! command line's defaults ([`WRITER_BURST_US`] and the rest) are
//! calibrated against seed 003.
//!
//! Traces are text, one access per line: `page [think_us]`; `#` lines are
//! comments. Record one from any code with [`TraceRecorder`] (or
//! [`Trace::from_accesses`] over the byte offsets it touches), save it with
//! [`Trace::save`], replay it with [`run`]. [`default_trace`] is the
//! synthetic trace shipped in `data/launch-trace.txt`, which equals
//! [`synthetic_trace`]`(SYNTHETIC_PAGES, SYNTHETIC_LEN, SYNTHETIC_SEED)`.

use super::common::{cpu_time, pattern_stores, Knobs, Rng, RunResult, Writers};
use super::random::{pattern_word, read_map_options};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::{Error, Result, PAGE_SIZE};

/// One access of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Page index in the region.
    pub page: usize,
    /// Time the app computes after this access, in µs.
    pub think_us: u32,
}

/// A page-access trace, in access order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// The accesses.
    pub accesses: Vec<Access>,
}

impl Trace {
    /// A trace of the pages holding `offsets` (bytes into the region), in
    /// order, without think time; consecutive accesses to the same page
    /// count once.
    pub fn from_accesses(offsets: impl IntoIterator<Item = usize>) -> Trace {
        let mut r = TraceRecorder::untimed();
        for o in offsets {
            r.touch(o);
        }
        r.finish()
    }

    /// Parses the text format (see the module docs). A trace with no
    /// access, or one past [`MAX_TRACE_PAGES`], is an error.
    pub fn parse(text: &str) -> io::Result<Trace> {
        let bad = |n: usize, what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("launch trace line {}: {what}", n + 1),
            )
        };
        let mut accesses = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut it = line.split_whitespace();
            let page = it.next().unwrap_or_default();
            let page: usize = page.parse().map_err(|_| bad(n, "bad page index"))?;
            if page >= MAX_TRACE_PAGES {
                return Err(bad(
                    n,
                    "page index past the largest region (16777216 pages)",
                ));
            }
            let think_us = match it.next() {
                Some(t) => t.parse().map_err(|_| bad(n, "bad think time"))?,
                None => 0,
            };
            if it.next().is_some() {
                return Err(bad(n, "expected `page [think_us]`"));
            }
            accesses.push(Access { page, think_us });
        }
        if accesses.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "launch trace: no accesses",
            ));
        }
        Ok(Trace { accesses })
    }

    /// The text format: a header comment, then `page` or `page think_us`
    /// per line.
    pub fn to_text(&self) -> String {
        let mut s =
            String::from("# uffd-pager launch trace: one access per line, `page [think_us]`\n");
        for a in &self.accesses {
            if a.think_us == 0 {
                s += &format!("{}\n", a.page);
            } else {
                s += &format!("{} {}\n", a.page, a.think_us);
            }
        }
        s
    }

    /// Reads a trace file: a regular file of at most [`MAX_TRACE_BYTES`].
    /// (Anything else was read whole: `/dev/zero` until the OOM killer
    /// came, a FIFO without end.)
    pub fn load(path: &Path) -> io::Result<Trace> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let refuse = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
        // O_NONBLOCK: opening a FIFO with no writer must not wait for one.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err(refuse("not a regular file".into()));
        }
        if meta.len() > MAX_TRACE_BYTES {
            return Err(refuse(format!(
                "{} bytes: a trace is at most {MAX_TRACE_BYTES}",
                meta.len()
            )));
        }
        let mut text = String::new();
        // (Bounded again: the file may grow while it is read.)
        f.take(MAX_TRACE_BYTES + 1).read_to_string(&mut text)?;
        if text.len() as u64 > MAX_TRACE_BYTES {
            return Err(refuse(format!(
                "a trace is at most {MAX_TRACE_BYTES} bytes"
            )));
        }
        Trace::parse(&text)
    }

    /// Writes a trace file.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_text())
    }

    /// Accesses.
    pub fn len(&self) -> usize {
        self.accesses.len()
    }

    /// Whether there are no accesses.
    pub fn is_empty(&self) -> bool {
        self.accesses.is_empty()
    }

    /// The region size the trace needs, in pages (highest page + 1).
    pub fn pages(&self) -> usize {
        self.accesses.iter().map(|a| a.page + 1).max().unwrap_or(0)
    }

    /// Distinct pages touched (the major faults of a cold launch with a
    /// large enough budget).
    pub fn distinct_pages(&self) -> usize {
        let mut seen = vec![false; self.pages()];
        self.accesses
            .iter()
            .filter(|a| !std::mem::replace(&mut seen[a.page], true))
            .count()
    }

    /// The longest think time of one access, in µs.
    pub fn longest_think_us(&self) -> u64 {
        self.accesses
            .iter()
            .map(|a| u64::from(a.think_us))
            .max()
            .unwrap_or(0)
    }

    /// Total think time.
    pub fn think_time(&self) -> Duration {
        Duration::from_micros(self.accesses.iter().map(|a| a.think_us as u64).sum())
    }
}

/// The largest trace file, in bytes (64 MiB: some six million accesses).
pub const MAX_TRACE_BYTES: u64 = 64 << 20;

/// The largest region a trace may address, in pages (64 GiB).
pub const MAX_TRACE_PAGES: usize = 1 << 24;

/// Records a trace from any code: call [`touch`](TraceRecorder::touch)
/// with the byte offset (into the region) of each access. A timed recorder
/// stores the time since the previous access as that access's think time.
#[derive(Debug, Clone)]
pub struct TraceRecorder {
    trace: Trace,
    last: Option<Instant>,
    timed: bool,
}

impl TraceRecorder {
    /// A recorder that measures think time.
    pub fn new() -> TraceRecorder {
        TraceRecorder {
            trace: Trace::default(),
            last: None,
            timed: true,
        }
    }

    /// A recorder that records no think time.
    pub fn untimed() -> TraceRecorder {
        TraceRecorder {
            timed: false,
            ..TraceRecorder::new()
        }
    }

    /// Records an access at byte `offset`. An access to the same page as
    /// the previous one is merged into it (its think time grows).
    pub fn touch(&mut self, offset: usize) {
        let page = offset / PAGE_SIZE;
        let now = self.timed.then(Instant::now);
        let think = match (now, self.last) {
            (Some(n), Some(l)) => n.duration_since(l).as_micros().min(u32::MAX as u128) as u32,
            _ => 0,
        };
        if let Some(prev) = self.trace.accesses.last_mut() {
            prev.think_us = prev.think_us.saturating_add(think);
        }
        if self.trace.accesses.last().map(|a| a.page) != Some(page) {
            self.trace.accesses.push(Access { page, think_us: 0 });
        }
        self.last = now;
    }

    /// The trace so far.
    pub fn finish(self) -> Trace {
        self.trace
    }
}

impl Default for TraceRecorder {
    fn default() -> Self {
        TraceRecorder::new()
    }
}

/// Footprint of the shipped synthetic trace, in pages.
pub const SYNTHETIC_PAGES: usize = 4096;
/// Accesses in the shipped synthetic trace.
pub const SYNTHETIC_LEN: usize = 3000;
/// Seed of the shipped synthetic trace.
pub const SYNTHETIC_SEED: u64 = 3;

/// A deterministic launch-like trace of `len` accesses over `pages` pages:
/// the first 1/16 of the pages read in order (exec and startup code), then
/// sequential runs (60 %), jumps to random pages (25 %, libraries and
/// data) and revisits of the 64 most recent pages (15 %); one access in 16
/// thinks for 10–200 µs. No access repeats the previous one's page.
pub fn synthetic_trace(pages: usize, len: usize, seed: u64) -> Trace {
    let pages = pages.max(2);
    let mut rng = Rng::new(seed);
    let mut accesses: Vec<Access> = Vec::with_capacity(len);
    let mut recent: Vec<usize> = Vec::with_capacity(64);
    let mut cur = 0usize;
    while accesses.len() < len {
        let next = if accesses.is_empty() {
            0
        } else if accesses.len() < pages / 16 {
            cur + 1
        } else {
            match rng.below(100) {
                0..60 => (cur + 1) % pages,
                60..85 => rng.below(pages as u64) as usize,
                _ => recent[rng.below(recent.len() as u64) as usize],
            }
        };
        if !accesses.is_empty() && next == cur {
            continue;
        }
        let think_us = if rng.below(16) == 0 {
            10 + rng.below(191) as u32
        } else {
            0
        };
        accesses.push(Access {
            page: next,
            think_us,
        });
        if recent.len() == 64 {
            recent.remove(0);
        }
        recent.push(next);
        cur = next;
    }
    Trace { accesses }
}

/// The shipped synthetic trace (`data/launch-trace.txt`).
pub fn default_trace() -> Trace {
    Trace::parse(include_str!("../../../data/launch-trace.txt")).expect("shipped trace parses")
}

/// The launch model's calibration against seed 003 (a Baidu Tieba cold
/// launch on a Pixel 6: 3.6 s, of which 570 ms in 32.4 mmap_lock read
/// waits under vanilla, 470 ms in 10.9 waits with the retry): the
/// writers' default burst and pause, and the [`Model`]'s defaults. See
/// the README's "Cold launch" for what they give.
pub const WRITER_BURST_US: u64 = 30_000;
/// See [`WRITER_BURST_US`].
pub const WRITER_PAUSE_US: u64 = 550_000;
/// See [`WRITER_BURST_US`].
pub const THINK_SCALE: u32 = 150;
/// See [`WRITER_BURST_US`].
pub const HEAP_EVERY: usize = 12;

/// How a launch behaves beyond its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    /// Each access's think time is multiplied by this.
    pub think_scale: u32,
    /// Every this many accesses the app maps a small anonymous region (its
    /// heap growing) and touches it: that first fault needs the global
    /// lock (`__vmf_anon_prepare`), under either policy. 0: never.
    pub heap_every: usize,
}

impl Default for Model {
    /// The calibrated model (about 3.2 s per launch).
    fn default() -> Self {
        Model {
            think_scale: THINK_SCALE,
            heap_every: HEAP_EVERY,
        }
    }
}

impl Model {
    /// The trace as recorded, no heap growth: a launch in about 0.2 s.
    pub const FAST: Model = Model {
        think_scale: 1,
        heap_every: 0,
    };
}

/// Replays `trace` on the region at `base`; returns the words that differ
/// from the pattern.
fn replay(pager: &uffd_pager::Pager, base: usize, trace: &Trace, model: Model) -> Result<u64> {
    let mut bad = 0;
    let mut heap = Vec::new();
    for (n, a) in trace.accesses.iter().enumerate() {
        if model.heap_every > 0 && n % model.heap_every == model.heap_every - 1 {
            let mut r = pager.map_anonymous(4 * PAGE_SIZE)?;
            r.as_mut_slice()[0] = 1;
            heap.push(r);
        }
        let off = a.page * PAGE_SIZE + 8 * (a.page % (PAGE_SIZE / 8));
        // SAFETY: `a.page < trace.pages()`, the region's length in pages;
        // the caller keeps the region mapped; 8-aligned.
        let v = unsafe { std::ptr::read_volatile((base + off) as *const u64) };
        bad += (v != pattern_word(off)) as u64;
        if a.think_us > 0 {
            let think = a.think_us as u64 * model.think_scale as u64;
            let until = Instant::now() + Duration::from_micros(think);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
    }
    drop(heap);
    Ok(bad)
}

/// Runs `launches` cold launches replaying `trace` under `model` (see the
/// module docs).
/// `k.duration` and `k.threads` are not used.
///
/// `ops` is launches and `elapsed` the whole run. `stats` are the counters
/// summed over the launches (each launch has its own pager; the latency
/// percentiles and residency are the last launch's), so per-launch figures
/// divide them by `ops`. Extras:
/// `launch_ms_mean`, `launch_ms_max`, `lock_wait_us_mean`,
/// `lock_wait_us_max` (global-lock read wait per launch),
/// `lock_waits_per_launch` (contended global read acquisitions),
/// `majfault_per_launch`, `mismatches`, `writer_loops`, `trace_len`,
/// `trace_pages`.
pub fn run(k: &Knobs, trace: &Trace, launches: usize, model: Model) -> Result<RunResult> {
    if trace.is_empty() || launches == 0 {
        return Err(Error::Config(
            "launch needs a non-empty trace and at least one launch".into(),
        ));
    }
    // Whole pages of the region's size.
    let pages = trace
        .pages()
        .next_multiple_of(k.page_size / uffd_pager::PAGE_SIZE);
    let far = k.far("launch")?;
    let store = pattern_stores(k, far.as_deref(), "launch", pages, 1)?.remove(0);
    let opts = k.sized(read_map_options(k.install));
    let (mut times, mut waits, mut wait_counts) = (Vec::new(), Vec::new(), Vec::new());
    let (mut mismatches, mut writer_loops, mut majfaults) = (0u64, 0u64, 0u64);
    let mut total: Option<uffd_pager::Stats> = None;
    let (t0, c0) = (Instant::now(), cpu_time());
    for _ in 0..launches {
        let pager = Arc::new(k.pager_far(far.as_ref())?);
        // Stopped right after the launch below; the deadline is only a
        // backstop.
        let backstop = Instant::now() + Duration::from_secs(3600);
        let writers = Writers::start(&pager, k, backstop)?;
        let one = || -> Result<(Duration, u64, uffd_pager::Stats)> {
            let s0 = pager.stats();
            let t = Instant::now();
            // SAFETY: the workload's stores and files are its own, and it changes them only
            // through its regions (the store contract).
            let region = unsafe { pager.map_store(store.clone(), pages * PAGE_SIZE, &opts) }?;
            let bad = replay(&pager, region.as_ptr() as usize, trace, model)?;
            let dt = t.elapsed();
            let d = pager.stats().since(&s0);
            drop(region);
            Ok((dt, bad, d))
        };
        let res = one();
        writer_loops += writers.stop();
        let (dt, bad, d) = res?;
        times.push(dt.as_secs_f64() * 1e3);
        waits.push(d.global.read_wait_ns as f64 / 1e3);
        wait_counts.push(d.global.read_contended as f64);
        mismatches += bad;
        majfaults += d.get(uffd_pager::Counter::PGMAJFAULT);
        total = Some(total.map_or_else(|| d.clone(), |t| t.plus(&d)));
    }
    let (elapsed, cpu) = (t0.elapsed(), cpu_time() - c0);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    Ok(RunResult {
        workload: "launch",
        label: k.policy.to_string(),
        ops: launches as u64,
        unit: "launches",
        elapsed,
        cpu,
        stats: total.expect("at least one launch"),
        latency: store.latency_report(),
        extra: vec![
            ("launch_ms_mean", mean(&times)),
            ("launch_ms_max", max(&times)),
            ("lock_wait_us_mean", mean(&waits)),
            ("lock_wait_us_max", max(&waits)),
            ("lock_waits_per_launch", mean(&wait_counts)),
            ("majfault_per_launch", majfaults as f64 / launches as f64),
            ("mismatches", mismatches as f64),
            ("writer_loops", writer_loops as f64),
            ("trace_len", trace.len() as f64),
            ("trace_pages", pages as f64),
        ],
        install: Some(opts.install_kind()),
    })
}
