//! The `random` workload's file and readers, shared with its kernel floor
//! ([`crate::bench::random_floor`]): a file of [`pattern`] pages, how it is
//! mapped, and threads reading one checked word per random page.

use super::common::{pattern, sum_over_threads, Knobs, Rng};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::Instant;
use uffd_pager::store::FileStore;
use uffd_pager::{Access, AtomicHistogram, Error, InstallKind, MapOptions, Result, PAGE_SIZE};

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
    if offset.is_multiple_of(8) {
        super::common::pattern_aligned_word(offset)
    } else {
        u64::from_le_bytes(std::array::from_fn(|i| pattern(offset + i)))
    }
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
        Self::create_beside(dir, tag, pages, |_| Ok(()))
    }

    /// [`PatternFile::create`], calling `beside(range)` before each run of
    /// pages it writes (256 at a time) with that run's page range, so that
    /// a caller can have other pages allocated in step with the file's:
    /// where the kernel takes a page from decides how fast it is read
    /// (pages allocated at different times differed by up to a sixth in a
    /// scan here), so two sides compared should get theirs at the same time.
    pub fn create_beside(
        dir: &Path,
        tag: &str,
        pages: usize,
        mut beside: impl FnMut(std::ops::Range<usize>) -> Result<()>,
    ) -> Result<PatternFile> {
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
            beside(p..p + n)?;
            super::common::fill_pattern(&mut buf[..n * PAGE_SIZE], p * PAGE_SIZE);
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
        self.store_rw(false)
    }

    /// A [`FileStore`] over the file, writable if asked.
    pub fn store_rw(&self, writable: bool) -> Result<FileStore> {
        let io = |e| Error::Io {
            context: "opening a store over a pattern file".into(),
            source: e,
        };
        FileStore::from_file(self.file.try_clone().map_err(io)?, writable).map_err(io)
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
pub fn read_map_options(kind: Option<InstallKind>) -> MapOptions {
    MapOptions {
        kind,
        writable: false,
        ..MapOptions::default()
    }
}

/// Map options for `random`: read-only unless `write_pct > 0`, and
/// advised [`Access::Random`] (so with `kind` `None` a read-only run gets
/// the anonymous kind, as any application that gives that advice would).
pub fn random_map_options(kind: Option<InstallKind>, write_pct: u32) -> MapOptions {
    MapOptions {
        writable: write_pct > 0,
        access: Access::Random,
        ..read_map_options(kind)
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

/// The access loop of `random`, shared with its raw floor and the kernel
/// baseline: `threads` threads each access one `u64` at a uniformly random
/// page of a `pages`-page mapping holding [`pattern`] until `deadline`.
/// Every access reads the word and checks it; `write_pct` in a hundred
/// also write it back unchanged, which dirties the page (so reclaim must
/// write it back) while the contents stay the pattern.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RandomWords {
    pub pages: usize,
    pub threads: usize,
    pub seed: u64,
    pub deadline: Instant,
    pub write_pct: u32,
}

impl RandomWords {
    /// The loop `k` asks for (its threads, seed and writes) over `pages`
    /// pages until `deadline`.
    pub(crate) fn of(k: &Knobs, pages: usize, deadline: Instant) -> RandomWords {
        RandomWords {
            pages,
            threads: k.threads.max(1),
            seed: k.seed,
            deadline,
            write_pct: k.write_pct,
        }
    }

    /// Runs the loop on the mapping at `base`, counting words that differ
    /// from the pattern in `mismatches`. With `latency`, each access is
    /// timed (two `clock_gettime` calls through the vDSO, tens of ns) into a
    /// histogram of its thread's, merged into `latency` at the end. Returns
    /// the accesses done (an error if a thread could not be started).
    ///
    /// # Safety
    /// `base` must map `pages` readable pages for the whole call, writable
    /// too if `write_pct > 0`.
    pub(crate) unsafe fn run(
        &self,
        base: usize,
        mismatches: &AtomicU64,
        latency: Option<&AtomicHistogram>,
    ) -> uffd_pager::Result<u64> {
        let pages = self.pages;
        sum_over_threads(self.threads, |i| {
            let mut rng = Rng::new(self.seed.wrapping_add(i as u64));
            let mine = latency.map(|_| Box::new(AtomicHistogram::new()));
            let mut n = 0u64;
            while !n.is_multiple_of(64) || Instant::now() < self.deadline {
                let r = rng.next_u64();
                let p = (((r >> 9) as u128 * pages as u128) >> 55) as usize;
                let off = p * PAGE_SIZE + 8 * (r as usize % (PAGE_SIZE / 8));
                // Bits the page index hardly depends on (it takes the
                // product's top bits of `r >> 9`).
                let write = ((r >> 9) & 0xffff) % 100 < self.write_pct as u64;
                let addr = (base + off) as *mut u64;
                let t0 = mine.as_ref().map(|_| Instant::now());
                // SAFETY: `off + 8 <= pages * PAGE_SIZE`, inside the
                // caller's mapping; `off` is 8-aligned and the mapping
                // page-aligned; it is writable when `write_pct > 0`.
                let v = unsafe { std::ptr::read_volatile(addr) };
                // A write stores back the word it read: the page turns
                // dirty, but its bytes do not change, so `mismatches`
                // checks what reads see, not write-back (a lost write-back
                // would leave the same bytes). The tortures check that.
                if write {
                    // SAFETY: as above.
                    unsafe { std::ptr::write_volatile(addr, v) };
                }
                if let (Some(h), Some(t0)) = (&mine, t0) {
                    h.record(t0.elapsed().as_nanos() as u64);
                }
                if v != pattern_word(off) {
                    mismatches.fetch_add(1, Relaxed);
                }
                n += 1;
            }
            if let (Some(total), Some(h)) = (latency, &mine) {
                total.absorb(h);
            }
            n
        })
    }
}
