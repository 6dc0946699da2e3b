//! What every workload shares: the knobs, the result, the global-lock
//! writer threads and small helpers.

use crate::far::{Far, StoreUrl};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{LatencyModel, LatencyReport, SimulatedStore, Store};
use uffd_pager::{Delivery, InstallKind, Pager, PagerBuilder, Policy, Stats};

/// Knobs every workload takes.
#[derive(Debug, Clone)]
pub struct Knobs {
    /// Worker (faulting) threads.
    pub threads: usize,
    /// Extra global-lock writer threads (map/unmap of unrelated regions).
    pub writers: usize,
    /// Pause between a writer's map/unmap loops (0: none). On a machine
    /// with few CPUs, writers that never pause starve the workers of CPU,
    /// which measures the scheduler rather than the lock.
    pub writer_pause: Duration,
    /// How long a writer maps and unmaps back to back before each pause
    /// (zero: one map/unmap per pause). An app's writers come in bursts
    /// (a library loading, a heap growing), during which a fault that
    /// falls back to the global lock waits.
    pub writer_burst: Duration,
    /// Scheduler-noise threads (seed 000's noise variant, see
    /// [`super::noise`]); filemap and swap start them.
    pub noise: usize,
    /// How long to run.
    pub duration: Duration,
    /// RNG seed.
    pub seed: u64,
    /// Fault-handling policy.
    pub policy: Policy,
    /// Fault delivery.
    pub delivery: Delivery,
    /// Install kind of the workload's regions (`--kind`); `None` lets the
    /// engine choose ([`uffd_pager::MapOptions::install_kind`]).
    pub install: Option<InstallKind>,
    /// Memory budget in pages.
    pub budget_pages: u64,
    /// Simulated store latency.
    pub latency: LatencyModel,
    /// Simulated I/Os in flight at most (0: unbounded).
    pub max_inflight: u32,
    /// Region size in pages (per worker, or shared, as the workload says).
    pub pages: usize,
    /// Largest readahead window in pages (0: off).
    pub readahead_pages: u32,
    /// Fault-around base cluster in pages (0: off); a sequential reader's grows to 8x.
    pub fault_around_pages: usize,
    /// Run the background reclaimer (kswapd); without it, faulting threads
    /// reclaim for themselves (direct reclaim).
    pub kswapd: bool,
    /// `random`: accesses in a hundred that also write (the word read, back
    /// unchanged: the page turns dirty, its contents stay the pattern).
    pub write_pct: u32,
    /// Far memory: the workload's store lives in Redis at this URL instead
    /// of the simulated store (`latency` and `max_inflight` then do not
    /// apply: the latency is the network's), and anonymous regions swap to
    /// it.
    pub store: Option<StoreUrl>,
    /// Page size of the workload's regions ([`uffd_pager::MapOptions::page_size`]);
    /// `pages` and `budget_pages` still count 4 KiB pages (multiples of
    /// 512 with 2 MiB pages).
    pub page_size: usize,
    /// The kernel maps what read-only shared regions cache
    /// ([`uffd_pager::MapOptions::kernel_maps`]).
    pub kernel_maps: bool,
    /// `random`: run its raw floor beside the engine, in alternated slices
    /// (where the floor does the same work). The floor's file and resident
    /// pages are held beside the engine's all through the run: the run
    /// takes twice the memory of the engine's side alone.
    pub floor: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            threads: 4,
            writers: 0,
            writer_pause: Duration::ZERO,
            writer_burst: Duration::ZERO,
            noise: 0,
            duration: Duration::from_secs(2),
            seed: 1,
            policy: Policy::default(),
            delivery: Delivery::InThread,
            install: None,
            budget_pages: 1024,
            latency: LatencyModel::Fixed { ns: 50_000 },
            max_inflight: 0,
            pages: 256,
            readahead_pages: 32,
            fault_around_pages: 64,
            kswapd: true,
            write_pct: 0,
            store: None,
            page_size: uffd_pager::PAGE_SIZE,
            kernel_maps: false,
            floor: true,
        }
    }
}

impl Knobs {
    /// `opts` with the knobs' page size, and kernel-mapped if the knobs
    /// say so and `opts` is a read-only shared region.
    pub fn sized(&self, opts: uffd_pager::MapOptions) -> uffd_pager::MapOptions {
        let opts = uffd_pager::MapOptions {
            page_size: self.page_size,
            kernel_maps: self.kernel_maps,
            ..opts
        };
        uffd_pager::MapOptions {
            kernel_maps: self.kernel_maps
                && opts.install_kind() == InstallKind::Shared
                && !opts.writable,
            ..opts
        }
    }

    /// A pager configured from the knobs.
    pub fn pager(&self) -> uffd_pager::Result<Pager> {
        self.builder().build()
    }

    /// The run's namespace in Redis, if the knobs name a store.
    pub fn far(&self, what: &str) -> uffd_pager::Result<Option<Arc<Far>>> {
        self.store
            .as_ref()
            .map(|u| Far::open(u, what).map(Arc::new))
            .transpose()
    }

    /// A pager configured from the knobs whose anonymous regions swap to
    /// `far` if there is one.
    pub fn pager_far(&self, far: Option<&Arc<Far>>) -> uffd_pager::Result<Pager> {
        match far {
            // SAFETY: `swap_maker` gives each region a store of its own under a
            // namespace of this run's, which nothing but the pager writes.
            Some(f) => unsafe { self.builder().swap_to(f.swap_maker()) }.build(),
            None => self.pager(),
        }
    }

    /// A builder configured from the knobs.
    pub fn builder(&self) -> PagerBuilder {
        Pager::builder()
            .policy(self.policy)
            .delivery(self.delivery)
            .budget_pages(self.budget_pages)
            .readahead(self.readahead_pages, 2)
            .fault_around(self.fault_around_pages)
            .kswapd(self.kswapd)
            // The seeds' rounds read their file each time (their figures
            // rest on major faults); `bench filemap --baseline kernel`
            // keeps the page cache, as the kernel side does.
            .keep_unmapped(0)
    }
}

/// One run of one workload under one policy.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Workload name.
    pub workload: &'static str,
    /// The policy (or variant) label.
    pub label: String,
    /// Operations completed (rounds, page reads, populate ops…).
    pub ops: u64,
    /// What one operation is.
    pub unit: &'static str,
    /// Wall time.
    pub elapsed: Duration,
    /// Process CPU time (user + system) during the run.
    pub cpu: Duration,
    /// Counters over the run.
    pub stats: Stats,
    /// Delivered store latency, for simulated stores.
    pub latency: Option<LatencyReport>,
    /// Workload-specific figures.
    pub extra: Vec<(&'static str, f64)>,
    /// The install kind the workload's regions got (the engine chooses it
    /// when `--kind` is not given), where it maps regions of one kind.
    pub install: Option<InstallKind>,
}

impl RunResult {
    /// Operations per second.
    pub fn throughput(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Operations per CPU-second (stress-ng's "bogo ops/s (usr+sys)").
    pub fn ops_per_cpu_second(&self) -> f64 {
        self.ops as f64 / self.cpu.as_secs_f64().max(1e-9)
    }

    /// A workload-specific figure.
    pub fn extra(&self, k: &str) -> Option<f64> {
        self.extra.iter().find(|e| e.0 == k).map(|e| e.1)
    }
}

/// Process CPU time (user + system) so far.
pub fn cpu_time() -> Duration {
    // SAFETY: a zeroed rusage is valid and getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Global-lock writers: each loops mapping and unmapping a one-page
/// anonymous region (two write acquisitions per loop) until stopped.
pub struct Writers {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
    /// Map/unmap loops done.
    pub loops: Arc<AtomicU64>,
}

impl Writers {
    /// Starts `k.writers` writers on `pager` (`k.writer_burst` of map/unmap
    /// loops, then `k.writer_pause`, in turn); they stop by themselves at
    /// `deadline` (so that workers they hold up can always finish).
    pub fn start(pager: &Arc<Pager>, k: &Knobs, deadline: Instant) -> uffd_pager::Result<Writers> {
        let (pause, burst) = (k.writer_pause, k.writer_burst);
        let mut w = Writers {
            stop: Arc::new(AtomicBool::new(false)),
            handles: Vec::with_capacity(k.writers),
            loops: Arc::new(AtomicU64::new(0)),
        };
        for _ in 0..k.writers {
            let (p, stop, loops) = (pager.clone(), w.stop.clone(), w.loops.clone());
            let started = spawn(move || {
                while !stop.load(Relaxed) && Instant::now() < deadline {
                    let until = Instant::now() + burst;
                    loop {
                        if let Ok(r) = p.map_anonymous(uffd_pager::PAGE_SIZE) {
                            drop(r);
                        }
                        loops.fetch_add(1, Relaxed);
                        if stop.load(Relaxed) || Instant::now() >= until {
                            break;
                        }
                    }
                    if !pause.is_zero() {
                        // Woken early by `stop` (a launch must not wait
                        // out a writer's pause to end).
                        std::thread::park_timeout(pause);
                    }
                }
            });
            match started {
                Ok(h) => w.handles.push(h),
                Err(e) => {
                    w.stop();
                    return Err(e);
                }
            }
        }
        Ok(w)
    }

    /// Stops and joins them.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.loops.load(Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Relaxed);
        for h in &self.handles {
            h.thread().unpark();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Writers left behind by an error stop too.
impl Drop for Writers {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A small, fast, seedable RNG (splitmix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// The byte every page-pattern store holds at `offset`: never zero (a
/// page filled with zeros is told apart), and no two pages alike, nor two
/// 8-byte words of one page (a page served with another's bytes, or
/// shifted within itself, is told apart). Each page's words are its index
/// times an odd constant (distinct for every index), each word's own
/// multiple mixed in; a zero byte becomes 0x5a. (Before, the bytes
/// depended on the page index's low byte only, with its low bit dropped:
/// 128 page contents in all, page 0 alike with page 223, and a wrong page
/// passed the workloads' checks in one case of 32 with `random`'s file.)
#[inline]
pub fn pattern(offset: usize) -> u8 {
    (pattern_aligned_word(offset & !7) >> ((offset & 7) * 8)) as u8
}

/// The little-endian `u64` of [`pattern`] bytes at `offset & !7`: one
/// hash for the eight bytes (the scans check a word per page in their
/// timed loops), its zero bytes made 0x5a without a branch.
#[inline]
pub fn pattern_aligned_word(offset: usize) -> u64 {
    let page = (offset >> 12) as u64;
    let word = ((offset & 0xfff) >> 3) as u64;
    let h = (page.wrapping_add(1)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ word.wrapping_mul(0xd6e8_feb8_6659_fd93);
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // 0x80 in each byte of `h` that is zero, 0 elsewhere.
    let zero = !(((h & LOW7).wrapping_add(LOW7)) | h | LOW7);
    h | ((zero >> 7) * 0x5a)
}

/// Fills `buf` with the [`pattern`] bytes from offset `at` on: a word at a
/// time (a byte at a time set up a multi-GiB file seconds slower).
pub fn fill_pattern(buf: &mut [u8], at: usize) {
    let mut i = 0;
    while i < buf.len() {
        let off = at + i;
        if off.is_multiple_of(8) && i + 8 <= buf.len() {
            buf[i..i + 8].copy_from_slice(&pattern_aligned_word(off).to_le_bytes());
            i += 8;
        } else {
            buf[i] = pattern(off);
            i += 1;
        }
    }
}

/// A memory store of `pages` pages filled with [`pattern`].
pub fn pattern_store(pages: usize) -> uffd_pager::Result<uffd_pager::store::MemoryStore> {
    let s = uffd_pager::store::MemoryStore::new((pages * uffd_pager::PAGE_SIZE) as u64)?;
    let mut buf = vec![0u8; uffd_pager::PAGE_SIZE];
    for p in 0..pages {
        fill_pattern(&mut buf, p * uffd_pager::PAGE_SIZE);
        uffd_pager::store::Store::write(&s, (p * uffd_pager::PAGE_SIZE) as u64, &buf)?;
    }
    Ok(s)
}

/// `n` stores of `pages` pages of [`pattern`] for the workload `name`:
/// simulated stores (the knobs' latency, seeds `seed + i`) over one memory
/// store, or, with `far`, one Redis store filled once and shared.
pub fn pattern_stores(
    k: &Knobs,
    far: Option<&Far>,
    name: &str,
    pages: usize,
    n: usize,
) -> uffd_pager::Result<Vec<Arc<dyn Store>>> {
    Ok(match far {
        Some(f) => {
            let s: Arc<dyn Store> = Arc::new(f.filled(name, pages, pattern)?);
            vec![s; n]
        }
        None => {
            let base = Arc::new(pattern_store(pages)?);
            (0..n)
                .map(|i| {
                    Arc::new(SimulatedStore::new(
                        base.clone(),
                        k.latency,
                        k.max_inflight,
                        k.seed.wrapping_add(i as u64),
                    )) as Arc<dyn Store>
                })
                .collect()
        }
    })
}

/// Bytes in MiB, for extras.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Why a thread could not be started (the process's thread limit, or no
/// memory for its stack), as the workloads' error.
fn not_started(e: std::io::Error) -> uffd_pager::Error {
    uffd_pager::Error::Io {
        context: "starting a workload thread".into(),
        source: e,
    }
}

/// Starts a thread: an error, not a panic, where none can be started.
pub fn spawn<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> uffd_pager::Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new().spawn(f).map_err(not_started)
}

/// Starts a scoped thread: an error, not a panic, where none can be
/// started. (A panic there would leave the scope waiting for the threads
/// already started, which may run until told to stop.)
pub fn spawn_scoped<'s, 'e, T: Send + 's>(
    s: &'s std::thread::Scope<'s, 'e>,
    f: impl FnOnce() -> T + Send + 's,
) -> uffd_pager::Result<std::thread::ScopedJoinHandle<'s, T>> {
    std::thread::Builder::new()
        .spawn_scoped(s, f)
        .map_err(not_started)
}

/// Joins every thread that started and sums what they did; the first
/// error (a thread that could not start, or one that failed) is returned
/// once all have been joined.
pub fn join_sum(
    hs: Vec<uffd_pager::Result<std::thread::ScopedJoinHandle<'_, uffd_pager::Result<u64>>>>,
) -> uffd_pager::Result<u64> {
    let mut sum = Ok(0u64);
    for h in hs {
        let r = h.and_then(|h| h.join().expect("workload thread panicked"));
        sum = match (sum, r) {
            (Ok(a), Ok(b)) => Ok(a + b),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        };
    }
    sum
}

/// Runs `f(i)` on `threads` scoped threads (`i` = 0..threads) and sums
/// what they return (operations done).
pub fn sum_over_threads(
    threads: usize,
    f: impl Fn(usize) -> u64 + Sync,
) -> uffd_pager::Result<u64> {
    std::thread::scope(|s| {
        let f = &f;
        let hs = (0..threads)
            .map(|i| spawn_scoped(s, move || Ok(f(i))))
            .collect();
        join_sum(hs)
    })
}

/// Runs `f` until `deadline`, counting its calls.
pub fn until(deadline: Instant, mut f: impl FnMut()) -> u64 {
    let mut n = 0;
    while Instant::now() < deadline {
        f();
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::pattern;
    const PAGE: usize = uffd_pager::PAGE_SIZE;

    fn page(p: usize) -> Vec<u8> {
        (0..PAGE).map(|i| pattern(p * PAGE + i)).collect()
    }

    /// No two pages of a 64 Ki-page file alike (the old pattern had 128
    /// contents: page 0 was page 223's), no page shifted within itself
    /// alike, no zero byte.
    #[test]
    fn pattern_tells_pages_and_places_apart() {
        let mut seen = std::collections::HashSet::new();
        for p in 0..65536 {
            let first: Vec<u8> = (0..16).map(|i| pattern(p * PAGE + i)).collect();
            assert!(
                seen.insert(first),
                "page {p}'s first words repeat an earlier page's"
            );
        }
        for p in [0, 1, 223, 256, 4095] {
            let d = page(p);
            assert!(d.iter().all(|&b| b != 0), "page {p} has a zero byte");
            for shift in [8, 256, 2048] {
                assert_ne!(d[..PAGE - shift], d[shift..], "page {p} shifted by {shift}");
            }
            assert_ne!(d, page(p + 1));
        }
        // The branchless word against the rule byte by byte: the hash's
        // bytes, a zero one replaced by 0x5a.
        let mut zeros = 0;
        for off in (0..64 * PAGE).step_by(8) {
            let (page, word) = ((off >> 12) as u64, ((off & 0xfff) >> 3) as u64);
            let h = (page + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ word.wrapping_mul(0xd6e8_feb8_6659_fd93);
            let want = h.to_le_bytes().map(|b| if b == 0 { 0x5a } else { b });
            zeros += h.to_le_bytes().iter().filter(|&&b| b == 0).count();
            assert_eq!(
                super::pattern_aligned_word(off).to_le_bytes(),
                want,
                "word at {off}"
            );
        }
        assert!(zeros > 0, "no zero byte met: the stand-in went untested");
        // Filled a word at a time, from any start: the bytes.
        for at in [0, 3, 4093] {
            let mut buf = vec![0u8; 3 * PAGE + 5];
            super::fill_pattern(&mut buf, at);
            let want: Vec<u8> = (0..buf.len()).map(|i| pattern(at + i)).collect();
            assert_eq!(buf, want, "filled from {at}");
        }
    }
}
