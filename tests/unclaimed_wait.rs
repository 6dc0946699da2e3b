//! A SIGBUS no pager claims (a mapping of a file past its end) while
//! another pager is applying an event: the handler waits for that event
//! (it may be a move that puts a region at the address), but not inside
//! the read section of the pagers' registry, which every pager's build
//! and drop waits out. The event is held unapplied on purpose: its
//! pager's global lock is held (`Pager::hold_global_write`).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};
use uffd_pager::{Delivery, Pager};
use util::*;

/// The application's SIGBUS handler: maps a page of its own where the
/// access faulted, so the access succeeds when it runs again.
extern "C" fn map_over(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo; the faulting page is the
    // test's own file mapping, which nothing else refers to.
    unsafe { map_own_fixed((*info).si_addr() as usize & !(PAGE - 1), PAGE) };
}

#[test]
fn child_unclaimed_wait() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(30) };
    // SAFETY: installs the application's handler before any pager's.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = map_over as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
    let busy = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let gone = busy.map_anonymous(PAGE).unwrap();
    // A file of one page mapped two pages long: the second is past its end.
    let file = TempFile::with_contents("unclaimed", &[7u8; PAGE]);
    let f = std::fs::File::open(file.path()).unwrap();
    let past = map_file_shared(&f, 2 * PAGE) + PAGE;
    let hold = busy.hold_global_write();
    // SAFETY: the application unmaps region memory itself; the handle is
    // dropped after the event is applied.
    assert_eq!(
        unsafe { libc::munmap(gone.as_ptr() as *mut libc::c_void, PAGE) },
        0
    );
    // (munmap returned: the event has been read, and waits for the lock.)
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let toucher = {
        let done = done.clone();
        std::thread::spawn(move || {
            // SAFETY: past the file's end: SIGBUS, then the handler's page.
            let v = unsafe { std::ptr::read_volatile(past as *const u8) };
            done.store(true, SeqCst);
            v
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let third = std::thread::spawn(|| {
        Pager::builder()
            .delivery(Delivery::InThread)
            .build()
            .unwrap()
    });
    while !third.is_finished() && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let built = third.is_finished();
    let took = t.elapsed();
    let waited_for_the_event = !done.load(SeqCst);
    drop(hold);
    drop(third.join().unwrap());
    assert_eq!(toucher.join().unwrap(), 0, "the handler's own page");
    assert!(
        built,
        "a pager's build waited {took:?} for the SIGBUS handler"
    );
    println!("built in {took:?}; the access waited for the event: {waited_for_the_event}");
    drop(gone);
    std::process::exit(0);
}

#[test]
fn a_sigbus_no_pager_claims_waits_for_events_outside_the_registry() {
    let out = run_child("child_unclaimed_wait", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}
