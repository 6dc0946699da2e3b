//! Non-cooperative events: the application's own `munmap`, `mremap` and
//! `madvise(MADV_DONTNEED)` on region memory (`UFFD_EVENT_UNMAP`, `REMAP`,
//! `REMOVE`), and what the engine does about them.
//!
//! The kernel makes the calling thread wait until the event is read, and
//! until then every userfaultfd ioctl on the descriptor fails with EAGAIN.
//! So every delivery mode has a reader (in-thread delivery gets a thread of
//! its own, `uffd-events`; handler threads read events among fault
//! messages), and EAGAIN means "let the events be read, then retry".
//!
//! # The gate
//! Applying an event changes what the engine believes about a range: the
//! range is gone, has moved, or its pages read as their source again. A
//! fault or an eviction that looked at the range before must not act on it
//! after (an eviction that moved a page out of a range the application has
//! since mapped its own memory into would take the application's page). So
//! every piece of engine work that issues ioctls on user addresses runs in
//! a read section of [`Events::gate`] (a per-CPU rwsem: two RMWs on the
//! CPU's own line), and events are applied under its write side:
//!
//! - With in-thread delivery the event thread takes the gate *before* it
//!   reads: the calling thread stays blocked in its `munmap` until the
//!   engine knows, and nothing can race the change. Faults that hit EAGAIN
//!   while the gate is wanted leave their section and wait.
//! - With handler threads the read comes first (events arrive among fault
//!   messages), then the gate; in the moment between, a fault another
//!   handler is finishing still holds its section on the old view. Its
//!   install would fill whatever registered mapping took the range
//!   meanwhile (the kernel's fill ioctls check only that the destination
//!   is registered with some userfaultfd), so every fill a fault makes
//!   runs only while no event is read and unapplied ([`Events::fill`]),
//!   and the fault restarts otherwise.
//!   An eviction is another matter: its `UFFDIO_MOVE` out of the range
//!   (the kernel checks only the destination's registration) or its
//!   `MADV_DONTNEED` of it would take the application's own new page
//!   there, so evictions act only while no event is read and unapplied
//!   ([`Events::act`]).
//!
//! What each event does:
//! - `REMOVE` (only anonymous regions mapped writable report it): the pages
//!   in the range read as their source again (zeros, or the store): cached
//!   and swapped copies are dropped, installed pages are marked absent (the
//!   caller's zap follows the read).
//! - `UNMAP`: the range is no longer the region's. Pieces outside it stay;
//!   anonymous pages inside are discarded, shared ones stay cached. An
//!   object whose last region it took is released (its dirty pages written
//!   back and synced, then kept or freed) by the pager's release thread
//!   ([`release`]; by the applying thread once it has let go of the gate
//!   and the global lock, where that thread does not run), or by another
//!   holder of it when that one gives its reference back: under the gate
//!   and the lock, a slow store held every fault of the pager for as long
//!   as the write-back took.
//! - `REMAP`: the part inside the moved range is published at its new
//!   address (the kernel moved its PTEs and its registration with it).

use crate::sync::percpu_rwsem::{PercpuRwsem, ReadGuard};
use crate::sys::uffd::{Msg, Uffd, EVENT_REMAP, EVENT_REMOVE, EVENT_UNMAP};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

pub mod apply;
pub(crate) mod coming;
mod records;
pub mod release;

/// The event features a descriptor asks for on top of `base`: `munmap`
/// and `mremap` always; `madvise` unless `quiet`.
pub fn features(base: u64, quiet: bool) -> u64 {
    use crate::sys::uffd::feature;
    let f = base | feature::EVENT_UNMAP | feature::EVENT_REMAP;
    if quiet {
        f
    } else {
        f | feature::EVENT_REMOVE
    }
}

/// An unread `UNMAP` already applied ([`Events`]'s `pre_applied`): the
/// part of the range it unmaps not yet taken by an unmap read, the range
/// a region holds there since, and that region's descriptor (the one the
/// late event comes on).
#[derive(Debug, Clone)]
pub(crate) struct PreApplied {
    pub(crate) key: (usize, usize),
    pub(crate) kept: (usize, usize),
    pub(crate) desc: records::Desc,
}

/// Per-pager event state. See the module docs.
#[derive(Debug, Default)]
pub struct Events {
    /// Read: engine work on user addresses. Write: applying events.
    pub gate: PercpuRwsem,
    /// Serialises handler threads' reads of their descriptors, so the
    /// events they return are queued in the order they were read. The
    /// kernel sends one event at a time (the caller waits until it is
    /// read), and one call can send several (an `mremap` that moves a range
    /// reports the move, then the unmap of what was there before): applied
    /// out of order they would undo each other.
    reads: Mutex<()>,
    /// Events read and not applied yet, in read order, each with the
    /// descriptor it was read from ([`uffd_id`]).
    queue: Mutex<VecDeque<(Event, usize)>>,
    /// Reads in flight plus events queued and not yet applied.
    busy: AtomicU32,
    /// Events in `queue` (changed under its lock; read without it).
    queued: AtomicU32,
    /// The descriptor ([`uffd_id`]) of the event taken off `queue` and
    /// being applied (set under `queue`'s lock); 0: none.
    applying: AtomicUsize,
    /// The descriptors of the moves being applied, outermost first: one
    /// applies older events of other descriptors inside its own
    /// (`apply::older_first`), never of these.
    nested: Mutex<Vec<usize>>,
    /// Handler threads' fills of user pages in flight ([`Events::fill`]):
    /// a read waits for them before it reads.
    filling: AtomicU32,
    /// Objects an applied unmap left to release and not yet released
    /// ([`release::Released`]).
    releasing: AtomicU32,
    /// The release thread's queue ([`release`]).
    release: release::Queue,
    /// Events applied so far.
    applied: AtomicU64,
    /// Unread `UNMAP`s already applied, each by the range it unmaps (the
    /// key) and the range given since to a new or moved region there (the
    /// kernel handed it over): the event, when it is read on that region's
    /// descriptor, takes the parts of the records its range covers, and
    /// must not touch the region there.
    pre_applied: Mutex<Vec<PreApplied>>,
    /// Ranges a move applied has left, with the moved region's descriptor:
    /// the application's `mremap` posts the unmap of the old range after
    /// the move, and a `map` must not land there before that unmap is
    /// applied (it would cut the new region). Dropped when that unmap is
    /// applied, or once the descriptor has no event on its way. (The
    /// descriptor, not the region: a record must not keep an object
    /// alive.)
    left: Mutex<Vec<(usize, usize, records::Desc)>>,
}

/// Which descriptor `uffd` is: its address (the pager's two live as
/// long as the address space, a region's own as long as its object).
pub(crate) fn uffd_id(uffd: &Uffd) -> usize {
    uffd as *const Uffd as usize
}

/// One event, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `madvise` dropped `[start, end)`.
    Remove(usize, usize),
    /// `munmap` removed `[start, end)`.
    Unmap(usize, usize),
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Bytes moved.
        len: usize,
        /// The moved pieces' placement stamp ([`crate::vma::Vma::placed`]),
        /// taken when the event was read: the application's `mremap`
        /// returns then, so a region another pager maps at `to` after
        /// the application's own calls return is placed later, however
        /// late this event is applied. Not one mapped there before the
        /// read: another thread can unmap the moved range and another
        /// pager map there while this event waits to be read (the
        /// SIGBUS handler asks which pager has an event on its way,
        /// [`crate::address_space::Mm::live_claim`], before it compares
        /// placements).
        placed: u64,
    },
}

impl Event {
    /// The event in a message, if it is one the engine applies.
    pub fn of(m: &Msg) -> Option<Event> {
        match m.event {
            EVENT_REMOVE => Some(Event::Remove(m.arg0 as usize, m.arg1 as usize)),
            EVENT_UNMAP => Some(Event::Unmap(m.arg0 as usize, m.arg1 as usize)),
            EVENT_REMAP => Some(Event::Remap {
                from: m.arg0 as usize,
                to: m.arg1 as usize,
                len: m.arg2 as usize,
                placed: crate::vma::next_placement(),
            }),
            _ => None,
        }
    }
}

/// A fill counted in flight ([`Events::fill`]) until dropped, a panic in
/// the fill included (a count left up would hold every read a second).
struct Filling<'a>(&'a AtomicU32);

impl<'a> Filling<'a> {
    fn new(count: &'a AtomicU32) -> Filling<'a> {
        count.fetch_add(1, SeqCst);
        Filling(count)
    }
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Events {
    /// Enters a read section (see the module docs). Async-signal-safe.
    #[inline]
    pub fn section(&self) -> ReadGuard<'_> {
        self.gate.read()
    }

    /// Whether events are waiting to be applied: a section that meets
    /// EAGAIN leaves instead of retrying. One load.
    #[inline]
    pub fn pending(&self) -> bool {
        self.gate.writer_waiting()
    }

    /// Events applied so far: a fault notes it when it starts (one load of
    /// a line written once per event).
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.applied.load(SeqCst)
    }

    /// Whether events may have changed the address space under a fault
    /// that started at `epoch`: some were applied since, or some are being
    /// read or wait to be applied. A fault that found no region then
    /// restarts instead of raising SIGSEGV: the region may be about to
    /// appear where the application moved it.
    #[inline]
    pub fn unsettled_since(&self, epoch: u64) -> bool {
        self.pending() || self.busy.load(SeqCst) != 0 || self.applied.load(SeqCst) != epoch
    }

    /// Whether an event is being read, or was read and waits to be
    /// applied. One load.
    #[inline]
    pub fn in_flight(&self) -> bool {
        self.busy.load(SeqCst) != 0
    }

    /// Waits until no event is being read, waits or is being applied, and
    /// no object an applied unmap left is being released (written back),
    /// whatever its store: for [`Pager::flush_unmapped`](crate::Pager::flush_unmapped),
    /// which writes what every release left. Calls about one store (a
    /// map, a region's unmap, a flush of an unmapped region) take
    /// [`wait_applied`](Self::wait_applied) and then wait for that store's
    /// releases alone ([`crate::kept::KeptObjects::wait_for`]). Yields
    /// while an event is on its way; sleeps (20 µs, growing to 1 ms) while
    /// only a release runs, which takes as long as its store.
    pub fn quiesce(&self) {
        let mut pause = 20_000;
        loop {
            self.wait_applied();
            if self.releasing.load(SeqCst) == 0 {
                return;
            }
            crate::sys::sleep_ns(pause);
            pause = (pause * 2).min(1_000_000);
        }
    }

    /// [`quiesce`](Self::quiesce) without the wait for releases: for a
    /// fault that must restart once the events are applied, and for calls
    /// that need only the address space up to date (populate, protect,
    /// remap, `dontneed`, residency guards, `reclaim_pages`), which the
    /// write-back of an object no region maps does not concern, and for
    /// calls that then wait for one store's releases (a map, a region's
    /// unmap). Async-signal-safe.
    pub fn wait_applied(&self) {
        loop {
            self.gate.wait_for_writers();
            if self.busy.load(SeqCst) == 0 {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Runs `f`, a system call that takes a page out of a user mapping
    /// without the kernel checking that the range is still the region's
    /// (`UFFDIO_MOVE` from it, `MADV_DONTNEED` of it), only while no event
    /// is on its way: `None` (try later) otherwise.
    ///
    /// Hazard: the kernel frees a range the application unmaps before it
    /// posts the event (`__vm_munmap` drops `mmap_lock`, then waits for
    /// the event to be read), so another thread of the application can map
    /// its own memory there and write it before the engine hears of the
    /// unmap; a page the engine looked up before that would take the new
    /// memory with it. `changing` asks the kernel whether such an event is
    /// on its way on the descriptors of the pages `f` acts on
    /// ([`Uffd::mmap_changing`]: the kernel's count covers the window from
    /// before the unmap until the event is read); it is asked last, right
    /// before `f`. What is left is an unmap and another thread's new
    /// mapping both fitting between that question and `f`.
    ///
    /// With handler threads an event is also counted from its read until it
    /// is applied (`busy`, under `reads`, so no read is in flight meanwhile).
    /// In-thread delivery's reader takes the gate before it reads, so the
    /// caller's section covers that part there (and direct reclaim runs in
    /// a signal handler, where no mutex may be taken).
    #[inline]
    pub fn act<R>(
        &self,
        in_thread: bool,
        changing: impl FnOnce() -> bool,
        f: impl FnOnce() -> R,
    ) -> Option<R> {
        if in_thread {
            return (!changing()).then(f);
        }
        let _order = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        // No read in flight (we hold `reads`): `busy` counts events read
        // and not yet applied.
        if self.busy.load(SeqCst) != 0 || changing() {
            return None;
        }
        Some(f())
    }

    /// Runs `f`, a call that fills, maps or protects memory at a user
    /// address (`UFFDIO_COPY`, `ZEROPAGE`, `CONTINUE`, `MOVE` into the
    /// range, `WRITEPROTECT`, `POISON`, `mprotect`), only while no event is
    /// read and not yet applied: `Err(EAGAIN)` otherwise, and the caller
    /// restarts (a fault, once the events are applied).
    ///
    /// Hazard: the kernel's fill ioctls check that the destination is
    /// registered with *a* userfaultfd, not with the descriptor they are
    /// called on (only `MOVE` checks that, and a refused move falls back to
    /// a copy; `mprotect` checks nothing). The kernel refuses them with
    /// EAGAIN from before the application's `munmap` or `mremap` frees a
    /// range until its event is read; with handler threads the event is
    /// read before it is applied (the gate comes second), and the
    /// application's call returns at the read. A fault past its lookup then
    /// filled whatever registered mapping another pager, or this one, had
    /// put in the range meanwhile: its page's bytes in someone else's
    /// memory (`tests/install_after_unmap.rs`). So a fill counts itself in
    /// `filling` and then looks at `busy`; a read counts itself in `busy`
    /// and then waits for `filling` to drain before it reads (both
    /// `SeqCst`: one of the two sees the other). A fill that meets a read
    /// in flight or an event not yet applied takes `reads`, under which no
    /// read is in flight and `busy` counts only events: none, and it counts
    /// itself before it lets go (a read after that waits for it); some,
    /// and it backs off. `f` itself runs with no lock held.
    ///
    /// In-thread delivery's reader takes the gate before it reads, so a
    /// caller's section covers this there (`f` runs at once; a signal
    /// handler may take no mutex). Cost with handler threads: two
    /// read-modify-writes of a shared line and a load per call, and a mutex
    /// where a read is in flight.
    #[inline]
    pub fn fill<R>(&self, in_thread: bool, f: impl FnOnce() -> Result<R, i32>) -> Result<R, i32> {
        if in_thread {
            return f();
        }
        let counted = Filling::new(&self.filling);
        if self.busy.load(SeqCst) != 0 {
            drop(counted);
            let order = self.reads.lock().unwrap_or_else(|e| e.into_inner());
            if self.busy.load(SeqCst) != 0 {
                return Err(libc::EAGAIN);
            }
            let counted = Filling::new(&self.filling);
            drop(order);
            let r = f();
            drop(counted);
            return r;
        }
        let r = f();
        drop(counted);
        r
    }

    /// How long a read waits for the fills in flight before it reads
    /// anyway: a fill's ioctl that faults on its source where only a read
    /// of this pager's could serve it (a store whose
    /// [`page_in_memory`](crate::store::Store::page_in_memory) is region
    /// memory) would otherwise wait for itself.
    const FILL_PATIENCE_NS: u64 = 1_000_000_000;

    /// Waits until no fill is in flight ([`Events::fill`]), at most
    /// [`Self::FILL_PATIENCE_NS`]: spins, then yields. (Never in a signal
    /// handler: readers are threads.)
    fn wait_fills(&self) {
        let mut deadline = 0;
        let mut spins = 0u32;
        while self.filling.load(SeqCst) != 0 {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
                continue;
            }
            let now = crate::sys::now_ns();
            if deadline == 0 {
                deadline = now + Self::FILL_PATIENCE_NS;
            } else if now > deadline {
                tracing::warn!(
                    "a fill of a user page has been in flight for a second; reading the \
                     userfaultfd anyway (is a store's page_in_memory region memory?)"
                );
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Reads up to `msgs.len()` messages from `uffd` (non-blocking; `Ok(0)`:
    /// none) in read order with the other readers, and queues the events
    /// among them for [`apply::queued`]. Waits first for the fills in
    /// flight ([`Events::fill`]).
    pub fn read(&self, uffd: &Uffd, msgs: &mut [Msg]) -> Result<usize, i32> {
        let _order = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        self.busy.fetch_add(1, SeqCst);
        self.wait_fills();
        // (The queue held across the read: an event the kernel has let go
        // of is in the queue for whoever holds it next; see
        // `apply::may_come`. One non-blocking read.)
        let mut q = self.lock_queue();
        let r = uffd.read_msgs(msgs);
        if let Ok(n) = r {
            for e in msgs[..n].iter().filter_map(Event::of) {
                self.busy.fetch_add(1, SeqCst);
                self.queued.fetch_add(1, SeqCst);
                q.push_back((e, uffd_id(uffd)));
            }
        }
        drop(q);
        self.busy.fetch_sub(1, SeqCst);
        r
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<(Event, usize)>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_pre_applied(&self) -> std::sync::MutexGuard<'_, Vec<PreApplied>> {
        self.pre_applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_nested(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.nested.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_left(&self) -> std::sync::MutexGuard<'_, Vec<(usize, usize, records::Desc)>> {
        self.left.lock().unwrap_or_else(|e| e.into_inner())
    }
}
