//! The kernel baseline's access loops, one per workload, each written once
//! and run on either side's mapping ([`Mapper`]): the engine's region or
//! the kernel's own `mmap` of the same file.

use crate::workload::common::{pattern, sum_over_threads, Knobs};
use crate::workload::pattern_file::RandomWords;
use crate::workload::scan::scan_pass;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{FileStore, FileStoreOptions};
use uffd_pager::{AtomicHistogram, MapOptions, Pager, Region, PAGE_SIZE};

/// The workloads the baseline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// `random`: one file 4 × the budget, one checked word per random page,
    /// every read timed.
    Random,
    /// `scan`: one file that fits the limit, read once untimed (warm), then
    /// passes of one checked word per page in order, each after the
    /// page-table entries were dropped (`MADV_DONTNEED` on either side).
    Scan,
    /// `filemap`: one file per thread; rounds of map → read one checked
    /// byte per page → unmap, every read timed.
    Filemap,
}

impl Workload {
    /// Its name in the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Random => "random",
            Workload::Scan => "scan",
            Workload::Filemap => "filemap",
        }
    }

    /// What one operation is, for the table's rate column.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Random => "reads",
            Workload::Scan => "pages",
            Workload::Filemap => "rounds",
        }
    }
}

/// One file mapped by one side.
pub trait Mapped {
    /// The mapping's first byte.
    fn base(&self) -> usize;
    /// Drops the mapping's page-table entries; its pages stay cached.
    fn drop_ptes(&mut self) -> Result<(), String>;
}

/// How a side maps file `i` of the run (`pages` pages, read-only).
pub trait Mapper: Sync {
    /// One mapping.
    type M: Mapped;
    /// Maps file `i`.
    fn map(&self, i: usize) -> Result<Self::M, String>;
    /// What the side holds, for the report (the engine's `memory_use`):
    /// read while the run's mapping is still there.
    fn footprint(&self) -> String {
        String::new()
    }
}

/// The engine's side: one pager, one `O_DIRECT` file store per file, so
/// that the file is cached once (by the engine, in the cgroup), not twice.
pub struct EngineMapper {
    /// The run's pager.
    pub pager: Pager,
    stores: Vec<Arc<FileStore>>,
    opts: MapOptions,
    pages: usize,
}

/// The engine side's map options for `w`: `random`'s (read-only unless
/// `--write-pct`, advised random access), or read-only ones for `scan` and
/// `filemap`; the install kind is `--kind` or the engine's choice.
pub fn engine_map_options(w: Workload, k: &Knobs) -> MapOptions {
    use crate::workload::pattern_file::{random_map_options, read_map_options};
    k.sized(match w {
        Workload::Random => random_map_options(k.install, k.write_pct),
        Workload::Scan | Workload::Filemap => read_map_options(k.install),
    })
}

impl EngineMapper {
    /// A pager from `k` (its budget raised to `budget_pages`, anonymous
    /// regions swapping to files in `swap_dir`, whose page cache the cgroup
    /// can reclaim) and stores over `files` of `pages` pages each.
    pub fn new(
        w: Workload,
        k: &Knobs,
        budget_pages: u64,
        files: &[std::fs::File],
        pages: usize,
        swap_dir: &Path,
    ) -> Result<EngineMapper, String> {
        let stores = files
            .iter()
            .map(|f| {
                FileStore::open(
                    Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())),
                    &FileStoreOptions {
                        direct: true,
                        writable: k.write_pct > 0,
                        ..FileStoreOptions::default()
                    },
                )
                .map(Arc::new)
                .map_err(|e| format!("opening the file with O_DIRECT: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let pager = k
            .builder()
            .budget_pages(budget_pages)
            .swap_dir(swap_dir)
            // The kernel keeps a file's page cache across its mappings:
            // so does the engine here (one kept object per file).
            .keep_unmapped(k.threads.max(16))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(EngineMapper {
            pager,
            stores,
            opts: engine_map_options(w, k),
            pages,
        })
    }
}

impl Mapped for Region {
    fn base(&self) -> usize {
        self.as_ptr() as usize
    }
    fn drop_ptes(&mut self) -> Result<(), String> {
        let len = self.len();
        self.dontneed(0, len).map_err(|e| e.to_string())
    }
}

impl Mapper for EngineMapper {
    type M = Region;
    fn footprint(&self) -> String {
        self.pager.memory_use().to_string()
    }
    fn map(&self, i: usize) -> Result<Region, String> {
        // SAFETY: the workload's stores and files are its own, and it changes them only through
        // its regions (the store contract).
        unsafe {
            self.pager
                .map_store(self.stores[i].clone(), self.pages * PAGE_SIZE, &self.opts)
        }
        .map_err(|e| e.to_string())
    }
}

/// The kernel's side: `mmap(MAP_SHARED)` of the file, read-only unless
/// asked, with `MADV_RANDOM` if asked.
pub struct KernelMapper {
    /// The files' descriptors.
    pub fds: Vec<RawFd>,
    /// Pages per file.
    pub pages: usize,
    /// `madvise(MADV_RANDOM)` each mapping.
    pub random: bool,
    /// Map `PROT_READ | PROT_WRITE`.
    pub writable: bool,
}

/// A kernel mapping; unmapped on drop.
pub struct KernelMap {
    base: usize,
    len: usize,
}

impl Mapped for KernelMap {
    fn base(&self) -> usize {
        self.base
    }
    fn drop_ptes(&mut self) -> Result<(), String> {
        // SAFETY: our own mapping, read only through raw pointers; its pages
        // come back from the file.
        match unsafe { libc::madvise(self.base as *mut _, self.len, libc::MADV_DONTNEED) } {
            0 => Ok(()),
            _ => Err(format!("madvise: {}", std::io::Error::last_os_error())),
        }
    }
}

impl Drop for KernelMap {
    fn drop(&mut self) {
        // SAFETY: our mapping; nothing refers into it once it is dropped.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

impl Mapper for KernelMapper {
    type M = KernelMap;
    fn map(&self, i: usize) -> Result<KernelMap, String> {
        let len = self.pages * PAGE_SIZE;
        // SAFETY: a fresh shared read-only mapping of our file; the kernel
        // picks the address, so nothing else is replaced.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                if self.writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                },
                libc::MAP_SHARED,
                self.fds[i],
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        if self.random {
            // SAFETY: advice on our own mapping.
            unsafe { libc::madvise(base, len, libc::MADV_RANDOM) };
        }
        Ok(KernelMap {
            base: base as usize,
            len,
        })
    }
}

/// What one side's access loop did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Operations ([`Workload::unit`]), all threads.
    pub ops: u64,
    /// Wall time of the timed part.
    pub elapsed: Duration,
    /// Words or bytes that differed from the file.
    pub mismatches: u64,
    /// Every timed access (empty for `scan`: timing a 100 ns access would
    /// double it).
    pub latency: AtomicHistogram,
    /// [`Mapper::footprint`] at the end of the timed part: before `random`
    /// and `scan` unmap their file (it was read after, and showed the
    /// engine holding no page; found by review), after `filemap`'s last
    /// round: what the engine keeps across rounds (the shared kind's
    /// cached objects; nothing for the anonymous kind, which keeps none).
    pub footprint: String,
}

/// Runs workload `w` on `mapper` for `k.duration` with `k.threads` threads
/// (one for `scan`) over files of `pages` pages.
pub fn run<M: Mapper>(w: Workload, mapper: &M, pages: usize, k: &Knobs) -> Result<Outcome, String> {
    let out = Outcome::default();
    let held;
    let mismatches = AtomicU64::new(0);
    let threads = k.threads.max(1);
    let t0 = Instant::now();
    let deadline = t0 + k.duration;
    let (ops, elapsed) = match w {
        Workload::Random => {
            let m = mapper.map(0)?;
            let words = RandomWords::of(k, pages, deadline);
            // SAFETY: `m` maps `pages` pages of the pattern file (writable
            // when writes are asked for) and outlives the call.
            let n = unsafe { words.run(m.base(), &mismatches, Some(&out.latency)) }
                .map_err(|e| e.to_string())?;
            let elapsed = t0.elapsed();
            held = mapper.footprint();
            (n, elapsed)
        }
        Workload::Scan => {
            let mut m = mapper.map(0)?;
            // SAFETY (each pass): `m` maps the pattern file's `pages` pages
            // for the whole loop.
            let mut bad = unsafe { scan_pass(m.base(), pages) };
            let (mut n, mut timed) = (0u64, Duration::ZERO);
            while n == 0 || Instant::now() < deadline {
                m.drop_ptes()?;
                let t = Instant::now();
                bad += unsafe { scan_pass(m.base(), pages) };
                timed += t.elapsed();
                n += pages as u64;
            }
            mismatches.fetch_add(bad, Relaxed);
            held = mapper.footprint();
            (n, timed)
        }
        Workload::Filemap => {
            let failed = std::sync::Mutex::new(None);
            let n = sum_over_threads(threads, |t| {
                let lat = AtomicHistogram::new();
                let mut rounds = 0;
                while Instant::now() < deadline {
                    let m = match mapper.map(t) {
                        Ok(m) => m,
                        Err(e) => {
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            break;
                        }
                    };
                    for p in 0..pages {
                        let off = p * PAGE_SIZE + (p * 7) % PAGE_SIZE;
                        let a = Instant::now();
                        // SAFETY: `off` is inside the mapping, which lives
                        // to the end of the round.
                        let v = unsafe { std::ptr::read_volatile((m.base() + off) as *const u8) };
                        lat.record(a.elapsed().as_nanos() as u64);
                        if v != pattern(off) {
                            mismatches.fetch_add(1, Relaxed);
                        }
                    }
                    rounds += 1;
                }
                out.latency.absorb(&lat);
                rounds
            })
            .map_err(|e| e.to_string())?;
            if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
                return Err(e);
            }
            let elapsed = t0.elapsed();
            held = mapper.footprint();
            (n, elapsed)
        }
    };
    Ok(Outcome {
        ops,
        elapsed,
        mismatches: mismatches.into_inner(),
        footprint: held,
        ..out
    })
}
