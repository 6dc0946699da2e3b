//! One shard's ring of LRU entries: a circular buffer in a mapping
//! reserved for its largest size and touched only as entries use it, so that
//! pushing, popping and growing allocate nothing (async-signal-safe). The
//! caller holds the shard's lock across every call.

use super::Entry;
use crate::sys::mem::Mapping;

pub(super) struct Ring {
    /// Room for `max` entries, reserved (`MAP_NORESERVE`) and touched only
    /// as the ring uses it.
    buf: Mapping,
    /// Entries the ring holds now.
    cap: usize,
    /// Entries it may grow to ([`Ring::grow`]).
    max: usize,
    head: usize,
    /// Entries in the ring.
    pub(super) len: usize,
}

/// How many times its first size a ring may grow to.
pub(super) const RING_GROWTH: usize = 64;

impl Ring {
    /// An empty ring of `cap` entries in `buf`, which has room for `max`.
    pub(super) fn new(buf: Mapping, cap: usize, max: usize) -> Ring {
        Ring {
            buf,
            cap,
            max,
            head: 0,
            len: 0,
        }
    }

    fn at(&self, i: usize) -> *mut Entry {
        // SAFETY: `i % cap < cap <= max`; the mapping holds `max` u64s.
        unsafe { (self.buf.addr() as *mut Entry).add(i % self.cap) }
    }
    /// Doubles a full ring (up to `max`), keeping its entries in their
    /// order; returns the bytes it added, or None at `max`. Residency
    /// passes the budget, which sized the ring, where write-back fails
    /// (a store's dirty pages stay), so the live pages can outnumber its
    /// first size: a page whose entry found no room was never reclaimable
    /// (`tests/store_failures.rs`). One copy of the entries that wrapped
    /// past the end, under the shard lock; no allocation.
    pub(super) fn grow(&mut self) -> Option<usize> {
        let new = self.cap.saturating_mul(2).min(self.max);
        let wrapped = (self.head + self.len).saturating_sub(self.cap);
        if new == self.cap || wrapped > new - self.cap {
            return None;
        }
        let base = self.buf.addr() as *mut Entry;
        // SAFETY: `[0, wrapped)` and `[cap, cap + wrapped)` lie in the
        // mapping (`cap + wrapped <= new <= max`) and do not overlap
        // (`wrapped <= len <= cap`); exclusive access under the shard lock.
        unsafe { std::ptr::copy_nonoverlapping(base, base.add(self.cap), wrapped) };
        let added = (new - self.cap) * std::mem::size_of::<Entry>();
        self.cap = new;
        Some(added)
    }
    pub(super) fn push(&mut self, e: Entry) -> bool {
        if self.len == self.cap {
            return false;
        }
        // SAFETY: in bounds (see `at`); exclusive access under the shard lock.
        unsafe { *self.at(self.head + self.len) = e };
        self.len += 1;
        true
    }
    /// Keeps the entries `keep` says are live, in their order.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(Entry) -> bool) {
        let mut k = 0;
        for i in 0..self.len {
            // SAFETY: as in `push`; `k <= i`, so no entry is overwritten
            // before it is read.
            unsafe {
                let e = *self.at(self.head + i);
                if keep(e) {
                    *self.at(self.head + k) = e;
                    k += 1;
                }
            }
        }
        self.len = k;
    }
    /// Puts `e` back at the head, where [`Ring::pop`] took it from.
    pub(super) fn push_front(&mut self, e: Entry) -> bool {
        if self.len == self.cap {
            return false;
        }
        self.head = (self.head + self.cap - 1) % self.cap;
        self.len += 1;
        // SAFETY: as in `push`.
        unsafe { *self.at(self.head) = e };
        true
    }
    pub(super) fn pop(&mut self) -> Option<Entry> {
        if self.len == 0 {
            return None;
        }
        // SAFETY: as in `push`.
        let e = unsafe { *self.at(self.head) };
        self.head = (self.head + 1) % self.cap;
        self.len -= 1;
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full ring of 4 entries (10..=13) whose head is at `head`, able
    /// to grow to `max`.
    fn full_ring(head: usize, max: usize) -> Ring {
        let mut r = Ring {
            buf: Mapping::anonymous(4096).unwrap(),
            cap: 4,
            max,
            head: 0,
            len: 0,
        };
        for e in 0..head as Entry {
            assert!(r.push(e));
            assert_eq!(r.pop(), Some(e));
        }
        for e in [10, 11, 12, 13] {
            assert!(r.push(e));
        }
        assert!(!r.push(14), "full");
        r
    }

    #[test]
    fn ring_push_front_and_retain_keep_order_across_the_wrap() {
        // Head at 3: the ring wraps after one entry.
        let mut r = full_ring(3, 4);
        assert_eq!(r.pop(), Some(10));
        assert_eq!(r.pop(), Some(11));
        // Back at the head, in their order.
        assert!(r.push_front(11));
        assert!(r.push_front(10));
        assert!(!r.push_front(9), "full");
        r.retain(|e| e != 11);
        assert_eq!(r.len, 3);
        assert!(r.push(14));
        let got: Vec<Entry> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(got, [10, 12, 13, 14]);
    }

    #[test]
    fn a_full_ring_grows_keeping_its_order_across_the_wrap() {
        // Head at 2: two entries wrap past the end.
        let mut r = full_ring(2, 8);
        assert_eq!(r.grow(), Some(4 * 8));
        for e in [14, 15, 16, 17] {
            assert!(r.push(e));
        }
        assert_eq!(r.grow(), None, "at its most");
        assert!(!r.push_front(9));
        let got: Vec<Entry> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(got, [10, 11, 12, 13, 14, 15, 16, 17]);
    }
}
