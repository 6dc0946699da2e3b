//! [`Windows`]: where an object's pages are mapped, read locklessly by
//! reclaim under a sequence count.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};

/// Most windows one object can be mapped through at once. A region the
/// application splits with its own `munmap` maps its object through one
/// window per piece; pieces past this many are not found by reclaim, so
/// their pages stay resident until the region goes.
pub const WINDOWS: usize = 4;

/// The object's mapped windows: `(first page, end page, base)` where page
/// `i` of the window is at `base + (i << shift)`, in the object's page
/// size. Written by address-space writers (under the global write lock, so
/// one at a time), read locklessly by reclaim under a sequence count (a
/// seqlock).
#[derive(Debug)]
pub struct Windows {
    seq: AtomicU32,
    shift: u32,
    w: [[AtomicUsize; 3]; WINDOWS],
    /// A [`Windows::set`] had more windows than these (never cleared).
    overflow: AtomicBool,
}

/// One window: object pages `[first, end)` at `base + (i << shift)`.
pub type Window = (usize, usize, usize);

impl Windows {
    /// No windows, for pages of `1 << shift` bytes.
    pub fn new(shift: u32) -> Windows {
        Windows {
            seq: AtomicU32::new(0),
            shift,
            w: Default::default(),
            overflow: AtomicBool::new(false),
        }
    }

    /// The user address of page `i`, if a window maps it. Async-signal-safe.
    #[inline]
    pub fn addr_of(&self, i: usize) -> Option<usize> {
        loop {
            let s = self.seq.load(Acquire);
            if s & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            let mut found = None;
            for w in &self.w {
                let (first, end) = (w[0].load(Relaxed), w[1].load(Relaxed));
                if i >= first && i < end {
                    found = Some(w[2].load(Relaxed).wrapping_add(i << self.shift));
                    break;
                }
            }
            std::sync::atomic::fence(Acquire);
            if self.seq.load(Relaxed) == s {
                return found;
            }
        }
    }

    /// Whether no window maps any page. Atomics only; a torn read is
    /// possible while a writer changes them (the caller checks again where
    /// that matters).
    pub fn is_empty(&self) -> bool {
        self.w
            .iter()
            .all(|w| w[1].load(Relaxed) <= w[0].load(Relaxed))
    }

    /// The windows now (for writers).
    pub fn get(&self) -> Vec<Window> {
        self.w
            .iter()
            .map(|w| (w[0].load(Relaxed), w[1].load(Relaxed), w[2].load(Relaxed)))
            .filter(|w| w.1 > w.0)
            .collect()
    }

    /// Replaces the windows (the caller holds the global write lock).
    /// Returns false if there were more than [`WINDOWS`] (the rest are
    /// dropped: their pages are then out of reclaim's reach).
    pub fn set(&self, list: &[Window]) -> bool {
        self.seq.fetch_add(1, Acquire);
        std::sync::atomic::fence(Release);
        for (k, w) in self.w.iter().enumerate() {
            let (first, end, base) = list.get(k).copied().unwrap_or((0, 0, 0));
            w[0].store(first, Relaxed);
            w[1].store(end, Relaxed);
            w[2].store(base, Relaxed);
        }
        // Sticky: `replace` builds the next list from the held windows
        // only, so a piece dropped once stays unknown for good.
        if list.len() > WINDOWS {
            self.overflow.store(true, Relaxed);
        }
        self.seq.fetch_add(1, Release);
        list.len() <= WINDOWS
    }

    /// Whether a window was ever dropped (more than [`WINDOWS`]): a page
    /// [`Windows::addr_of`] does not find may be mapped all the same.
    pub fn overflowed(&self) -> bool {
        self.overflow.load(Relaxed)
    }

    /// Replaces the window covering exactly `[first, end)` (if any) by
    /// `new`; returns [`Windows::set`]'s answer.
    pub fn replace(&self, first: usize, end: usize, new: &[Window]) -> bool {
        let mut list: Vec<Window> = self
            .get()
            .into_iter()
            .filter(|w| (w.0, w.1) != (first, end))
            .collect();
        list.extend(new.iter().copied().filter(|w| w.1 > w.0));
        self.set(&list)
    }
}
