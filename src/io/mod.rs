//! I/O workers: where the engine calls stores that must not run in the
//! faulting thread, and how every such call ends within a timeout.
//!
//! A store that is not [`Store::signal_safe`] (any store of the
//! application's own, by default) may allocate, lock, log or block, so the
//! engine never calls it in a signal handler: the faulting thread posts the
//! request on a lock-free queue and sleeps on the request's state word (a
//! futex), as `filemap_fault` sleeps on the folio after submitting the read.
//! A worker thread makes the call, as ordinary Rust, into the request's own
//! page buffer, and wakes it.
//!
//! **Every wait ends.** If the call has not returned within
//! [`crate::PagerBuilder::io_timeout`], the faulting thread abandons the
//! request and takes the read-error path (the page is poisoned and the
//! access gets SIGBUS, as with any failed read; a failed write-back keeps
//! the page dirty). The worker, whenever its call returns, finds the
//! request abandoned and frees it: it only ever wrote the request's buffer,
//! never a page of the engine's, so a late read changes nothing. A late
//! *write* could: it still carries the page's old contents, and could land
//! after a newer write of the page. So until an abandoned write's worker
//! has returned, a new write of any of its pages fails at once (`EBUSY`:
//! the page stays dirty and is written by a later write-back). Likewise a
//! read given up on is not sent again while it is still inside the store
//! (a read of the same offset fails at once, `ETIMEDOUT`), so that a
//! fault's retries do not take every worker into a store that did not
//! answer (see [`Io::read`]). Nor do calls to its other pages: one store
//! has at most one fewer calls inside it than there are workers, so the
//! last worker is always free for the others (`Io::store_full`). A store
//! that panics is a failed call (the panic is caught on the worker).
//!
//! # Cost
//! A thread hop per call (tens of µs on an idle vCPU) and a page copy; none
//! for signal-safe stores, which keep the in-thread path. A batch (a
//! readahead window, a write-back batch) is one request and one store call
//! ([`Store::read_many`], [`Store::write_many`]) of up to [`MAX_BATCH`]
//! pages, or one 2 MiB page. Requests are a fixed table ([`SLOTS`] of
//! them, each with 2 MiB of buffer mapped on first use; a request of base
//! pages touches 128 KiB of it, and a 2 MiB request gives the rest back
//! when it is done): a request that finds every slot taken (queued behind
//! slow calls, or stuck) polls for a free one every 20 µs, within its own
//! timeout, and fails with `EBUSY` only then.

use crate::store::{Store, StoreError, MAX_BATCH};
use crate::sync::work_queue::WorkQueue;
use crate::sys::huge::HUGE_PAGE_SIZE;
use crate::sys::mem::Mapping;
use crate::sys::{futex, now_ns, PAGE_SIZE};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;

/// Requests in flight at most.
pub const SLOTS: usize = 64;

/// A request's buffer: one 2 MiB page, or [`MAX_BATCH`] base pages (a
/// base-page request touches only its first [`REQUEST_BYTES`]).
const SLOT_BYTES: usize = HUGE_PAGE_SIZE;

/// The most bytes a request of base pages carries.
const REQUEST_BYTES: usize = MAX_BATCH * PAGE_SIZE;

const FREE: u32 = 0;
/// Claimed by a caller, being filled in.
const CLAIMED: u32 = 1;
const PENDING: u32 = 2;
const RUNNING: u32 = 3;
const DONE: u32 = 4;
/// The caller gave up waiting while the call ran; the worker frees the
/// slot when the call returns.
const ABANDONED: u32 = 5;
/// The caller gave up waiting before the call began: it never runs, and
/// the worker that pops it frees the slot. (Told apart from ABANDONED:
/// a call given up on while queued says nothing of its store, which may
/// have had no worker to run it.)
const DROPPED: u32 = 6;

const READ: u32 = 0;
const WRITE: u32 = 1;
/// [`Store::sync`] (no buffer).
const SYNC: u32 = 2;
/// [`Store::discard`] (no buffer; the offset and length in `offs[0..2]`).
const DISCARD: u32 = 3;

struct Slot {
    state: AtomicU32,
    op: AtomicU32,
    /// A read's offset; a write's page offsets, one per page of the buffer.
    offs: [AtomicU64; MAX_BATCH],
    /// Bytes in the buffer.
    len: AtomicU64,
    /// The store's address, to find a write still running for it.
    store_id: AtomicUsize,
    /// 0, or the errno of the failed call.
    result: AtomicI32,
    /// Set by the caller while CLAIMED, taken by the worker while RUNNING.
    store: UnsafeCell<Option<Arc<dyn Store>>>,
}

/// The I/O workers' shared state. See the module docs.
pub struct Io {
    slots: Box<[Slot]>,
    /// [`MAX_BATCH`] pages per slot, mapped on first use.
    bufs: Mapping,
    queue: WorkQueue,
    timeout_ns: u64,
    /// Spin this long before sleeping, waiting or idle.
    spin_ns: u64,
    /// The most calls one store has inside at a time (set by [`start`]:
    /// one fewer than the workers).
    per_store: AtomicUsize,
    /// Pipes that fill kernel-mapped objects' memfds (`sys::pipe`).
    pub(crate) pipes: crate::sys::pipe::PipePool,
    /// Stores whose sync failed after its caller had given up on it: the
    /// next sync of each reports it. Weak, so that an entry's address is
    /// never another store's (and a dropped store's entry goes). Never
    /// taken in a signal handler (syncs are not made there).
    failed_syncs: std::sync::Mutex<Vec<std::sync::Weak<dyn Store>>>,
}

// SAFETY: a slot's `store` cell is written only by the caller that claimed
// the slot (CLAIMED) and taken only by the worker that moved it to RUNNING
// (or that found it DROPPED before running), so no two threads touch it
// at once; its buffer likewise (caller while CLAIMED or after DONE, worker
// while RUNNING). Everything else is atomic.
unsafe impl Sync for Io {}
// SAFETY: as above; the stores are `Send + Sync`.
unsafe impl Send for Io {}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("timeout_ns", &self.timeout_ns)
            .finish_non_exhaustive()
    }
}

impl Io {
    /// Request state for `timeout_ns`-bounded calls, whose waiters and
    /// idle workers spin `spin_ns` before they sleep.
    pub fn new(timeout_ns: u64, spin_ns: u64) -> Result<Io, i32> {
        Ok(Io {
            slots: (0..SLOTS)
                .map(|_| Slot {
                    state: AtomicU32::new(FREE),
                    op: AtomicU32::new(READ),
                    offs: std::array::from_fn(|_| AtomicU64::new(0)),
                    len: AtomicU64::new(0),
                    store_id: AtomicUsize::new(0),
                    result: AtomicI32::new(0),
                    store: UnsafeCell::new(None),
                })
                .collect(),
            bufs: Mapping::anonymous(SLOTS * SLOT_BYTES)?,
            queue: WorkQueue::new(SLOTS * 2),
            timeout_ns,
            spin_ns,
            per_store: AtomicUsize::new(usize::MAX),
            pipes: Default::default(),
            failed_syncs: Default::default(),
        })
    }

    /// Bytes of memory the request buffers hold now.
    pub fn resident_bytes(&self) -> u64 {
        self.bufs.resident()
    }

    fn buf(&self, k: usize) -> *mut u8 {
        (self.bufs.addr() + k * SLOT_BYTES) as *mut u8
    }

    /// Reads `buf.len()` (at most [`MAX_BATCH`] pages) bytes at `off` from
    /// `store` on a worker, in one [`Store::read`] or [`Store::read_many`]
    /// call, waiting at most the timeout. Async-signal-safe.
    ///
    /// Hazard: a read the store has not answered within the timeout is
    /// not sent again until that read returns: a read of the same offset
    /// fails at once (`ETIMEDOUT`). Sent on, each try took another worker
    /// into the store after the first (a fault's own retries at once),
    /// until every worker was inside it and every other store's requests
    /// queued behind them, timed out and failed (found by review: a
    /// healthy region's pages were poisoned beside a hung one). Reads of
    /// other offsets go on: one page's hang does not take the store down.
    pub fn read(&self, store: &Arc<dyn Store>, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let id = Arc::as_ptr(store) as *const u8 as usize;
        if self.given_up_inside(id, READ, Some(off)) {
            return Err(StoreError(libc::ETIMEDOUT));
        }
        let k = self.submit(store, READ, buf.len(), |s, _| s.offs[0].store(off, Relaxed))?;
        self.wait(k, |p| {
            // SAFETY: the slot is DONE and ours again: the worker wrote its
            // buffer and no longer touches it.
            buf.copy_from_slice(unsafe { std::slice::from_raw_parts(p, buf.len()) })
        })
    }

    /// Writes each `(offset, page)` of `pages` (at most [`MAX_BATCH`]
    /// whole 4 KiB pages, or one 2 MiB page) to `store` on a worker, in one
    /// [`Store::write`] or [`Store::write_many`] call, waiting at most the
    /// timeout. Async-signal-safe.
    pub fn write(&self, store: &Arc<dyn Store>, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let huge = matches!(pages, [(_, p)] if p.len() == HUGE_PAGE_SIZE);
        if !huge && (pages.len() > MAX_BATCH || pages.iter().any(|(_, p)| p.len() != PAGE_SIZE)) {
            return Err(StoreError(libc::EINVAL));
        }
        if self.stale_write_running(store, pages) {
            return Err(StoreError(libc::EBUSY));
        }
        let len = pages.iter().map(|(_, p)| p.len()).sum();
        let k = self.submit(store, WRITE, len, |s, p| {
            let mut at = 0;
            for (n, (off, page)) in pages.iter().enumerate() {
                s.offs[n].store(*off, Relaxed);
                // SAFETY: the slot is CLAIMED by us: nobody else touches its
                // buffer, which holds SLOT_BYTES (checked by `submit`'s
                // caller above: 32 base pages or one huge page).
                unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), p.add(at), page.len()) }
                at += page.len();
            }
        })?;
        self.wait(k, |_| {})
    }

    /// Runs [`Store::sync`] of `store` on a worker, waiting at most the
    /// timeout (then `ETIMEDOUT`); a panic in it fails it (`EIO`).
    ///
    /// Hazard: the kernel reports a failed write-back once per open file
    /// (its `errseq`). A sync given up on goes on, and if it fails it takes
    /// that report with it: a later sync of writes the failure dropped
    /// would say 0. So while one given up on still runs, another of the
    /// same store is refused (`EBUSY`: it could race it for the report),
    /// and one that failed after its caller left is reported by the next
    /// sync of its store (`EIO`). The write-back that gets either keeps its
    /// pages dirty, as after any failed sync.
    pub fn sync(&self, store: &Arc<dyn Store>) -> Result<(), StoreError> {
        let id = Arc::as_ptr(store) as *const u8 as usize;
        // (Running first: a sync given up on records its failure before
        // its slot is freed.)
        if self.given_up_inside(id, SYNC, None) {
            return Err(StoreError(libc::EBUSY));
        }
        let failed = {
            let mut l = self.failed_syncs.lock().unwrap_or_else(|e| e.into_inner());
            l.retain(|w| w.strong_count() > 0);
            let k = l
                .iter()
                .position(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(store)));
            k.map(|k| l.swap_remove(k)).is_some()
        };
        if failed {
            return Err(StoreError(libc::EIO));
        }
        let k = self.submit(store, SYNC, 0, |_, _| {})?;
        self.wait(k, |_| {})
    }

    /// Runs [`Store::discard`] of `[off, off + len)` of `store` on a
    /// worker, waiting at most the timeout: for a store that is not
    /// signal-safe, which is called nowhere else. First waits, at most the
    /// timeout too, for writes to the store given up on (still inside the
    /// store): one landing after the discard would leave its copy behind.
    pub fn discard(&self, store: &Arc<dyn Store>, off: u64, len: u64) -> Result<(), StoreError> {
        let id = Arc::as_ptr(store) as *const u8 as usize;
        let deadline = now_ns().saturating_add(self.timeout_ns);
        while self.given_up_inside(id, WRITE, None) && now_ns() < deadline {
            crate::sys::sleep_ns(1_000_000);
        }
        let k = self.submit(store, DISCARD, 0, |s, _| {
            s.offs[0].store(off, Relaxed);
            s.offs[1].store(len, Relaxed);
        })?;
        self.wait(k, |_| {})
    }

    /// Whether a call `op` to the store at `id` (at offset `off`, if
    /// given) that its caller gave up on is still inside the store
    /// (ABANDONED: its worker has not returned). Async-signal-safe
    /// (atomics only).
    fn given_up_inside(&self, id: usize, op: u32, off: Option<u64>) -> bool {
        self.slots.iter().any(|s| {
            s.state.load(Acquire) == ABANDONED
                && s.op.load(Relaxed) == op
                && s.store_id.load(Relaxed) == id
                && off.is_none_or(|o| s.offs[0].load(Relaxed) == o)
        })
    }

    /// A sync of `store` failed after its caller gave up on it (called
    /// while the worker still holds `store`, before the slot is freed).
    fn failed_sync_given_up(&self, store: &Arc<dyn Store>) {
        // (Nobody else holds it: nobody will sync it again.)
        if Arc::strong_count(store) == 1 {
            return;
        }
        let mut l = self.failed_syncs.lock().unwrap_or_else(|e| e.into_inner());
        if !l
            .iter()
            .any(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(store)))
        {
            l.push(Arc::downgrade(store));
        }
    }

    /// Claims a slot, fills it in and queues it.
    fn submit(
        &self,
        store: &Arc<dyn Store>,
        op: u32,
        len: usize,
        fill: impl FnOnce(&Slot, *mut u8),
    ) -> Result<usize, StoreError> {
        if len > SLOT_BYTES || (len > MAX_BATCH * PAGE_SIZE && len != HUGE_PAGE_SIZE) {
            return Err(StoreError(libc::EINVAL));
        }
        // Every slot taken (by requests queued behind slow calls, or by
        // calls stuck in the store): wait for one to come free, within the
        // request's own timeout. Failing at once made a burst of faults on
        // a healthy but slow store count failed reads and poison pages.
        let claim = || {
            (0..SLOTS).find(|&k| {
                self.slots[k]
                    .state
                    .compare_exchange(FREE, CLAIMED, Acquire, Relaxed)
                    .is_ok()
            })
        };
        let deadline = now_ns().saturating_add(self.timeout_ns);
        let k = loop {
            if let Some(k) = claim() {
                break k;
            }
            if now_ns() >= deadline {
                return Err(StoreError(libc::EBUSY));
            }
            // (nanosleep: async-signal-safe.)
            std::thread::sleep(std::time::Duration::from_micros(20));
        };
        let s = &self.slots[k];
        s.op.store(op, Relaxed);
        s.store_id
            .store(Arc::as_ptr(store) as *const u8 as usize, Relaxed);
        s.len.store(len as u64, Relaxed);
        s.result.store(0, Relaxed);
        // SAFETY: CLAIMED: this thread alone touches the cell (see the
        // `Sync` impl). Cloning an Arc is one atomic increment, and the old
        // value is `None` (workers take it), so nothing is dropped here.
        unsafe { *s.store.get() = Some(store.clone()) };
        fill(s, self.buf(k));
        s.state.store(PENDING, Release);
        if !self.queue.push(k as u64) {
            // Cannot happen (the queue holds twice the slots); undo.
            // SAFETY: still ours (nobody was told of it).
            drop(unsafe { (*s.store.get()).take() });
            s.state.store(FREE, Release);
            return Err(StoreError(libc::EBUSY));
        }
        self.queue.kick();
        Ok(k)
    }

    /// Whether a write its caller gave up on (ABANDONED: the worker may
    /// still be inside the store call, and a store may retry it) is still
    /// out for one of `pages` of `store`. Writing the page now could race
    /// it: the old write could land after the new one and leave the store
    /// stale behind a clean page. Such a page stays dirty for a later
    /// write-back instead. Async-signal-safe (atomics only).
    ///
    /// No abandon can slip in after the scan: the caller of the old write
    /// abandoned it while holding the page's lock, which the caller of the
    /// new one holds now.
    fn stale_write_running(&self, store: &Arc<dyn Store>, pages: &[(u64, &[u8])]) -> bool {
        let id = Arc::as_ptr(store) as *const u8 as usize;
        self.slots.iter().any(|s| {
            s.state.load(Acquire) == ABANDONED
                && s.op.load(Relaxed) == WRITE
                && s.store_id.load(Relaxed) == id
                && {
                    let n = match s.len.load(Relaxed) as usize {
                        HUGE_PAGE_SIZE => 1,
                        len => (len / PAGE_SIZE).min(MAX_BATCH),
                    };
                    s.offs[..n]
                        .iter()
                        .any(|o| pages.iter().any(|(off, _)| *off == o.load(Relaxed)))
                }
        })
    }

    /// Waits for slot `k` until DONE or the timeout; `done` gets its
    /// buffer, then the slot is freed. On timeout the slot is abandoned to
    /// the worker.
    fn wait(&self, k: usize, done: impl FnOnce(*mut u8)) -> Result<(), StoreError> {
        let s = &self.slots[k];
        let start = now_ns();
        let deadline = start.saturating_add(self.timeout_ns);
        if self.spin_ns > 0 {
            let until = start + self.spin_ns.min(self.timeout_ns);
            while s.state.load(Acquire) != DONE && now_ns() < until {
                std::hint::spin_loop();
            }
        }
        loop {
            let st = s.state.load(Acquire);
            if st == DONE {
                let r = s.result.load(Relaxed);
                if r == 0 {
                    done(self.buf(k));
                }
                self.give_back_tail(k);
                s.state.store(FREE, Release);
                return if r == 0 { Ok(()) } else { Err(StoreError(r)) };
            }
            let now = now_ns();
            if now >= deadline {
                let gave_up = if st == PENDING { DROPPED } else { ABANDONED };
                if s.state
                    .compare_exchange(st, gave_up, AcqRel, Relaxed)
                    .is_ok()
                {
                    return Err(StoreError(libc::ETIMEDOUT));
                }
                continue;
            }
            futex::wait_timeout(&s.state, st, deadline - now);
        }
    }
}

mod call;
mod worker;
pub(crate) use call::{caught, discard, page_in_memory};
pub use call::{read, write};
pub use worker::start;

#[cfg(test)]
mod tests;
