//! The region table (the kernel's maple tree of VMAs): regions sorted by
//! start address, read locklessly through an RCU snapshot and updated by
//! copy.
//!
//! # Layout and cost
//! Regions are kept in sorted chunks of at most [`CHUNK`] entries, each
//! chunk behind its own `Arc`. A lookup is two binary searches (over chunk
//! heads, then within one chunk): O(log n), no allocation, no locks. An
//! update copies only the top-level chunk list (n/`CHUNK` pointers) and the
//! one chunk it changes, so mapping 10⁵ regions one at a time stays cheap,
//! where a flat copied vector would cost O(n) per map.

use crate::vma::Vma;
use std::sync::Arc;

/// Most regions per chunk before it splits.
pub const CHUNK: usize = 128;

/// See the module docs.
#[derive(Debug, Default, Clone)]
pub struct Table {
    chunks: Vec<Arc<Vec<Arc<Vma>>>>,
    /// Ranges being unmapped (still registered with userfaultfd, no longer a
    /// region's): faults there get SIGSEGV semantics.
    pub dying: Vec<(usize, usize)>,
}

impl Table {
    /// The region containing `addr`. Async-signal-safe.
    #[inline]
    pub fn find(&self, addr: usize) -> Option<&Arc<Vma>> {
        let c = self.chunks.partition_point(|c| c[0].start <= addr);
        let chunk = self.chunks.get(c.checked_sub(1)?)?;
        let i = chunk.partition_point(|v| v.start <= addr);
        let v = chunk.get(i.checked_sub(1)?)?;
        v.contains(addr).then_some(v)
    }

    /// Whether `addr` belongs to this address space (a region or a range
    /// being torn down).
    pub fn claims(&self, addr: usize) -> bool {
        self.find(addr).is_some() || self.dying.iter().any(|&(s, e)| addr >= s && addr < e)
    }

    /// Every region, in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Vma>> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }

    /// Whether there are no regions.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Whether `[start, end)` overlaps a region other than `except`.
    pub fn overlaps(&self, start: usize, end: usize, except: Option<&Arc<Vma>>) -> bool {
        self.iter()
            .filter(|v| except.is_none_or(|e| !Arc::ptr_eq(v, e)))
            .any(|v| v.start < end && start < v.end)
    }

    /// Adds a region (it must not overlap another).
    pub fn insert(&mut self, vma: Arc<Vma>) {
        let start = vma.start;
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(vec![vma]));
            return;
        }
        let c = self
            .chunks
            .partition_point(|c| c[0].start <= start)
            .saturating_sub(1);
        let mut chunk = (*self.chunks[c]).clone();
        let i = chunk.partition_point(|v| v.start < start);
        chunk.insert(i, vma);
        if chunk.len() > 2 * CHUNK {
            let tail = chunk.split_off(CHUNK);
            self.chunks[c] = Arc::new(chunk);
            self.chunks.insert(c + 1, Arc::new(tail));
        } else {
            self.chunks[c] = Arc::new(chunk);
        }
    }

    /// Removes `vma` (by identity); returns whether it was there.
    pub fn remove(&mut self, vma: &Arc<Vma>) -> bool {
        let start = vma.start;
        let c = self.chunks.partition_point(|c| c[0].start <= start);
        let Some(c) = c.checked_sub(1) else {
            return false;
        };
        let Some(i) = self.chunks[c].iter().position(|v| Arc::ptr_eq(v, vma)) else {
            return false;
        };
        let mut chunk = (*self.chunks[c]).clone();
        chunk.remove(i);
        if chunk.is_empty() {
            self.chunks.remove(c);
        } else {
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
        for v in vmas.drain(..n / 2) {
            assert!(t.remove(&v));
            assert!(t.find(v.start).is_none());
        }
        assert_eq!(t.len(), n - n / 2);
        assert!(t.find(vmas[0].start).is_some());
    }
}
