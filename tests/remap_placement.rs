//! Two in-thread pagers: the application moves pager A's region to X with
//! its own `mremap`, then unmaps it there, and pager B maps a region at X
//! before A has applied either event. A applies the move first, and for
//! a moment lists a region at X too. A fault on B's region must go to B:
//! the move is older than B's map, though A applied it later. (The moved
//! region's placement was taken when A applied the event, so A's stale
//! region looked newer, and the fault waited behind A's events.) A's
//! events are held on purpose: its global lock (`hold_global_write`) until
//! B has mapped, then a pause after the move is applied
//! (`testing::set_after_event`).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager, Region};
use util::*;

static ARMED: AtomicBool = AtomicBool::new(false);
static ASLEEP: AtomicBool = AtomicBool::new(false);

/// Set once B's writes are done; set when the pause ran out before them.
static B_WROTE: AtomicBool = AtomicBool::new(false);
static PAUSE_RAN_OUT: AtomicBool = AtomicBool::new(false);

/// The event hook: the first event applied once armed (the move) is
/// followed by a pause until B's writes are done (5 s at most: a pause of
/// a fixed 400 ms, with 200 ms for the writes, was short on a loaded
/// machine).
fn pause_after_the_move() {
    if ARMED.swap(false, SeqCst) {
        ASLEEP.store(true, SeqCst);
        if !hold_until(&B_WROTE) {
            PAUSE_RAN_OUT.store(true, SeqCst);
        }
    }
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The regions' length.
const LEN: usize = 8 * PAGE;

/// Two in-thread pagers, A built first (the SIGBUS handler asks the
/// pagers in the order they were built, so a wrong choice would go to
/// A), and a region of A's of `len` bytes, written. A hang ends the
/// child (`alarm`).
fn two_pagers(len: usize) -> (Pager, Pager, Region) {
    // SAFETY: alarm has no preconditions.
    unsafe { libc::alarm(30) };
    let build = || {
        Pager::builder()
            .delivery(Delivery::InThread)
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let mut ra = a.map_anonymous(len).unwrap();
    ra.as_mut_slice().fill(0x11);
    (a, b, ra)
}

/// The application moves the `len` bytes at `y` to `x` with its own
/// `mremap` and unmaps them there, and B maps a region at `x`. The
/// mover's mremap returns only once both its events (the move, and the
/// unmap of the old range) are read, which may wait for A's events held:
/// the unmap at X comes from another thread, as soon as the kernel has
/// moved the range there (its mmap_lock is free while the mover waits),
/// and returns once A reads it. Their threads are given back to be joined
/// once A's events go on.
fn move_unmap_and_map(b: &Pager, y: usize, x: usize, len: usize) -> (Region, [Joined; 2]) {
    let mover = std::thread::spawn(move || app_mremap(y, len, len, x));
    let unmapping = Arc::new(AtomicBool::new(false));
    let unmapper = {
        let unmapping = unmapping.clone();
        std::thread::spawn(move || {
            wait_for("the kernel moved the range", || mapped(x));
            unmapping.store(true, SeqCst);
            // SAFETY: the application unmaps the memory it moved there.
            assert_eq!(unsafe { libc::munmap(x as *mut libc::c_void, len) }, 0);
        })
    };
    wait_for("the unmap freed X", || unmapping.load(SeqCst) && !mapped(x));
    let opts = MapOptions {
        kind: Some(InstallKind::Anonymous),
        fixed_addr: Some(x),
        ..MapOptions::default()
    };
    (b.map_anonymous_with(len, &opts).unwrap(), [mover, unmapper])
}

type Joined = std::thread::JoinHandle<()>;

#[test]
fn child_remap_placement() {
    if !is_child() {
        return;
    }
    let (a, b, ra) = two_pagers(LEN);
    let (y, x) = (ra.as_ptr() as usize, free_range(LEN));
    let hold = a.hold_global_write();
    let (rb, [mover, unmapper]) = move_unmap_and_map(&b, y, x, LEN);
    uffd_pager::testing::set_after_event(Some(pause_after_the_move));
    ARMED.store(true, SeqCst);
    drop(hold);
    wait_for("A applied the move", || ASLEEP.load(SeqCst));
    let t = Instant::now();
    let writer = std::thread::spawn(move || {
        for pg in 0..8 {
            // SAFETY: B's region at X, live until the writer is joined.
            unsafe { std::ptr::write_volatile((x + pg * PAGE) as *mut u8, 0x22) };
        }
        B_WROTE.store(true, SeqCst);
    });
    writer.join().unwrap();
    let took = t.elapsed();
    mover.join().unwrap();
    unmapper.join().unwrap();
    uffd_pager::testing::set_after_event(None);
    assert!(
        !PAUSE_RAN_OUT.load(SeqCst),
        "B's faults waited {took:?} behind A's events"
    );
    for pg in 0..8 {
        assert_eq!(rb.as_slice()[pg * PAGE], 0x22, "page {pg}");
    }
    drop(ra);
    drop(rb);
    println!("B's writes took {took:?}");
    std::process::exit(0);
}

#[test]
fn a_move_applied_late_is_older_than_a_map_made_since() {
    let out = run_child("child_remap_placement", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// Where the late-read test's event hook is: 1, holding A's events behind
/// its first (an unrelated unmap) so that the move is not read yet; 2,
/// holding them after the move is applied, until B's writes are done.
static PHASE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
static IN_HOOK: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
static RELEASED: AtomicBool = AtomicBool::new(false);
static WRITES_DONE: AtomicBool = AtomicBool::new(false);
static HELD_OUT: AtomicBool = AtomicBool::new(false);
static SET_UP_LATE: AtomicBool = AtomicBool::new(false);

/// Sleeps in 1 ms steps (nanosleep: async-signal-safe) until `until`
/// holds or 5 s pass; whether it held.
fn hold_until(until: &AtomicBool) -> bool {
    for _ in 0..5000 {
        if until.load(SeqCst) {
            return true;
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        // SAFETY: a valid timespec; no remainder wanted.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
    until.load(SeqCst)
}

/// The event hook of the late-read test (see [`PHASE`]).
fn hold_events() {
    match PHASE.swap(0, SeqCst) {
        1 => {
            IN_HOOK.store(1, SeqCst);
            if !hold_until(&RELEASED) {
                SET_UP_LATE.store(true, SeqCst);
            }
        }
        2 => {
            IN_HOOK.store(2, SeqCst);
            if !hold_until(&WRITES_DONE) {
                HELD_OUT.store(true, SeqCst);
            }
        }
        _ => {}
    }
}

#[test]
fn child_remap_read_late() {
    if !is_child() {
        return;
    }
    let (a, b, ra) = two_pagers(LEN);
    let rz = a.map_anonymous(LEN).unwrap();
    let (y, z, x) = (ra.as_ptr() as usize, rz.as_ptr() as usize, free_range(LEN));
    uffd_pager::testing::set_after_event(Some(hold_events));
    PHASE.store(1, SeqCst);
    // A's event thread applies the application's unmap of Z and then waits
    // in the hook: the move below stays unread.
    // SAFETY: the application unmaps region memory itself; the call
    // returns once A has read its event.
    assert_eq!(unsafe { libc::munmap(z as *mut libc::c_void, LEN) }, 0);
    wait_for("A holds its events behind the unmap", || {
        IN_HOOK.load(SeqCst) == 1
    });
    let (rb, [mover, unmapper]) = move_unmap_and_map(&b, y, x, LEN);
    // Now A reads the move (its placement taken after B's map) and applies
    // it, and then holds the unmap at X until B's writes are done.
    PHASE.store(2, SeqCst);
    RELEASED.store(true, SeqCst);
    wait_for("A applied the move", || {
        assert!(
            !SET_UP_LATE.load(SeqCst),
            "the set-up took past the first hold (5 s): A read the move early"
        );
        IN_HOOK.load(SeqCst) == 2
    });
    for pg in 0..8 {
        // SAFETY: B's region at X, live until the end of the test.
        unsafe { std::ptr::write_volatile((x + pg * PAGE) as *mut u8, 0x22) };
    }
    WRITES_DONE.store(true, SeqCst);
    mover.join().unwrap();
    unmapper.join().unwrap();
    uffd_pager::testing::set_after_event(None);
    assert!(
        !HELD_OUT.load(SeqCst),
        "B's faults waited for A's events (5 s)"
    );
    for pg in 0..8 {
        assert_eq!(rb.as_slice()[pg * PAGE], 0x22, "page {pg}");
    }
    drop(ra);
    drop(rb);
    std::process::exit(0);
}

/// As above, but A reads the move late: its event thread is busy with an
/// earlier event while the application moves A's region to X, unmaps it
/// there and B maps X. A's move then gets a placement newer than B's
/// map, and for a moment A lists a region at X again, with its unmap of X
/// still to apply. A fault on B's region must still go to B: A has an
/// event on its way, B none. (The newer placement alone sent it to A,
/// where it waited for A's events.)
#[test]
fn a_move_read_late_does_not_take_a_fault_from_the_pager_that_maps_there() {
    let out = run_child("child_remap_read_late", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}
