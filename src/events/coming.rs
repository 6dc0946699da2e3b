//! Events on their way, for the engine's own calls that claim address
//! space: whether a `map` may take a range ([`event_coming`]), whether a
//! `Region::remap` may let the kernel place its region ([`any_coming`]),
//! and the bounded waits for them.

use super::records::{prune_left, Desc};
use crate::address_space::Mm;
use std::sync::atomic::Ordering::SeqCst;

/// How long a `map` waits for the events of regions whose range the
/// kernel has freed before it takes them for unmapped
/// ([`stale`](super::apply::stale)). The
/// kernel posts such an event as soon as the application's call lets go
/// of `mmap_lock`, and the engine's readers read it at once; this bounds
/// the wait should a reader be stuck.
pub(crate) const SETTLE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// What a `map` about to claim a range found there ([`event_coming`]).
pub(crate) struct Claim {
    /// The descriptors of the regions overlapping the range, or of moved
    /// regions that left a range overlapping it whose unmap is not applied
    /// yet.
    there: Vec<Desc>,
    /// An event on its way will change them.
    pub(crate) coming: bool,
    /// Found only by asking the new region's own descriptor: nothing the
    /// engine knows of lies there, and an event on that descriptor may be
    /// for any of its regions. A map that gives up waiting for it leaves
    /// nothing to apply and nothing to record.
    pub(crate) only_own: bool,
}

/// Whether a `map` may claim `[start, end)` now. `None`: nothing of the
/// engine's is there. Otherwise the table holds regions there, or a move
/// left the range and the unmap the application's `mremap` posts after
/// the move is not applied yet; `coming` says whether an event on its way
/// will change that. The application's own `munmap` or `mremap` freed the
/// range, and the kernel counts its events on the region's descriptor
/// from before the change until they are read ([`Uffd::mmap_changing`]);
/// read, they wait in the queue until applied
/// ([`Events::in_flight`](super::Events::in_flight), pager-wide). One
/// system call per region found. The caller holds the global write lock.
///
/// [`Uffd::mmap_changing`]: crate::sys::uffd::Uffd::mmap_changing
///
/// Where the table holds nothing there, the descriptor the new region
/// will be registered with (that of `new`, its object) is asked too: one
/// call of the application's over regions of two descriptors posts an
/// event on each, the second only once the first is read, and the first,
/// applied, leaves the table empty there while the second is on its way.
pub(crate) fn event_coming(
    mm: &Mm,
    start: usize,
    end: usize,
    new: &crate::object::Object,
) -> Option<Claim> {
    let there: Vec<Desc> = mm
        .table
        .read(|t| t.overlapping(start, end))
        .iter()
        .map(|v| Desc::of(&v.object))
        .collect();
    if !there.is_empty() {
        let coming = mm.events.in_flight() || there.iter().any(|d| d.changing(mm));
        return Some(Claim {
            there,
            coming,
            only_own: false,
        });
    }
    let mut left = mm.events.lock_left();
    // (A record whose events have all been applied is done with.)
    prune_left(mm, &mut left);
    let mut there: Vec<Desc> = left
        .iter()
        .filter(|(a, b, _)| *a < end && start < *b)
        .map(|(_, _, d)| d.clone())
        .collect();
    drop(left);
    let only_own = there.is_empty();
    let own = Desc::of(new);
    if own.changing(mm) {
        there.push(own);
    } else if only_own && any_coming(mm) {
        // Hazard: the application may have moved a region here (the
        // kernel placed it, then freed the range again for the
        // application's `munmap` of it there) with the move not applied
        // yet, on another descriptor than the new region's: the table
        // still has the moved region at its old range. Applied after this
        // map, the move took the new region for one it replaced and cut
        // it (`apply::settle_stale`). So any event on its way or waiting
        // is waited for, on every descriptor.
        there.extend(every_desc(mm));
    }
    (!there.is_empty()).then_some(Claim {
        there,
        coming: true,
        only_own,
    })
}

/// Waits, holding no engine lock, until the events on their way for what
/// `claim` found are read and applied, or until `deadline`: sleeps that
/// grow from 20 µs to 1 ms, so the wait takes no lock that the event's
/// reader or its application needs.
///
/// Hazard: one call of the application's can post several events, and a
/// move posts the move and then the unmap of the range it left. The
/// kernel counts them all from before the change, so the wait asks the
/// descriptors of the regions found there under the lock, wherever those
/// regions have gone since: a map that went ahead once the move alone was
/// applied would have its new region there cut by the unmap after it.
pub(crate) fn wait_for_event(mm: &Mm, claim: &Claim, deadline: std::time::Instant) {
    let mut pause = std::time::Duration::from_micros(20);
    while std::time::Instant::now() < deadline
        && (mm.events.in_flight() || claim.there.iter().any(|d| d.changing(mm)))
    {
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(1));
    }
}

/// Whether an event of this pager's may be on its way or waiting: read and
/// not applied (queued, or being applied), or posted and not read on any
/// of its descriptors (the pager's two, and
/// under per-region delivery every region's own: one system call each).
/// For an engine `mremap` (`Mm::remap`), which cannot know beforehand
/// where the kernel will put the region. The caller holds the global
/// write lock.
pub(crate) fn any_coming(mm: &Mm) -> bool {
    // The descriptors first, then the queue (as `may_come`: a read holds
    // the queue across its system call, so an event the kernel let go of
    // is there). Not `in_flight`, which counts the handlers' reads of
    // fault messages too: a remap beside a fault load waited for them.
    if every_desc(mm).iter().any(|d| d.changing(mm)) {
        return true;
    }
    let queue = mm.events.lock_queue();
    !queue.is_empty() || mm.events.applying.load(SeqCst) != 0
}

/// The pager's two descriptors, then every region's own (per-region
/// delivery).
fn every_desc(mm: &Mm) -> Vec<Desc> {
    let mut all = vec![Desc::Pager { quiet: false }, Desc::Pager { quiet: true }];
    mm.table.read(|t| {
        all.extend(
            t.iter()
                .filter(|v| v.object.region_uffd.get().is_some())
                .map(|v| Desc::of(&v.object)),
        )
    });
    all
}

/// Waits, with no lock held, until [`any_coming`] says no or `deadline`
/// passes (20 µs, growing to 1 ms, between looks).
pub(crate) fn wait_for_any(mm: &Mm, deadline: std::time::Instant) {
    let mut pause = std::time::Duration::from_micros(20);
    while std::time::Instant::now() < deadline && any_coming(mm) {
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(1));
    }
}

/// What an engine call that changes a region's range with a system call
/// the kernel does not check (`Region::protect`'s `mprotect` and write
/// protection, `dontneed`'s `MADV_DONTNEED` of a quiet region) returns
/// when [`range_in_doubt`] said yes: it has let go of its locks, and
/// [`until_settled`] waits and calls it again.
pub(crate) struct Unsettled;

/// One try of a call that [`until_settled`] repeats: its result, or
/// [`Unsettled`].
pub(crate) type Tried<R> = Result<crate::Result<R>, Unsettled>;

/// Whether the range of a region on `uffd` may no longer be the region's:
/// an event is on its way on that descriptor, or read and not yet
/// applied. The caller holds the global lock (read or write), under which
/// no event is applied, and asks right before its system call.
///
/// Hazard: `mprotect` and `madvise` act on whatever is mapped at an
/// address. The application's `munmap` of the region posts its event
/// and returns once the event is read, and the application may then map
/// its own memory there; an engine call that looked the region up before
/// the event was applied (it was waiting for the global lock the event's
/// application takes) would change the protection of that memory, or
/// drop its pages. The descriptor first, then the queue (as
/// [`any_coming`]). What is left is an unmap and the application's new
/// mapping both fitting between this look and the system call.
pub(crate) fn range_in_doubt(mm: &Mm, uffd: &crate::sys::uffd::Uffd) -> bool {
    if uffd.mmap_changing() {
        return true;
    }
    let queue = mm.events.lock_queue();
    !queue.is_empty() || mm.events.applying.load(SeqCst) != 0
}

/// Runs `call`, which takes its locks afresh each time, until it does not
/// return [`Unsettled`]: between tries it waits, with no lock held, until
/// the events on their way are applied (after which the region may be
/// smaller, or gone). Bounded by [`SETTLE_PATIENCE`]: a call still
/// unsettled then fails with `EAGAIN` from `op` rather than act on a
/// range that may be someone else's.
pub(crate) fn until_settled<R>(
    mm: &Mm,
    op: &'static str,
    mut call: impl FnMut() -> Tried<R>,
) -> crate::Result<R> {
    let deadline = std::time::Instant::now() + SETTLE_PATIENCE;
    loop {
        mm.events.wait_applied();
        match call() {
            Ok(r) => return r,
            Err(Unsettled) if std::time::Instant::now() >= deadline => {
                return Err(crate::Error::sys(op, libc::EAGAIN));
            }
            Err(Unsettled) => wait_for_any(mm, deadline),
        }
    }
}
