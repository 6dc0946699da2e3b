//! The soak's address-space churn: while the torture's threads fault and
//! reclaim runs, one more thread keeps mapping, writing, remapping (grow,
//! shrink, move), protecting, dropping (`dontneed`) and unmapping side
//! regions of the same pager, anonymous and shared, and checks every byte
//! of them after each step against what it wrote.
//!
//! The side regions share the pager's budget, so their pages are evicted
//! and faulted back like the tortured region's; every address-space writer
//! races the faults, kswapd and the explicit reclaimer.

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{InstallKind, MapOptions, Pager, Region, Result, PAGE_SIZE};

/// Side regions alive at once, at most.
const LIVE: usize = 6;
/// Pages of a side region, at most.
const MAX_PAGES: usize = 48;

/// What the churn did.
#[derive(Debug, Clone, Default)]
pub struct ChurnReport {
    /// Address-space operations (map, remap, protect, dontneed, unmap).
    pub ops: u64,
    /// Bytes of side regions that did not hold what was written, each
    /// counted once (the check after every operation takes what it found
    /// as what the region holds from then on).
    pub mismatches: u64,
    /// The first of them: where, and after which operation.
    pub first: Option<String>,
}

/// A side region and what it must hold.
struct Side {
    region: Region,
    want: Vec<u8>,
    kind: InstallKind,
    writable: bool,
    /// A shared region's store, read back after the unmap: the unmap must
    /// write the dirty pages back (nothing looked, and an unmap that threw
    /// them away passed; found by review).
    store: Option<Arc<MemoryStore>>,
}

/// A small generator (xorshift): deterministic per seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// `len` bytes of the workloads' [`pattern`](super::common::pattern), as
/// if at page `seed` (2^20 pages apart per seed): no two pages alike,
/// within a region or across regions. (Before, every page of a side region
/// held the same bytes, and a page moved to the wrong place passed.)
fn fill(seed: u64, len: usize) -> Vec<u8> {
    let at = (seed as usize & ((1 << 30) - 1)) << 32;
    (0..len).map(|i| super::common::pattern(at + i)).collect()
}

/// The operations' names, for the report (by `op` number).
const OPS: [&str; 6] = ["map", "unmap", "remap", "protect", "dontneed", "rewrite"];

/// Runs the churn on `pager` until `stop`.
pub fn churn(pager: &Pager, seed: u64, stop: &AtomicBool) -> Result<ChurnReport> {
    let mut rng = Rng(seed | 1);
    let mut live: Vec<Side> = Vec::new();
    let mut r = ChurnReport::default();
    while !stop.load(Acquire) {
        let op = if live.is_empty() { 0 } else { rng.below(6) };
        let name = match op {
            0 if live.len() >= LIVE => "unmap",
            _ => OPS[op as usize],
        };
        match op {
            // Map a new side region and write it.
            0 if live.len() < LIVE => {
                let pages = 4 + rng.below(MAX_PAGES as u64 - 4) as usize;
                let len = pages * PAGE_SIZE;
                let data = fill(rng.below(u64::MAX), len);
                let side = if rng.below(2) == 0 {
                    let mut region = pager.map_anonymous(len)?;
                    region.as_mut_slice().copy_from_slice(&data);
                    Side {
                        region,
                        want: data,
                        kind: InstallKind::Anonymous,
                        writable: true,
                        store: None,
                    }
                } else {
                    let store = Arc::new(MemoryStore::from_bytes(&data)?);
                    // SAFETY: the workload's stores and files are its own, and it changes them
                    // only through its regions (the store contract).
                    let region =
                        unsafe { pager.map_store(store.clone(), len, &MapOptions::default()) }?;
                    Side {
                        region,
                        want: data,
                        kind: InstallKind::Shared,
                        writable: true,
                        store: Some(store),
                    }
                };
                live.push(side);
            }
            0 | 1 => {
                // Unmap one.
                let k = rng.below(live.len() as u64) as usize;
                unmap(live.swap_remove(k), k, &mut r)?;
            }
            2 => {
                // Grow, shrink or move one (within what its object holds).
                let k = rng.below(live.len() as u64) as usize;
                let s = &mut live[k];
                let cap = s.want.len().div_ceil(PAGE_SIZE);
                let cur = s.region.len() / PAGE_SIZE;
                let new = 1 + rng.below(cap as u64) as usize;
                s.region.remap(new * PAGE_SIZE)?;
                // Anonymous memory shrunk away reads as zeros when it comes
                // back; a shared region's store keeps it.
                if s.kind == InstallKind::Anonymous && new < cur {
                    s.want[new * PAGE_SIZE..cur * PAGE_SIZE].fill(0);
                }
            }
            3 => {
                // Toggle its protection.
                let k = rng.below(live.len() as u64) as usize;
                let s = &mut live[k];
                s.writable = !s.writable;
                s.region.protect(s.writable)?;
            }
            4 => {
                // Drop a range (anonymous: zeros after; shared: kept).
                let k = rng.below(live.len() as u64) as usize;
                let s = &mut live[k];
                let pages = s.region.len() / PAGE_SIZE;
                let first = rng.below(pages as u64) as usize;
                let n = 1 + rng.below((pages - first) as u64) as usize;
                s.region.dontneed(first * PAGE_SIZE, n * PAGE_SIZE)?;
                if s.kind == InstallKind::Anonymous {
                    s.want[first * PAGE_SIZE..(first + n) * PAGE_SIZE].fill(0);
                }
            }
            _ => {
                // Rewrite a page of a writable one.
                let k = rng.below(live.len() as u64) as usize;
                let s = &mut live[k];
                if s.writable {
                    let pages = s.region.len() / PAGE_SIZE;
                    let p = rng.below(pages as u64) as usize;
                    let v = fill(rng.below(u64::MAX), PAGE_SIZE);
                    s.region.as_mut_slice()[p * PAGE_SIZE..(p + 1) * PAGE_SIZE].copy_from_slice(&v);
                    s.want[p * PAGE_SIZE..(p + 1) * PAGE_SIZE].copy_from_slice(&v);
                }
            }
        }
        r.ops += 1;
        for (k, s) in live.iter_mut().enumerate() {
            check(s, k, name, &mut r);
        }
    }
    for (k, s) in live.into_iter().enumerate() {
        unmap(s, k, &mut r)?;
    }
    Ok(r)
}

/// Unmaps side region `s` (the `k`th live one); a shared one's store must
/// then hold what the region held, its dirty pages written back. Counts
/// the bytes that differ into `r`, noting the first.
fn unmap(s: Side, k: usize, r: &mut ChurnReport) -> Result<()> {
    s.region.unmap()?;
    let Some(store) = s.store else {
        return Ok(());
    };
    let got = store.snapshot();
    for (i, (&g, &w)) in got.iter().zip(&s.want).enumerate() {
        if g != w {
            r.mismatches += 1;
            r.first.get_or_insert_with(|| {
                format!(
                    "side region {k}'s store after its unmap (operation {}), byte {i} (page {}): \
                     read {g:#04x}, want {w:#04x}",
                    r.ops,
                    i / PAGE_SIZE
                )
            });
        }
    }
    Ok(())
}

/// Compares side region `s` (the `k`th live one) with what it must hold
/// after operation `op`: counts the bytes that differ into `r`, notes the
/// first, and takes what it found as what the region holds from then on,
/// so one wrong byte is counted once, not after every later operation.
fn check(s: &mut Side, k: usize, op: &str, r: &mut ChurnReport) {
    let n = s.region.len();
    let got = &s.region.as_slice()[..n];
    for (i, (&g, w)) in got.iter().zip(&mut s.want[..n]).enumerate() {
        if g != *w {
            r.mismatches += 1;
            r.first.get_or_insert_with(|| {
                format!(
                    "side region {k} ({:?}, {} pages), byte {i} (page {}) after {op} \
                     (operation {}): read {g:#04x}, want {:#04x}",
                    s.kind,
                    n / PAGE_SIZE,
                    i / PAGE_SIZE,
                    r.ops,
                    *w
                )
            });
            *w = g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of a side region, and regions of two seeds, hold different
    /// bytes (every page was alike before).
    #[test]
    fn fill_tells_pages_and_regions_apart() {
        let d = fill(3, 2 * PAGE_SIZE);
        assert_ne!(d[..PAGE_SIZE], d[PAGE_SIZE..]);
        assert_ne!(fill(0x100, PAGE_SIZE), fill(0, PAGE_SIZE));
        assert!(d.iter().all(|&b| b != 0));
    }

    /// A wrong byte is counted once, however many checks follow, and the
    /// first is located (each check counted it again before, unlocated).
    #[test]
    fn a_wrong_byte_is_counted_once_and_located() {
        let pager = Pager::builder().build().unwrap();
        let want = fill(9, 2 * PAGE_SIZE);
        let mut region = pager.map_anonymous(want.len()).unwrap();
        region.as_mut_slice().copy_from_slice(&want);
        region.as_mut_slice()[PAGE_SIZE + 5] ^= 0x80;
        let mut side = Side {
            region,
            want,
            kind: InstallKind::Anonymous,
            writable: true,
            store: None,
        };
        let mut r = ChurnReport::default();
        for _ in 0..3 {
            r.ops += 1;
            check(&mut side, 0, "protect", &mut r);
        }
        assert_eq!(r.mismatches, 1);
        let first = r.first.expect("located");
        assert!(
            first.contains("byte 4101 (page 1) after protect (operation 1)"),
            "{first}"
        );
    }

    /// A shared side region's store is read back after its unmap: a
    /// write-back it holds is found right, and a byte it does not hold as
    /// the region did (as a lost write-back would leave it) is counted and
    /// located.
    #[test]
    fn a_shared_side_regions_store_is_checked_after_its_unmap() {
        let pager = Pager::builder().build().unwrap();
        let data = fill(11, 2 * PAGE_SIZE);
        let side = |want: Vec<u8>| {
            let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            // SAFETY: the test changes the store only through the region.
            let mut region =
                unsafe { pager.map_store(store.clone(), data.len(), &MapOptions::default()) }
                    .unwrap();
            region.as_mut_slice()[PAGE_SIZE + 7] ^= 0x40;
            Side {
                region,
                want,
                kind: InstallKind::Shared,
                writable: true,
                store: Some(store),
            }
        };
        let mut written = data.clone();
        written[PAGE_SIZE + 7] ^= 0x40;
        let mut r = ChurnReport::default();
        unmap(side(written), 0, &mut r).unwrap();
        assert_eq!(r.mismatches, 0, "{:?}", r.first);
        unmap(side(data.clone()), 0, &mut r).unwrap();
        assert_eq!(r.mismatches, 1);
        assert!(r.first.unwrap().contains("page 1"));
    }
}
