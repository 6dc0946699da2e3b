//! Keeping a range resident while a system call uses it (the `mlock`
//! analog).
//!
//! With in-thread delivery, and with any user-mode-only descriptor, the
//! kernel does not deliver a fault it takes inside a system call: a
//! `read(2)` into an absent page of a region fails with `EFAULT`. Faulting
//! the buffer in first ([`crate::Region::prefault`]) is not enough when
//! another thread keeps the pager at its budget: reclaim may evict the
//! buffer again before the call. A [`ResidentGuard`] faults the range in
//! and keeps reclaim away from it until it is dropped: each page carries a
//! guard count in its state word, and reclaim rotates a guarded page
//! instead of evicting it. The range is also `mlock`ed where the process
//! may (root, or within `RLIMIT_MEMLOCK`), so the kernel's own reclaim (on
//! this machine kind, DAMON's pageout of shared pages) leaves it mapped
//! too; without that, a shared page the kernel unmaps is mapped again by
//! the next user-mode access, but a system call on it would still fail.
//!
//! # Cost
//! One atomic per page to take and to drop, plus the faults and an `mlock`
//! / `munlock` pair. A range larger than the budget is refused: it could
//! never all be resident.

use crate::address_space::Mm;
use crate::error::{Error, Result};
use crate::fault::{handle_fault, Access, Resolution};
use crate::object::Object;
use crate::page_cache::{GUARDS, GUARD_ONE, MAPPED, UPTODATE};
use crate::sys::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Serialises guards' `mlock` and `munlock` calls with the guard counts
/// they go by. The kernel does not count locks: one `munlock` undoes every
/// `mlock` of a page. So a guard unlocks only the pages it was the last
/// guard of, and a guard taken meanwhile locks its range only after that
/// (else the unlock, landing after its lock, undid it).
static MLOCKS: Mutex<()> = Mutex::new(());

/// Whether any guard has called `mlock2`: until one has, a guard's drop
/// unlocks nothing (a page no guard locked is left as the application
/// locked it).
static ANY_MLOCKED: AtomicBool = AtomicBool::new(false);

/// `munlock`s the runs of object pages `[first, end)` (mapped from
/// `start`, pages of `1 << shift` bytes) for which `pick` is true; `pick`
/// is called once per page, in order.
fn munlock_picked(
    start: usize,
    shift: u32,
    first: usize,
    end: usize,
    mut pick: impl FnMut(usize) -> bool,
) {
    let addr = |i: usize| start + ((i - first) << shift);
    let mut run = None;
    for i in first..=end {
        let picked = i < end && pick(i);
        match (run, picked) {
            (None, true) => run = Some(i),
            (Some(r), false) => {
                // SAFETY: munlock only changes how the kernel treats the
                // range, pages of this guard's region.
                unsafe { libc::munlock(addr(r) as *const libc::c_void, addr(i) - addr(r)) };
                run = None;
            }
            _ => {}
        }
    }
}

/// A range of a region kept resident until dropped, while a system call
/// uses it (the `mlock` analog; made by [`crate::Region::lock_resident`],
/// which has an example).
///
/// With in-thread delivery, and with any user-mode-only descriptor, the
/// kernel does not deliver a fault it takes inside a system call: a
/// `read(2)` into an absent page of a region fails with `EFAULT`. Faulting
/// the buffer in first ([`crate::Region::prefault`]) is not enough when
/// another thread keeps the pager at its budget: reclaim may evict the
/// buffer again before the call. A [`ResidentGuard`] faults the range in
/// and keeps reclaim away from it until it is dropped: each page carries a
/// guard count in its state word, and reclaim rotates a guarded page
/// instead of evicting it. The range is also `mlock`ed where the process
/// may (root, or within `RLIMIT_MEMLOCK`), so the kernel's own reclaim (on
/// this machine kind, DAMON's pageout of shared pages) leaves it mapped
/// too; without that, a shared page the kernel unmaps is mapped again by
/// the next user-mode access, but a system call on it would still fail.
///
/// # Cost
/// One atomic per page to take and to drop, plus the faults and an `mlock`
/// / `munlock` pair (the `munlock` of the pages no other guard holds,
/// under a process-wide mutex that orders it against other guards'
/// `mlock`). A range larger than the budget is refused: it could never
/// all be resident. An `mlock` of the application's own over a guarded
/// range is undone when the range's last guard goes (the kernel does not
/// count locks).
#[derive(Debug)]
pub struct ResidentGuard<'a> {
    mm: MmRef<'a>,
    /// Given back on drop ([`Mm::release_object`]: the application may
    /// have unmapped the region meanwhile).
    obj: Option<Arc<Object>>,
    /// Object pages `[first, end)`.
    first: usize,
    end: usize,
    /// The address of page `first`.
    start: usize,
    /// The `mlock`ed range, if the kernel allowed it.
    locked: Option<(usize, usize)>,
}

/// The address space a guard acts on: borrowed with its region
/// ([`Region::lock_resident`](crate::Region::lock_resident)), or held
/// ([`Region::lock_resident_owned`](crate::Region::lock_resident_owned)).
enum MmRef<'a> {
    Borrowed(&'a Mm),
    /// With what else its pager needs alive while the guard lives (its
    /// threads and I/O workers: a guard dropped last gives back an object
    /// whose write-back they run).
    Held(
        Arc<Mm>,
        #[allow(dead_code)] Arc<dyn std::any::Any + Send + Sync>,
    ),
}

impl std::fmt::Debug for MmRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MmRef::Borrowed(_) => "Borrowed",
            MmRef::Held(..) => "Held",
        })
    }
}

impl std::ops::Deref for MmRef<'_> {
    type Target = Mm;
    fn deref(&self) -> &Mm {
        match self {
            MmRef::Borrowed(m) => m,
            MmRef::Held(m, _) => m,
        }
    }
}

/// [`lock`], the guard holding the address space (it outlives no borrow).
/// `keep`: what the pager needs alive until the guard has given its
/// pages back.
pub(crate) fn lock_held(
    mm: &Arc<Mm>,
    keep: Arc<dyn std::any::Any + Send + Sync>,
    id: u64,
    start: usize,
    end: usize,
    write: bool,
) -> Result<ResidentGuard<'static>> {
    let mut g = lock(mm, id, start, end, write)?;
    // (The borrowed guard is left with nothing to give back.)
    Ok(ResidentGuard {
        mm: MmRef::Held(mm.clone(), keep),
        obj: g.obj.take(),
        first: g.first,
        end: g.end,
        start: g.start,
        locked: g.locked.take(),
    })
}

// A guard that outlives its borrow goes to other threads (the C API's
// handle, an interposer's call): it must stay `Send` and `Sync`.
const _: fn() = || {
    fn both<T: Send + Sync>() {}
    both::<ResidentGuard<'static>>();
};

impl ResidentGuard<'_> {
    fn obj(&self) -> &Object {
        self.obj.as_deref().expect("taken only on drop")
    }

    /// Whether the kernel also `mlock`ed the range (see above).
    ///
    /// Example: [`ResidentGuard`](crate::ResidentGuard).
    pub fn mlocked(&self) -> bool {
        self.locked.is_some()
    }
}

/// Guards the pages of `[start, end)` (page-aligned user addresses inside
/// region `id`), faulting them in for a write if `write` and the region is
/// writable there. (By id: the caller looked without the lock, and the
/// application's `munmap` of the range may be applied since and another
/// region mapped there.)
pub(crate) fn lock(
    mm: &Mm,
    id: u64,
    start: usize,
    end: usize,
    write: bool,
) -> Result<ResidentGuard<'_>> {
    let _deferred = crate::sys::thread::Deferred::new();
    mm.check_owner()?;
    let units = ((end - start) / PAGE_SIZE) as u64;
    let budget = mm.config.budget_pages;
    if budget > 0 && units > budget {
        return Err(Error::OverBudget {
            pages: units,
            budget,
        });
    }
    crate::inject::before_own_range(start);
    // (Writable as the piece the range lies in is, not the region's first:
    // the application may have made a part of it read-only.)
    let (obj, first, write) = {
        let _g = mm.lock.read();
        let vma = mm
            .find_vma_locked(start)
            .filter(|v| v.id == id && end <= v.end)
            .ok_or_else(|| Error::Config("the range is not inside one region".into()))?;
        let writable = vma.writable.load(std::sync::atomic::Ordering::Acquire);
        (vma.object.clone(), vma.page_index(start), write && writable)
    };
    let obj_shift = obj.page_shift();
    let mut guard = ResidentGuard {
        mm: MmRef::Borrowed(mm),
        obj: Some(obj),
        first,
        end: first,
        start,
        locked: None,
    };
    // Guards first, then the faults: a page faulted in is never evicted
    // before the call.
    let pages = (end - start) >> obj_shift;
    for i in first..first + pages {
        if !guard.obj().cache.guard(i) {
            return Err(Error::Config(
                "too many residency guards on one page".into(),
            ));
        }
        guard.end = i + 1;
    }
    // As in `Region::populate`: events read and not applied yet first.
    mm.events.wait_applied();
    let access = Access::engine(write, id);
    let deadline = std::time::Instant::now() + crate::events::coming::SETTLE_PATIENCE;
    for _ in 0..8 {
        let mut a = start;
        while a < end {
            if handle_fault(mm, a, access) != Resolution::Resolved {
                return Err(Error::Store(crate::store::StoreError(libc::EIO)));
            }
            a += 1 << obj_shift;
        }
        if guard.locked.is_none() {
            // MLOCK_ONFAULT for an anonymous region: its pages are mapped
            // already, faulted in for write where the region is writable;
            // plain mlock would fault a private writable mapping's pages
            // for write itself, which is a write to a region made read-only
            // with write protection (see `Vma::read_only_wp`: it would end
            // that). A shared region's mlock faults for read only.
            let flags = if guard.obj().kind == crate::object::InstallKind::Anonymous {
                libc::MLOCK_ONFAULT
            } else {
                0
            };
            // mlock2 (and the munlock of its failure) acts on whatever is
            // mapped there: only while the range is still the region's
            // and no event on its way may take it from it.
            match still_ours(mm, guard.obj(), first, start, end) {
                Some(true) => {}
                Some(false) => {
                    crate::events::coming::wait_for_any(mm, deadline);
                    continue;
                }
                None => {
                    return Err(Error::Config(
                        "the range is no longer the region's: the application unmapped or \
                         moved it"
                            .into(),
                    ))
                }
            }
            let _order = MLOCKS.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: mlock2 only changes how the kernel treats a range of
            // this region, whose pages are all mapped now (a kernel-mapped
            // region's are in its memfd, where mlock's own faults find
            // them; the guard keeps reclaim off them).
            let r = unsafe { libc::mlock2(start as *const libc::c_void, end - start, flags) };
            // (Noted even where it fails: the kernel may have locked part
            // of the range before it failed.)
            ANY_MLOCKED.store(true, Relaxed);
            if r == 0 {
                guard.locked = Some((start, end));
            } else {
                // Over RLIMIT_MEMLOCK, or a page went meanwhile: the engine's
                // guard still holds; undo whatever part got locked, but
                // not on pages another guard holds (it may have locked
                // them: they are unlocked when their last guard goes).
                let obj = guard.obj();
                let (first, last) = (guard.first, guard.end);
                munlock_picked(start, obj_shift, first, last, |i| {
                    obj.cache.load(i) & GUARDS == GUARD_ONE
                });
            }
        }
        let all = (guard.first..guard.end)
            .all(|i| guard.obj().cache.load(i) & (UPTODATE | MAPPED) == UPTODATE | MAPPED);
        if all {
            return Ok(guard);
        }
    }
    Err(Error::Store(crate::store::StoreError(libc::EIO)))
}

/// Whether `[start, end)` is still page `first` on of `obj`'s region,
/// with no event on its way that may take it ([`range_in_doubt`]): `None`
/// if it is not, `Some(false)` if it is in doubt. The lock is held for the
/// look only (`mlock2` may fault, and a fault may need the global lock
/// behind a waiting writer): an unmap and a new mapping both between the
/// look and the call are not seen.
///
/// [`range_in_doubt`]: crate::events::coming::range_in_doubt
fn still_ours(mm: &Mm, obj: &Object, first: usize, start: usize, end: usize) -> Option<bool> {
    let _g = mm.lock.read();
    let vma = mm.find_vma_locked(start).filter(|v| {
        end <= v.end && std::ptr::eq(&*v.object, obj) && v.page_index(start) == first
    })?;
    crate::inject::before_range_change(vma);
    Some(!crate::events::coming::range_in_doubt(
        mm,
        mm.uffd_for(&vma.object),
    ))
}

impl Drop for ResidentGuard<'_> {
    fn drop(&mut self) {
        if self.obj.is_none() {
            // (Handed over to a held guard: `lock_held`.)
            return;
        }
        let _deferred = crate::sys::thread::Deferred::new();
        if self.mm.in_child() {
            // (A forked child inherits no locks; its copy of the counts
            // is not the parent's to change.)
            return;
        }
        {
            // The pages this guard was the last of are unlocked, if any
            // guard ever locked (see `MLOCKS`), and only where the region
            // still maps them where the guard found them: the application
            // may have moved or unmapped it with its own `mremap`/`munmap`
            // meanwhile, and what is at those addresses now is not this
            // guard's to unlock (another region's guarded pages, say).
            self.mm.events.wait_applied();
            let _order = MLOCKS.lock().unwrap_or_else(|e| e.into_inner());
            let obj = self.obj();
            let shift = obj.page_shift();
            let in_place = || {
                let _g = self.mm.lock.read();
                self.mm.find_vma_locked(self.start).is_some_and(|v| {
                    std::ptr::eq(Arc::as_ptr(&v.object), obj)
                        && v.page_index(self.start) == self.first
                        && self.start + ((self.end - self.first) << shift) <= v.end
                })
            };
            let unlock = (self.locked.is_some() || ANY_MLOCKED.load(Relaxed)) && in_place();
            munlock_picked(self.start, shift, self.first, self.end, |i| {
                obj.cache.unguard(i) && unlock
            });
        }
        if let Some(obj) = self.obj.take() {
            if let Err(err) = self.mm.release_object(obj) {
                tracing::error!(error = %err, "writing back a region unmapped under a residency guard");
            }
        }
    }
}
