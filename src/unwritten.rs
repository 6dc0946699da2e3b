//! Objects whose last region went while their dirty pages could not be
//! written back: the kernel keeps a file's dirty page cache after its last
//! `munmap` and its flusher writes it later; the engine keeps the object
//! and writes it when asked.
//!
//! An object no region maps any more whose pages are dirty is listed here
//! from before its last write-back starts until that write-back
//! succeeds (so that a map over its store never misses it while the write
//! is in flight). When it fails (a [`Region::unmap`](crate::Region::unmap)
//! that returns the error, a drop or the application's own `munmap` that
//! can only log it), the object stays here with its pages: out of the
//! rmap and the budget (reclaim cannot reach it), in memory. Its write-back is tried again by
//! [`Pager::flush_unmapped`](crate::Pager::flush_unmapped), before any new
//! region over the same store is mapped (one that cannot be written then
//! refuses the map: the new region would read the store's older bytes,
//! and a later write-back would put them back over its own), and when the
//! pager is dropped, which logs the pages it still cannot write: those
//! alone are lost.
//!
//! # Held objects
//! An object whose last region went while another holder (a residency
//! guard, a flush or a refresh in flight) kept a reference is released,
//! and written back, only when that holder lets go
//! ([`Mm::release_object`](crate::address_space::Mm)). Until then its dirty
//! pages are owed to the store as surely as a listed object's, so such
//! an object is noted too ([`Unwritten::hold`], by its rmap slot and a weak
//! reference, which keeps neither it nor its pages alive), and a map over
//! its store, or a flush of unmapped pages, writes them first
//! (`Mm::flush_unwritten`). Before this, a map of the store meanwhile read
//! the store's older bytes.
//!
//! Cost: an atomic load per map while the lists are empty; a mutex and a
//! scan otherwise.

use crate::object::Object;
use crate::page_cache::{DIRTY, SYNCING, UPTODATE};
use crate::store::Store;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, Weak};

/// The objects waiting for a write-back. See the module docs.
#[derive(Debug, Default)]
pub struct Unwritten {
    list: Mutex<Vec<Arc<Object>>>,
    /// `list.len()`, read without the lock.
    len: AtomicUsize,
    /// Held objects (see the module docs): rmap slot and object.
    held: Mutex<Vec<(u32, Weak<Object>)>>,
    /// `held.len()`, read without the lock.
    held_len: AtomicUsize,
}

/// Which stores' objects a call is about.
#[derive(Clone, Copy)]
pub enum Which<'a> {
    /// Every store.
    All,
    /// The same store as this one: the same allocation, or the same
    /// [`Store::identity`].
    SameAs(&'a Arc<dyn Store>),
    /// Stores with this [`Store::identity`] (a file's device and inode).
    Identity((u64, u64)),
}

impl Which<'_> {
    /// Whether `s` is one of the stores named.
    pub fn matches(self, s: &Arc<dyn Store>) -> bool {
        match self {
            Which::All => true,
            Which::SameAs(b) => {
                std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(b))
                    || s.identity().is_some_and(|i| b.identity() == Some(i))
            }
            Which::Identity(i) => s.identity() == Some(i),
        }
    }
}

/// The number of pages of `obj` owed to its store: cached and dirty, or
/// written by a write-back whose sync has not ended (dirty again if it
/// fails). Reads the state words only.
pub fn owed_pages(obj: &Object) -> usize {
    (0..obj.npages())
        .filter(|&i| owed(obj.cache.load(i)))
        .count()
}

/// Whether `obj` owes any page to its store ([`owed_pages`] above 0;
/// stops at the first).
pub fn owes_pages(obj: &Object) -> bool {
    (0..obj.npages()).any(|i| owed(obj.cache.load(i)))
}

/// Whether a page in state `w` is owed to the store.
fn owed(w: u32) -> bool {
    w & UPTODATE != 0 && w & (DIRTY | SYNCING) != 0
}

/// The number of pages of `obj` that are cached and dirty.
pub fn dirty_pages(obj: &Object) -> usize {
    (0..obj.npages())
        .filter(|&i| obj.cache.load(i) & (UPTODATE | DIRTY) == UPTODATE | DIRTY)
        .count()
}

impl Unwritten {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Object>>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lists `obj` (no region maps it; out of the rmap, or about to be
    /// taken out by its release).
    pub fn add(&self, obj: &Arc<Object>) {
        let mut l = self.lock();
        if !l.iter().any(|o| Arc::ptr_eq(o, obj)) {
            l.push(obj.clone());
        }
        self.len.store(l.len(), Release);
    }

    /// Takes `obj` off the list after a write-back of it succeeded, unless
    /// it has dirty pages again: another write-back of it (a flush and the
    /// release of its last region can run at once) failed and marked its
    /// own pages dirty again. The check is made under the list's lock, and
    /// a failed write-back lists the object again ([`add`](Self::add))
    /// after it marked its pages dirty, so of the two one always leaves it
    /// listed. (Taken off unchecked, the object was gone with those pages,
    /// and the next flush said Ok.)
    pub fn remove_if_written(&self, obj: &Arc<Object>) {
        let mut l = self.lock();
        if dirty_pages(obj) == 0 {
            l.retain(|o| !Arc::ptr_eq(o, obj));
        }
        self.len.store(l.len(), Release);
    }

    /// Notes `obj`, at rmap slot `slot`, as held: no region maps it and
    /// another holder will release it (see the module docs). Notes that
    /// died meanwhile are dropped here.
    pub fn hold(&self, slot: u32, obj: Weak<Object>) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.retain(|(_, w)| w.strong_count() > 0);
        if !h.iter().any(|(_, w)| w.ptr_eq(&obj)) {
            h.push((slot, obj));
        }
        self.held_len.store(h.len(), Release);
    }

    /// Drops the note of `obj` (its release has begun: from there on it
    /// is [`add`](Self::add)ed here if it owes pages).
    pub fn unhold(&self, obj: &Object) {
        if self.held_len.load(Acquire) == 0 {
            return;
        }
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.retain(|(_, w)| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), obj));
        self.held_len.store(h.len(), Release);
    }

    /// The held objects' notes: rmap slot, and a weak reference (to check
    /// what the slot holds against, by address: while the caller holds
    /// it, no other object can take that address; never upgraded, see
    /// `Region`'s `object`).
    pub fn held(&self) -> Vec<(u32, Weak<Object>)> {
        if self.held_len.load(Acquire) == 0 {
            return Vec::new();
        }
        let h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.iter()
            .filter(|(_, w)| w.strong_count() > 0)
            .cloned()
            .collect()
    }

    /// The listed objects over the stores `which` names.
    pub fn over(&self, which: Which<'_>) -> Vec<Arc<Object>> {
        if self.len.load(Acquire) == 0 {
            return Vec::new();
        }
        self.lock()
            .iter()
            .filter(|o| which.matches(&o.store))
            .cloned()
            .collect()
    }

    /// Calls `f` on each listed object, under the list's lock: no
    /// reference is taken, so none can outlive the list's own (see
    /// `Mm::memory_use`'s hazard). `f` must not call back into the list.
    pub fn for_each(&self, mut f: impl FnMut(&Object)) {
        if self.len.load(Acquire) == 0 {
            return;
        }
        for o in self.lock().iter() {
            f(o);
        }
    }

    /// The dirty pages waiting for the stores `which` names, in bytes.
    pub fn bytes(&self, which: Which<'_>) -> u64 {
        if self.len.load(Acquire) == 0 {
            return 0;
        }
        self.lock()
            .iter()
            .filter(|o| which.matches(&o.store))
            .map(|o| (dirty_pages(o) as u64) << o.page_shift())
            .sum()
    }
}
