//! Unit tests of the LRU's rings and batches.

use super::*;

/// An entry put back (`unisolate`, `putback`) into a ring at its
/// largest that adds filled meanwhile leaves the LRU; every page still
/// flagged on it has an entry. (Pages 0 and 1 kept `ON_LRU` with no
/// entry before: never reclaimable.)
#[test]
fn an_entry_a_full_ring_cannot_take_back_leaves_the_lru() {
    use crate::object::{InstallKind, Object};
    use crate::store::ZeroStore;
    use std::sync::Arc;
    for unisolating in [true, false] {
        let store = Arc::new(ZeroStore::new(8 * 4096));
        let obj = Object::new(
            InstallKind::Anonymous,
            store.clone(),
            Some(store),
            8,
            true,
            12,
        );
        let obj = Arc::new(obj.unwrap());
        let objects = ObjectTable::new().unwrap();
        let slot = objects.insert(&obj).unwrap();
        let mut lru = Lru::new(1, 0).unwrap();
        lru.shards[0].ring = UnsafeCell::new(Ring::new(Mapping::anonymous(4096).unwrap(), 4, 4));
        let c = Counters::default();
        for p in 0..6 {
            obj.cache.update(p, UPTODATE | ON_LRU, 0);
        }
        let e = |p| entry(slot, p);
        lru.putback(&[e(0), e(1), e(2), e(3)], &objects, &c);
        let mut out = [0; 2];
        assert_eq!(lru.isolate(&mut out, &c), 2);
        // Adds fill the room isolation made.
        lru.putback(&[e(4), e(5)], &objects, &c);
        if unisolating {
            lru.unisolate(&out, &objects, &c);
        } else {
            lru.putback(&out, &objects, &c);
        }
        assert_eq!(lru.overflow.load(Relaxed), 2);
        let mut all = [0; 8];
        let n = lru.isolate(&mut all, &c);
        let listed: Vec<usize> = all[..n].iter().map(|&e| unpack(e).1).collect();
        for p in 0..6 {
            let on = obj.cache.word(p).load(Relaxed) & ON_LRU != 0;
            assert_eq!(
                on,
                listed.contains(&p),
                "page {p} (unisolate: {unisolating})"
            );
        }
    }
}

#[test]
fn entries_keep_page_indices_past_32_bits() {
    for &(slot, page) in &[
        (0u32, 0usize),
        (7, 1 << 32),
        (1 << 19, (1 << 44) - 1),
        (3, 123_456_789_012),
    ] {
        assert_eq!(unpack(entry(slot, page)), (slot, page));
    }
}
