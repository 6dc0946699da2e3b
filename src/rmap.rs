//! The reverse map: from an LRU entry (object slot, page index) back to the
//! object and the address where it is mapped, so reclaim can find what to
//! unmap (the kernel's rmap walk).
//!
//! Objects get a slot in a fixed table of atomic pointers. Readers (reclaim,
//! possibly in a signal handler) pin an object inside an RCU read section;
//! removing an object clears its slot and waits a grace period, after which
//! no new pin can be taken, then waits for existing pins to drain.

use crate::object::{Object, ObjectPin};
use crate::sync::rcu::Rcu;
use crate::sys::mem::Mapping;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};

/// Most objects one pager can have mapped at once.
pub const MAX_OBJECTS: usize = 1 << 20;
const QUARANTINE: usize = 64;

/// See the module docs.
#[derive(Debug)]
pub struct ObjectTable {
    slots: Mapping,
    /// Free slots, reused in FIFO order (so consecutive objects land in
    /// different LRU shards), and the high-water mark.
    free: Mutex<(VecDeque<u32>, u32)>,
    grace: Rcu<()>,
}

impl ObjectTable {
    /// An empty table (8 MiB of address space, touched as slots are used).
    pub fn new() -> Result<ObjectTable, i32> {
        Ok(ObjectTable {
            slots: Mapping::anonymous(MAX_OBJECTS * std::mem::size_of::<usize>())?,
            free: Mutex::new((VecDeque::new(), 0)),
            grace: Rcu::new(()),
        })
    }

    fn slot(&self, i: u32) -> &AtomicUsize {
        assert!((i as usize) < MAX_OBJECTS);
        // SAFETY: the mapping holds MAX_OBJECTS zeroed, aligned usizes for
        // the table's life; AtomicUsize has usize's layout.
        unsafe { &*(self.slots.addr() as *const AtomicUsize).add(i as usize) }
    }

    /// Bytes of memory the table holds now (its touched slots).
    pub fn resident_bytes(&self) -> u64 {
        self.slots.resident()
    }

    /// Gives `obj` a slot; returns it. Fails when the table is full.
    pub fn insert(&self, obj: &Arc<Object>) -> Option<u32> {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        // A freed slot is reused only once QUARANTINE others are free: stale
        // LRU entries then rarely name a new object, and consecutive objects
        // spread over the LRU shards.
        let i = if f.0.len() >= QUARANTINE || f.1 as usize >= MAX_OBJECTS {
            f.0.pop_front()?
        } else {
            f.1 += 1;
            f.1 - 1
        };
        self.slot(i).store(Arc::as_ptr(obj) as usize, Release);
        Some(i)
    }

    /// Clears slot `i`; on return no reader can pin its object any more
    /// (existing pins may still be held: see [`Object::wait_unpinned`]).
    pub fn remove(&self, i: u32) {
        self.slot(i).store(0, Release);
        self.grace.replace(());
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        f.0.push_back(i);
    }

    /// Pins the object in slot `i`, if any. Async-signal-safe.
    #[inline]
    pub fn pin(&self, i: u32) -> Option<ObjectPin> {
        if i as usize >= MAX_OBJECTS {
            return None;
        }
        self.grace.read(|_| {
            let p = self.slot(i).load(Acquire);
            // SAFETY: a non-null slot points to a live object: `remove`
            // clears the slot and waits for this read section before the
            // object's owner may free it (after waiting for pins).
            (p != 0).then(|| unsafe { &*(p as *const Object) }.pin())
        })
    }
}
