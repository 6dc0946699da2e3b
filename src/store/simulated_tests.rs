//! Unit tests of `simulated.rs`.

use super::*;
use crate::store::{MemoryStore, ZeroStore};
use crate::sys::PAGE_SIZE;

fn zero(pages: u64) -> Arc<dyn Store> {
    Arc::new(ZeroStore::new(pages * PAGE_SIZE as u64))
}

#[test]
fn model_means_and_samples() {
    assert_eq!(LatencyModel::None.mean_ns(), 0);
    assert_eq!(LatencyModel::Fixed { ns: 7 }.mean_ns(), 7);
    let u = LatencyModel::Uniform {
        min_ns: 10,
        max_ns: 21,
    };
    assert_eq!(u.mean_ns(), 15);
    let big = LatencyModel::Uniform {
        min_ns: u64::MAX,
        max_ns: u64::MAX,
    };
    assert_eq!(big.mean_ns(), u64::MAX);
    assert_eq!(u.sample(0), 10);
    assert_eq!(u.sample(u64::MAX), 21);
    let swapped = LatencyModel::Uniform {
        min_ns: 21,
        max_ns: 10,
    };
    assert_eq!(swapped.sample(0), 10);
    assert_eq!(swapped.sample(u64::MAX), 21);
    let e = LatencyModel::Exponential { mean_ns: 1_000 };
    assert_eq!(e.mean_ns(), 1_000);
    // Sample means over many draws land near the configured mean.
    let s = SimulatedStore::new(zero(1), e, 0, 42);
    let n = 100_000u64;
    let mut sum_e = 0u64;
    let mut sum_u = 0u64;
    for _ in 0..n {
        let r = s.next_random();
        sum_e += e.sample(r);
        let x = u.sample(r);
        assert!((10..=21).contains(&x));
        sum_u += x;
    }
    let mean_e = sum_e as f64 / n as f64;
    let mean_u = sum_u as f64 / n as f64;
    assert!((900.0..1100.0).contains(&mean_e), "exp mean {mean_e}");
    assert!((15.0..16.0).contains(&mean_u), "uniform mean {mean_u}");
}

#[test]
fn seeded_sequences_repeat() {
    let a = SimulatedStore::new(zero(1), LatencyModel::None, 0, 7);
    let b = SimulatedStore::new(zero(1), LatencyModel::None, 0, 7);
    let c = SimulatedStore::new(zero(1), LatencyModel::None, 0, 8);
    let va: Vec<u64> = (0..8).map(|_| a.next_random()).collect();
    let vb: Vec<u64> = (0..8).map(|_| b.next_random()).collect();
    let vc: Vec<u64> = (0..8).map(|_| c.next_random()).collect();
    assert_eq!(va, vb);
    assert_ne!(va, vc);
}

#[test]
fn fixed_latency_is_delivered() {
    let s = SimulatedStore::new(zero(4), LatencyModel::Fixed { ns: 200_000 }, 0, 1);
    let mut buf = vec![1u8; PAGE_SIZE];
    for i in 0..20 {
        s.read((i % 4) * PAGE_SIZE as u64, &mut buf).unwrap();
    }
    assert!(buf.iter().all(|&b| b == 0));
    let rep = s.latency_report().unwrap();
    assert_eq!(rep.model, LatencyModel::Fixed { ns: 200_000 });
    assert_eq!(rep.configured_mean_ns, 200_000);
    assert_eq!(rep.delivered.count, 20);
    assert!(rep.delivered.mean_ns >= 200_000.0, "{rep:?}");
    assert!(rep.delivered.mean_ns < 50_000_000.0, "{rep:?}");
    assert!(s.histogram().min_ns() >= 200_000);
    assert_eq!(s.reads(), 20);
    assert_eq!(s.name(), "simulated");
}

#[test]
fn short_delays_spin() {
    let s = SimulatedStore::new(zero(1), LatencyModel::Fixed { ns: 5_000 }, 0, 1);
    let mut buf = vec![0u8; PAGE_SIZE];
    for _ in 0..50 {
        s.read(0, &mut buf).unwrap();
    }
    assert!(s.histogram().min_ns() >= 5_000);
    assert!(s.histogram().mean_ns() < 50_000_000.0);
}

#[test]
fn bounded_concurrency_queues() {
    // One slot, 4 threads × 5 reads of 1 ms: at least 20 ms overall, and
    // some reads must have waited for the slot.
    let s = Arc::new(SimulatedStore::new(
        zero(4),
        LatencyModel::Fixed { ns: 1_000_000 },
        1,
        3,
    ));
    let t0 = std::time::Instant::now();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; PAGE_SIZE];
                for _ in 0..5 {
                    s.read(t * PAGE_SIZE as u64, &mut buf).unwrap();
                    assert!(s.inflight() <= 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(t0.elapsed() >= std::time::Duration::from_millis(20));
    assert_eq!(s.inflight(), 0);
    assert_eq!(s.max_inflight(), 1);
    let rep = s.latency_report().unwrap();
    assert_eq!(rep.delivered.count, 20);
    assert!(rep.delivered.max_ns >= 2_000_000, "{rep:?}");
}

#[test]
fn unbounded_concurrency_overlaps() {
    let s = Arc::new(SimulatedStore::new(
        zero(4),
        LatencyModel::Fixed { ns: 20_000_000 },
        0,
        3,
    ));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; PAGE_SIZE];
                s.read(0, &mut buf).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.inflight(), 0);
    assert_eq!(s.reads(), 4);
}

#[test]
fn injected_failures() {
    let mem = Arc::new(MemoryStore::from_bytes(&[9u8; PAGE_SIZE]).unwrap());
    let s = SimulatedStore::new(mem, LatencyModel::None, 0, 0);
    let mut buf = vec![0u8; PAGE_SIZE];
    s.fail_next_reads(2);
    assert_eq!(s.read(0, &mut buf), Err(StoreError(libc::EIO)));
    assert_eq!(s.read(0, &mut buf), Err(StoreError(libc::EIO)));
    assert_eq!(s.reads(), 0);
    s.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 9));
    assert_eq!(s.reads(), 1);
    assert_eq!(s.histogram().count(), 3);
}

#[test]
fn writes_pass_through() {
    let mem = Arc::new(MemoryStore::new(2 * PAGE_SIZE as u64).unwrap());
    let s = SimulatedStore::new(mem.clone(), LatencyModel::Fixed { ns: 100_000 }, 2, 0)
        .with_write_latency(true);
    assert!(s.writable());
    assert_eq!(s.len(), 2 * PAGE_SIZE as u64);
    let page = vec![0x42u8; PAGE_SIZE];
    let t0 = now_ns();
    s.write(PAGE_SIZE as u64, &page).unwrap();
    assert!(now_ns() - t0 >= 100_000);
    assert_eq!(s.writes(), 1);
    assert_eq!(&mem.snapshot()[PAGE_SIZE..], &page[..]);
    s.sync().unwrap();
    // Writes are not in the read report.
    assert_eq!(s.latency_report().unwrap().delivered.count, 0);

    let ro = SimulatedStore::new(zero(1), LatencyModel::None, 0, 0);
    assert!(!ro.writable());
    assert_eq!(ro.write(0, &page), Err(StoreError(libc::EROFS)));
}

/// A store whose reads panic.
struct Panics;

impl Store for Panics {
    fn len(&self) -> u64 {
        PAGE_SIZE as u64
    }
    fn read(&self, _: u64, _: &mut [u8]) -> Result<(), StoreError> {
        panic!("a store that panics");
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
        Err(StoreError(libc::EROFS))
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "panics"
    }
}

/// An inner store's panic gives its slot back: the engine catches the
/// panic and goes on with the store, and before, once `max_inflight`
/// reads had panicked, every later one waited for a slot for ever.
#[test]
fn a_panic_gives_the_slot_back() {
    let s = SimulatedStore::new(Arc::new(Panics), LatencyModel::None, 1, 0);
    for _ in 0..2 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.read(0, &mut [0u8; PAGE_SIZE])
        }));
        assert!(r.is_err());
        assert_eq!(s.inflight(), 0, "the slot is given back");
    }
}

/// `memory_bytes` was the trait's 0: an in-memory swap store behind a
/// simulated one read as taking no memory in `Pager::memory_use`.
#[test]
fn memory_held_is_the_wrapped_stores() {
    let mem = Arc::new(MemoryStore::new(4 * PAGE_SIZE as u64).unwrap());
    let s = SimulatedStore::new(mem.clone(), LatencyModel::None, 0, 1);
    s.write(PAGE_SIZE as u64, &[3; PAGE_SIZE]).unwrap();
    assert_eq!(s.memory_bytes(), PAGE_SIZE as u64);
    assert_eq!(s.memory_bytes(), mem.memory_bytes());
}
