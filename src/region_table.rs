//! The region table (the kernel's maple tree of VMAs): regions sorted by
//! start address, read locklessly through an RCU snapshot and updated by
//! copy.
//!
//! # Layout and cost
//! Regions are kept in sorted chunks of at most 2 × [`CHUNK`] entries, each
//! chunk behind its own `Arc`. As in the maple tree, the keys sit inline:
//! the table holds the first start address of every chunk in one array, and
//! each chunk its regions' start and end addresses in arrays of their own.
//! A lookup is two binary searches over contiguous `usize`s (the chunk
//! heads, then one chunk's starts) and one dereference of the region found:
//! O(log n), a handful of cache lines even with 10⁵ regions, no allocation,
//! no locks. An update copies only the top-level arrays (n/`CHUNK` entries)
//! and the one chunk it changes, so mapping 10⁵ regions one at a time stays
//! cheap, where a flat copied vector would cost O(n) per map.

use crate::vma::Vma;
use std::sync::Arc;

/// Regions per chunk after a split (a chunk splits past twice this).
pub const CHUNK: usize = 128;

/// One sorted chunk: parallel arrays of start, end and region.
#[derive(Debug, Default, Clone)]
struct Chunk {
    starts: Vec<usize>,
    ends: Vec<usize>,
    vmas: Vec<Arc<Vma>>,
}

impl Chunk {
    fn insert(&mut self, i: usize, vma: Arc<Vma>) {
        self.starts.insert(i, vma.start);
        self.ends.insert(i, vma.end);
        self.vmas.insert(i, vma);
    }

    fn remove(&mut self, i: usize) {
        self.starts.remove(i);
        self.ends.remove(i);
        self.vmas.remove(i);
    }

    fn split_off(&mut self, at: usize) -> Chunk {
        Chunk {
            starts: self.starts.split_off(at),
            ends: self.ends.split_off(at),
            vmas: self.vmas.split_off(at),
        }
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

    /// The region containing `addr`. Async-signal-safe.
    #[inline]
    pub fn find(&self, addr: usize) -> Option<&Arc<Vma>> {
        let chunk = &self.chunks[self.chunk_of(addr)?];
        let i = chunk
            .starts
            .partition_point(|&s| s <= addr)
            .checked_sub(1)?;
        (addr < chunk.ends[i]).then(|| &chunk.vmas[i])
    }

    /// Whether `addr` belongs to this address space (a region or a range
    /// being torn down).
    pub fn claims(&self, addr: usize) -> bool {
        self.find(addr).is_some() || self.dying.iter().any(|&(s, e)| addr >= s && addr < e)
    }

    /// Every region, in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Vma>> {
        self.chunks.iter().flat_map(|c| c.vmas.iter())
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.vmas.len()).sum()
    }

    /// Whether there are no regions.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Whether `[start, end)` overlaps a region other than `except`.
    /// Regions do not overlap one another, so the ones that overlap the
    /// range are the last few starting before `end`: walk back from there
    /// while they still end past `start`.
    pub fn overlaps(&self, start: usize, end: usize, except: Option<&Arc<Vma>>) -> bool {
        let Some(last) = end.checked_sub(1) else {
            return false;
        };
        let Some(mut c) = self.chunk_of(last) else {
            return false;
        };
        let mut i = self.chunks[c].starts.partition_point(|&s| s < end);
        loop {
            let chunk = &self.chunks[c];
            while i > 0 {
                i -= 1;
                if chunk.ends[i] <= start {
                    return false;
                }
                if except.is_none_or(|e| !Arc::ptr_eq(&chunk.vmas[i], e)) {
                    return true;
                }
            }
            if c == 0 {
                return false;
            }
            c -= 1;
            i = self.chunks[c].vmas.len();
        }
    }

    /// Adds a region (it must not overlap another).
    pub fn insert(&mut self, vma: Arc<Vma>) {
        let start = vma.start;
        if self.chunks.is_empty() {
            let mut chunk = Chunk::default();
            chunk.insert(0, vma);
            self.heads.push(start);
            self.chunks.push(Arc::new(chunk));
            return;
        }
        // Before every chunk's head: it goes first in the first chunk.
        let c = self.chunk_of(start).unwrap_or(0);
        let mut chunk = (*self.chunks[c]).clone();
        let i = chunk.starts.partition_point(|&s| s < start);
        chunk.insert(i, vma);
        self.heads[c] = chunk.starts[0];
        if chunk.vmas.len() > 2 * CHUNK {
            let tail = chunk.split_off(CHUNK);
            self.heads.insert(c + 1, tail.starts[0]);
            self.chunks[c] = Arc::new(chunk);
            self.chunks.insert(c + 1, Arc::new(tail));
        } else {
            self.chunks[c] = Arc::new(chunk);
        }
    }

    /// Removes `vma` (by identity); returns whether it was there.
    pub fn remove(&mut self, vma: &Arc<Vma>) -> bool {
        let Some(c) = self.chunk_of(vma.start) else {
            return false;
        };
        let Some(i) = self.chunks[c].vmas.iter().position(|v| Arc::ptr_eq(v, vma)) else {
            return false;
        };
        let mut chunk = (*self.chunks[c]).clone();
        chunk.remove(i);
        if chunk.vmas.is_empty() {
            self.heads.remove(c);
            self.chunks.remove(c);
        } else {
            self.heads[c] = chunk.starts[0];
            self.chunks[c] = Arc::new(chunk);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{InstallKind, Object};
    use crate::store::ZeroStore;

    #[test]
    fn insert_find_remove_across_chunks() {
        let obj = Arc::new(
            Object::new(
                InstallKind::Anonymous,
                Arc::new(ZeroStore::new(4096)),
                1,
                true,
            )
            .unwrap(),
        );
        let mut t = Table::default();
        let n = 5 * CHUNK + 7;
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
        for v in vmas.drain(..n / 2) {
            assert!(t.remove(&v));
            assert!(t.find(v.start).is_none());
        }
        assert_eq!(t.len(), n - n / 2);
        assert!(t.find(vmas[0].start).is_some());
    }
}
