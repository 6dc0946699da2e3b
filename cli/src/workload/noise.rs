//! Scheduler noise, as the seed reproducer's noise variant makes it
//! (lianux-mm/ioretry_test's `ioretry_noise.c`, as issue 14 describes it;
//! written here from that description): one noise thread per CPU in turn,
//! pinned there at nice −10 with a 10 µs EEVDF slice (`sched_setattr`
//! runtime 10000 ns), spinning briefly and sleeping 50 µs in a loop. A
//! faulting thread on that CPU is then preempted often, among other places
//! between the end of its I/O and re-taking the lock, the window in which
//! reclaim takes its page (seed 000's Miss/Drop).
//!
//! Raising priority needs root (`CAP_SYS_NICE`); without it the threads
//! still run at the default priority and slice, and [`Noise::prioritised`]
//! says how many got both.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a noise thread spins before each sleep.
const SPIN: Duration = Duration::from_micros(5);
/// How long it sleeps.
const SLEEP: Duration = Duration::from_micros(50);
/// The EEVDF slice asked for (the seed's).
const SLICE_NS: u64 = 10_000;

/// `struct sched_attr` (include/uapi/linux/sched/types.h), version 1.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// The CPUs this process may run on (its affinity mask), in order; all of
/// `available_parallelism` if the mask cannot be read.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, which
    // sched_getaffinity fills (0: this thread, whose mask the process's
    // threads start with); CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let v: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect();
            if !v.is_empty() {
                return v;
            }
        }
    }
    (0..std::thread::available_parallelism().map_or(1, |c| c.get())).collect()
}

/// Pins the calling thread to `cpu` (one the process may run on) and asks
/// for nice −10 with a 10 µs slice; true if the kernel granted the
/// priority and slice.
fn place(cpu: usize) -> bool {
    // A 50 µs sleep overshoots by the default 50 µs timer slack; the
    // noise is in its rhythm.
    // SAFETY: PR_SET_TIMERSLACK takes a plain value.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes in
    // it; sched_setaffinity reads it (0: this thread).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        nice: -10,
        runtime: SLICE_NS,
        ..SchedAttr::default()
    };
    // SAFETY: sched_setattr reads `attr.size` bytes of a struct that has
    // that size; pid 0 is the calling thread.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) == 0 }
}

/// Noise threads, running until stopped or their deadline.
pub struct Noise {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
    prioritised: Arc<AtomicUsize>,
    /// Spin-and-sleep loops done, all threads.
    pub loops: Arc<AtomicU64>,
}

impl Noise {
    /// Starts `n` noise threads, the i-th pinned to the `i % CPUs`-th CPU
    /// the process may run on. (It was CPU `i % CPUs` by number: under
    /// `taskset -c 1` the pin to CPU 0 failed, unseen, and the thread ran
    /// wherever the scheduler put it; found by a read-only review.)
    pub fn start(n: usize, deadline: Instant) -> uffd_pager::Result<Noise> {
        let cpus = allowed_cpus();
        let mut noise = Noise {
            stop: Arc::new(AtomicBool::new(false)),
            handles: Vec::with_capacity(n),
            prioritised: Arc::new(AtomicUsize::new(0)),
            loops: Arc::new(AtomicU64::new(0)),
        };
        for i in 0..n {
            let (stop, loops, prio) = (
                noise.stop.clone(),
                noise.loops.clone(),
                noise.prioritised.clone(),
            );
            let cpu = cpus[i % cpus.len()];
            let started = super::common::spawn(move || {
                if place(cpu) {
                    prio.fetch_add(1, Relaxed);
                }
                while !stop.load(Relaxed) && Instant::now() < deadline {
                    let t = Instant::now();
                    while t.elapsed() < SPIN {
                        std::hint::spin_loop();
                    }
                    std::thread::sleep(SLEEP);
                    loops.fetch_add(1, Relaxed);
                }
            });
            match started {
                Ok(h) => noise.handles.push(h),
                Err(e) => {
                    noise.stop();
                    return Err(e);
                }
            }
        }
        Ok(noise)
    }

    /// How many threads got nice −10 and the 10 µs slice.
    pub fn prioritised(&self) -> usize {
        self.prioritised.load(Relaxed)
    }

    /// Stops and joins them; returns (loops, threads prioritised).
    pub fn stop(mut self) -> (u64, usize) {
        self.halt();
        (self.loops.load(Relaxed), self.prioritised())
    }

    fn halt(&mut self) {
        self.stop.store(true, Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Noise left behind by an error stops too.
impl Drop for Noise {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn noise_threads_run_and_stop() {
        let n = super::Noise::start(
            2,
            std::time::Instant::now() + std::time::Duration::from_secs(5),
        )
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (loops, prio) = n.stop();
        assert!(loops > 0);
        // As root the kernel grants nice -10 and the slice (6.6+).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(prio, 2);
        }
    }

    /// This thread's CPU affinity.
    fn affinity() -> Vec<usize> {
        super::allowed_cpus()
    }

    /// Under a narrower affinity (`taskset -c N`), the noise threads are
    /// pinned inside it: the first was pinned to CPU 0 by number, outside.
    #[test]
    fn noise_threads_stay_inside_the_process_affinity() {
        let all = affinity();
        let last = *all.last().unwrap();
        std::thread::spawn(move || {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET
            // writes in it; sched_setaffinity reads it (0: this thread).
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(last, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                    0
                );
            }
            assert_eq!(affinity(), vec![last]);
            // A noise thread reports the CPUs it was left on.
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let s = seen.clone();
            let cpu = super::allowed_cpus()[0];
            std::thread::spawn(move || {
                super::place(cpu);
                *s.lock().unwrap() = affinity();
            })
            .join()
            .unwrap();
            assert_eq!(*seen.lock().unwrap(), vec![last]);
        })
        .join()
        .unwrap();
    }
}
