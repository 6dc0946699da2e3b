//! The region table (the kernel's maple tree of VMAs): regions sorted by
//! start address, read locklessly through an RCU snapshot and updated by
//! copy.
//!
//! # Layout and cost
//! A fault looks its region up with every cache line it touches cold (with
//! 10⁵ regions the table and the regions no longer fit in cache), so the
//! layout is counted in dependent cache misses, as the maple tree's nodes
//! are sized to cache lines:
//!
//! - The table holds the first start address of every chunk (`heads`) in
//!   one array. It is small (a few KiB with 10⁵ regions) and searched on
//!   every fault, so it stays cached.
//! - A chunk holds at most [`CHUNK_MAX`] regions. Its start addresses sit
//!   in cache-line groups of [`LINE`]; the first key of every group sits in
//!   a summary at the head of the chunk itself. A lookup searches the
//!   summary (the chunk's first two lines), then one group (one line), then
//!   reads one entry (one line): with the chunk's pointer (`chunks`, beside
//!   `heads`) before them and the region behind the entry after, five
//!   dependent misses at most, against one per halving step for a plain
//!   sorted array.
//! - An entry holds the region's end, the region, and its object's address,
//!   so the caller can prefetch the object in parallel with the region
//!   ([`Entry::prefetch_object`]) instead of after it.
//!
//! An update copies only the top-level arrays (one entry per chunk) and the
//! one chunk it changes, so mapping 10⁵ regions one at a time stays cheap,
//! where a flat copied vector would cost O(n) per map. No lookup allocates
//! or locks.

use crate::object::Object;
use crate::vma::Vma;
use std::sync::Arc;

/// Regions per group: a group's start addresses fill one cache line.
pub const LINE: usize = 8;
/// Regions per chunk at most; a chunk splits in two halves past this.
pub const CHUNK_MAX: usize = 16 * LINE;
const GROUPS: usize = CHUNK_MAX / LINE;

/// [`LINE`] regions, one field per cache line: four lines, fetched
/// together once the summary has chosen the group.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Group {
    /// Start addresses (`usize::MAX` in unused slots).
    starts: [usize; LINE],
    ends: [usize; LINE],
    /// Each region's object (`vma.object`), to prefetch it without first
    /// reading the region.
    objects: [*const Object; LINE],
    vmas: [Option<Arc<Vma>>; LINE],
}

// SAFETY: the object pointers point into the `Arc<Object>`s that the
// group's own `vmas` own; they are only read, and only as addresses to
// prefetch, so they are as shareable as the `Arc<Vma>`s beside them.
unsafe impl Send for Group {}
// SAFETY: as for Send.
unsafe impl Sync for Group {}

impl Group {
    const EMPTY: Group = Group {
        starts: [usize::MAX; LINE],
        ends: [0; LINE],
        objects: [std::ptr::null(); LINE],
        vmas: [const { None }; LINE],
    };

    /// Starts loading the group's other three lines while its first one,
    /// the start addresses, is searched. A hint only: it cannot fault.
    #[inline]
    fn prefetch(&self) {
        let p = self as *const Group as *const i8;
        prefetch_lines(p.wrapping_add(64), 3);
    }
}

/// Hints the CPU to load the `n` cache lines from `p`. Prefetches never
/// fault and read nothing architecturally, so any address is allowed.
#[inline]
fn prefetch_lines(p: *const i8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    for k in 0..n {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is only a hint; it does not dereference `p`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * k)) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

/// A region found by [`Table::find_entry`].
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    vma: &'a Arc<Vma>,
    object: *const Object,
}

impl<'a> Entry<'a> {
    /// The region.
    #[inline]
    pub fn vma(self) -> &'a Arc<Vma> {
        self.vma
    }

    /// Starts loading the region's object (its fields and inline state
    /// words: four cache lines), so that the miss overlaps the region's
    /// own. A hint only.
    #[inline]
    pub fn prefetch_object(self) {
        let lines = std::mem::size_of::<Object>().div_ceil(64).min(4);
        prefetch_lines(self.object as *const i8, lines);
    }
}

/// One sorted chunk of at most [`CHUNK_MAX`] regions. Immutable once
/// published: an update builds a new one ([`Chunk::build`]).
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Chunk {
    /// `summary[g]` is the first start in `groups[g]` (`usize::MAX` if the
    /// group is unused): the chunk's first two cache lines.
    summary: [usize; GROUPS],
    groups: [Group; GROUPS],
    len: usize,
}

impl Chunk {
    /// A chunk over `vmas`, sorted by start, at most [`CHUNK_MAX`].
    fn build(vmas: Vec<Arc<Vma>>) -> Chunk {
        debug_assert!(!vmas.is_empty() && vmas.len() <= CHUNK_MAX);
        let len = vmas.len();
        let mut groups = [const { Group::EMPTY }; GROUPS];
        for (i, v) in vmas.into_iter().enumerate() {
            let g = &mut groups[i / LINE];
            let j = i % LINE;
            g.starts[j] = v.start;
            g.ends[j] = v.end;
            g.objects[j] = Arc::as_ptr(&v.object);
            g.vmas[j] = Some(v);
        }
        let summary = std::array::from_fn(|g| groups[g].starts[0]);
        Chunk {
            summary,
            groups,
            len,
        }
    }

    fn first(&self) -> usize {
        self.summary[0]
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Region `i` (`i < len`).
    fn vma(&self, i: usize) -> &Arc<Vma> {
        self.groups[i / LINE].vmas[i % LINE]
            .as_ref()
            .expect("slot below len is used")
    }

    fn vmas(&self) -> impl Iterator<Item = &Arc<Vma>> {
        (0..self.len).map(|i| self.vma(i))
    }

    /// The region containing `addr`, if it is in this chunk.
    #[inline]
    fn find(&self, addr: usize) -> Option<Entry<'_>> {
        let g = self
            .summary
            .partition_point(|&s| s <= addr)
            .checked_sub(1)?;
        let group = &self.groups[g];
        group.prefetch();
        let j = group
            .starts
            .partition_point(|&s| s <= addr)
            .checked_sub(1)?;
        if addr >= group.ends[j] {
            return None;
        }
        Some(Entry {
            vma: group.vmas[j].as_ref()?,
            object: group.objects[j],
        })
    }

    /// How many regions start below `addr`.
    fn count_below(&self, addr: usize) -> usize {
        let g = self.summary.partition_point(|&s| s < addr);
        if g == 0 {
            return 0;
        }
        (g - 1) * LINE + self.groups[g - 1].starts.partition_point(|&s| s < addr)
    }
}

/// See the module docs.
#[derive(Debug, Default, Clone)]
pub struct Table {
    /// `heads[c]` is the first start address in `chunks[c]`.
    heads: Vec<usize>,
    chunks: Vec<Arc<Chunk>>,
    /// Ranges being unmapped (still registered with userfaultfd, no longer a
    /// region's): faults there get SIGSEGV semantics.
    pub dying: Vec<(usize, usize)>,
}

impl Table {
    /// The chunk that would hold a region starting at `addr`.
    #[inline]
    fn chunk_of(&self, addr: usize) -> Option<usize> {
        self.heads.partition_point(|&h| h <= addr).checked_sub(1)
    }

    /// The entry of the region containing `addr`. Async-signal-safe.
    #[inline]
    pub fn find_entry(&self, addr: usize) -> Option<Entry<'_>> {
        self.chunks[self.chunk_of(addr)?].find(addr)
    }

    /// The region containing `addr`. Async-signal-safe.
    #[inline]
    pub fn find(&self, addr: usize) -> Option<&Arc<Vma>> {
        self.find_entry(addr).map(Entry::vma)
    }

    /// Whether `addr` lies in a range being unmapped (not a live region).
    pub fn dying_claims(&self, addr: usize) -> bool {
        self.dying.iter().any(|&(s, e)| addr >= s && addr < e)
    }

    /// Every region, in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Vma>> {
        self.chunks.iter().flat_map(|c| c.vmas())
    }

    /// Number of regions.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }

    /// Whether `[start, end)` overlaps a region other than `except`.
    /// Regions do not overlap one another, so the ones that overlap the
    /// range are the last few starting before `end`: walk back from there
    /// while they still end past `start`.
    pub fn overlaps(&self, start: usize, end: usize, except: Option<&Arc<Vma>>) -> bool {
        // (An empty range overlaps nothing, even inside a region.)
        let Some(last) = end.checked_sub(1).filter(|_| start < end) else {
            return false;
        };
        let Some(mut c) = self.chunk_of(last) else {
            return false;
        };
        let mut i = self.chunks[c].count_below(end);
        loop {
            let chunk = &self.chunks[c];
            while i > 0 {
                i -= 1;
                let v = chunk.vma(i);
                if v.end <= start {
                    return false;
                }
                if except.is_none_or(|x| !Arc::ptr_eq(v, x)) {
                    return true;
                }
            }
            if c == 0 {
                return false;
            }
            c -= 1;
            i = self.chunks[c].len();
        }
    }

    /// The regions that overlap `[start, end)`, in address order.
    pub fn overlapping(&self, start: usize, end: usize) -> Vec<Arc<Vma>> {
        let mut out = Vec::new();
        let Some(last) = end.checked_sub(1).filter(|_| start < end) else {
            return out;
        };
        let Some(mut c) = self.chunk_of(last) else {
            return out;
        };
        let mut i = self.chunks[c].count_below(end);
        'walk: loop {
            let chunk = &self.chunks[c];
            while i > 0 {
                i -= 1;
                let v = chunk.vma(i);
                if v.end <= start {
                    break 'walk;
                }
                out.push(v.clone());
            }
            if c == 0 {
                break;
            }
            c -= 1;
            i = self.chunks[c].len();
        }
        out.reverse();
        out
    }

    /// Replaces chunk `c` by `entries` (sorted), split in halves if there
    /// are more than [`CHUNK_MAX`], or removed if there are none.
    fn replace_chunk(&mut self, c: usize, mut entries: Vec<Arc<Vma>>) {
        if entries.is_empty() {
            self.heads.remove(c);
            self.chunks.remove(c);
            return;
        }
        let tail = (entries.len() > CHUNK_MAX).then(|| entries.split_off(entries.len() / 2));
        let head = Chunk::build(entries);
        self.heads[c] = head.first();
        self.chunks[c] = Arc::new(head);
        if let Some(tail) = tail {
            let tail = Chunk::build(tail);
            self.heads.insert(c + 1, tail.first());
            self.chunks.insert(c + 1, Arc::new(tail));
        }
    }

    /// Adds a region (it must not overlap another).
    pub fn insert(&mut self, vma: Arc<Vma>) {
        let start = vma.start;
        if self.chunks.is_empty() {
            self.heads.push(start);
            self.chunks.push(Arc::new(Chunk::build(vec![vma])));
            return;
        }
        // Before every chunk's head: it goes first in the first chunk.
        let c = self.chunk_of(start).unwrap_or(0);
        let chunk = &self.chunks[c];
        let i = chunk.count_below(start);
        let mut entries: Vec<Arc<Vma>> = chunk.vmas().cloned().collect();
        entries.insert(i, vma);
        self.replace_chunk(c, entries);
    }

    /// Removes `vma` (by identity); returns whether it was there.
    pub fn remove(&mut self, vma: &Arc<Vma>) -> bool {
        let Some(c) = self.chunk_of(vma.start) else {
            return false;
        };
        let chunk = &self.chunks[c];
        let Some(i) = chunk.vmas().position(|v| Arc::ptr_eq(v, vma)) else {
            return false;
        };
        let mut entries: Vec<Arc<Vma>> = chunk.vmas().cloned().collect();
        entries.remove(i);
        self.replace_chunk(c, entries);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{InstallKind, Object};
    use crate::store::ZeroStore;

    /// A one-page object for the regions to map.
    fn object() -> Arc<Object> {
        let store = Arc::new(ZeroStore::new(4096));
        Arc::new(
            Object::new(
                InstallKind::Anonymous,
                store.clone(),
                Some(store),
                1,
                true,
                12,
            )
            .unwrap(),
        )
    }

    #[test]
    fn insert_find_remove_across_chunks() {
        let obj = object();
        let mut t = Table::default();
        let n = 5 * CHUNK_MAX + 7;
        // Insert in a scrambled order.
        let mut vmas: Vec<Arc<Vma>> = (0..n)
            .map(|k| {
                Arc::new(Vma::new(
                    0x1000_0000 + k * 0x2000,
                    0x1000,
                    0,
                    obj.clone(),
                    true,
                ))
            })
            .collect();
        for k in (0..n).map(|k| (k * 7919) % n) {
            t.insert(vmas[k].clone());
        }
        assert_eq!(t.len(), n);
        for (k, v) in vmas.iter().enumerate() {
            assert!(Arc::ptr_eq(t.find(v.start + 5).unwrap(), v), "{k}");
            assert!(t.find(v.start + 0x1000).is_none(), "gap after {k}");
        }
        assert!(t
            .iter()
            .zip(t.iter().skip(1))
            .all(|(a, b)| a.start < b.start));
        // Overlap checks: inside, straddling and between regions.
        let v0 = vmas[3].clone();
        assert!(t.overlaps(v0.start + 5, v0.start + 6, None));
        assert!(!t.overlaps(v0.start + 5, v0.start + 6, Some(&v0)));
        assert!(t.overlaps(v0.start - 0x800, v0.start + 1, None));
        assert!(!t.overlaps(v0.end, v0.end + 0x1000, None));
        assert!(t.overlaps(v0.end, v0.end + 0x1001, None));
        assert!(t.overlaps(0, usize::MAX, None));
        assert!(!t.overlaps(0, 0x1000_0000, None));
        // An empty range overlaps nothing, inside a region or not.
        assert!(!t.overlaps(v0.start + 0x10, v0.start + 0x10, None));
        assert!(t.overlapping(v0.start + 0x10, v0.start + 0x10).is_empty());
        assert!(!t.overlaps(v0.start + 0x20, v0.start + 0x10, None));
        for v in vmas.drain(..n / 2) {
            assert!(t.remove(&v));
            assert!(t.find(v.start).is_none());
        }
        assert_eq!(t.len(), n - n / 2);
        assert!(t.find(vmas[0].start).is_some());
    }

    /// Random inserts and removes of regions of random lengths, checked
    /// against a plain sorted list: every region's first and last byte,
    /// the bytes around it, and the overlap queries.
    #[test]
    fn matches_a_sorted_list_under_random_updates() {
        // A xorshift generator: any fixed sequence of varied values will do.
        let mut x = 7u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let obj = object();
        let mut t = Table::default();
        let mut model: Vec<Arc<Vma>> = Vec::new();
        // Slots of 4 pages; a region takes 1 to 3 pages at the start of its
        // slot, so neighbours never overlap and gaps vary.
        let slots = 3 * CHUNK_MAX;
        for step in 0..6 * CHUNK_MAX {
            let slot = (next() % slots as u64) as usize;
            let start = 0x4000_0000 + slot * 0x4000;
            if let Some(k) = model.iter().position(|v| v.start == start) {
                let v = model.remove(k);
                assert!(t.remove(&v), "step {step}");
                assert!(!t.remove(&v), "removed twice at step {step}");
            } else {
                let pages = 1 + (next() % 3) as usize;
                let v = Arc::new(Vma::new(start, pages * 0x1000, 0, obj.clone(), true));
                let k = model.partition_point(|m| m.start < start);
                model.insert(k, v.clone());
                t.insert(v);
            }
            assert_eq!(t.len(), model.len());
            if step % 37 != 0 {
                continue;
            }
            assert!(t.iter().zip(&model).all(|(a, b)| Arc::ptr_eq(a, b)));
            for v in &model {
                assert!(Arc::ptr_eq(t.find(v.start).unwrap(), v));
                assert!(Arc::ptr_eq(t.find(v.end - 1).unwrap(), v));
                assert!(t.find(v.start - 1).is_none());
                assert!(t.find(v.end).is_none());
                assert!(t.overlaps(v.start, v.end, None));
                assert!(!t.overlaps(v.start, v.end, Some(v)));
                assert!(!t.overlaps(v.end, v.end + 0x1000, None));
            }
        }
    }
}
