//! Reclaim torture: several threads read and write random words of one
//! region that is at least four times the memory budget, while reclaim
//! (direct, kswapd and an explicit reclaimer thread) and write-back run all
//! the time. Every read is checked against an exact in-memory model, and at
//! the end the whole region (and, for file-backed regions, the whole file)
//! is compared with the model.
//!
//! # The model
//! The region is an array of `u64` words. Word `w` holds
//! `encode(w, seq)`: a 32-bit tag derived from `w` and the seed in the high
//! half and a per-word sequence number `seq` in the low half. `seq` 0 is the
//! initial contents (the tag with a zero low half for a file, all zeros for
//! anonymous memory, whose tags are never zero so that a lost page reads as
//! a mismatch). Each write stores the next sequence number of its word. The
//! model is one `AtomicU64` per word: the last sequence number published.
//!
//! # Exactness under concurrency
//! Ownership is partitioned: page `p` is written only by thread
//! `p % threads`, so each word has a single writer and its sequence numbers
//! rise one by one. Region words are accessed with atomic loads and stores
//! on the mapped memory (ordinary loads and stores on x86-64, so faults are
//! taken exactly as by plain code).
//!
//! - A writer stores `encode(w, s+1)` into the region (Release), then
//!   `s+1` into the model (Release).
//! - The owner reading its own word needs no tolerance: the region must hold
//!   exactly `encode(w, model)`.
//! - Another thread reads the model (`m1`, Acquire), the region word (`r`,
//!   Acquire), then the model again (`m2`, Acquire), and accepts `r` only if
//!   it decodes to a sequence number `s` with `m1 <= s <= m2 + 1`. Why this
//!   is tight: `m1` was published after `encode(w, m1)` was stored, so the
//!   region read sees that value or a later one (`s >= m1`); if it saw
//!   `encode(w, k)` with `k >= m2 + 2`, it synchronised with the store of
//!   `k`, which follows the model store of `k - 1` in the writer, so `m2`
//!   would be at least `k - 1 > m2`. The `+ 1` is exactly the one write
//!   that may sit between the writer's region store and its model store.
//!
//! A lost write (an eviction that dropped a dirty page, a stale copy
//! reinstalled) shows up as a sequence number below `m1`, or for the owner
//! as any difference; data from another page shows up as a wrong tag.
//!
//! # The page's first word
//! Every write also writes the first word of its page (the next sequence
//! number of that word, as any other), and every read also checks it: a
//! whole page that comes back stale (an older copy of it reinstalled) is
//! caught at its first read after a write to it, not only when a read
//! happens on one of the words written since that copy.

use crate::far::{Far, StoreUrl};
use crate::workload::common::spawn_scoped;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uffd_pager::{
    Delivery, Error, InstallKind, MapOptions, Pager, Policy, Region, Result, PAGE_SIZE,
};

/// What backs the tortured region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TortureKind {
    /// A file at `path`, created (or truncated) and filled with the initial
    /// pattern, mapped with [`TortureConfig::install`]. At the end the file
    /// is read back and compared with the model (shared), or with the
    /// initial pattern (anonymous: a private copy never writes its file).
    /// The file is left in place; the caller removes it.
    File {
        /// Where the file goes.
        path: PathBuf,
    },
    /// Anonymous memory swapped to the default in-memory swap store.
    Anonymous,
    /// Anonymous memory swapped to an unlinked swap file in `dir`
    /// ([`uffd_pager::PagerBuilder::swap_dir`]).
    Swapfile {
        /// Directory for the swap file.
        dir: PathBuf,
    },
    /// A file-like object that lives in Redis (far memory): a namespace of
    /// its own at `url`, filled with the initial pattern, mapped with
    /// [`TortureConfig::install`]. At the end a plain client reads every
    /// page back from Redis and compares it with the model (shared), or
    /// with the initial pattern (anonymous: a private copy never writes
    /// its source); its swap goes to Redis too. The namespace is deleted.
    Far {
        /// The server or cluster.
        url: StoreUrl,
    },
    /// Anonymous memory swapped to Redis
    /// ([`uffd_pager::PagerBuilder::swap_to`]).
    FarSwap {
        /// The server or cluster.
        url: StoreUrl,
    },
}

/// One torture run's settings.
#[derive(Debug, Clone)]
pub struct TortureConfig {
    /// Application threads (at least 1, at most `pages`).
    pub threads: usize,
    /// Pages in the region; at least `4 * budget_pages`.
    pub pages: usize,
    /// The pager's memory budget in pages (at least 1: the run must evict).
    pub budget_pages: u64,
    /// Page size of the region ([`MapOptions::page_size`]); `pages` and
    /// `budget_pages` still count 4 KiB pages (multiples of 512 with
    /// 2 MiB pages).
    pub page_size: usize,
    /// Operations per application thread.
    pub ops_per_thread: u64,
    /// Percentage of operations that write (0-100).
    pub write_pct: u32,
    /// Seed for the operation streams and the data pattern.
    pub seed: u64,
    /// What backs the region.
    pub kind: TortureKind,
    /// How pages are installed, for [`TortureKind::File`] and
    /// [`TortureKind::Far`] (anonymous kinds always install anonymously).
    /// With [`InstallKind::Anonymous`] the region is a private copy of the
    /// file (or object): its writes go to the pager's swap and never reach
    /// the file, so the region is verified against the model and the file
    /// must still hold its initial pattern at the end.
    pub install: InstallKind,
    /// Fault delivery.
    pub delivery: Delivery,
    /// Fault-handling policy.
    pub policy: Policy,
    /// Run for this long instead (each thread stops at `ops_per_thread`
    /// or the deadline, whichever comes first): a soak.
    pub duration: Option<Duration>,
    /// One more thread maps, remaps, protects, drops and unmaps side
    /// regions of the same pager all along, checking their bytes
    /// ([`crate::workload::soak`]).
    pub churn: bool,
}

impl Default for TortureConfig {
    /// 2 threads, 512 pages, a budget of 64, 20 000 operations each, half
    /// of them writes, over anonymous memory, in-thread delivery.
    fn default() -> Self {
        TortureConfig {
            threads: 2,
            pages: 512,
            budget_pages: 64,
            page_size: PAGE_SIZE,
            ops_per_thread: 20_000,
            write_pct: 50,
            seed: 1,
            kind: TortureKind::Anonymous,
            install: InstallKind::Shared,
            delivery: Delivery::InThread,
            policy: Policy::default(),
            duration: None,
            churn: false,
        }
    }
}

use check::{read_word, verify_source, verify_words, word_at, write_word};
use model::{mix, Model, Rng, WORDS_PER_PAGE};
use report::Findings;
pub use report::{Mismatch, Phase, TortureReport};

mod check;
mod model;
mod report;

fn validate(cfg: &TortureConfig) -> Result<()> {
    let bad = |m: String| Err(Error::Config(m));
    if cfg.threads == 0 {
        return bad("torture needs at least one thread".into());
    }
    if cfg.budget_pages == 0 {
        return bad("torture needs a memory budget (budget_pages > 0)".into());
    }
    if (cfg.pages as u64) < cfg.budget_pages.saturating_mul(4) {
        return bad(format!(
            "torture region of {} pages is smaller than 4x the budget of {}",
            cfg.pages, cfg.budget_pages
        ));
    }
    if cfg.pages < cfg.threads {
        return bad("torture needs at least one page per thread".into());
    }
    if cfg.write_pct > 100 {
        return bad(format!("write_pct {} is over 100", cfg.write_pct));
    }
    if cfg.ops_per_thread.saturating_mul(cfg.threads as u64) >= u32::MAX as u64 {
        return bad("too many operations for 32-bit sequence numbers".into());
    }
    Ok(())
}

/// One application thread's work; returns (reads, writes).
fn worker(
    t: usize,
    cfg: &TortureConfig,
    base: usize,
    model: &Model,
    findings: &Findings,
) -> (u64, u64) {
    let threads = cfg.threads;
    let pages = cfg.pages;
    let mut rng = Rng(mix(cfg.seed) ^ mix(t as u64 + 1));
    let (mut reads, mut writes) = (0, 0);
    let deadline = cfg.duration.map(|d| Instant::now() + d);
    for n in 0..cfg.ops_per_thread {
        if n % 1024 == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let write = (rng.below(100) as u32) < cfg.write_pct;
        let mut page = rng.below(pages as u64) as usize;
        if write {
            // The page of this thread's partition nearest below.
            page = page - page % threads + t;
            if page >= pages {
                page -= threads;
            }
        }
        let w = page * WORDS_PER_PAGE + rng.below(WORDS_PER_PAGE as u64) as usize;
        if write {
            // SAFETY: `w` is inside the region, which outlives the workers.
            unsafe { write_word(t, base, w, model, findings) };
            writes += 1;
        } else {
            // SAFETY: as above.
            unsafe { read_word(t, page % threads == t, base, w, model, findings) };
            reads += 1;
        }
    }
    (reads, writes)
}

/// Runs the torture described by `cfg`. See the module docs for what is
/// checked. Returns an error only when the run could not be set up or
/// torn down (a bad configuration, a failed map, flush or unmap);
/// wrong data is reported in [`TortureReport::mismatches`].
pub fn run(cfg: &TortureConfig) -> Result<TortureReport> {
    validate(cfg)?;
    let words = cfg.pages * WORDS_PER_PAGE;
    let len = cfg.pages * PAGE_SIZE;
    let file = matches!(cfg.kind, TortureKind::File { .. } | TortureKind::Far { .. });
    let model = Model::new(words, cfg.seed, file);
    let initial = |o: usize| model.encode(o / 8, 0).to_ne_bytes()[o % 8];
    let far = match &cfg.kind {
        TortureKind::Far { url } | TortureKind::FarSwap { url } => {
            Some(Arc::new(Far::open(url, "torture")?))
        }
        _ => None,
    };

    let mut b = Pager::builder()
        .budget_pages(cfg.budget_pages)
        // (Its end checks that unmapping uncharges every page.)
        .keep_unmapped(0)
        .kswapd(true)
        .delivery(cfg.delivery)
        .policy(cfg.policy);
    if let TortureKind::Swapfile { dir } = &cfg.kind {
        b = b.swap_dir(dir.clone());
    }
    if let Some(far) = &far {
        // SAFETY: `swap_maker` gives each region a store of its own under a
        // namespace of this run's, which nothing but the pager writes.
        b = unsafe { b.swap_to(far.swap_maker()) };
    }
    let pager = b.build()?;
    let far_object = match (&far, &cfg.kind) {
        (Some(far), TortureKind::Far { .. }) => {
            Some(Arc::new(far.filled("object", cfg.pages, initial)?))
        }
        _ => None,
    };

    let region = match &cfg.kind {
        TortureKind::File { path } => {
            let mut init = Vec::with_capacity(len);
            for w in 0..words {
                init.extend_from_slice(&model.encode(w, 0).to_ne_bytes());
            }
            std::fs::write(path, &init).map_err(|e| Error::Io {
                context: format!("writing {}", path.display()),
                source: e,
            })?;
            let opts = MapOptions {
                kind: Some(cfg.install),
                page_size: cfg.page_size,
                ..MapOptions::default()
            };
            // SAFETY: the workload's stores and files are its own, and it changes them only
            // through its regions (the store contract).
            unsafe { pager.map_file(path, Some(len), &opts) }?
        }
        TortureKind::Far { .. } => {
            let opts = MapOptions {
                kind: Some(cfg.install),
                page_size: cfg.page_size,
                ..MapOptions::default()
            };
            let object = far_object.clone().expect("made above for this kind");
            // SAFETY: the workload's stores and files are its own, and it changes them only
            // through its regions (the store contract).
            unsafe { pager.map_store(object, len, &opts) }?
        }
        TortureKind::Anonymous | TortureKind::Swapfile { .. } | TortureKind::FarSwap { .. } => {
            let opts = MapOptions {
                page_size: cfg.page_size,
                ..MapOptions::default()
            };
            pager.map_anonymous_with(len, &opts)?
        }
    };
    let base = region.as_ptr() as usize;
    let findings = Findings {
        count: AtomicU64::new(0),
        first: Mutex::new(Vec::new()),
    };

    let stop = AtomicBool::new(false);
    let started = Instant::now();
    // A thread that cannot be started is an error once the others are
    // joined; the background threads stop with `stop` whatever happened (a
    // panic in the scope would wait for them for ever).
    let (reads, writes, bg, churn, not_started) = std::thread::scope(|s| {
        let bg = spawn_scoped(s, || background(&pager, &region, cfg.budget_pages, &stop));
        let churn = cfg.churn.then(|| {
            spawn_scoped(s, || {
                crate::workload::soak::churn(&pager, mix(cfg.seed), &stop)
            })
        });
        let hs: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (model, findings) = (&model, &findings);
                spawn_scoped(s, move || worker(t, cfg, base, model, findings))
            })
            .collect();
        let (mut reads, mut writes, mut not_started, mut panicked) = (0, 0, None, None);
        for h in hs {
            match h.map(|h| h.join()) {
                Ok(Ok((r, w))) => {
                    reads += r;
                    writes += w;
                }
                // Passed on once the background threads are stopped.
                Ok(Err(p)) => panicked = panicked.or(Some(p)),
                Err(e) => not_started = not_started.or(Some(e)),
            }
        }
        stop.store(true, Release);
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        let bg = bg.and_then(|h| h.join().expect("torture background thread panicked"));
        let churn = churn.map(|c| c.and_then(|c| c.join().expect("torture churn thread panicked")));
        (reads, writes, bg, churn, not_started)
    });
    let elapsed = started.elapsed();
    if let Some(e) = not_started {
        return Err(e);
    }
    let (background_flushes, background_reclaimed) = bg?;
    let churn = churn.transpose()?.unwrap_or_default();

    // Final read-back through the region (faults every page back in).
    let mut words_verified = verify_words(
        &model,
        Phase::Region,
        &findings,
        // SAFETY: every word index is inside the live region.
        (0..words).map(|w| (w, unsafe { word_at(base, w) }.load(Acquire))),
    );

    if let TortureKind::File { path } = &cfg.kind {
        if cfg.install == InstallKind::Shared {
            region.flush()?;
        }
        region.unmap()?;
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            context: format!("reading back {}", path.display()),
            source: e,
        })?;
        if bytes.len() != len {
            return Err(Error::Config(format!(
                "{} changed length: {} bytes, want {len}",
                path.display(),
                bytes.len()
            )));
        }
        words_verified += verify_source(&model, cfg.install, &findings, &bytes);
    } else if let (Some(far), Some(object)) = (&far, &far_object) {
        if cfg.install == InstallKind::Shared {
            region.flush()?;
        }
        region.unmap()?;
        let bytes = far.read_back(object)?;
        words_verified += verify_source(&model, cfg.install, &findings, &bytes);
    } else {
        region.unmap()?;
    }

    let first_mismatches = findings
        .first
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    Ok(TortureReport {
        ops: reads + writes,
        reads,
        writes,
        mismatches: findings.count.load(Relaxed),
        first_mismatches,
        words_verified,
        background_flushes,
        background_reclaimed,
        churn_ops: churn.ops,
        churn_mismatches: churn.mismatches,
        churn_first: churn.first,
        elapsed,
        stats: pager.stats(),
    })
}

/// The background thread: write-back (a no-op for anonymous regions) and
/// explicit reclaim, racing the workers and kswapd, until `stop`.
fn background(
    pager: &Pager,
    region: &Region,
    budget: u64,
    stop: &AtomicBool,
) -> Result<(u64, u64)> {
    let (mut flushes, mut reclaimed) = (0, 0);
    let batch = (budget / 8).max(1);
    while !stop.load(Acquire) {
        region.flush()?;
        flushes += 1;
        reclaimed += pager.reclaim_pages(batch);
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok((flushes, reclaimed))
}
