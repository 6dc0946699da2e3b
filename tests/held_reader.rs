//! Helpers for tests that hold an engine reader thread (included with
//! `#[path = "held_reader.rs"] mod held;`): a reader held in a signal
//! handler leaves the events on its descriptor unread meanwhile.
//! Compiled on its own it is an empty test crate.
//!
//! (SIGTRAP: the engine's threads block every asynchronous signal and
//! leave open only those the kernel raises for an instruction, SIGTRAP
//! among them.)

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};

pub static HOLD: AtomicBool = AtomicBool::new(false);
pub static HELD: AtomicBool = AtomicBool::new(false);

/// SIGTRAP: waits while `HOLD` is set. Async-signal-safe (atomics and
/// `sched_yield` only; errno saved and restored).
extern "C" fn wait_while_held(_: libc::c_int) {
    // SAFETY: errno is this thread's; sched_yield is async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        HELD.store(true, SeqCst);
        while HOLD.load(SeqCst) {
            libc::sched_yield();
        }
        *libc::__errno_location() = errno;
    }
}

/// Holds thread `tid` of this process in [`wait_while_held`] until `HOLD`
/// is cleared. The thread is held only once it is idle, blocked in
/// poll(2) (its wait for messages): a handler signalled while it was
/// still finishing the fault the test had just taken (the kernel wakes
/// the faulting thread before the handler leaves the event gate's section
/// and lets go of its locks) was held there, and the test's next `remap`
/// or `map` waited for it for ever (a CI run hung so).
///
/// The thread is let go at the latest when the returned guard is dropped:
/// on a failed assertion's unwind too, which otherwise waited for ever on
/// the held thread (a pager's drop joins it) and hid the failure behind a
/// hang.
pub fn hold(tid: libc::pid_t) -> Held {
    wait_for("the thread to block in poll(2)", || in_poll(tid));
    // SAFETY: installs a handler that only touches atomics.
    unsafe {
        libc::signal(
            libc::SIGTRAP,
            wait_while_held as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    HELD.store(false, SeqCst);
    HOLD.store(true, SeqCst);
    // SAFETY: a signal to a thread of this process.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGTRAP) };
    assert_eq!(rc, 0);
    let held = Held(());
    wait_for("the held thread", || HELD.load(SeqCst));
    held
}

/// Lets the thread [`hold`] held go when dropped (clears `HOLD`).
#[must_use = "the held thread is let go when this is dropped"]
pub struct Held(());

impl Drop for Held {
    fn drop(&mut self) {
        HOLD.store(false, SeqCst);
    }
}

/// Whether thread `tid` of this process is blocked in poll(2) or ppoll(2)
/// (x86-64 numbers 7 and 271): `/proc/.../syscall` names the call a
/// blocked thread is in, and reads `running` for one that runs.
fn in_poll(tid: libc::pid_t) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) else {
        return false;
    };
    matches!(s.split_whitespace().next(), Some("7" | "271"))
}

/// The ids of this process's threads named `uffd-region*`.
pub fn region_threads() -> Vec<libc::pid_t> {
    let mut v: Vec<libc::pid_t> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            comm.starts_with("uffd-region")
                .then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect();
    v.sort_unstable();
    v
}

pub fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}: never");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A pager with per-region delivery.
pub fn per_region_pager() -> Pager {
    Pager::builder()
        .delivery(Delivery::PerRegion)
        .build()
        .unwrap()
}

/// A shared region's options, mapped at `addr`.
pub fn shared_at(addr: usize) -> MapOptions {
    MapOptions {
        fixed_addr: Some(addr),
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    }
}

/// A pager with one handler thread (the one [`the_handler`] finds).
pub fn one_handler_pager() -> Pager {
    Pager::builder()
        .delivery(Delivery::Threads {
            threads: 1,
            spin_us: 0,
        })
        .build()
        .unwrap()
}

/// The one `uffd-handler` thread of this process (a pager with one
/// handler thread must be running).
pub fn the_handler() -> libc::pid_t {
    thread_named("uffd-handler")
}

/// The first thread of this process whose name starts with `prefix`,
/// once there is one (10 s at most).
pub fn thread_named(prefix: &str) -> libc::pid_t {
    let t = Instant::now();
    loop {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no thread named {prefix}*"
        );
        let t: Vec<(String, String)> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| {
                let tid = e.ok()?.file_name().into_string().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
                Some((tid, comm))
            })
            .filter(|(_, c)| c.starts_with(prefix))
            .collect();
        if let Some((tid, _)) = t.first() {
            return tid.parse::<libc::pid_t>().unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
