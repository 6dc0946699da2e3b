//! In-thread delivery: one process-wide SIGBUS handler that dispatches each
//! fault, by address, to the pager that owns it.
//!
//! The handler is async-signal-safe: it reads an [`Rcu`] registry of
//! address spaces (atomics only), runs the fault path (futex locks, ioctls,
//! store I/O, none of which allocate), and never logs. Addresses no pager
//! owns go to the previous SIGBUS handler, or to the default action, once
//! the access has been run again and faulted there a second time (the
//! first may be a fault on a range unmapped since it was raised).

use crate::address_space::Mm;
use crate::fault::{handle_fault_since, Resolution};
use crate::sync::pins::Pins;
use crate::sync::rcu::Rcu;
use std::sync::{Arc, OnceLock};

/// Registered address spaces, as raw pointers to their [`Entry`]s (a
/// pager unregisters, waiting out readers and then its entry's pins,
/// before it frees its `Mm`).
static REGISTRY: OnceLock<Rcu<Vec<usize>>> = OnceLock::new();

/// A registered address space, and the faults running on it: the handler
/// pins the entry in the registry's read section and leaves that section
/// before it serves the fault, so a fault that waits on its store (for up
/// to the store's timeouts) holds up only its own pager's unregister, not
/// every other pager's register and unregister (see [`Pins`]).
struct Entry {
    /// Kept alive by its pager until [`unregister`] returns.
    mm: *const Mm,
    pins: Pins,
}

impl Entry {
    /// The address space.
    fn mm(&self) -> &Mm {
        // SAFETY: the pager keeps its `Mm` alive until `unregister` has
        // removed this entry and waited out its readers and pins, and an
        // `&Entry` is had only inside a read section or under a pin.
        unsafe { &*self.mm }
    }
}
/// The outcome of the one attempt to install the handler (an errno).
static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();

/// The engine's SIGBUS action: [`on_sigbus`] with `SA_SIGINFO`, every
/// signal blocked while it runs (the kernel's fault path runs before any
/// signal is delivered: an application handler that ran nested here could
/// touch region memory with SIGBUS blocked, and the kernel then kills the
/// process with it, or fault into a lock this fault holds).
///
/// `SA_RESTART`: a fault inside a system call is `EFAULT`, never our
/// SIGBUS, so only a SIGBUS some process sends (or the kernel's
/// asynchronous memory-error one) can interrupt one, and one the
/// application ignores should not: a blocked `read` returned `EINTR`
/// (found by review). Calls the kernel never restarts (`poll`,
/// `epoll_wait`, `nanosleep`, `sigsuspend`...) still return `EINTR` on
/// such a signal, and a handler of the application's that was installed
/// without `SA_RESTART` sees its interrupted call restarted.
/// Async-signal-safe.
pub(super) fn our_action() -> libc::sigaction {
    // SAFETY: a zeroed sigaction is valid; sigfillset fills its mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigfillset(&mut sa.sa_mask);
        sa
    }
}

fn registry() -> &'static Rcu<Vec<usize>> {
    REGISTRY.get_or_init(|| Rcu::new(Vec::new()))
}

/// Installs the handler once per process, remembering the previous one;
/// every later call reports the first attempt's outcome.
///
/// The previous action is read first and ours installed after, so a SIGBUS
/// that arrives as soon as ours is live already has somewhere to go. (A
/// handler that another thread installs between the two calls is lost; a
/// program that installs SIGBUS handlers concurrently with building its
/// first pager has a race of its own anyway.) An application that installs
/// its own SIGBUS handler later replaces ours: in-thread delivery then
/// stops, and every fault on a region goes to the application's handler.
///
/// Without `SA_ONSTACK`: the fault path (reclaim included) needs up to
/// about 35 KiB of stack (page buffers aligned to 4 KiB), more than the
/// small alternate signal stacks that runtimes (Rust's std among them)
/// install for their stack-overflow handlers. It
/// runs on the faulting thread's own stack, as the kernel's fault path runs
/// on the task's kernel stack.
fn ensure_installed() -> Result<(), i32> {
    *INSTALLED.get_or_init(|| {
        registry();
        // SAFETY: a zeroed sigaction is a valid out-parameter; we read the
        // current action, then install ours, with valid pointers; the
        // atfork child handler is async-signal-safe.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return Err(crate::sys::errno());
            }
            super::chain::remember_previous(old);
            super::segv::guard_an_init();
            super::stack::reserve();
            libc::pthread_atfork(None, None, Some(registry_in_child));
            if libc::sigaction(libc::SIGBUS, &our_action(), std::ptr::null_mut()) != 0 {
                return Err(crate::sys::errno());
            }
        }
        Ok(())
    })
}

/// In a `fork()`ed child: the registry as no thread uses it (see
/// [`Rcu::reset_in_child`]). Async-signal-safe, as an atfork child handler
/// must be.
extern "C" fn registry_in_child() {
    if let Some(r) = REGISTRY.get() {
        // SAFETY: a child just made by fork, whose one thread is in no read
        // section or update of the registry: the engine forks nothing
        // itself, and a fork from a signal handler that interrupted the
        // engine's own signal handler cannot happen (it blocks every
        // signal); one that interrupted a pager's build or drop is not
        // supported (as fork from any handler that interrupts a lock
        // holder).
        unsafe { r.reset_in_child() };
    }
}

/// Adds an address space to the dispatch registry.
pub fn register(mm: &Arc<Mm>) -> Result<(), i32> {
    ensure_installed()?;
    let entry = Box::new(Entry {
        mm: Arc::as_ptr(mm),
        pins: Pins::default(),
    });
    let p = Box::into_raw(entry) as usize;
    registry().update(|v| {
        let mut v = v.clone();
        v.push(p);
        v
    });
    Ok(())
}

/// Removes an address space; returns once no handler can still use it:
/// after the registry's readers (short: a lookup) and then the faults
/// still running on it (as long as they take).
pub fn unregister(mm: &Mm) {
    // Ours are told from the others inside the update, under the
    // registry's writer lock, and not in the old snapshot after it:
    // another pager's unregister may free its entry as soon as this
    // update returns (found by review: while this one waited for a slow
    // fault below, another pager dropped beside it freed its entry, and
    // the next look read it).
    let mut gone = Vec::new();
    registry().update(|v| {
        let (mine, others): (Vec<usize>, Vec<usize>) = v.iter().partition(|&&p| {
            // SAFETY: entries in the current snapshot are live: only this
            // function frees one, after removing it in an update, which
            // the writer lock held here orders after this one.
            std::ptr::eq(unsafe { &*(p as *const Entry) }.mm, mm)
        });
        gone = mine;
        others
    });
    for p in gone {
        // SAFETY: removed above, and the update waited out every reader
        // that could still find it, so no pin can be taken from here on.
        let entry = unsafe { Box::from_raw(p as *mut Entry) };
        entry.pins.wait_unpinned();
        // The last unpin still reads the entry once the count is zero; it
        // unpins inside a read section, which this grace period waits out
        // (see `Pins`' hazard).
        registry().update(|v| v.clone());
        drop(entry);
    }
}

/// `BUS_ADRERR`: what the kernel sends for a userfaultfd fault in SIGBUS
/// mode. Memory errors (`BUS_MCEERR_AR`/`AO`, and accesses to pages the
/// engine poisoned) and `BUS_ADRALN` are not faults to serve.
const BUS_ADRERR: i32 = 2;

/// x86-64 page-fault error code bits (`X86_PF_*`) in `REG_ERR`.
const PF_PROT: i64 = 1 << 0;
const PF_WRITE: i64 = 1 << 1;

/// "C-unwind": a cancellation that acts in the application's handler a
/// SIGBUS not ours is chained to unwinds through here (no value with a
/// destructor is alive at the chain), as it would through the kernel's
/// signal frame; through an `extern "C"` frame the process aborted.
extern "C-unwind" fn on_sigbus(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    // The interrupted code's errno is restored on every way out: the fault
    // path makes syscalls, and code that reads errno after touching region
    // memory must see its own.
    let saved = crate::sys::errno();
    // Cancellation off while the engine works: its own `pread`s and sleeps
    // are cancellation points (`sys::thread::NoCancel`). Put back before
    // the application's handler runs: one that leaves with `siglongjmp`
    // skips every drop here, and left the thread uncancellable for good.
    let no_cancel = crate::sys::thread::NoCancel::new();
    // The fault's latency counts from here: the looks, waits and tries
    // below are all the faulting thread's.
    let since = crate::sys::now_ns();
    // Until the fault is handled this thread runs engine code: libc calls
    // it makes (a store's `pwrite`) pass through interposers unseen.
    let mark = crate::sys::thread::Mark::enter();
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    if code == BUS_ADRERR {
        let (write, present) = {
            // SAFETY: for SA_SIGINFO handlers `uctx` points to the
            // interrupted context; on x86-64 gregs[REG_ERR] holds the page
            // fault error code: bit 1 "write", bit 0 "the page was present"
            // (a protection fault: a write to a write-protected page).
            let uc = unsafe { &*(uctx as *const libc::ucontext_t) };
            let err = uc.uc_mcontext.gregs[libc::REG_ERR as usize];
            (err & PF_WRITE != 0, err & PF_PROT != 0)
        };
        // On an engine stack where the fault was taken on a small
        // alternate one (`stack`); back on the application's to return.
        let access = crate::fault::Access {
            write,
            present: Some(present),
            region: None,
        };
        let handled = super::stack::with_room(uctx, || serve(addr, access, since));
        if handled.is_some() {
            UNCLAIMED.with(|last| last.set((0, 0)));
        }
        match handled {
            Some(Resolution::Resolved) => {
                crate::sys::set_errno(saved);
                return;
            }
            // The access is this thread's, now: no region is SIGSEGV
            // (`SEGV_MAPERR`), a region that refuses it too (`SEGV_ACCERR`).
            Some(r @ Resolution::Segv) | Some(r @ Resolution::NoRegion) => {
                // (Where the signal cannot wait for the return, the
                // application's handler runs nested in this one, as
                // application code: it may never come back, leaving with
                // `siglongjmp`, keeping the errno it found.)
                drop(mark);
                drop(no_cancel);
                crate::sys::set_errno(saved);
                let code = match r {
                    Resolution::NoRegion => super::segv::SEGV_MAPERR,
                    _ => super::segv::SEGV_ACCERR,
                };
                super::segv::force_segv(addr, code, uctx);
                crate::sys::set_errno(saved);
                return;
            }
            // No pager claims the address, live or dying: perhaps it never
            // was ours, or the fault was raised while a pager owned the
            // range and this thread was preempted before it looked, and the
            // unmap has finished meanwhile (its dying claim is gone). The
            // default action would kill with SIGBUS a thread whose access
            // should get what an access to an unmapped range gets. So the
            // first such SIGBUS at an address runs the access again and the
            // kernel answers it: SIGSEGV where nothing is mapped, a fault in
            // whatever is mapped there now. A second one in a row at the
            // same address, with no claim given up in between, is not ours
            // and goes on below.
            None if unclaimed_first_time(addr, claims_epoch()) => {
                crate::sys::set_errno(saved);
                return;
            }
            // `handle_fault` restarts faults itself.
            Some(Resolution::Bus) | Some(Resolution::NoPage) | Some(Resolution::Restart) | None => {
            }
        }
    }
    // The application's own handler runs as application code, with the
    // thread's own cancel state.
    drop(mark);
    drop(no_cancel);
    crate::sys::set_errno(saved);
    super::chain::chain(sig, info, uctx, &our_action());
    crate::sys::set_errno(saved);
}

/// Looks `addr` up among the pagers and serves the fault (`access`, begun
/// at `since`) where one claims it. `None`: no pager claims it.
/// Async-signal-safe. Never inlined: its frame (tens of KiB, below it)
/// must be on the stack `stack::with_room` chose, not in the handler's own
/// frame, which is built before the switch.
#[inline(never)]
fn serve(addr: usize, access: crate::fault::Access, since: u64) -> Option<Resolution> {
    // A live region of a pager whose view was stale: the application
    // unmapped it, the event was not applied yet, and new memory was
    // mapped there (another pager's region). The fault found the old
    // region, which was gone by the time it was served (`NoRegion`):
    // look again, as the kernel's fault finds the new VMA. Before, the
    // access got SIGSEGV (two pagers in one process, found by CI).
    let mut tries = 0;
    let mut unread = 0u32;
    loop {
        let found = registry().read(|entries| {
            // In a fork()ed child the parent's pagers serve nothing (their
            // regions are not mapped here, and their ioctls would act on
            // the parent).
            let live = || {
                entries
                    .iter()
                    // SAFETY: registered entries are live until
                    // `unregister` has waited out this read section.
                    .map(|&p| unsafe { &*(p as *const Entry) })
                    .filter(|e| !e.mm().in_child())
            };
            let mms = || live().map(Entry::mm);
            let epochs = mms().fold(0u64, |a, mm| a.wrapping_add(mm.events.epoch()));
            // A live region first: another pager may still list the
            // same range as dying after unmapping it, and a fault on
            // this pager's new region there must not go to it. Of
            // two live claims one is stale: the other pager has not
            // applied the application's unmap of its region there
            // yet, and a fault sent to it would wait for that (its
            // events' gate) and then find nothing. A claim not in
            // doubt (`Mm::live_claim`: no event of its pager on its
            // way, no engine change of it in flight) is the true one;
            // among the rest, the later placement. (Not the later
            // placement alone: a move's is taken when its event is
            // read, and a move read late, its target unmapped
            // meanwhile and mapped there by another pager, looked
            // newer than that pager's map. Where that pager has an
            // event of its own on its way too, it still does: the
            // fault waits for the stale pager's events, finds
            // nothing and looks again.) Served after the read
            // section, under a pin of its entry.
            let mut claims = live().filter_map(|e| e.mm().live_placement(addr).map(|_| e));
            let newest = match (claims.next(), claims.next()) {
                (one, None) => one,
                _ => live()
                    .filter_map(|e| e.mm().live_claim(addr).map(|(p, doubt)| ((!doubt, p), e)))
                    .max_by_key(|&(key, _)| key)
                    .map(|(_, e)| e),
            };
            if let Some(e) = newest {
                // SAFETY: `unregister` frees the entry only once this
                // pin is dropped (below, when the fault is served).
                let e: &'static Entry = unsafe { &*(e as *const Entry) };
                return Found::Live(e, e.pins.pin());
            }
            // A fault raised on a range while its pager unmapped it:
            // the access is to memory that is going away.
            if let Some(mm) = mms().find(|mm| mm.claims_dying(addr)) {
                mm.counters.inc(crate::stats::Counter::SEGV);
                return Found::Done(Resolution::Segv);
            }
            // No pager's, unless an event that puts a region here is
            // being applied: the application's mremap returns once its
            // event is read, so its next access can come before the
            // region is published. Wait for the event, then look again:
            // outside the read section, under a pin (the event waits for
            // that pager's faults in flight, as long as their stores
            // take, and every pager's build and drop waits for this
            // section).
            if let Some(e) = live().find(|e| e.mm().events.pending()) {
                // SAFETY: as for a live region's entry above.
                let e: &'static Entry = unsafe { &*(e as *const Entry) };
                return Found::Wait(e, e.pins.pin());
            }
            // Or one on its way that no reader has taken up yet: the
            // kernel moved a range here (the access found it) and posts
            // the move's event once it lets go of `mmap_lock`, and the
            // event thread has not woken. The descriptors'
            // `mmap_changing` covers that window (before, two quick
            // faults in it passed the SIGBUS on, and it killed: 1 run
            // in 40 of `event_wait_latency`'s moved-address test).
            if mms().any(|mm| mm.uffd.mmap_changing() || mm.uffd_quiet.mmap_changing()) {
                return Found::Unread;
            }
            // Or applied since the look began: look again.
            let now = mms().fold(0u64, |a, mm| a.wrapping_add(mm.events.epoch()));
            if now == epochs {
                Found::Nobody
            } else {
                Found::Again
            }
        });
        let live = matches!(found, Found::Live(..));
        let handled = match found {
            Found::Live(entry, pin) => {
                let r = handle_fault_since(entry.mm(), addr, access, since);
                // Counted while the pin keeps the pager: the access gets
                // SIGSEGV unless it is looked up again (below).
                let again = r == Resolution::NoRegion && tries < 8;
                if matches!(r, Resolution::Segv | Resolution::NoRegion) && !again {
                    entry.mm().counters.inc(crate::stats::Counter::SEGV);
                }
                // Inside a read section: `unregister` frees the entry
                // only after a grace period, and the unpin reads it
                // after the count it waits for is zero.
                registry().read(|_| drop(pin));
                Some(r)
            }
            Found::Wait(entry, pin) => {
                entry.mm().events.gate.wait_for_writers();
                // (Inside a read section: see the live case.)
                registry().read(|_| drop(pin));
                continue;
            }
            Found::Again => continue,
            Found::Unread => {
                // Yields, then sleeps 50 µs a look once it lasts (an
                // event held up behind another userfaultfd's reader).
                unread += 1;
                if unread < 100 {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                } else {
                    crate::sys::sleep_ns(50_000);
                }
                continue;
            }
            Found::Done(r) => Some(r),
            Found::Nobody => None,
        };
        if live && handled == Some(Resolution::NoRegion) && tries < 8 {
            tries += 1;
            continue;
        }
        break handled;
    }
}

/// What the handler's look in the registry found.
enum Found {
    /// A live region of this entry's pager holds the address: the fault is
    /// served under the pin, outside the read section.
    Live(&'static Entry, crate::sync::pins::Pin<'static>),
    /// Answered in the read section.
    Done(Resolution),
    /// No pager claims the address, and this entry's pager is applying
    /// events: wait for them under the pin, outside the read section, and
    /// look again.
    Wait(&'static Entry, crate::sync::pins::Pin<'static>),
    /// No pager claims the address, but events were applied during the
    /// look: look again.
    Again,
    /// No pager claims the address, and a pager has an event on its way
    /// that its reader has not taken up yet: let it run, and look again.
    Unread,
    /// No pager claims the address.
    Nobody,
}

thread_local! {
    /// This thread's last SIGBUS that no pager claimed, as its address and
    /// the pagers' [`claims_epoch`] then (0, 0: none, or a claimed one
    /// since). Const-initialised and without a destructor, so using it in
    /// the handler allocates nothing and registers nothing.
    static UNCLAIMED: std::cell::Cell<(usize, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The sum of the registered pagers' [`Mm::claims_epoch`]: it changes
/// whenever one of them gives a range up. Async-signal-safe.
fn claims_epoch() -> u64 {
    registry().read(|entries| {
        entries.iter().fold(0u64, |a, &p| {
            // SAFETY: as in the handler: registered entries are live for
            // the length of the read section.
            let e = unsafe { &*(p as *const Entry) };
            a.wrapping_add(e.mm().claims_epoch())
        })
    })
}

/// Whether a SIGBUS at `addr` that no pager claims, seen at `epoch`, is the
/// first in a row at that address and epoch on this thread (see the
/// handler). Async-signal-safe.
fn unclaimed_first_time(addr: usize, epoch: u64) -> bool {
    UNCLAIMED.with(|last| {
        let first = last.get() != (addr, epoch);
        last.set(if first { (addr, epoch) } else { (0, 0) });
        first
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same address at the same epoch twice in a row is passed on; an
    /// unmap (or event) in between, or another address, starts over. (Each
    /// test runs on a thread of its own, so the cell starts empty.)
    #[test]
    fn an_unclaimed_sigbus_is_retried_once_per_address_and_epoch() {
        assert!(unclaimed_first_time(0x1000, 7), "first: retried");
        assert!(
            !unclaimed_first_time(0x1000, 7),
            "second in a row: passed on"
        );
        assert!(unclaimed_first_time(0x1000, 7), "after passing on: retried");
        // A claim given up since: the same address is a new race.
        assert!(unclaimed_first_time(0x1000, 8), "new epoch: retried");
        assert!(!unclaimed_first_time(0x1000, 8));
        // Another address in between.
        assert!(unclaimed_first_time(0x1000, 9));
        assert!(unclaimed_first_time(0x2000, 9));
        assert!(unclaimed_first_time(0x1000, 9), "not in a row: retried");
    }

    /// Two pagers unregistered at once, one of which waits for a fault
    /// still running on it: it frees its own entry and nothing else.
    /// Before, it told its own entries from the others' in the old
    /// snapshot, one at a time between its waits, so it read the other
    /// pager's entry after that one was freed; here the freed memory is
    /// reused for a new entry of the waiting pager's address space, which
    /// it then took for its own and freed while still registered.
    #[test]
    fn an_unregister_waiting_for_a_fault_frees_only_its_own_entry() {
        let build = || {
            crate::Pager::builder()
                .delivery(crate::Delivery::InThread)
                .build()
                .unwrap()
        };
        let (a, b) = (build(), build());
        let (ma, mb) = (a.mm().clone(), b.mm().clone());
        let entry_of = |mm: &Arc<Mm>| {
            registry().read(|v| {
                v.iter()
                    .copied()
                    // SAFETY: registered entries are live in a read section.
                    .filter(|&p| std::ptr::eq(unsafe { &*(p as *const Entry) }.mm, &**mm))
                    .collect::<Vec<_>>()
            })
        };
        let ea = entry_of(&ma)[0];
        // A fault running on `a`: its entry pinned.
        // SAFETY: the entry stays allocated until its unregister has
        // waited for this pin, dropped below.
        let pin = unsafe { &*(ea as *const Entry) }.pins.pin();
        let waiter = {
            let ma = ma.clone();
            std::thread::spawn(move || unregister(&ma))
        };
        let t = std::time::Instant::now();
        while !entry_of(&ma).is_empty() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // (Now waiting for the pin.)
        std::thread::sleep(std::time::Duration::from_millis(100));
        let eb = entry_of(&mb)[0];
        unregister(&mb);
        // The freed entry's memory made the next block of its size this
        // thread allocates (a new entry of `a`'s, here), as a busy
        // allocator would hand it out sooner or later.
        let mut held = Vec::with_capacity(1000);
        loop {
            let block = Box::new([0u64; 4]);
            if &*block as *const _ as usize == eb {
                break;
            }
            assert!(held.len() < 1000, "the freed entry's block never came back");
            held.push(block);
        }
        register(&ma).unwrap();
        let again = entry_of(&ma);
        assert_eq!(again.len(), 1);
        drop(held);
        // In a read section of the registry, as the fault path drops its
        // pins: the last unpin still touches the entry after the count
        // reaches zero (see `sync::pins`, "Hazard: freeing the `Pins`"), and the
        // waiter's grace period waits for read sections only.
        registry().read(|_| drop(pin));
        waiter.join().unwrap();
        assert_eq!(entry_of(&ma), again, "the new entry was taken");
        unregister(&ma);
        assert!(entry_of(&ma).is_empty());
        drop((a, b));
    }
}
