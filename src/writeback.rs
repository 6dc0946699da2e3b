//! Write-back (`mm/page-writeback.c`, the `msync` analog): every dirty page
//! of a shared object goes to its store, in batches of up to
//! [`MAX_BATCH`] pages, each batch one [`Store::write_many`] call (one
//! pipeline for a networked store).
//!
//! A mapped page is write-protected again before it is written, so a write
//! that races the write-back faults, waits for the page lock and marks the
//! page dirty anew. A batch holds its pages' locks from the first lock to
//! the store call's end; only the first is waited for: a later page that is
//! busy ends the batch first, so the write-back never blocks on a page lock
//! while it holds another. A failed batch keeps every page of it dirty and
//! ends the write-back with its error (a store that is down is not asked
//! again for every other batch).
//!
//! A write-back of a mapped object write-protects pages at their
//! addresses, so it runs in an event-gate read section (see
//! [`crate::events`]): an unmap the application made cannot be applied
//! halfway. [`Gate::Sections`] takes one per batch of writes, and lets a
//! waiting event in between batches, where no page lock is held; the
//! store's sync runs outside any. Holding one section across every batch
//! and the sync, a slow store held the application's `munmap` of any
//! region (its event is read only once it can be applied) and, behind
//! the event, every fault of the pager, for as long as the sync took
//! (`tests/reclaim_flush.rs`).
//!
//! An object no region maps whose write-back failed waits in
//! [`crate::unwritten`]; [`Mm::flush_unwritten`] tries it again, and
//! first writes the pages of held ones (no region maps them, a residency
//! guard or a flush in flight keeps them).
//!
//! [`Store::write_many`]: crate::store::Store::write_many

use crate::address_space::Mm;
use crate::durability::Synced;
use crate::error::Result;
use crate::object::{InstallKind, Object};
use crate::page_cache::{DIRTY, GUARDS, MAPPED, SYNCING, UPTODATE};
use crate::stats::Counter::WRITEBACK;
use crate::store::MAX_BATCH;
use crate::unwritten::Which;
use std::sync::Arc;

/// How a write-back stands to the event gate (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Gate {
    /// The caller holds the gate's write side (it applies an event) or
    /// needs none (no region maps the object any more), for the whole
    /// write-back.
    Held,
    /// The write-back takes a read section per batch of writes; the
    /// caller holds no section.
    Sections,
}

/// Pages of one batch: index, and whether it is protected against writes
/// (so its dirty bit may be cleared once written).
/// Why a write-back left pages dirty that it wrote from a copy (a page
/// under a residency guard aside: see `Region::flush_range`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LeftDirty {
    /// The kernel refused a page's write protection with EAGAIN: an unmap
    /// or remap on the descriptor is on its way; once it is applied, a
    /// second pass may clean the page.
    pub changing: bool,
    /// A mapped page could not be write-protected for another reason (see
    /// `Batch::stuck`): another pass will not clean it.
    pub stuck: bool,
}

struct Batch {
    pages: [(usize, bool); MAX_BATCH],
    n: usize,
    /// Pages written and marked clean, until the store's sync says they
    /// are durable.
    cleaned: Vec<usize>,
    /// A page's write protection was refused with EAGAIN.
    changing: bool,
    /// A mapped page no guard holds could not be write-protected for
    /// another reason: no window gives its address (an object in more
    /// pieces than [`crate::object::WINDOWS`]), or the kernel refused with
    /// another errno. It was written from a copy and stays dirty.
    stuck: bool,
    /// Pages passed by because another write-back's sync of them was in
    /// flight (`SYNCING`).
    met_syncing: Vec<usize>,
}

/// Marks the pages `cleaned` dirty again (each under its page lock), and
/// no longer syncing. (One the application discarded meanwhile stays
/// absent: its contents are gone by its own hand.)
fn dirty_again(obj: &Object, cleaned: &[usize]) {
    for &i in cleaned {
        let w = obj.cache.lock(i);
        let set = if w & UPTODATE != 0 { DIRTY } else { 0 };
        obj.cache.unlock(i, set, SYNCING);
    }
}

/// Waits (if `wait`) until none of pages `met` is being synced by another
/// write-back (each such write-back ends its sync by clearing `SYNCING`:
/// the page is durable, or dirty again); returns those dirty again, in
/// order. Gives up with EBUSY after 30 s (a write-back that never ended).
fn settle_syncing(obj: &Object, met: &[usize], wait: bool) -> Result<Vec<usize>> {
    let t = std::time::Instant::now();
    let mut again = Vec::new();
    for &i in met {
        while wait && obj.cache.load(i) & SYNCING != 0 {
            if t.elapsed() > std::time::Duration::from_secs(30) {
                return Err(crate::store::StoreError(libc::EBUSY).into());
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if obj.cache.load(i) & (UPTODATE | DIRTY) == UPTODATE | DIRTY {
            again.push(i);
        }
    }
    Ok(again)
}

/// The pages `cleaned` are durable: reclaim may take them.
///
/// Hazard: two write-backs of one object at once may both have cleaned a
/// page (the application wrote it again between them). The first to
/// finish lets reclaim take it while the second's sync may still fail,
/// and that page then cannot go dirty again. Only a page written between
/// two write-backs' syncs is exposed, not the common case of one slow
/// sync with reclaim running beside it.
fn synced(obj: &Object, cleaned: &[usize]) {
    for &i in cleaned {
        obj.cache.update(i, 0, SYNCING);
    }
}

impl Mm {
    /// Writes every dirty page of a shared object back to its store and
    /// syncs it. Anonymous objects are private copies: nothing to write.
    pub(crate) fn writeback_object(&self, obj: &Object, gate: Gate) -> Result<()> {
        self.writeback_pages_changing(obj, 0..obj.npages(), gate)
            .map(|_| ())
    }

    /// [`writeback_object`](Self::writeback_object) of object pages
    /// `pages` only (clipped to the object), and why pages were written
    /// from a copy and stay dirty, if any were ([`LeftDirty`]: a write
    /// protection the kernel refused with EAGAIN, for an event on its way
    /// on the descriptor, or one that could not be made at all).
    ///
    /// Hazard: a page another write-back wrote and is syncing (`SYNCING`)
    /// is not dirty, so this one passes it by; if that sync fails, the
    /// page is dirty again, and not durable, after this one said Ok (found
    /// by review: a second flush, or a `flush_range` whose caller then
    /// changed the store, over a page the first flush's failed sync lost).
    /// So such pages are waited for once this write-back's own sync is
    /// done, and those dirty again are written and synced by it too.
    pub(crate) fn writeback_pages_changing(
        &self,
        obj: &Object,
        pages: std::ops::Range<usize>,
        gate: Gate,
    ) -> Result<LeftDirty> {
        if obj.kind != InstallKind::Shared || !obj.store_writes() {
            return Ok(LeftDirty::default());
        }
        let (left, met) = self.writeback_pass(obj, pages, gate)?;
        // (A caller that holds the event gate does not wait: the other
        // write-back may be waiting for a section between its batches.)
        let again = settle_syncing(obj, &met, gate == Gate::Sections)?;
        match (again.first(), again.last()) {
            (Some(&lo), Some(&hi)) => {
                // (Pages still being synced by a third write-back now are
                // that one's to report.)
                let (more, _) = self.writeback_pass(obj, lo..hi + 1, gate)?;
                Ok(LeftDirty {
                    changing: left.changing || more.changing,
                    stuck: left.stuck || more.stuck,
                })
            }
            _ => Ok(left),
        }
    }

    /// One pass of [`writeback_pages_changing`](Self::writeback_pages_changing):
    /// whether a page stayed dirty for an event on its way, and the pages
    /// passed by while another write-back synced them.
    fn writeback_pass(
        &self,
        obj: &Object,
        pages: std::ops::Range<usize>,
        gate: Gate,
    ) -> Result<(LeftDirty, Vec<usize>)> {
        let mut b = Batch {
            pages: [(0, false); MAX_BATCH],
            n: 0,
            cleaned: Vec::new(),
            changing: false,
            stuck: false,
            met_syncing: Vec::new(),
        };
        // (Before any write of this write-back's: see `Durability::sync`.)
        let first = obj.durability.first_mark();
        if let Err(e) = self.write_dirty(obj, pages, &mut b, gate) {
            // The pages of the batches written before the one that failed
            // are clean, but not synced: dirty again, as after a failed
            // sync below. (Left clean, a failed sync after this, which
            // rewrites only its own pages, lost them while the next
            // flush said Ok.)
            dirty_again(obj, &b.cleaned);
            return Err(e);
        }
        // Durable: this write-back's writes, and reclaim's before it (see
        // `crate::durability`).
        let mine = obj.durability.mark();
        let err = match obj.durability.sync(first, mine, !b.cleaned.is_empty(), || {
            self.io.sync(&obj.store)
        }) {
            Synced::Done => {
                synced(obj, &b.cleaned);
                let left = LeftDirty {
                    changing: b.changing,
                    stuck: b.stuck,
                };
                return Ok((left, b.met_syncing));
            }
            Synced::Failed(e) => e,
            Synced::FailedBefore => crate::store::StoreError(libc::EIO),
        };
        // Written but not durable (after a failed `fsync` the kernel may
        // already have dropped its copy): dirty again, so that the next
        // write-back writes them once more.
        dirty_again(obj, &b.cleaned);
        Err(err.into())
    }

    /// Writes the dirty pages of `pages` in batches (`b`), recording the
    /// pages each batch cleaned in `b.cleaned`; in read sections as `gate`
    /// says, left by the time it returns.
    fn write_dirty(
        &self,
        obj: &Object,
        pages: std::ops::Range<usize>,
        b: &mut Batch,
        gate: Gate,
    ) -> Result<()> {
        let mut section = None;
        for i in pages.start..pages.end.min(obj.npages()) {
            let w = obj.cache.load(i);
            if w & (UPTODATE | DIRTY) != UPTODATE | DIRTY {
                if w & SYNCING != 0 {
                    b.met_syncing.push(i);
                }
                continue;
            }
            // Between batches (no page lock held, which an event being
            // applied may wait for): a waiting event goes first.
            if gate == Gate::Sections && b.n == 0 {
                if self.events.pending() {
                    section = None;
                }
                section.get_or_insert_with(|| self.events.section());
            }
            let w = if b.n == 0 {
                obj.cache.lock(i)
            } else {
                match obj.cache.try_lock(i) {
                    Ok(w) => w,
                    Err(_) => {
                        self.write_batch(obj, b)?;
                        obj.cache.lock(i)
                    }
                }
            };
            if w & (UPTODATE | DIRTY) != UPTODATE | DIRTY {
                if w & SYNCING != 0 {
                    b.met_syncing.push(i);
                }
                obj.cache.unlock(i, 0, 0);
                continue;
            }
            // A guarded page (`Region::lock_resident`) keeps its mapping as
            // it is: protected again, a system call's write into it would
            // fail with EFAULT where the kernel does not deliver the fault
            // (in-thread delivery, a user-mode-only descriptor). It is
            // written, and stays dirty. (A guard taken after this look
            // faults the page in first: that fault waits for the page lock
            // this holds, then lifts the protection again.)
            let protected = w & MAPPED == 0
                || w & GUARDS == 0 && {
                    let done = obj.windows.addr_of(i).ok_or(0).and_then(|a| {
                        // (As a fill: not while an event is read and not
                        // applied, when `a` may be another region's; see
                        // `Events::fill`.)
                        let in_thread = self.config.delivery.is_in_thread();
                        self.events.fill(in_thread, || {
                            self.uffd_for(obj)
                                .writeprotect(a, obj.page_size(), true, false)
                        })
                    });
                    match done {
                        Ok(_) => true,
                        Err(libc::EAGAIN) => {
                            b.changing = true;
                            false
                        }
                        Err(_) => {
                            b.stuck = true;
                            false
                        }
                    }
                };
            b.pages[b.n] = (i, protected);
            b.n += 1;
            if b.n == MAX_BATCH {
                self.write_batch(obj, b)?;
            }
        }
        self.write_batch(obj, b)
    }

    /// Writes the batch's pages in one store call and unlocks them.
    fn write_batch(&self, obj: &Object, b: &mut Batch) -> Result<()> {
        if b.n == 0 {
            return Ok(());
        }
        let mut r = Ok(());
        // A page left writable (a guarded one, or one whose protection
        // failed) may be written by the application while the store reads
        // it: it is copied through the kernel first, never lent to the
        // store as a slice of memory that changes under it. (It stays
        // dirty, so a torn copy is written again.)
        let copies: Vec<Option<crate::sys::PagesBuf>> = if b.pages[..b.n].iter().all(|p| p.1) {
            Vec::new()
        } else {
            b.pages[..b.n]
                .iter()
                .map(|&(i, protected)| match protected {
                    true => None,
                    false => obj
                        .copy_page_out(i)
                        .map_err(|e| r = Err(crate::store::StoreError(e)))
                        .ok(),
                })
                .collect()
        };
        let mut list: [(u64, &[u8]); MAX_BATCH] = [(0, &[]); MAX_BATCH];
        for (k, &(i, protected)) in b.pages[..b.n].iter().enumerate() {
            let off = (i << obj.page_shift()) as u64;
            if !protected {
                if let Some(Some(c)) = copies.get(k) {
                    list[k] = (off, c.as_bytes());
                }
                continue;
            }
            // SAFETY: we hold page `i`'s lock and it is protected against
            // writes (unmapped, or write-protected above): its contents are
            // only read, and the slice lives until the page is unlocked
            // below.
            match unsafe { obj.page_to_write_out(i) } {
                Ok(p) => list[k] = (off, p),
                Err(e) => r = Err(crate::store::StoreError(e)),
            }
        }
        if r.is_ok() {
            r = obj
                .durability
                .write(|| crate::io::write(&self.io, &obj.store, &list[..b.n]));
        }
        for &(i, protected) in &b.pages[..b.n] {
            let clear = if r.is_ok() && protected { DIRTY } else { 0 };
            let set = if clear != 0 {
                b.cleaned.push(i);
                SYNCING
            } else {
                0
            };
            obj.cache.unlock(i, set, clear);
            if r.is_ok() {
                self.counters.inc(WRITEBACK);
            }
        }
        b.n = 0;
        Ok(r?)
    }

    /// Writes back the dirty pages of held objects ([`crate::unwritten`]:
    /// no region maps them, another holder keeps them), and tries the
    /// write-back of the unmapped objects whose write-back failed again:
    /// those over the stores `which` names. Frees the listed ones written;
    /// keeps the rest and returns the first error.
    pub(crate) fn flush_unwritten(&self, which: Which<'_>) -> Result<()> {
        let mut r = self.flush_held(|o| which.matches(&o.store));
        for obj in self.unwritten.over(which) {
            r = r.and(self.flush_one_unwritten(&obj));
        }
        r
    }

    /// [`flush_unwritten`](Self::flush_unwritten) for the object at `obj`
    /// alone: `Ok` at once if none is kept there.
    pub(crate) fn flush_unwritten_object(&self, obj: *const Object) -> Result<()> {
        self.flush_held(|o| std::ptr::eq(o, obj))?;
        let kept = self.unwritten.over(Which::All);
        match kept.iter().find(|o| std::ptr::eq(Arc::as_ptr(o), obj)) {
            Some(o) => self.flush_one_unwritten(o),
            None => Ok(()),
        }
    }

    /// The bytes of pages owed to the stores `which` names by unmapped
    /// objects: the dirty pages of those listed as unwritten, and the
    /// owed pages (dirty, or mid-sync) of held ones (`crate::unwritten`'s
    /// module docs). An object being released can be counted twice, for
    /// the moment between its listing and the end of its note.
    pub(crate) fn unwritten_bytes(&self, which: Which<'_>) -> u64 {
        let mut b = self.unwritten.bytes(which);
        self.each_held(|o| {
            if which.matches(&o.store) {
                b += (crate::unwritten::owed_pages(o) as u64) << o.page_shift();
            }
        });
        b
    }

    /// Writes back the dirty pages of the held objects (`crate::unwritten`'s
    /// module docs) that `pick` picks. No region maps a held object, so no
    /// gate is needed.
    fn flush_held(&self, pick: impl Fn(&Object) -> bool) -> Result<()> {
        let mut r = Ok(());
        self.each_held(|o| {
            if pick(o) {
                let written = self.writeback_object(o, Gate::Held);
                if r.is_ok() {
                    r = written;
                }
            }
        });
        r
    }

    /// Calls `f` with each held object (`crate::unwritten`'s module docs)
    /// still held, pinned. Each is pinned through the rmap, which a release
    /// leaves only after it has listed the object's owed pages, so one
    /// released meanwhile is found on the unwritten list instead. The slot
    /// is checked to hold the noted object: the note's weak reference,
    /// held across the check and the call, keeps another from taking its
    /// address.
    fn each_held(&self, mut f: impl FnMut(&Object)) {
        for (slot, w) in self.unwritten.held() {
            if let Some(pin) = self.objects.pin(slot) {
                if std::ptr::eq(&*pin, w.as_ptr()) {
                    f(&pin);
                }
            }
            drop(w);
        }
    }

    fn flush_one_unwritten(&self, obj: &Arc<Object>) -> Result<()> {
        // (An object whose first write-back is still in flight, in the
        // release of its last region, is written here too: the page locks
        // order the two, and whichever fails leaves it listed; see
        // `Unwritten::remove_if_written`.)
        match self.writeback_object(obj, Gate::Held) {
            Ok(()) => {
                self.unwritten.remove_if_written(obj);
                Ok(())
            }
            Err(e) => {
                self.unwritten.add(obj);
                Err(e)
            }
        }
    }
}
