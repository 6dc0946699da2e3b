//! Writers on the address space: map (unmap is [`crate::munmap`]'s,
//! remap [`crate::mremap`]'s, protect [`crate::mprotect`]'s). Each takes
//! the global lock for write and write-locks every region it touches, as
//! the kernel's `mmap_write_lock` + `vma_start_write`. (`dontneed`,
//! [`crate::madvise`]'s, takes the global lock for read and the pages'
//! locks, as the kernel's `madvise(MADV_DONTNEED)` takes `mmap_lock` for
//! read.)
//!
//! The engine's own calls never raise a non-cooperative event (they would
//! block on the event reader): a range is unregistered before the engine
//! unmaps or moves it, and anonymous pages leave mappings by `UFFDIO_MOVE`.
//! The application's own calls do raise them; [`crate::events`] applies
//! them with the helpers at the end of this file.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::object::{InstallKind, Object};
use crate::sys::huge::HUGE_PAGE_SIZE;
use crate::sys::mem::{madvise, mprotect, At, Mapping};
use crate::sys::uffd::mode;
use crate::vma::{VmFlags, Vma};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

pub(crate) fn register_mode(obj: &Object) -> u64 {
    match obj.kind {
        // WP: a huge page is write-protected while reclaim copies it out
        // (`reclaim`'s `huge`: hugetlb has no `UFFDIO_MOVE`).
        // WP for base pages: clean pages of a read-only region are
        // installed protected (`Object::protects_clean`), and `protect`
        // makes a region read-only with write protection
        // (`Vma::read_only_wp`).
        InstallKind::Anonymous => mode::MISSING | mode::WP,
        // MINOR catches pages present in the memfd but not mapped; MISSING
        // catches holes (absent pages), which would otherwise be zero-filled
        // by the kernel. Both are resolved by filling the memfd and
        // UFFDIO_CONTINUE. WP: pages are installed write-protected (see
        // `Object::install_wp`), for dirty tracking over a writable store
        // and to refuse writes to a read-only one.
        // MISSING only: the kernel maps what the memfd holds, with its own
        // fault-around, which MINOR or WP registration would turn off.
        InstallKind::Shared if obj.kernel_maps => mode::MISSING,
        InstallKind::Shared => mode::MINOR | mode::MISSING | mode::WP,
    }
}

/// Where a new mapping goes.
#[derive(Debug, Default)]
pub struct Placement {
    /// Exact address, or anywhere.
    pub fixed: Option<usize>,
    /// The fixed range's hold (see [`crate::hold`]): the region is mapped
    /// over it. Without one, the fixed range must be free.
    pub hold: Option<Mapping>,
}

impl Mm {
    /// Maps `len` bytes of `object` (from page 0) and registers the range.
    /// Returns the region's id and start.
    ///
    /// `kept`: `object` is one [`KeptObjects::take`](crate::kept) gave
    /// back, still in the rmap. On an error the caller then releases it
    /// ([`Mm::release_now`]).
    pub fn map(
        &self,
        object: Arc<Object>,
        len: usize,
        flags: VmFlags,
        at: Placement,
        kept: bool,
    ) -> Result<(u64, usize)> {
        let _deferred = crate::sys::thread::Deferred::new();
        let VmFlags {
            writable, pinned, ..
        } = flags;
        self.check_owner()?;
        self.events.wait_applied();
        let mut w = self.lock.write();
        let mut hold = at.hold;
        let (hint, fixed) = at
            .fixed
            .map_or((crate::inject::before_map(len), false), |a| (a, true));
        if fixed && hint.checked_add(len).is_none() {
            return Err(past_the_end(hint, len));
        }
        // The table may still hold regions where this map lands: the
        // application freed their range with its own `munmap` or `mremap`
        // and the event is not applied yet. A move taken for an unmap
        // loses the region (its evicted pages are discarded, its new
        // address has none), so while such an event is on its way the map
        // lets its range go, waits with no lock held, and starts again
        // (see `events::coming::event_coming`). Bounded; then the regions
        // there are taken for unmapped (`stale`).
        let deadline = std::time::Instant::now() + crate::events::coming::SETTLE_PATIENCE;
        let mut waited = false;
        let wait = |w, claim: &crate::events::coming::Claim, waited: &mut bool| {
            drop(w);
            if !std::mem::replace(waited, true) {
                self.counters.inc(crate::stats::Counter::MAP_WAITED_EVENT);
            }
            crate::events::coming::wait_for_event(self, claim, deadline);
            self.lock.write()
        };
        let m = loop {
            let coming = crate::events::coming::event_coming;
            if fixed {
                match coming(self, hint, hint + len, &object) {
                    None => {}
                    Some(c) if c.coming && std::time::Instant::now() < deadline => {
                        w = wait(w, &c, &mut waited);
                        continue;
                    }
                    Some(c) if c.only_own => {}
                    // (A range a move left, whose unmap was not read in
                    // time: the kernel has it free.)
                    Some(_) if !self.table.read(|t| t.overlaps(hint, hint + len, None)) => {
                        crate::events::apply::stale(self, hint, hint + len, true, &object);
                    }
                    Some(_) => return Err(Error::Overlap { addr: hint, len }),
                }
            }
            // Over the hold (a retry's too: see the wait below).
            let place = match hold.take() {
                // On a 2 MiB boundary, so that the kernel maps its huge
                // folios with one PMD each (`collapse`).
                _ if !fixed && hint == 0 && object.kernel_maps && len >= HUGE_PAGE_SIZE => {
                    At::Over(
                        Mapping::reserve_aligned(len, HUGE_PAGE_SIZE)
                            .map_err(|e| Error::sys("mmap", e))?,
                    )
                }
                _ if !fixed => At::Near(hint),
                Some(h) => At::Over(h),
                None => At::Free(hint),
            };
            let m = match object.kind {
                InstallKind::Anonymous if object.is_huge() => {
                    crate::sys::huge::anonymous_at(place, len)
                }
                InstallKind::Anonymous => Mapping::anonymous_at(place, len),
                InstallKind::Shared => {
                    let fd = object.memfd().expect("shared objects have a memfd").fd();
                    if object.is_huge() {
                        crate::sys::huge::shared_at(fd, len, place)
                    } else {
                        Mapping::shared(fd, len, place)
                    }
                }
            }
            .map_err(|e| match e {
                libc::EEXIST => Error::Overlap { addr: hint, len },
                e => Error::sys("mmap", e),
            })?;
            let start = m.addr();
            match coming(self, start, start + len, &object) {
                None => {}
                // (Unmapped at once: not registered, so no event.)
                Some(c) if c.coming && std::time::Instant::now() < deadline => {
                    // A fixed range stays held while the map waits: left
                    // free, anything could take it meanwhile (a thread's
                    // stack, a large malloc), and the next try would be
                    // an overlap.
                    if fixed {
                        hold = Some(m.into_hold().map_err(|e| Error::sys("mmap", e))?);
                    } else {
                        drop(m);
                    }
                    w = wait(w, &c, &mut waited);
                    continue;
                }
                Some(c) if c.only_own => {}
                Some(c) => crate::events::apply::stale(self, start, start + len, c.coming, &object),
            }
            break m;
        };
        let _w = w;
        let start = m.addr();
        // A fork()ed child gets no copy of region memory: its touches are a
        // clean SIGSEGV, and the engine refuses to work in a child (see
        // `crate::fork`).
        madvise(start, len, libc::MADV_DONTFORK).map_err(|e| Error::sys("madvise", e))?;
        if !writable {
            mprotect(start, len, libc::PROT_READ).map_err(|e| Error::sys("mprotect", e))?;
        }
        let slot = if kept {
            object.slot.load(Acquire)
        } else {
            let Some(slot) = self.objects.insert(&object) else {
                return Err(Error::Config(format!(
                    "too many mapped objects (at most {})",
                    crate::rmap::MAX_OBJECTS
                )));
            };
            object.slot.store(slot, Release);
            slot
        };
        // (A kept object stays in the rmap on an error: the caller's
        // release takes it out.)
        //
        // Hazard: once in the rmap the object can be pinned by anyone
        // holding an entry that names its slot (readahead, the LRU and
        // khugepaged keep entries of a slot's earlier objects), and a pin
        // reads the object after the caller drops it on the error. So
        // the pins are waited out after the slot is emptied, as a release
        // does.
        let unslot = || {
            if !kept {
                self.objects.remove(slot);
                object.wait_unpinned();
            }
        };
        let own = match self.per_region.get() {
            Some(p) => match p.open(object.quiet) {
                Ok(u) => Some(u),
                Err(e) => {
                    unslot();
                    return Err(Error::Io {
                        context: "opening a region's userfaultfd".into(),
                        source: e,
                    });
                }
            },
            None => None,
        };
        let uffd = own.as_deref().unwrap_or(self.pager_uffd(object.quiet));
        if let Err(e) = uffd.register(start, len, register_mode(&object)) {
            unslot();
            if let (Some(p), Some(u)) = (self.per_region.get(), &own) {
                p.close(u);
            }
            return Err(Error::sys("UFFDIO_REGISTER", e));
        }
        if let Some(u) = own {
            let _ = object.region_uffd.set(u);
        }
        if pinned {
            // (Its pages leave the LRU: a kept object would hold them.)
            *object.keep_stamp.lock().unwrap_or_else(|e| e.into_inner()) = None;
            object.mapped_pinned.store(true, Release);
        }
        let id = self.next_region_id();
        let mut vma = Vma::new(start, len, 0, object, writable);
        vma.pinned = pinned;
        vma.random = std::sync::atomic::AtomicBool::new(flags.random);
        vma.id = id;
        vma.object.windows.set(&[vma.window()]);
        self.publish(&[], &[Arc::new(vma)]);
        // The region now owns the range; unmap releases it.
        let _ = m.into_raw();
        Ok((id, start))
    }

    /// The pieces of region `id`, in address order.
    ///
    /// Hazard: a piece's reference holds its object, and once the
    /// application's own unmap of the region is applied it can be the
    /// object's last: dropped plainly then, it frees the object without its
    /// release (dirty pages lost, the rmap pointing at freed memory; see
    /// [`Mm::release_object`]). So a caller drops them under the global
    /// lock (which applying an event takes for writing), or holds a
    /// reference of its own to the object that it gives back through
    /// `release_object`; one that needs only their spans and flags takes
    /// [`piece_spans`](Self::piece_spans), which holds no reference.
    pub(crate) fn pieces(&self, id: u64) -> Vec<Arc<Vma>> {
        self.with_pieces(id, |v| v.clone())
    }

    /// Where the pieces of region `id` are and how they are mapped, in
    /// address order, read without taking a reference to them (see
    /// [`pieces`](Self::pieces)' hazard).
    pub(crate) fn piece_spans(&self, id: u64) -> Vec<PieceSpan> {
        self.with_pieces(id, |v| PieceSpan {
            start: v.start,
            end: v.end,
            pinned: v.pinned,
            writable: v.writable.load(Acquire),
            kind: v.object.kind,
        })
    }

    fn with_pieces<T>(&self, id: u64, f: impl Fn(&Arc<Vma>) -> T) -> Vec<T> {
        // Applying the application's munmap takes this lock (`publish`):
        // an application handler that faulted while this thread held it
        // would wait for that event, and so for itself (see `Deferred`).
        let _deferred = crate::sys::thread::Deferred::new();
        let spans = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let Some(starts) = spans.get(&id) else {
            return Vec::new();
        };
        self.table.read(|t| {
            starts
                .iter()
                .filter_map(|&s| t.find(s).filter(|v| v.start == s && v.id == id).map(&f))
                .collect()
        })
    }

    /// The address ranges of region `id` still mapped, in address order,
    /// once every event the kernel has sent is applied (the application's
    /// own `munmap`, `mremap` or `MAP_FIXED` over the region cut or move
    /// its pieces). Empty in a `fork()`ed child.
    pub fn mapped(&self, id: u64) -> Vec<std::ops::Range<usize>> {
        if self.check_owner().is_err() {
            return Vec::new();
        }
        self.events.wait_applied();
        self.piece_spans(id)
            .iter()
            .map(|v| v.start..v.end)
            .collect()
    }

    /// The one piece of region `id`, or an error if the application split
    /// it or unmapped it all.
    pub(crate) fn only_piece(&self, id: u64) -> Result<Arc<Vma>> {
        let mut p = self.pieces(id);
        match p.len() {
            1 => Ok(p.pop().unwrap()),
            0 => Err(Error::Config(
                "the region's memory was unmapped by the application".into(),
            )),
            n => Err(Error::Config(format!(
                "the application split the region into {n} pieces with its own munmap/mremap"
            ))),
        }
    }

    /// Replaces `old` VMAs by `new` ones in the table and in the region
    /// index (the caller holds the global lock for write).
    pub(crate) fn publish(&self, old: &[Arc<Vma>], new: &[Arc<Vma>]) {
        // The index of starts is held across the table's update: a reader
        // of a region's pieces ([`Mm::piece_spans`]) takes it before its
        // read of the table, so it sees both before or both after. (With
        // the new table and the old starts, a region whose head the
        // application had just unmapped read as having no piece at all.)
        let mut r = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        self.table.update(|t| {
            let mut t = t.clone();
            for v in old {
                t.remove(v);
            }
            for v in new {
                t.insert(v.clone());
            }
            t
        });
        for v in old {
            if let Some(s) = r.get_mut(&v.id) {
                s.retain(|&x| x != v.start);
                if s.is_empty() {
                    r.remove(&v.id);
                }
            }
        }
        for v in new {
            let s = r.entry(v.id).or_default();
            if let Err(k) = s.binary_search(&v.start) {
                s.insert(k, v.start);
            }
        }
    }
}

/// The error for a fixed range `[addr, addr+len)` that wraps past the end
/// of the address space (`mmap`'s `EINVAL`).
pub(crate) fn past_the_end(addr: usize, len: usize) -> Error {
    Error::Config(format!(
        "range {addr:#x}+{len:#x} runs past the end of the address space"
    ))
}

/// A piece of a region as [`Mm::piece_spans`] reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PieceSpan {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) pinned: bool,
    pub(crate) writable: bool,
    pub(crate) kind: InstallKind,
}
