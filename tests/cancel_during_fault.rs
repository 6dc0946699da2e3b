//! A thread with a `pthread_cancel` pending (deferred, the default) faults
//! on pager memory. The engine serves the fault in the thread itself
//! (in-thread delivery, in its SIGBUS handler) and reads the page with
//! `pread`, which glibc makes a cancellation point: the cancellation acted
//! there, unwinding out of the signal handler with a page lock held, and
//! the process died (SIGABRT). The engine now turns cancellation off while
//! it works on an application's thread; the thread is cancelled at its
//! next cancellation point, after the access, as without the engine. The
//! same for engine calls made on the thread (`prefault`).
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

/// What the cancelled thread is given: the byte to load and its value, or
/// a region to prefault.
struct Job {
    addr: usize,
    want: u8,
    region: Option<*const Region>,
}

/// The access `job` asks for: whether it read the right byte, or the
/// prefault succeeded.
#[inline(never)]
fn access(job: &Job) -> bool {
    match job.region {
        // SAFETY: the parent keeps the region alive until the join.
        Some(r) => unsafe { (*r).prefault(0, PAGES * PAGE).is_ok() },
        // SAFETY: inside the region, which outlives the thread.
        None => (unsafe { std::ptr::read_volatile(job.addr as *const u8) }) == job.want,
    }
}

/// Cancels itself, then accesses with the cancel pending, then reaches a
/// cancellation point. A return means it was not cancelled (non-null: the access
/// failed). "C-unwind": the cancellation unwinds through it.
extern "C-unwind" fn pending_then_access(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` is the `Job` the parent keeps alive until the join.
    let job = unsafe { &*(arg as *const Job) };
    // SAFETY: plain pthread calls on this thread.
    unsafe { libc::pthread_cancel(libc::pthread_self()) };
    if !access(job) {
        return std::ptr::dangling_mut::<libc::c_void>();
    }
    // SAFETY: a cancellation point.
    unsafe { pthread_testcancel() };
    std::ptr::null_mut()
}

/// Runs `job` on a new thread; panics unless it was cancelled.
fn run_cancelled(job: &Job) {
    // SAFETY: `job` outlives the thread (joined below); the start routine
    // has the signature pthread_create wants (the unwind ABI aside: glibc's
    // `start_thread` is where a cancellation's unwind ends).
    unsafe {
        let mut t: libc::pthread_t = 0;
        let arg = job as *const Job as *mut libc::c_void;
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
        assert_eq!(res as isize, -1, "the thread was not cancelled ({res:?})");
    }
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
    let r = file_region(&p, &data);
    let at = 3 * PAGE + 17;
    run_cancelled(&Job {
        addr: r.as_ptr() as usize + at,
        want: data[at],
        region: None,
    });
    run_cancelled(&Job {
        addr: 0,
        want: 0,
        region: Some(&r as *const Region),
    });
    assert!(r.as_slice() == &data[..], "the region's bytes");
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
