//! The LRU: resident pages in reclaim order (the kernel's lruvec), behind
//! the LRU lock, fed through per-CPU add batches of 31 (`folio_batch`).
//!
//! # Design
//! Each shard (the per-node lruvec analog) is a ring of entries
//! `(object slot, page index)` under a [`CountingMutex`]. Reclaim takes
//! entries from the head and either evicts them or rotates them to the tail
//! (second chance: a page referenced since the last look). That is the
//! CLOCK algorithm over the resident pages, chosen because it needs no
//! per-page links: the page's 4-byte state word carries `ON_LRU`,
//! `LRU_BATCHED` and `REFERENCED`, and the ring costs 8 bytes per resident
//! page, not per tracked page. Entries that went stale (the object was
//! unmapped, the page evicted by another entry) are dropped when reached.
//!
//! Pages enter through a per-CPU batch; a full batch is moved into its
//! shards under their locks. A per-CPU batch is guarded by a try-lock: if
//! another thread on the same CPU holds it, the page goes straight to the
//! shard. Nothing here allocates after construction: async-signal-safe.

use crate::page_cache::{LOCKED, LRU_BATCHED, ON_LRU, UPTODATE};
use crate::rmap::ObjectTable;
use crate::stats::{Counter, Counters};
use crate::sync::mutex::CountingMutex;
use crate::sys::mem::Mapping;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

mod ring;
use ring::{Ring, RING_GROWTH};

/// Pages per per-CPU add batch (`PAGEVEC_SIZE` / `folio_batch`).
pub const BATCH: usize = 31;

/// When populate drains the calling CPU's add batch (seed 002).
///
/// ```
/// use uffd_pager::{DrainPolicy, Pager};
///
/// let pager = Pager::builder().drain_policy(DrainPolicy::Never).budget_pages(64).build()?;
/// let region = pager.map_anonymous(16 * uffd_pager::PAGE_SIZE)?;
/// region.populate(0, region.len())?;
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DrainPolicy {
    /// Populate always drains at its end (`lru_add_drain`; mainline).
    #[default]
    Always,
    /// Only for locked (pinned) regions (John Hubbard's patch).
    LockedOnly,
    /// Never: batches drain when full.
    Never,
}

impl std::str::FromStr for DrainPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(DrainPolicy::Always),
            "locked-only" => Ok(DrainPolicy::LockedOnly),
            "never" => Ok(DrainPolicy::Never),
            _ => Err(format!(
                "unknown drain policy {s:?} (always, locked-only, never)"
            )),
        }
    }
}

impl std::fmt::Display for DrainPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DrainPolicy::Always => "always",
            DrainPolicy::LockedOnly => "locked-only",
            DrainPolicy::Never => "never",
        })
    }
}

/// An LRU entry: the object's slot in the top [`SLOT_BITS`] bits, the page
/// index in the rest (44 bits: more pages than x86-64's 47-bit user address
/// space holds).
pub type Entry = u64;

/// Bits of an entry that hold the object slot.
pub const SLOT_BITS: u32 = 20;
const PAGE_BITS: u32 = 64 - SLOT_BITS;
const _: () = assert!(crate::rmap::MAX_OBJECTS <= 1 << SLOT_BITS);

/// Packs an entry (`slot < 2^20`, `page < 2^44`).
#[inline]
pub fn entry(slot: u32, page: usize) -> Entry {
    ((slot as u64) << PAGE_BITS) | (page as u64 & ((1 << PAGE_BITS) - 1))
}

/// Unpacks an entry.
#[inline]
pub fn unpack(e: Entry) -> (u32, usize) {
    (
        (e >> PAGE_BITS) as u32,
        (e & ((1 << PAGE_BITS) - 1)) as usize,
    )
}

struct Shard {
    lock: CountingMutex,
    ring: UnsafeCell<Ring>,
    /// The ring's length as of its last change, for a peek without the
    /// lock (the ring itself is touched only under it).
    filled: AtomicUsize,
}

impl Shard {
    /// Pushes `e` at the ring's tail; false if the ring is full.
    ///
    /// # Safety
    /// The caller holds `lock`.
    unsafe fn push_locked(&self, e: Entry, objects: &ObjectTable, grown: &AtomicUsize) -> bool {
        // SAFETY: the lock (the caller's contract) makes this the only view.
        let ring = unsafe { &mut *self.ring.get() };
        let pushed = make_room(ring, objects, grown, |r| r.push(e));
        self.filled.store(ring.len, Relaxed);
        pushed
    }
}

/// Runs `put` (a push) on `ring`; when the ring is full, drops its stale
/// entries ([`compact`]) and tries again, then grows it ([`Ring::grow`],
/// adding the bytes to `grown`) and tries once more.
fn make_room(
    ring: &mut Ring,
    objects: &ObjectTable,
    grown: &AtomicUsize,
    mut put: impl FnMut(&mut Ring) -> bool,
) -> bool {
    put(ring)
        || {
            compact(ring, objects);
            put(ring)
        }
        || ring.grow().is_some_and(|b| {
            grown.fetch_add(b, Relaxed);
            put(ring)
        })
}

/// Drops a full ring's stale entries: those of objects gone from the
/// table (unmapped), of pages no longer on the LRU (evicted), or waiting
/// in an add batch (re-added after an eviction: the batch holds their
/// entry), and of pages that left residency without leaving the LRU
/// (dropped with `MADV_DONTNEED`: [`crate::discard`] keeps `ON_LRU` so that
/// the page, faulted in again, is not added twice). Such a page's entry is
/// its one entry: it leaves the LRU here (as [`crate::reclaim::evict_page`]
/// takes it off when it reaches the entry), unless it is locked (a fault
/// is filling it) or resident again. Stale entries are otherwise dropped
/// only when reclaim reaches them, and reclaim runs only past the high
/// watermark: a program that maps, touches and unmaps regions (or drops
/// pages of one) under its budget filled the ring with them, and pages
/// added then overflowed and were never reclaimable
/// (`tests/lru_ring_full.rs`). Called under
/// the shard lock, only when the ring is full: one pass over it, a pin per
/// entry.
fn compact(ring: &mut Ring, objects: &ObjectTable) {
    ring.retain(|e| {
        let (slot, page) = unpack(e);
        objects.pin(slot).is_some_and(|o| {
            if page >= o.npages() {
                return false;
            }
            let left = o.cache.word(page).fetch_update(AcqRel, Acquire, |w| {
                (w & (ON_LRU | LRU_BATCHED | LOCKED | UPTODATE) == ON_LRU).then_some(w & !ON_LRU)
            });
            match left {
                Ok(_) => false,
                Err(w) => w & (ON_LRU | LRU_BATCHED) == ON_LRU,
            }
        })
    });
}

/// An entry that reclaim took and a full ring could not take back (the
/// ring at its largest, and adds filled the room isolation made): its page
/// leaves the LRU, as an add that overflows does ([`Lru::move_to_lru`]),
/// unless an add batch holds an entry of it. Before, it kept `ON_LRU` with
/// no entry: never reachable by reclaim, and never added again, since an
/// add skips a page already on the LRU. (Still, a page that leaves the LRU
/// while resident is added again only when it is next cached: it stays
/// charged until dropped or unmapped.) Called under the shard's lock.
fn lost(objects: &ObjectTable, e: Entry) {
    let (slot, page) = unpack(e);
    if let Some(o) = objects.pin(slot).filter(|o| page < o.npages()) {
        let _ = o.cache.word(page).fetch_update(AcqRel, Acquire, |w| {
            (w & (ON_LRU | LRU_BATCHED) == ON_LRU).then_some(w & !ON_LRU)
        });
    }
}

struct CpuBatch {
    busy: AtomicBool,
    n: UnsafeCell<usize>,
    items: UnsafeCell<[Entry; BATCH]>,
}

/// The LRU of one pager. See the module docs.
pub struct Lru {
    shards: Box<[Shard]>,
    batches: Box<[CpuBatch]>,
    /// Round-robin cursor for reclaim.
    cursor: AtomicUsize,
    /// Entries dropped because a ring was full (should stay 0).
    pub overflow: AtomicUsize,
    /// Bytes of the rings in use (their first sizes, and what they grew
    /// by).
    ring_bytes: AtomicUsize,
}

// SAFETY: the UnsafeCells are only touched under their shard lock or the
// batch's `busy` try-lock (a peek at a ring's length reads `filled`, an
// atomic outside the cell).
unsafe impl Sync for Lru {}
// SAFETY: as above; the mappings are plain memory.
unsafe impl Send for Lru {}

impl std::fmt::Debug for Lru {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lru")
            .field("shards", &self.shards.len())
            .finish()
    }
}

use crate::sys::{cpu_count as ncpus, this_cpu};

impl Lru {
    /// Bytes of address space the rings take.
    pub fn ring_bytes(&self) -> usize {
        self.ring_bytes.load(Relaxed)
    }

    /// An LRU with `shards` shards, sized for a budget of `budget` pages.
    pub fn new(shards: usize, budget: usize) -> Result<Lru, i32> {
        let shards = shards.max(1);
        // Resident pages are at most the budget plus a few in flight; stale
        // entries add to that until reached. Generous and lazily touched.
        let cap = budget
            .checked_mul(4)
            .and_then(|b| b.checked_add(4096))
            .map(|b| b / shards + 1024)
            .ok_or(libc::ENOMEM)?;
        let bytes = |n: usize| {
            n.checked_mul(8)
                .and_then(|b| b.checked_next_multiple_of(4096))
                .ok_or(libc::ENOMEM)
        };
        let ring_len = bytes(cap)?;
        let mut v = Vec::with_capacity(shards);
        for _ in 0..shards {
            // Room to grow reserved up front (address space only), or
            // none where even that is refused.
            let grown = cap
                .checked_mul(RING_GROWTH)
                .and_then(|m| Some((m, Mapping::anonymous(bytes(m).ok()?).ok()?)));
            let (max, buf) = match grown {
                Some(g) => g,
                None => (cap, Mapping::anonymous(ring_len)?),
            };
            v.push(Shard {
                lock: CountingMutex::new(),
                ring: UnsafeCell::new(Ring::new(buf, cap, max)),
                filled: AtomicUsize::new(0),
            });
        }
        let batches = (0..ncpus() * 2)
            .map(|_| CpuBatch {
                busy: AtomicBool::new(false),
                n: UnsafeCell::new(0),
                items: UnsafeCell::new([0; BATCH]),
            })
            .collect();
        Ok(Lru {
            shards: v.into_boxed_slice(),
            batches,
            cursor: AtomicUsize::new(0),
            overflow: AtomicUsize::new(0),
            ring_bytes: AtomicUsize::new(ring_len * shards),
        })
    }

    /// The shard of an object slot.
    #[inline]
    pub fn shard_of(&self, slot: u32) -> usize {
        slot as usize % self.shards.len()
    }

    fn lock_shard(&self, s: usize, c: &Counters) -> crate::sync::mutex::MutexGuard<'_> {
        let (g, contended) = self.shards[s].lock.lock_contended();
        c.inc(Counter::LRU_LOCK);
        if contended {
            c.inc(Counter::LRU_LOCK_CONTENDED);
        }
        g
    }

    /// Entries in the rings now (a peek at each ring's length, so
    /// approximate while others add or isolate), not counting the CPUs'
    /// add batches. Async-signal-safe (loads only).
    pub fn entries(&self) -> usize {
        self.shards.iter().map(|s| s.filled.load(Relaxed)).sum()
    }

    /// Per-shard (acquisitions, contended) counts.
    pub fn shard_counts(&self) -> Vec<(u64, u64)> {
        self.shards.iter().map(|s| s.lock.counts()).collect()
    }

    /// Adds a page (whose word already has `ON_LRU | LRU_BATCHED` set) to
    /// the calling CPU's batch, draining the batch when full.
    pub fn add(&self, e: Entry, objects: &ObjectTable, c: &Counters) {
        let b = &self.batches[this_cpu() % self.batches.len()];
        if b.busy.swap(true, Acquire) {
            // Someone on this CPU holds the batch: go straight to the LRU.
            self.move_to_lru(&[e], objects, c);
            return;
        }
        // SAFETY: `busy` gives us exclusive access to this batch.
        let (n, items) = unsafe { (&mut *b.n.get(), &mut *b.items.get()) };
        items[*n] = e;
        *n += 1;
        if *n == BATCH {
            self.move_to_lru(&items[..], objects, c);
            *n = 0;
        }
        b.busy.store(false, Release);
    }

    /// `lru_add_drain`: moves the calling CPU's batch into the LRU.
    pub fn drain_local(&self, objects: &ObjectTable, c: &Counters) {
        self.drain_batch(this_cpu() % self.batches.len(), objects, c);
    }

    /// `lru_add_drain_all`: drains every CPU's batch that is not busy.
    pub fn drain_all(&self, objects: &ObjectTable, c: &Counters) {
        for i in 0..self.batches.len() {
            self.drain_batch(i, objects, c);
        }
    }

    fn drain_batch(&self, i: usize, objects: &ObjectTable, c: &Counters) {
        let b = &self.batches[i];
        if b.busy.swap(true, Acquire) {
            return;
        }
        // SAFETY: exclusive access via `busy`.
        let (n, items) = unsafe { (&mut *b.n.get(), &*b.items.get()) };
        if *n > 0 {
            self.move_to_lru(&items[..*n], objects, c);
            *n = 0;
        }
        b.busy.store(false, Release);
    }

    /// Moves entries into their shards: one lock acquisition per shard
    /// touched. Entries of unmapped objects are dropped on the way.
    fn move_to_lru(&self, es: &[Entry], objects: &ObjectTable, c: &Counters) {
        for s in 0..self.shards.len() {
            let mut g = None;
            for &e in es {
                let (slot, page) = unpack(e);
                if self.shard_of(slot) != s {
                    continue;
                }
                let Some(obj) = objects.pin(slot) else {
                    continue;
                };
                if page >= obj.npages() {
                    continue;
                }
                if g.is_none() {
                    g = Some(self.lock_shard(s, c));
                }
                obj.cache.update(page, 0, LRU_BATCHED);
                // SAFETY: we hold shard `s`'s lock.
                if !unsafe { self.shards[s].push_locked(e, objects, &self.ring_bytes) } {
                    self.overflow.fetch_add(1, Relaxed);
                    obj.cache.update(page, 0, ON_LRU);
                }
            }
        }
    }

    /// Takes up to `out.len()` entries from the head of the next shard
    /// (round robin). Returns how many.
    pub fn isolate(&self, out: &mut [Entry], c: &Counters) -> usize {
        let n = self.shards.len();
        for _ in 0..n {
            let s = self.cursor.fetch_add(1, Relaxed) % n;
            // A peek without the lock: only a hint.
            if self.shards[s].filled.load(Relaxed) == 0 {
                continue;
            }
            let _g = self.lock_shard(s, c);
            // SAFETY: we hold the shard lock.
            let ring = unsafe { &mut *self.shards[s].ring.get() };
            let mut k = 0;
            while k < out.len() {
                match ring.pop() {
                    Some(e) => {
                        out[k] = e;
                        k += 1;
                    }
                    None => break,
                }
            }
            self.shards[s].filled.store(ring.len, Relaxed);
            if k > 0 {
                return k;
            }
        }
        0
    }

    /// Puts entries that [`isolate`](Self::isolate) took but reclaim did
    /// not look at back at the head of their shard, in their order: they
    /// keep their place (a rotation would give them a new one at the
    /// tail). All from one shard, as `isolate` returns them.
    pub fn unisolate(&self, es: &[Entry], objects: &ObjectTable, c: &Counters) {
        let Some(&first) = es.first() else {
            return;
        };
        let s = self.shard_of(unpack(first).0);
        let _g = self.lock_shard(s, c);
        // SAFETY: we hold the shard lock.
        let ring = unsafe { &mut *self.shards[s].ring.get() };
        for &e in es.iter().rev() {
            let pushed = make_room(ring, objects, &self.ring_bytes, |r| r.push_front(e));
            if !pushed {
                self.overflow.fetch_add(1, Relaxed);
                lost(objects, e);
            }
        }
        self.shards[s].filled.store(ring.len, Relaxed);
    }

    /// Puts rotated entries back at the tails of their shards.
    pub fn putback(&self, es: &[Entry], objects: &ObjectTable, c: &Counters) {
        for s in 0..self.shards.len() {
            let mut g = None;
            for &e in es {
                if self.shard_of(unpack(e).0) != s {
                    continue;
                }
                if g.is_none() {
                    g = Some(self.lock_shard(s, c));
                }
                // SAFETY: we hold the shard lock.
                if !unsafe { self.shards[s].push_locked(e, objects, &self.ring_bytes) } {
                    self.overflow.fetch_add(1, Relaxed);
                    lost(objects, e);
                }
            }
        }
    }

    /// Takes the lock of `slot`'s shard once, as releasing a batch of pages
    /// that are on the LRU does (`folios_put` → `lruvec` lock). Their ring
    /// entries go stale and are dropped when reached.
    pub fn release_lock_once(&self, slot: u32, c: &Counters) {
        let _g = self.lock_shard(self.shard_of(slot), c);
    }
}

#[cfg(test)]
mod tests;
