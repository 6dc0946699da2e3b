//! `random` (the shape of UMap's `pfbenchmark-read`): one region backed by a
//! real file four times the memory budget, `k.threads` threads each reading
//! one `u64` word per uniformly random page until `k.duration` is up. With
//! the file 4× the budget, about three reads in four miss and reclaim runs
//! all the time. The file holds [`pattern`] and every word read is checked
//! against it. Throughput is page reads/s.
//!
//! The file is created (and unlinked at once) in [`default_dir`] — tmpfs
//! `/dev/shm` when it exists, so the store's `pread`s measure the pager
//! rather than a disk — or in a directory the caller names ([`run_in`]).
//! It is mapped read-only through a read-only [`FileStore`] with
//! `k.install` as install kind (see [`read_map_options`]).

use super::common::{cpu_time, pattern, sum_over_threads, Knobs, Rng, RunResult, Writers};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Instant;
use uffd_pager::store::FileStore;
use uffd_pager::{Error, InstallKind, MapOptions, Result, PAGE_SIZE};

/// Where the workloads create their files by default: `/dev/shm` (tmpfs)
/// if it is a directory, else [`std::env::temp_dir`].
pub fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The little-endian `u64` a [`pattern`] file holds at byte `offset`.
#[inline]
pub fn pattern_word(offset: usize) -> u64 {
    u64::from_le_bytes(std::array::from_fn(|i| pattern(offset + i)))
}

/// A file of whole pages filled with [`pattern`]. It is unlinked as soon
/// as it is created, so nothing is left behind even if the process dies;
/// it lives as long as its descriptors (this one and the stores').
#[derive(Debug)]
pub struct PatternFile {
    file: File,
    pages: usize,
}

impl PatternFile {
    /// Creates a file of `pages` pages in `dir` (under a fresh name made of
    /// `tag`, the process id and a counter, then unlinked).
    pub fn create(dir: &Path, tag: &str, pages: usize) -> Result<PatternFile> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "uffd-pager-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Relaxed)
        );
        let path = dir.join(name);
        let context = format!("creating {}", path.display());
        let io = |e| Error::Io {
            context: context.clone(),
            source: e,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io)?;
        std::fs::remove_file(&path).map_err(io)?;
        let chunk_pages = 256;
        let mut buf = vec![0u8; chunk_pages * PAGE_SIZE];
        let mut p = 0;
        while p < pages {
            let n = chunk_pages.min(pages - p);
            let base = p * PAGE_SIZE;
            for (i, b) in buf[..n * PAGE_SIZE].iter_mut().enumerate() {
                *b = pattern(base + i);
            }
            (&file).write_all(&buf[..n * PAGE_SIZE]).map_err(io)?;
            p += n;
        }
        Ok(PatternFile { file, pages })
    }

    /// The open file (read-write).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A read-only [`FileStore`] over the file, for a region mapped with
    /// [`read_map_options`] (of either install kind).
    pub fn store(&self) -> Result<FileStore> {
        let io = |e| Error::Io {
            context: "opening a store over a pattern file".into(),
            source: e,
        };
        FileStore::from_file(self.file.try_clone().map_err(io)?, false).map_err(io)
    }

    /// Length in pages.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.pages * PAGE_SIZE
    }

    /// Whether the file has no pages.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }
}

/// Map options for a region the workloads only read, of install `kind`:
/// read-only, so reclaim can drop its pages without writing them anywhere
/// (shared pages are never dirty; anonymous ones are `CLEAN`).
pub fn read_map_options(kind: InstallKind) -> MapOptions {
    MapOptions {
        kind,
        writable: false,
        ..MapOptions::default()
    }
}

/// The file size `random` uses, in pages: 4 × `k.budget_pages`, or
/// `k.pages` when there is no budget (0).
pub fn file_pages(k: &Knobs) -> usize {
    if k.budget_pages > 0 {
        4 * k.budget_pages as usize
    } else {
        k.pages.max(1)
    }
}

/// The reading loop of `random`, shared with its raw floor: `threads`
/// threads each read one `u64` at a uniformly random page of the
/// `pages`-page mapping at `base` (holding [`pattern`]) until `deadline`,
/// counting words that differ from the pattern in `mismatches`. Returns the
/// reads done.
///
/// # Safety
/// `base` must map `pages` readable pages for the whole call.
pub(crate) unsafe fn read_random_words(
    base: usize,
    pages: usize,
    threads: usize,
    seed: u64,
    deadline: Instant,
    mismatches: &AtomicU64,
) -> u64 {
    sum_over_threads(threads, |i| {
        let mut rng = Rng::new(seed.wrapping_add(i as u64));
        let mut n = 0u64;
        while !n.is_multiple_of(64) || Instant::now() < deadline {
            let r = rng.next_u64();
            let p = (((r >> 9) as u128 * pages as u128) >> 55) as usize;
            let off = p * PAGE_SIZE + 8 * (r as usize % (PAGE_SIZE / 8));
            // SAFETY: `off + 8 <= pages * PAGE_SIZE`, inside the caller's
            // mapping; `off` is 8-aligned and the mapping page-aligned.
            let v = unsafe { std::ptr::read_volatile((base + off) as *const u64) };
            if v != pattern_word(off) {
                mismatches.fetch_add(1, Relaxed);
            }
            n += 1;
        }
        n
    })
}

/// Runs `random` with its file in [`default_dir`].
pub fn run(k: &Knobs) -> Result<RunResult> {
    run_in(k, &default_dir())
}

/// Runs `random` with its file in `dir`.
///
/// `ops` is page reads (all threads). Extras: `us_per_page` (wall time per
/// page per thread, `elapsed × threads / ops` in µs), `us_per_page_overall`
/// (`elapsed / ops`: wall time per page of the whole run), `floor_us_per_page`
/// (the same measure for [`crate::bench::random_floor`], run right after
/// with the same threads, budget and duration; NaN without a budget),
/// `vs_floor` (their ratio), `mismatches` (words that differed from the
/// pattern, engine and floor; 0 unless one is broken),
/// `file_pages`, `writer_loops`.
pub fn run_in(k: &Knobs, dir: &Path) -> Result<RunResult> {
    let pages = file_pages(k);
    let file = PatternFile::create(dir, "random", pages)?;
    let pager = Arc::new(k.pager()?);
    let opts = read_map_options(k.install);
    let region = pager.map_store(Arc::new(file.store()?), pages * PAGE_SIZE, &opts)?;
    let base = region.as_ptr() as usize;
    let mismatches = AtomicU64::new(0);
    pager.reset_stats();
    let (t0, c0) = (Instant::now(), cpu_time());
    let deadline = t0 + k.duration;
    let writers = Writers::start(&pager, k.writers, k.writer_pause, deadline);
    let threads = k.threads.max(1);
    // SAFETY: the region maps `pages` pages of the file and outlives the call.
    let reads = unsafe { read_random_words(base, pages, threads, k.seed, deadline, &mismatches) };
    let writer_loops = writers.stop();
    let (elapsed, cpu) = (t0.elapsed(), cpu_time() - c0);
    let stats = pager.stats();
    drop(region);
    drop(file);
    drop(pager);
    let us_per_page = elapsed.as_secs_f64() * threads as f64 / reads.max(1) as f64 * 1e6;
    // The raw floor, same reads, same threads, same budget, right after.
    let floor_us = if k.budget_pages > 0 {
        let f = crate::bench::random_floor(
            dir,
            k.budget_pages as usize,
            threads,
            k.duration,
            k.seed,
            k.install,
        )?;
        if f.mismatches != 0 {
            mismatches.fetch_add(f.mismatches, Relaxed);
        }
        f.us_per_page(threads)
    } else {
        f64::NAN
    };
    Ok(RunResult {
        workload: "random",
        label: k.policy.to_string(),
        ops: reads,
        unit: "page reads",
        elapsed,
        cpu,
        stats,
        latency: None,
        extra: vec![
            ("us_per_page", us_per_page),
            ("us_per_page_overall", us_per_page / threads as f64),
            ("floor_us_per_page", floor_us),
            ("vs_floor", us_per_page / floor_us),
            ("mismatches", mismatches.load(Relaxed) as f64),
            ("file_pages", pages as f64),
            ("writer_loops", writer_loops as f64),
        ],
    })
}
