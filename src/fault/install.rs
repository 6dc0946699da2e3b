//! Installing a cached page into the user's mapping, and poisoning.

use super::Outcome;
use crate::address_space::Mm;
use crate::object::{InstallKind, Object};
use crate::page_cache::{DIRTY, SWAPPED};
use crate::stats::Counter::*;
use crate::sys::uffd::{IoResult, MODE_DONTWAKE, MODE_WP};
use crate::sys::PAGE_SIZE;
use crate::vma::Vma;
use std::sync::atomic::Ordering::Acquire;

/// Whether anonymous page `i` (state `w`, locked by the caller) goes in
/// clean, its contents its source's until a write that the engine sees.
/// A 2 MiB page for a read (it is write-protected); a base page for a read
/// in a region mapped read-only, unless its contents are newer than its
/// source (a write-back that failed, or a page read back from swap). A
/// write fault in a region the engine maps read-only comes after the
/// application's own `mprotect(PROT_WRITE)`: that page is not clean.
pub(super) fn installs_clean(vma: &Vma, w: u32, write: bool) -> bool {
    let obj = &vma.object;
    obj.kind == InstallKind::Anonymous
        && w & DIRTY == 0
        && (obj.install_wp(write) || !write && !vma.writable.load(Acquire) && w & SWAPPED == 0)
}

/// Whether page `i` (state `w`) is installed write-protected: a shared or
/// 2 MiB page per [`Object::install_wp`]; a base anonymous one when it goes
/// in clean in an object that protects those ([`Object::protects_clean`]),
/// or into a region made read-only with write protection
/// ([`Vma::read_only_wp`]).
pub(super) fn installs_wp(vma: &Vma, w: u32, write: bool) -> bool {
    let obj = &vma.object;
    obj.install_wp(write)
        || obj.protects_clean() && installs_clean(vma, w, write)
        || obj.kind == InstallKind::Anonymous && vma.read_only_wp.load(Acquire)
}

/// Installs object page `i` at its address in `vma`. `zero`: an anonymous
/// page that was never written back (UFFDIO_ZEROPAGE for a read, a copy of
/// zeros for a write so the write needs no second fault, or for a page
/// that goes in write-protected: the zero page takes no protection with
/// it). `wp`: [`installs_wp`]. Never wakes: the delivery layer wakes
/// waiters once per batch. Returns whether the page was moved out of the
/// cache area (which then holds no copy).
pub(super) fn install(
    mm: &Mm,
    vma: &Vma,
    i: usize,
    zero: bool,
    write: bool,
    wp: bool,
) -> Result<bool, i32> {
    let uffd = mm.uffd_for(&vma.object);
    retry_eagain(mm, uffd, || install_once(mm, vma, i, zero, write, wp))
}

/// How long an install keeps retrying EAGAIN before it reports the error.
const EAGAIN_PATIENCE_NS: u64 = 1_000_000_000;

/// Runs an install ioctl again while it fails with EAGAIN.
///
/// EAGAIN has two causes. The kernel could not take the page right now (a
/// folio locked for migration or compaction, a racing change of the
/// mapping): the first 100 retries spin, then each yields the CPU first,
/// since whoever holds the folio may need it (and sleeps, once it lasts).
/// Or a non-cooperative event is waiting to be read (the application's
/// munmap, mremap or madvise): then
/// spinning would only hold the event reader up, so the install gives up at
/// once with EAGAIN, and the fault restarts once the event is applied
/// ([`crate::events`]). Handler threads give up at once in both cases: the
/// event may be theirs to read. EAGAIN that lasts [`EAGAIN_PATIENCE_NS`]
/// is reported as ETIMEDOUT, unless the descriptor `uffd` is still
/// changing then (`mmap_changing`: an unmap or remap whose event is not
/// posted yet, as when the kernel waits for another userfaultfd's reader
/// to read its event of the same `munmap` first): that is EAGAIN too, and
/// the fault restarts. (Reported as ETIMEDOUT, it was SIGBUS, which
/// killed a thread whose access was valid.) Past the first millisecond
/// each retry sleeps first, a sixteenth of the wait so far (at most 1 ms).
/// Async-signal-safe (`sched_yield`, `clock_gettime`, `clock_nanosleep`,
/// an ioctl).
///
/// Each try runs as an event-safe fill ([`crate::events::Events::fill`]):
/// with handler threads, never while an event is read and not yet applied.
pub(super) fn retry_eagain<T>(
    mm: &Mm,
    uffd: &crate::sys::uffd::Uffd,
    mut op: impl FnMut() -> Result<T, i32>,
) -> Result<T, i32> {
    let in_thread = mm.config.delivery.is_in_thread();
    let give_up = || mm.events.pending() || !in_thread;
    retry_eagain_within(
        EAGAIN_PATIENCE_NS,
        give_up,
        || uffd.mmap_changing(),
        || mm.events.fill(in_thread, &mut op),
    )
}

fn retry_eagain_within<T>(
    patience_ns: u64,
    give_up: impl Fn() -> bool,
    changing: impl Fn() -> bool,
    mut op: impl FnMut() -> Result<T, i32>,
) -> Result<T, i32> {
    let mut tries = 0u32;
    let mut deadline = 0u64;
    loop {
        match op() {
            Err(libc::EAGAIN) => {
                if give_up() {
                    return Err(libc::EAGAIN);
                }
                tries += 1;
                if tries < 100 {
                    std::hint::spin_loop();
                    continue;
                }
                let now = crate::sys::now_ns();
                if deadline == 0 {
                    deadline = now + patience_ns;
                } else if now > deadline {
                    return Err(if changing() {
                        libc::EAGAIN
                    } else {
                        libc::ETIMEDOUT
                    });
                }
                // Past the first millisecond, a sleep of a sixteenth of
                // the wait so far (at most 1 ms): EAGAIN that lasts is an
                // event held up elsewhere, and yields alone kept the CPU
                // busy for the whole wait (seconds, behind another
                // userfaultfd's slow reader: `tests/other_descriptor_event.rs`).
                let waited = now + patience_ns - deadline;
                if waited > 1_000_000 {
                    crate::sys::sleep_ns((waited / 16).min(1_000_000));
                } else {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
            r => return r,
        }
    }
}

/// Copies the page at `src` (a buffer of the caller's) into place as object
/// page `i` with `UFFDIO_COPY` (which allocates it), write-protected if
/// `wp`. Never wakes.
pub(super) fn copy_in(mm: &Mm, vma: &Vma, i: usize, src: usize, wp: bool) -> Result<(), i32> {
    let uffd = mm.uffd_for(&vma.object);
    let (len, addr) = (vma.object.page_size(), vma.addr_of(i));
    let mode = MODE_DONTWAKE | if wp { MODE_WP } else { 0 };
    let r = retry_eagain(mm, uffd, || uffd.copy(addr, src, len, mode));
    match huge_anon_eexist(&vma.object, addr, r) {
        // A page already there was not protected by this copy; a clean
        // one must be (see `install_once`).
        Err(libc::EEXIST) if wp => {
            retry_eagain(mm, uffd, || uffd.writeprotect(addr, len, true, false))?;
            mm.counters.inc(PGINSTALL);
            Ok(())
        }
        Ok(_) | Err(libc::EEXIST) => {
            mm.counters.inc(PGINSTALL);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn install_once(
    mm: &Mm,
    vma: &Vma,
    i: usize,
    zero: bool,
    write: bool,
    wp: bool,
) -> Result<bool, i32> {
    let addr = vma.addr_of(i);
    let obj = &vma.object;
    let uffd = mm.uffd_for(obj);
    let len = obj.page_size();
    let mut moved = false;
    let wp_mode = if wp { MODE_WP } else { 0 };
    let r = match (obj.kind, zero) {
        // A read maps it write-protected; a write to a write-tracked page
        // maps it writable (the caller marks it dirty).
        (InstallKind::Shared, _) => uffd.cont(addr, len, MODE_DONTWAKE | wp_mode),
        // Hugetlb has no zero-page install: a copy of zeros.
        (InstallKind::Anonymous, true) if !write && !wp && !obj.is_huge() => {
            uffd.zeropage(addr, len, MODE_DONTWAKE)
        }
        (InstallKind::Anonymous, true) => uffd.copy(
            addr,
            crate::sys::mem::zeros(len).as_ptr() as usize,
            len,
            MODE_DONTWAKE | wp_mode,
        ),
        // Hugetlb has no `UFFDIO_MOVE`: copy from the cache area. A base
        // page that goes in protected is copied too (a move takes no
        // protection with it). Either way the copy there is freed, so the
        // page counts as moved: the mapping holds its contents, reclaim
        // takes them from there (and freed the area's copy only then),
        // and a page must not be held twice, or the budget bounds only
        // half the memory. (It was freed only for a huge page or a clean
        // one: a page read back from swap into a read-only region was
        // held twice, found by review.)
        (InstallKind::Anonymous, false) if obj.is_huge() || wp => {
            let src = obj.data(i)? as usize;
            let r = uffd.copy(addr, src, len, MODE_DONTWAKE | wp_mode);
            // (EEXIST: something is mapped there already; keep the copy.)
            if r.is_ok() && obj.free_data(i, 1).is_ok() {
                moved = true;
            }
            r
        }
        // Zero copy: move the cached page itself into place. A read-only
        // region cannot be a MOVE destination (its protection differs from
        // the cache area's), and a page that is not exclusive cannot move:
        // those are copied.
        (InstallKind::Anonymous, false) => {
            let src = obj.data(i)? as usize;
            match uffd.mv(addr, src, PAGE_SIZE, MODE_DONTWAKE) {
                Ok(n) => {
                    moved = true;
                    Ok(n)
                }
                // (The area's copy freed, as for a protected page above.)
                Err(libc::EINVAL) | Err(libc::EBUSY) => {
                    let r = uffd.copy(addr, src, PAGE_SIZE, MODE_DONTWAKE);
                    if r.is_ok() && obj.free_data(i, 1).is_ok() {
                        moved = true;
                    }
                    r
                }
                // MOVE can report an error after it moved the page (see
                // `reclaim`'s hazard note): if the page left the cache
                // area and one is in place, it is ours (we hold its lock).
                Err(e) if e != libc::EAGAIN => {
                    use crate::sys::pagemap::{page_present, page_there};
                    if page_present(src) == Ok(false) && page_there(addr) == Ok(true) {
                        mm.counters.inc(IOCTL_DID_WORK);
                        moved = true;
                        Ok(PAGE_SIZE as u64)
                    } else {
                        Err(e)
                    }
                }
                Err(e) => Err(e),
            }
        }
    };
    match huge_anon_eexist(obj, addr, r) {
        // A page already mapped there (huge anonymous: see
        // `huge_anon_eexist`) was not protected by this copy; a clean page
        // must be, as the caller marks it clean.
        Err(libc::EEXIST) if obj.kind == InstallKind::Anonymous && wp => {
            uffd.writeprotect(addr, len, true, false)?;
            mm.counters.inc(PGINSTALL);
            Ok(moved)
        }
        Ok(_) | Err(libc::EEXIST) => {
            mm.counters.inc(PGINSTALL);
            Ok(moved)
        }
        Err(e) => Err(e),
    }
}

/// `UFFDIO_COPY` into hugetlb answers `EEXIST` when the pool has no page
/// to copy into (kernel 6.18, seen with `strace`), not only when a page is
/// there. Taken for "installed", that would leave the access faulting
/// forever on a page that is not there; so for a huge anonymous page
/// `EEXIST` counts only if a page is mapped, and is `ENOMEM` otherwise.
/// Async-signal-safe (`mincore`).
fn huge_anon_eexist(obj: &Object, addr: usize, r: IoResult) -> IoResult {
    match r {
        Err(libc::EEXIST)
            if obj.is_huge()
                && obj.kind == InstallKind::Anonymous
                && crate::sys::pagemap::page_present(addr) != Ok(true) =>
        {
            Err(libc::ENOMEM)
        }
        r => r,
    }
}

/// How a fault on a page the engine believes installed ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recheck {
    /// The page is mapped (a racing fault had mapped it, or this mapped it
    /// again); `dirty`: it is mapped writable and now dirty.
    Present {
        /// The page was made writable for a write to a write-tracked page.
        dirty: bool,
    },
    /// Its contents are gone: an anonymous page left the mapping (the
    /// application dropped it), or a shared page left the memfd. The caller
    /// drops the page and starts over from its source.
    Gone,
    /// An event is waiting to be read (EAGAIN): restart the fault.
    Again,
    /// A write to a page of a read-only store (the application made the
    /// mapping writable itself): refused, SIGSEGV.
    Denied,
    /// The kernel refused for another reason.
    Failed,
}

/// A fault found page `i` installed (the caller holds its page lock, the
/// state says MAPPED). Either another fault raced this one and mapped it,
/// or it left the user mapping behind the engine's back: the kernel's
/// reclaim or DAMON unmaps shared pages (their contents stay in the memfd,
/// or in swap, and `UFFDIO_CONTINUE` brings them back), and the
/// application's own `madvise(MADV_DONTNEED)` drops anonymous ones. So the
/// page is looked at again rather than reported done, which would let the
/// access fault forever.
///
/// A write-protect fault (`present`) on a write-tracked page takes the one
/// `UFFDIO_WRITEPROTECT` of the `page_mkwrite` path; every other case costs
/// one syscall that the common paths never reach.
pub(super) fn recheck_installed(mm: &Mm, vma: &Vma, f: &super::Fault, i: usize, w: u32) -> Recheck {
    let obj = &vma.object;
    let addr = vma.addr_of(i);
    match obj.kind {
        // MISSING only: the kernel found no page in the memfd, or found
        // none before a racing fault filled it. (Writes never get here:
        // `attempt` refuses them.)
        InstallKind::Shared if obj.kernel_maps => match crate::sys::pagemap::page_present(addr) {
            Ok(true) => Recheck::Present { dirty: false },
            // (Moved by the application: as for an anonymous page below.)
            Ok(false) if event_on_its_way(mm, obj) => Recheck::Again,
            Ok(false) => Recheck::Gone,
            Err(_) => Recheck::Failed,
        },
        InstallKind::Shared => {
            if f.write && !obj.store_writes() {
                return Recheck::Denied;
            }
            let wp_fault = f.write;
            if wp_fault && f.present == Some(true) {
                return match make_writable(mm, vma, i) {
                    Ok(()) => Recheck::Present { dirty: true },
                    Err(libc::EAGAIN) => Recheck::Again,
                    Err(_) => Recheck::Failed,
                };
            }
            // Map it again: write-protected for a read of a clean tracked
            // page, writable otherwise. EEXIST: it is present.
            let wp = obj.install_wp(f.write) && w & DIRTY == 0;
            let mode = MODE_DONTWAKE | if wp { MODE_WP } else { 0 };
            let uffd = mm.uffd_for(obj);
            match retry_eagain(mm, uffd, || uffd.cont(addr, obj.page_size(), mode)) {
                Ok(_) => {
                    mm.counters.inc(REINSTALL);
                    Recheck::Present { dirty: wp_fault }
                }
                Err(libc::EEXIST) if wp_fault => match make_writable(mm, vma, i) {
                    Ok(()) => Recheck::Present { dirty: true },
                    Err(libc::EAGAIN) => Recheck::Again,
                    Err(_) => Recheck::Failed,
                },
                Err(libc::EEXIST) => Recheck::Present { dirty: false },
                // No page in the memfd at that offset: it was punched
                // (`MADV_REMOVE` through the mapping). Only EFAULT says so:
                // ENOENT is no registered mapping there, the state of a
                // range the application unmapped or moved, whose event is
                // read and not yet applied (handler threads); the page is
                // intact in the memfd, maybe dirty. Failed: the fault
                // restarts once the event is applied
                // (`tests/recheck_race.rs`; taken for a punched page, the
                // dirty page was discarded and the write lost).
                Err(libc::EFAULT) => Recheck::Gone,
                // (The unmap began after the ioctl's own check for one, and
                // its event is not read yet.)
                Err(libc::ENOENT) if uffd.mmap_changing() => Recheck::Again,
                Err(libc::EAGAIN) => Recheck::Again,
                Err(_) => Recheck::Failed,
            }
        }
        // An anonymous page is never unmapped by the kernel (it swaps it out
        // behind a swap PTE and faults it back itself), so a missing PTE
        // means the application dropped the page. A swap PTE is not a
        // missing one, though `mincore` calls it "not resident" once the
        // page left the swap cache: taken for a dropped page, a page of the
        // application's in swap was discarded by the engine's own faults
        // over it (`prefault`, `populate`, a residency guard) and read as
        // its source (`tests/kernel_swap.rs`).
        InstallKind::Anonymous => match crate::sys::pagemap::page_there(addr) {
            // A 2 MiB page installed write-protected for a read (see
            // `Object::install_wp`), or left so by an eviction that gave up
            // (see `reclaim`'s `huge`); or a clean base page of a read-only
            // region, written after the application's own
            // `mprotect(PROT_WRITE)` (see `Object::protects_clean`), or a
            // page of a region made writable again after it was made
            // read-only with write protection (see `Vma::read_only_wp`): a
            // write lifts the protection and the page is dirty from now on,
            // so reclaim no longer drops it. (Any write fault on a present
            // anonymous page takes this: every anonymous region is
            // registered for write protection, and a protection left on
            // would fault for ever; lifting one that is not there is
            // harmless, and a dirty mark only costs a write to swap.)
            Ok(true) if f.write => match make_writable(mm, vma, i) {
                Ok(()) => Recheck::Present { dirty: true },
                Err(libc::EAGAIN) => Recheck::Again,
                Err(_) => Recheck::Failed,
            },
            Ok(true) => Recheck::Present { dirty: false },
            // Moved by the application's `mremap` (the kernel moves the
            // page before it posts the event): taken for dropped, it was
            // uncharged and left the LRU while it lived on at the new
            // address (`tests/recheck_race.rs`). Restart once it is applied.
            Ok(false) if event_on_its_way(mm, obj) => Recheck::Again,
            Ok(false) => Recheck::Gone,
            Err(_) => Recheck::Failed,
        },
    }
}

/// Whether an event that may change `obj`'s mapping is on its way: unread
/// on its descriptor (`mmap_changing`), or read and not yet applied
/// (`in_flight`, asked second: the kernel's count ends at the read, which
/// the engine counts from before it). With in-thread delivery the caller's
/// read section keeps the reader out, so the first suffices there.
fn event_on_its_way(mm: &Mm, obj: &crate::object::Object) -> bool {
    mm.uffd_for(obj).mmap_changing() || mm.events.in_flight()
}

/// Resolves a write-protect fault on installed page `i` (the caller holds
/// the page lock): the page becomes dirty and writable.
pub(super) fn make_writable(mm: &Mm, vma: &Vma, i: usize) -> Result<(), i32> {
    let uffd = mm.uffd_for(&vma.object);
    let len = vma.object.page_size();
    retry_eagain(mm, uffd, || {
        uffd.writeprotect(vma.addr_of(i), len, false, false)
    })
    .map(|_| mm.counters.inc(WP_FAULT))
}

/// Marks the user page of object page `i` poisoned (UFFDIO_POISON), so the
/// access gets SIGBUS (EFAULT in a syscall), and reports it.
pub(super) fn poison(mm: &Mm, vma: &Vma, i: usize) -> Outcome {
    let uffd = mm.uffd_for(&vma.object);
    let len = vma.object.page_size();
    match retry_eagain(mm, uffd, || uffd.poison(vma.addr_of(i), len, MODE_DONTWAKE)) {
        Ok(_) => mm.counters.inc(POISONED),
        // An event first: the page may not be there any more.
        Err(libc::EAGAIN) => return Outcome::Restart,
        // Already poisoned by an earlier fault, or the kernel refused: the
        // access gets SIGBUS either way.
        Err(_) => {}
    }
    Outcome::Bus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eagain_is_retried_past_the_spins_and_reported_only_when_it_lasts() {
        // Fails 500 times (past the 100 spins), then succeeds.
        let mut n = 0;
        let never = || false;
        let r = retry_eagain_within(EAGAIN_PATIENCE_NS, never, never, || {
            n += 1;
            if n <= 500 {
                Err(libc::EAGAIN)
            } else {
                Ok(n)
            }
        });
        assert_eq!(r, Ok(501));
        // Other errors are returned at once.
        let mut calls = 0;
        let r: Result<(), i32> = retry_eagain_within(EAGAIN_PATIENCE_NS, never, never, || {
            calls += 1;
            Err(libc::EEXIST)
        });
        assert_eq!((r, calls), (Err(libc::EEXIST), 1));
        // EAGAIN that lasts is reported once the patience runs out.
        let t = std::time::Instant::now();
        let r: Result<(), i32> =
            retry_eagain_within(20_000_000, never, never, || Err(libc::EAGAIN));
        assert_eq!(r, Err(libc::ETIMEDOUT));
        assert!(t.elapsed() >= std::time::Duration::from_millis(20));
        // With an event waiting, EAGAIN is given up at once.
        let mut calls = 0;
        let r: Result<(), i32> = retry_eagain_within(
            EAGAIN_PATIENCE_NS,
            || true,
            never,
            || {
                calls += 1;
                Err(libc::EAGAIN)
            },
        );
        assert_eq!((r, calls), (Err(libc::EAGAIN), 1));
        // EAGAIN that lasts while the descriptor is changing (an event not
        // posted yet) is EAGAIN (a restart), not a failure.
        let r: Result<(), i32> =
            retry_eagain_within(20_000_000, never, || true, || Err(libc::EAGAIN));
        assert_eq!(r, Err(libc::EAGAIN));
    }
}
