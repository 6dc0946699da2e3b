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
use crate::page_cache::{MAPPED, UPTODATE};
use crate::sys::PAGE_SIZE;
use std::sync::Arc;

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
/// / `munlock` pair. A range larger than the budget is refused: it could
/// never all be resident.
#[derive(Debug)]
pub struct ResidentGuard<'a> {
    mm: &'a Mm,
    /// Given back on drop ([`Mm::release_object`]: the application may
    /// have unmapped the region meanwhile).
    obj: Option<Arc<Object>>,
    /// Object pages `[first, end)`.
    first: usize,
    end: usize,
    /// The `mlock`ed range, if the kernel allowed it.
    locked: Option<(usize, usize)>,
}

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
/// one region), faulting them in for a write if `write`.
pub(crate) fn lock(mm: &Mm, start: usize, end: usize, write: bool) -> Result<ResidentGuard<'_>> {
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
    let (obj, first) = {
        let _g = mm.lock.read();
        let vma = mm
            .find_vma_locked(start)
            .filter(|v| end <= v.end)
            .ok_or_else(|| Error::Config("the range is not inside one region".into()))?;
        (vma.object.clone(), vma.page_index(start))
    };
    let obj_shift = obj.page_shift();
    let mut guard = ResidentGuard {
        mm,
        obj: Some(obj),
        first,
        end: first,
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
    mm.events.quiesce();
    let access = Access::engine(write);
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
            // SAFETY: mlock2 only changes how the kernel treats a range of
            // this region, whose pages are all mapped now (a kernel-mapped
            // region's are in its memfd, where mlock's own faults find
            // them; the guard keeps reclaim off them).
            let r = unsafe { libc::mlock2(start as *const libc::c_void, end - start, flags) };
            if r == 0 {
                guard.locked = Some((start, end));
            } else {
                // Over RLIMIT_MEMLOCK, or a page went meanwhile: the engine's
                // guard still holds; undo whatever part got locked.
                // SAFETY: as above.
                unsafe { libc::munlock(start as *const libc::c_void, end - start) };
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

impl Drop for ResidentGuard<'_> {
    fn drop(&mut self) {
        let _deferred = crate::sys::thread::Deferred::new();
        if let Some((s, e)) = self.locked {
            // SAFETY: unlocks the range this guard locked.
            unsafe { libc::munlock(s as *const libc::c_void, e - s) };
        }
        if self.mm.in_child() {
            return;
        }
        for i in self.first..self.end {
            self.obj().cache.unguard(i);
        }
        if let Some(obj) = self.obj.take() {
            if let Err(err) = self.mm.release_object(obj) {
                tracing::error!(error = %err, "writing back a region unmapped under a residency guard");
            }
        }
    }
}
