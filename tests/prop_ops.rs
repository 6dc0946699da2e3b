//! Property test: random sequences of address-space operations and
//! accesses, run by two threads at once on one pager under a small budget,
//! checked against a plain model of what each region must hold. proptest
//! shrinks a failing pair of sequences to a short one.
//!
//! Each thread owns its regions (so its model is exact); the two share the
//! pager, its budget, its LRU, reclaim and the global lock, so every
//! operation races the other thread's faults, evictions and writers.

#[path = "engine_util.rs"]
mod util;

use proptest::prelude::*;
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager, Region};
use util::PAGE;

/// One step of a thread's sequence. Indices and pages are taken modulo
/// what exists when the step runs.
#[derive(Debug, Clone)]
enum Op {
    Map {
        shared: bool,
        pages: usize,
        seed: u8,
    },
    Unmap(usize),
    Remap {
        r: usize,
        pages: usize,
    },
    Protect {
        r: usize,
        writable: bool,
    },
    Populate {
        r: usize,
        page: usize,
        n: usize,
    },
    Dontneed {
        r: usize,
        page: usize,
        n: usize,
    },
    Flush(usize),
    Read {
        r: usize,
        page: usize,
        at: usize,
    },
    Write {
        r: usize,
        page: usize,
        at: usize,
        v: u8,
    },
    Reclaim(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<bool>(), 1usize..24, any::<u8>()).prop_map(|(shared, pages, seed)| Op::Map {
            shared,
            pages,
            seed
        }),
        (0usize..8).prop_map(Op::Unmap),
        (0usize..8, 1usize..24).prop_map(|(r, pages)| Op::Remap { r, pages }),
        (0usize..8, any::<bool>()).prop_map(|(r, writable)| Op::Protect { r, writable }),
        (0usize..8, 0usize..24, 1usize..8).prop_map(|(r, page, n)| Op::Populate { r, page, n }),
        (0usize..8, 0usize..24, 1usize..8).prop_map(|(r, page, n)| Op::Dontneed { r, page, n }),
        (0usize..8).prop_map(Op::Flush),
        (0usize..8, 0usize..24, 0usize..PAGE).prop_map(|(r, page, at)| Op::Read { r, page, at }),
        (0usize..8, 0usize..24, 0usize..PAGE, any::<u8>()).prop_map(|(r, page, at, v)| Op::Write {
            r,
            page,
            at,
            v
        }),
        (1u64..64).prop_map(Op::Reclaim),
    ]
}

/// A region and what it must hold (`want` covers the whole object, so that
/// a grown region's pages are known too).
struct Modeled {
    region: Region,
    want: Vec<u8>,
    shared: bool,
    writable: bool,
}

/// A region's first bytes: no two pages alike, nor two regions' (every
/// page of a region was alike before, and a page served at the wrong place
/// passed the model). From the thread, the step and the op's seed only, so
/// that a replay or a shrink sees the same bytes.
fn fill(who: u64, step: usize, seed: u8, len: usize) -> Vec<u8> {
    util::pattern_vec(who << 40 | (step as u64) << 8 | u64::from(seed), len)
}

/// Runs `ops` on `pager`; returns the first disagreement with the model.
fn run(pager: &Pager, who: u64, ops: &[Op]) -> Result<(), String> {
    let mut live: Vec<Modeled> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let pick = |live: &Vec<Modeled>, r: usize| (!live.is_empty()).then(|| r % live.len());
        let ctx = |what: &str| format!("step {step} {op:?}: {what}");
        match *op {
            Op::Map {
                shared,
                pages,
                seed,
            } => {
                if live.len() >= 4 {
                    continue;
                }
                let len = pages * PAGE;
                let data = fill(who, step, seed, len);
                let m = if shared {
                    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
                    // SAFETY: the test changes this store only through the region (the
                    // store contract).
                    let region = unsafe { pager.map_store(store, len, &MapOptions::default()) }
                        .map_err(|e| ctx(&e.to_string()))?;
                    Modeled {
                        region,
                        want: data,
                        shared,
                        writable: true,
                    }
                } else {
                    let mut region = pager.map_anonymous(len).map_err(|e| ctx(&e.to_string()))?;
                    region.as_mut_slice().copy_from_slice(&data);
                    Modeled {
                        region,
                        want: data,
                        shared,
                        writable: true,
                    }
                };
                live.push(m);
            }
            Op::Unmap(r) => {
                if let Some(k) = pick(&live, r) {
                    live.swap_remove(k)
                        .region
                        .unmap()
                        .map_err(|e| ctx(&e.to_string()))?;
                }
            }
            Op::Remap { r, pages } => {
                if let Some(k) = pick(&live, r) {
                    let m = &mut live[k];
                    let cap = m.want.len() / PAGE;
                    let new = pages.min(cap).max(1);
                    let cur = m.region.len() / PAGE;
                    m.region
                        .remap(new * PAGE)
                        .map_err(|e| ctx(&e.to_string()))?;
                    if !m.shared && new < cur {
                        m.want[new * PAGE..cur * PAGE].fill(0);
                    }
                }
            }
            Op::Protect { r, writable } => {
                if let Some(k) = pick(&live, r) {
                    live[k]
                        .region
                        .protect(writable)
                        .map_err(|e| ctx(&e.to_string()))?;
                    live[k].writable = writable;
                }
            }
            Op::Populate { r, page, n } | Op::Dontneed { r, page, n } => {
                if let Some(k) = pick(&live, r) {
                    let m = &mut live[k];
                    let pages = m.region.len() / PAGE;
                    let first = page % pages;
                    let n = n.min(pages - first);
                    if let Op::Populate { .. } = op {
                        m.region
                            .populate(first * PAGE, n * PAGE)
                            .map_err(|e| ctx(&e.to_string()))?;
                    } else {
                        m.region
                            .dontneed(first * PAGE, n * PAGE)
                            .map_err(|e| ctx(&e.to_string()))?;
                        if !m.shared {
                            m.want[first * PAGE..(first + n) * PAGE].fill(0);
                        }
                    }
                }
            }
            Op::Flush(r) => {
                if let Some(k) = pick(&live, r) {
                    live[k].region.flush().map_err(|e| ctx(&e.to_string()))?;
                }
            }
            Op::Read { r, page, at } => {
                if let Some(k) = pick(&live, r) {
                    let m = &live[k];
                    let o = (page % (m.region.len() / PAGE)) * PAGE + at;
                    let got = m.region.as_slice()[o];
                    if got != m.want[o] {
                        return Err(ctx(&format!(
                            "offset {o:#x}: got {got:#x}, want {:#x}",
                            m.want[o]
                        )));
                    }
                }
            }
            Op::Write { r, page, at, v } => {
                if let Some(k) = pick(&live, r) {
                    let m = &mut live[k];
                    if m.writable {
                        let o = (page % (m.region.len() / PAGE)) * PAGE + at;
                        m.region.as_mut_slice()[o] = v;
                        m.want[o] = v;
                    }
                }
            }
            Op::Reclaim(n) => {
                pager.reclaim_pages(n);
            }
        }
    }
    // Every byte of every live region, at the end.
    for (k, m) in live.iter().enumerate() {
        let n = m.region.len();
        if let Some(o) = (0..n).find(|&o| m.region.as_slice()[o] != m.want[o]) {
            return Err(format!(
                "end: region {k} offset {o:#x}: got {:#x}, want {:#x}",
                m.region.as_slice()[o],
                m.want[o]
            ));
        }
    }
    Ok(())
}

fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![
        Just(Delivery::InThread),
        Just(Delivery::Threads {
            threads: 2,
            spin_us: 0
        }),
        Just(Delivery::PerRegion),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        // (A case that hangs fails at its deadline; each shrink of it may
        // hang as long: bounded.)
        max_shrink_iters: 256,
        ..ProptestConfig::default()
    })]

    #[test]
    fn operations_from_two_threads_keep_every_byte(
        d in delivery(),
        a in proptest::collection::vec(op(), 1..60),
        b in proptest::collection::vec(op(), 1..60),
    ) {
        let pager = Pager::builder()
            .delivery(d)
            .budget_pages(24)
            .build()
            .unwrap();
        // Under a deadline: a hung fault fails the case instead of stalling
        // the run.
        let pager = Arc::new(pager);
        let (tx, rx) = std::sync::mpsc::channel();
        util::with_deadline(120, "two threads' operations", move || {
            let (ra, rb) = std::thread::scope(|s| {
                let ta = s.spawn(|| run(&pager, 1, &a));
                let tb = s.spawn(|| run(&pager, 2, &b));
                (ta.join().unwrap(), tb.join().unwrap())
            });
            let _ = tx.send((ra, rb));
        });
        let (ra, rb) = rx.recv().unwrap();
        prop_assert!(ra.is_ok(), "{d}: thread a: {}", ra.unwrap_err());
        prop_assert!(rb.is_ok(), "{d}: thread b: {}", rb.unwrap_err());
        let _ = InstallKind::Anonymous;
    }
}
