//! Objects kept after their last region goes: the kernel's page cache,
//! which belongs to the file (its `address_space`) and outlives every
//! `mmap` of it, so that mapping a file again finds its pages cached.
//!
//! When the last region over a shared object is unmapped, the object is
//! written back and, if its store can say whether its contents changed
//! ([`Store::contents_stamp`]), kept here with that stamp: still in the
//! rmap, its pages still resident, charged to the budget and on the LRU,
//! so reclaim frees them as it frees any cached page. A new region over
//! the same store (the same `Arc`), of the same page count and size, takes
//! the object back if the stamp has not moved; otherwise the object is
//! released and the region starts from the store. At most
//! [`Config::keep_unmapped`](crate::address_space::Config) objects are
//! kept, the oldest released first; the pager releases the rest when it
//! goes.
//!
//! Hazard: the stamp sees what changes the store's stamp (for a file: its
//! size and change times). A page another process writes through its own
//! shared mapping, when that page was already dirty there (the kernel
//! updates the times at the first write after a write-back only), is not
//! seen: the same holds within a live region ([`crate::Region::refresh`]).

use crate::object::Object;
use crate::store::Store;
pub(crate) use crate::store::StoreKey;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// One kept object and its store's stamp when it was kept.
#[derive(Debug)]
struct Kept {
    obj: Arc<Object>,
    stamp: u64,
}

/// The kept objects, oldest first. Cost: a mutex and a scan of at most
/// `cap` entries per map and per unmap of a shared region.
#[derive(Debug, Default)]
pub struct KeptObjects {
    list: Mutex<VecDeque<Kept>>,
    /// The stores (their addresses and identities) of objects on their way
    /// here, writing their dirty pages back first
    /// ([`KeptObjects::writing`]).
    writing: Mutex<Vec<StoreKey>>,
    written: std::sync::Condvar,
}

/// An object on its way to be kept, writing its dirty pages back: a map of
/// its store waits until this is dropped ([`KeptObjects::wait_for`]).
pub struct Writing<'a> {
    kept: &'a KeptObjects,
    store: StoreKey,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.kept.written_by(self.store);
    }
}

/// Whether `a` and `b` are the same store (the same allocation).
fn same_store(a: &Arc<dyn Store>, b: &Arc<dyn Store>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl KeptObjects {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Kept>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the store `key` names (an object's
    /// [`store_key`](crate::object::Object::store_key)) as having an object
    /// on its way here while it writes its dirty pages back, until the
    /// guard is dropped (after it is kept, or released and its unwritten
    /// pages listed).
    ///
    /// Hazard: a map of the same store meanwhile would find neither a kept
    /// object nor a listed one, read the store's older bytes, and its own
    /// write-back would put them back over the pages being written. So it
    /// waits ([`KeptObjects::wait_for`]). Not listed as unwritten instead:
    /// the object is still in the rmap and may be mapped again, and a
    /// flush of the listed objects holds plain references, which must
    /// never be the last of such an object.
    pub(crate) fn writing(&self, key: StoreKey) -> Writing<'_> {
        self.writing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(key);
        Writing {
            kept: self,
            store: key,
        }
    }

    /// [`writing`](Self::writing) with no guard: for an object the
    /// application's `munmap` left, from the moment the event hands it to
    /// the release thread until it is released, when the releasing thread
    /// calls [`written_by`](Self::written_by).
    pub(crate) fn mark_writing(&self, key: StoreKey) {
        self.writing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(key);
    }

    /// Ends one [`mark_writing`](Self::mark_writing) (or a [`Writing`]) of
    /// `key` and wakes the maps waiting for it.
    pub(crate) fn written_by(&self, key: StoreKey) {
        let mut w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = w.iter().position(|s| *s == key) {
            w.swap_remove(i);
        }
        drop(w);
        self.written.notify_all();
    }

    /// Waits until no object over the store `key` names, or over a store
    /// of the same file, is on its way here. For a map of any install
    /// kind (an anonymous region over the store reads it too), and for a
    /// flush of a region the application unmapped (by the key taken when
    /// it was mapped: its store may be held by nobody else now).
    pub(crate) fn wait_for(&self, key: StoreKey) {
        let mut w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        while w.iter().any(|k| k.same(&key)) {
            w = self.written.wait(w).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Keeps `obj` (no region maps it; its store's stamp is `stamp`).
    /// Returns what must now be released: the oldest kept objects past
    /// `cap`, or `obj` itself if `cap` is 0, and the kept objects nobody
    /// can map again.
    ///
    /// Hazard: an object is kept only while something else holds its
    /// store, but that can be another object over it (a second region, or
    /// one kept): once the caller's last reference is gone, every
    /// reference left is a kept object's, no map can name the store, and
    /// the objects held their memfds and the store (an open file, a
    /// connection) until newer ones pushed them out. So a store whose
    /// references are all kept objects' has them released here.
    pub fn keep(&self, obj: Arc<Object>, stamp: u64, cap: usize) -> Vec<Arc<Object>> {
        if cap == 0 {
            return vec![obj];
        }
        let mut l = self.lock();
        l.push_back(Kept { obj, stamp });
        let over = l.len().saturating_sub(cap);
        let mut out: Vec<Arc<Object>> = l.drain(..over).map(|k| k.obj).collect();
        // (All decided before any is taken out: one taken out still holds
        // its store.)
        let orphaned: Vec<bool> = l
            .iter()
            .map(|k| {
                let kept = l.iter().filter(|o| same_store(&o.obj.store, &k.obj.store));
                Arc::strong_count(&k.obj.store) <= kept.count()
            })
            .collect();
        let mut flags = orphaned.into_iter();
        let mut left = VecDeque::with_capacity(l.len());
        for k in l.drain(..) {
            if flags.next() == Some(true) {
                out.push(k.obj);
            } else {
                left.push_back(k);
            }
        }
        *l = left;
        out
    }

    /// Takes back the object kept for `store` with `npages` pages of
    /// `1 << shift` bytes, if there is one. `Ok`: its stamp still matches
    /// (the caller maps it); `Err`: the store changed since (the caller
    /// releases it).
    pub fn take(
        &self,
        store: &Arc<dyn Store>,
        npages: usize,
        shift: u32,
    ) -> Option<Result<Arc<Object>, Arc<Object>>> {
        let k = {
            let mut l = self.lock();
            let at = l.iter().position(|k| {
                same_store(&k.obj.store, store)
                    && k.obj.npages() == npages
                    && k.obj.page_shift() == shift
            })?;
            l.remove(at)?
        };
        // (Outside the lock: a file store's stamp is an `fstat`.) Hazard:
        // `k` holds the object's only reference now, and the object is
        // still in the rmap, charged and on the LRU; a panic in the
        // store's own code unwinding from here would free it under
        // reclaim. A panic counts as a changed store instead: the caller
        // releases the object.
        let now = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.contents_stamp()))
            .unwrap_or(None);
        Some(if now == Some(k.stamp) {
            Ok(k.obj)
        } else {
            Err(k.obj)
        })
    }

    /// Calls `f` on every kept object, under the list's lock (no reference
    /// is taken: the report must never hold an object's last one).
    pub fn for_each(&self, mut f: impl FnMut(&Object)) {
        for k in self.lock().iter() {
            f(&k.obj);
        }
    }

    /// Every kept object, for release (the pager is going).
    pub fn drain(&self) -> Vec<Arc<Object>> {
        self.lock().drain(..).map(|k| k.obj).collect()
    }
}
