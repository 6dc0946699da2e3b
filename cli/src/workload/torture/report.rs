//! What a torture run reports: its mismatches, each with the phase it was
//! seen in, and the totals.

use super::model::WORDS_PER_PAGE;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;
use std::time::Duration;
use uffd_pager::Stats;

/// When a mismatch was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A checked read while the threads ran.
    Run,
    /// The final read-back through the region.
    Region,
    /// The final comparison of the file's contents.
    File,
}

/// One word that did not hold what the model allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// When it was seen.
    pub phase: Phase,
    /// Word index in the region.
    pub word: usize,
    /// The value read.
    pub got: u64,
    /// The lowest sequence number acceptable.
    pub want_min_seq: u64,
    /// The highest sequence number acceptable.
    pub want_max_seq: u64,
    /// The sequence number `got` decodes to (`None`: wrong tag, garbage).
    pub got_seq: Option<u64>,
    /// The reading thread (`None` for the final checks).
    pub thread: Option<usize>,
}

impl Mismatch {
    /// The page the word is on.
    pub fn page(&self) -> usize {
        self.word / WORDS_PER_PAGE
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}: word {} (page {}) got {:#018x} (seq {:?}), want seq {}..={}",
            self.phase,
            self.word,
            self.page(),
            self.got,
            self.got_seq,
            self.want_min_seq,
            self.want_max_seq
        )?;
        if let Some(t) = self.thread {
            write!(f, " [thread {t}]")?;
        }
        Ok(())
    }
}

/// What a torture run did and found.
#[derive(Debug, Clone)]
pub struct TortureReport {
    /// Operations done by the application threads.
    pub ops: u64,
    /// Of which reads (each checked).
    pub reads: u64,
    /// Of which writes.
    pub writes: u64,
    /// Words that did not match the model, all phases together.
    pub mismatches: u64,
    /// The first few mismatches.
    pub first_mismatches: Vec<Mismatch>,
    /// Words compared by the final checks (region and file).
    pub words_verified: u64,
    /// Flushes issued by the background thread.
    pub background_flushes: u64,
    /// Pages freed by the background thread's `reclaim_pages` calls.
    pub background_reclaimed: u64,
    /// The side-region churn's operations (0 without churn).
    pub churn_ops: u64,
    /// Bytes of the churn's side regions that did not hold what was
    /// written (each counted once; not in [`mismatches`](Self::mismatches),
    /// which counts the tortured region's words).
    pub churn_mismatches: u64,
    /// The first of them.
    pub churn_first: Option<String>,
    /// Wall time of the concurrent phase.
    pub elapsed: Duration,
    /// The pager's statistics after the final checks (for file-backed
    /// regions, after the unmap's write-back).
    pub stats: Stats,
}

impl TortureReport {
    /// Whether every check passed.
    pub fn is_clean(&self) -> bool {
        self.mismatches == 0 && self.churn_mismatches == 0
    }
}

impl fmt::Display for TortureReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use uffd_pager::Counter::*;
        let s = &self.stats;
        write!(
            f,
            "ops {} (reads {}, writes {}) in {:?}; mismatches {}; verified {} words; \
             pgsteal {} writeback {} pgmajfault {} direct_reclaim {} kswapd_wake {}; \
             peak resident {} / budget {}; background flushes {} reclaimed {}",
            self.ops,
            self.reads,
            self.writes,
            self.elapsed,
            self.mismatches,
            self.words_verified,
            s.get(PGSTEAL),
            s.get(WRITEBACK),
            s.get(PGMAJFAULT),
            s.get(DIRECT_RECLAIM),
            s.get(KSWAPD_WAKE),
            s.peak_resident_pages,
            s.budget_pages,
            self.background_flushes,
            self.background_reclaimed
        )?;
        for m in &self.first_mismatches {
            write!(f, "\n  {m}")?;
        }
        if self.churn_mismatches > 0 {
            write!(f, "\n  churn: {} bytes wrong", self.churn_mismatches)?;
        }
        if let Some(m) = &self.churn_first {
            write!(f, "; first: {m}")?;
        }
        Ok(())
    }
}

/// Shared state of a run: the first mismatches and the count.
pub(super) struct Findings {
    pub(super) count: AtomicU64,
    pub(super) first: Mutex<Vec<Mismatch>>,
}

impl Findings {
    pub(super) fn record(&self, m: Mismatch) {
        self.count.fetch_add(1, Relaxed);
        let mut v = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() < KEEP_MISMATCHES {
            v.push(m);
        }
    }
}

/// Mismatches kept in [`TortureReport::first_mismatches`].
const KEEP_MISMATCHES: usize = 16;
