//! A fault that waits for an event to be applied (the application's
//! `munmap` of another region) is timed with that wait: the fault-latency
//! histogram started after it, so its slowest faults read as fast. The
//! event is held unapplied on purpose: the pager's global lock is held
//! (`Pager::hold_global_write`), which applying an event takes.

#[path = "engine_util.rs"]
mod util;

use std::time::{Duration, Instant};
use uffd_pager::{Delivery, Pager};
use util::*;

const HOLD: Duration = Duration::from_millis(300);

/// Runs `touch` on a thread of its own and returns once that thread is
/// about to make it, with the time then: the hold is timed from there, not
/// from the spawn (a thread that started late on a loaded machine spent
/// part of the hold before its fault, which then waited less than the
/// check below asks).
fn touch_on_a_thread(
    touch: impl FnOnce() + Send + 'static,
) -> (std::thread::JoinHandle<()>, Instant) {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Arc;
    let ready = Arc::new(AtomicBool::new(false));
    let r = ready.clone();
    let toucher = std::thread::spawn(move || {
        r.store(true, SeqCst);
        touch();
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.load(SeqCst) {
        assert!(Instant::now() < deadline, "the toucher never started");
        std::thread::yield_now();
    }
    (toucher, Instant::now())
}

#[test]
fn child_event_wait() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(30) };
    let d: Delivery = std::env::var("UFFD_DELIVERY").unwrap().parse().unwrap();
    let p = Pager::builder().delivery(d).build().unwrap();
    let r = p.map_anonymous(4 * PAGE).unwrap();
    let gone = p.map_anonymous(PAGE).unwrap();
    let at = r.as_ptr() as usize;
    p.reset_stats();
    let hold = p.hold_global_write();
    // SAFETY: the application unmaps region memory itself; its handle is
    // dropped only after the event is applied.
    assert_eq!(
        unsafe { libc::munmap(gone.as_ptr() as *mut libc::c_void, PAGE) },
        0
    );
    // (munmap returned: the event has been read, and waits for the lock.)
    let (toucher, t) = touch_on_a_thread(move || {
        // SAFETY: a page of the live region, which outlives the thread.
        unsafe { std::ptr::write_volatile((at + PAGE) as *mut u8, 7) };
    });
    std::thread::sleep(HOLD);
    drop(hold);
    toucher.join().unwrap();
    let took = t.elapsed();
    let s = p.stats();
    let max = Duration::from_nanos(s.fault_latency.max_ns);
    println!("{d}: the access took {took:?}; latency max {max:?}");
    assert!(took >= HOLD, "{d}: the access did not wait ({took:?})");
    assert!(
        max >= HOLD / 2,
        "{d}: the fault waited {took:?}, its latency says {max:?}\n{s}"
    );
    drop(gone);
    assert_eq!(r.as_slice()[PAGE], 7);
    std::process::exit(0);
}

/// The application moves a region with its own `mremap`, and another of
/// its threads touches the new address before the move is applied. No
/// region is there yet, so the SIGBUS handler waits for the pager's
/// events, then serves the fault: timed from the SIGBUS, not from the try
/// after the wait.
#[test]
fn child_moved_wait() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(30) };
    let d: Delivery = std::env::var("UFFD_DELIVERY").unwrap().parse().unwrap();
    let p = Pager::builder().delivery(d).build().unwrap();
    let len = 4 * PAGE;
    let r = p.map_anonymous(len).unwrap();
    let (from, to) = (r.as_ptr() as usize, free_range(len));
    p.reset_stats();
    let hold = p.hold_global_write();
    // (The mremap returns once both its events are read, which waits for
    // the hold: on a thread of its own.)
    let mover = std::thread::spawn(move || app_mremap(from, len, len, to));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mapped(to) {
        assert!(Instant::now() < deadline, "{d}: the kernel did not move it");
        std::thread::yield_now();
    }
    let (toucher, t) = touch_on_a_thread(move || {
        // SAFETY: a page of the moved region, which outlives the thread.
        unsafe { std::ptr::write_volatile((to + PAGE) as *mut u8, 9) };
    });
    std::thread::sleep(HOLD);
    drop(hold);
    toucher.join().unwrap();
    mover.join().unwrap();
    let took = t.elapsed();
    let s = p.stats();
    let max = Duration::from_nanos(s.fault_latency.max_ns);
    println!("{d} moved: the access took {took:?}; latency max {max:?}");
    assert!(took >= HOLD, "{d}: the access did not wait ({took:?})");
    assert!(
        max >= HOLD / 2,
        "{d}: the fault waited {took:?}, its latency says {max:?}\n{s}"
    );
    // SAFETY: the moved region's memory.
    assert_eq!(unsafe { *((to + PAGE) as *const u8) }, 9);
    std::mem::forget(r);
    std::process::exit(0);
}

/// In-thread only: with handler threads the message waits in the kernel's
/// queue while both threads wait on the events (one applying, one for
/// it), and its first look comes after the wait.
#[test]
fn a_fault_at_a_moved_address_is_timed_with_its_wait() {
    let d = Delivery::InThread;
    let out = run_child("child_moved_wait", &[("UFFD_DELIVERY", &d.to_string())]);
    assert!(out.status.success(), "{d}: {}", describe(&out));
}

#[test]
fn a_fault_that_waits_for_an_event_is_timed_with_the_wait() {
    for d in [Delivery::InThread, THREADS] {
        let out = run_child("child_event_wait", &[("UFFD_DELIVERY", &d.to_string())]);
        assert!(out.status.success(), "{d}: {}", describe(&out));
    }
}
