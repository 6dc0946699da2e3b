//! A thread with a `pthread_cancel` pending (deferred, the default) faults
//! on pager memory. The engine serves the fault in the thread itself
//! (in-thread delivery, in its SIGBUS handler) and reads the page with
//! `pread`, which glibc makes a cancellation point: the cancellation acted
//! there, unwinding out of the signal handler with a page lock held, and
//! the process died (SIGABRT). The engine now turns cancellation off while
//! it works on an application's thread; the thread is cancelled at its
//! next cancellation point, after the access, as without the engine. The
//! same for engine calls made on the thread (`prefault`, making a pager,
//! dropping one).
//!
//! Each case in a child process (`UFFD_CHILD=1`).

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{FileStore, FileStoreOptions};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager, Region};
use util::*;

const PAGES: usize = 16;

// "C-unwind": a cancellation unwinds out of it (a forced unwind).
extern "C-unwind" {
    fn pthread_testcancel();
}

/// A region over a file on disk (the store reads it with `pread`).
fn file_region(p: &Pager, data: &[u8]) -> Region {
    let path = std::env::temp_dir().join(format!("cancel-during-fault-{}", std::process::id()));
    std::fs::write(&path, data).unwrap();
    let store = FileStore::open(&path, &FileStoreOptions::default()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region.
    unsafe { p.map_store(Arc::new(store), PAGES * PAGE, &opts) }.unwrap()
}

/// What the cancelled thread does with the cancel pending: true if it
/// went as it should.
type Job = Box<dyn FnOnce() -> bool + Send>;

/// Runs the job `arg` points at (a `Box<Job>`), out of line: the frame
/// that holds it has destructors, the start routine below none.
#[inline(never)]
fn access(arg: *mut libc::c_void) -> bool {
    // SAFETY: `arg` is the `Box<Job>` `run_cancelled` leaked for this
    // thread, taken back once.
    let job = unsafe { Box::from_raw(arg as *mut Job) };
    job()
}

/// Cancels itself, then runs its job with the cancel pending, then
/// reaches a cancellation point. A return means it was not cancelled
/// (non-null: the job failed). "C-unwind": the cancellation unwinds
/// through it.
extern "C-unwind" fn pending_then_access(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: plain pthread calls on this thread.
    unsafe { libc::pthread_cancel(libc::pthread_self()) };
    if !access(arg) {
        return std::ptr::dangling_mut::<libc::c_void>();
    }
    // SAFETY: a cancellation point.
    unsafe { pthread_testcancel() };
    std::ptr::null_mut()
}

/// Runs `job` on a new thread with a cancel pending; panics unless the
/// thread was cancelled after it.
fn run_cancelled(what: &str, job: Job) {
    let arg = Box::into_raw(Box::new(job)) as *mut libc::c_void;
    // SAFETY: the thread takes `arg` back (joined below); the start
    // routine has the signature pthread_create wants (the unwind ABI
    // aside: glibc's `start_thread` is where a cancellation's unwind
    // ends).
    unsafe {
        let mut t: libc::pthread_t = 0;
        type Start = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
        let start = std::mem::transmute::<
            extern "C-unwind" fn(*mut libc::c_void) -> *mut libc::c_void,
            Start,
        >(pending_then_access);
        assert_eq!(
            libc::pthread_create(&mut t, std::ptr::null(), start, arg),
            0
        );
        let mut res: *mut libc::c_void = std::ptr::null_mut();
        assert_eq!(libc::pthread_join(t, &mut res), 0);
        assert_eq!(
            res as isize, -1,
            "{what}: the thread was not cancelled ({res:?})"
        );
    }
    println!("{what}: cancelled after it");
}

#[test]
fn child_cancel_pending() {
    if !is_child() {
        return;
    }
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let data = pattern_vec(9, PAGES * PAGE);
    let r = Arc::new(file_region(&p, &data));
    let at = 3 * PAGE + 17;
    let (addr, want) = (r.as_ptr() as usize + at, data[at]);
    // SAFETY: inside the region, which outlives the thread (joined).
    let load = move || (unsafe { std::ptr::read_volatile(addr as *const u8) }) == want;
    run_cancelled("a load", Box::new(load));
    let r2 = r.clone();
    run_cancelled(
        "a prefault",
        Box::new(move || r2.prefault(0, PAGES * PAGE).is_ok()),
    );
    assert!(r.as_slice() == &data[..], "the region's bytes");
    // Making a pager (it opens files) and dropping one with a region.
    run_cancelled(
        "a build",
        Box::new(|| {
            Pager::builder()
                .delivery(Delivery::InThread)
                .build()
                .is_ok()
        }),
    );
    let (p2, r3) = {
        let p2 = Pager::builder()
            .delivery(Delivery::InThread)
            .build()
            .unwrap();
        let r3 = file_region(&p2, &data);
        (p2, r3)
    };
    run_cancelled(
        "a drop",
        Box::new(move || {
            drop(r3);
            drop(p2);
            true
        }),
    );
    println!("CANCELLED-AFTER-ACCESS");
}

#[test]
fn a_pending_cancel_acts_after_the_engines_work_not_inside_it() {
    let out = run_child("child_cancel_pending", &[]);
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("CANCELLED-AFTER-ACCESS"),
        "{}",
        describe(&out)
    );
}
