//! A SIGBUS that no pager claims goes to the action installed before the
//! first pager, delivered as the kernel would have delivered it: the
//! handler's `sa_mask`, `SA_RESETHAND`, and an ignored SIGBUS that a fault
//! raised. Each case runs in a child process (the engine's handler is
//! installed once per process, and records the action it finds then), with
//! a deadline: a SIGBUS passed on wrongly can loop for ever.
//!
//! The SIGBUS that is not the engine's is the kernel's own: a read past the
//! end of a one-page file through a two-page shared mapping.

#[path = "engine_util.rs"]
mod util;

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use uffd_pager::{Delivery, Pager};
use util::*;

const MARKER: &str = "CHILD-REACHED-THE-FOREIGN-SIGBUS";

/// Runs test `name` of this binary as a child; kills it after `secs`.
/// Returns its output and whether it had to be killed.
fn run_child_with_deadline(name: &str, secs: u64) -> (Output, bool) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut killed = false;
    while child.try_wait().expect("waiting for the child").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (
        child.wait_with_output().expect("the child's output"),
        killed,
    )
}

/// Builds an in-thread pager and shows that it serves its own faults, then
/// reads past the end of a one-page file: a SIGBUS (`BUS_ADRERR`) that no
/// pager claims. Returns only if that read came back.
fn engine_then_foreign_sigbus() {
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut anon = pager.map_anonymous(4 * PAGE).unwrap();
    anon.as_mut_slice()[PAGE] = 9;
    assert_eq!(anon.as_slice()[PAGE], 9);
    let file = TempFile::with_contents("chain", &[1u8; PAGE]);
    let f = std::fs::File::open(file.path()).unwrap();
    let p = map_file_shared(&f, 2 * PAGE);
    let p = p as *const u8;
    // SAFETY: inside the file.
    assert_eq!(unsafe { std::ptr::read_volatile(p) }, 1);
    eprintln!("{MARKER}");
    // SAFETY: mapped, past the file's end: the kernel answers with SIGBUS.
    let b = unsafe { std::ptr::read_volatile(p.add(PAGE)) };
    eprintln!("CHILD: the read past the end returned {b}");
}

/// Writes `msg` to stderr with write(2): async-signal-safe.
fn say(msg: &[u8]) {
    // SAFETY: write(2) of a valid buffer.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// Installs `handler` for SIGBUS with `flags`, and `mask` as its `sa_mask`.
fn install(handler: libc::sighandler_t, flags: libc::c_int, mask: &[libc::c_int]) {
    // SAFETY: a zeroed sigaction filled in here; the handlers passed are
    // async-signal-safe (`say` and `_exit` only).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        for &s in mask {
            libc::sigaddset(&mut sa.sa_mask, s);
        }
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
}

fn child_ignored_sigbus() {
    install(libc::SIG_IGN, 0, &[]);
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    // A SIGBUS another process (here: this one) sends is ignored, as set.
    // SAFETY: raise is always safe to call.
    unsafe { libc::raise(libc::SIGBUS) };
    eprintln!("CHILD: a sent SIGBUS was ignored");
    drop(pager);
    engine_then_foreign_sigbus();
}

/// An ignored SIGBUS cannot hide a fault: without a pager the kernel kills
/// the process (it resets the action of a SIGBUS raised by a fault); with
/// one, the engine's handler passed it to `SIG_IGN`, the access ran again
/// and faulted again, and the process spun for ever.
#[test]
fn an_ignored_sigbus_from_a_fault_still_kills() {
    if is_child() {
        return child_ignored_sigbus();
    }
    let (out, killed) = run_child_with_deadline("an_ignored_sigbus_from_a_fault_still_kills", 30);
    assert!(!killed, "the child hung: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a sent SIGBUS was ignored") && err.contains(MARKER),
        "{}",
        describe(&out)
    );
    assert_eq!(exit_signal(&out), Some(libc::SIGBUS), "{}", describe(&out));
}

/// Reports which of SIGUSR1 (in its `sa_mask`) and SIGBUS (not `SA_NODEFER`)
/// are blocked while it runs, then exits.
extern "C" fn report_mask(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: pthread_sigmask reads the mask into a local set.
    let (usr1, bus) = unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
        (
            libc::sigismember(&cur, libc::SIGUSR1) == 1,
            libc::sigismember(&cur, libc::SIGBUS) == 1,
        )
    };
    say(if usr1 {
        b"MASK usr1=blocked "
    } else {
        b"MASK usr1=open "
    });
    say(if bus { b"bus=blocked\n" } else { b"bus=open\n" });
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) };
}

fn child_handler_mask() {
    install(
        report_mask as *const () as libc::sighandler_t,
        libc::SA_SIGINFO,
        &[libc::SIGUSR1],
    );
    engine_then_foreign_sigbus();
}

/// The previous handler runs with its own `sa_mask` blocked, as the kernel
/// would have run it (it ran with the engine's handler's empty one).
#[test]
fn the_previous_handler_runs_with_its_sa_mask() {
    if is_child() {
        return child_handler_mask();
    }
    let (out, killed) = run_child_with_deadline("the_previous_handler_runs_with_its_sa_mask", 30);
    assert!(!killed, "the child hung: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(MARKER), "{}", describe(&out));
    assert!(
        err.contains("MASK usr1=blocked bus=blocked"),
        "{}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

fn child_nodefer_mask() {
    install(
        report_mask as *const () as libc::sighandler_t,
        libc::SA_SIGINFO | libc::SA_NODEFER,
        &[libc::SIGUSR1, libc::SIGBUS],
    );
    engine_then_foreign_sigbus();
}

/// `SA_NODEFER` only leaves SIGBUS out of what delivery adds to the mask:
/// a previous handler whose own `sa_mask` lists SIGBUS runs with it
/// blocked, as the kernel would run it. The engine took SIGBUS out of the
/// mask it gave such a handler (found by review).
#[test]
fn a_nodefer_handler_runs_with_the_sigbus_its_sa_mask_lists_blocked() {
    const NAME: &str = "a_nodefer_handler_runs_with_the_sigbus_its_sa_mask_lists_blocked";
    if is_child() {
        return child_nodefer_mask();
    }
    let (out, killed) = run_child_with_deadline(NAME, 30);
    assert!(!killed, "the child hung: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(MARKER) && err.contains("MASK usr1=blocked bus=blocked"),
        "{}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

static CALLS: AtomicU32 = AtomicU32::new(0);

/// Returns the first time (so the access runs again); exits with 7 if it is
/// ever called a second time.
extern "C" fn once_then_default(_: libc::c_int) {
    if CALLS.fetch_add(1, Ordering::Relaxed) == 0 {
        say(b"RESETHAND-HANDLER\n");
        return;
    }
    say(b"RESETHAND-HANDLER-AGAIN\n");
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(7) };
}

fn child_resethand() {
    install(
        once_then_default as *const () as libc::sighandler_t,
        libc::SA_RESETHAND,
        &[],
    );
    engine_then_foreign_sigbus();
}

/// A handler installed with `SA_RESETHAND` runs once; the kernel resets
/// SIGBUS to its default on that delivery, so the access, run again and
/// faulting again, kills the process. It used to be called on every fault.
#[test]
fn a_resethand_handler_runs_once_then_the_default_kills() {
    if is_child() {
        return child_resethand();
    }
    let (out, killed) =
        run_child_with_deadline("a_resethand_handler_runs_once_then_the_default_kills", 30);
    assert!(!killed, "the child hung: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(MARKER) && err.contains("RESETHAND-HANDLER\n"),
        "{}",
        describe(&out)
    );
    assert!(
        !err.contains("RESETHAND-HANDLER-AGAIN"),
        "{}",
        describe(&out)
    );
    assert_eq!(exit_signal(&out), Some(libc::SIGBUS), "{}", describe(&out));
}

/// As Rust's std's stack-overflow handler does for a SIGBUS outside a
/// guard page: sets SIGBUS to its default and returns.
extern "C" fn default_and_return(sig: libc::c_int) {
    say(b"DEFAULT-AND-RETURN\n");
    // SAFETY: a zeroed sigaction is the default action; sigaction is
    // async-signal-safe.
    unsafe {
        let sa: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

fn child_default_and_return() {
    install(
        default_and_return as *const () as libc::sighandler_t,
        0,
        &[],
    );
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut anon = pager.map_anonymous(4 * PAGE).unwrap();
    // A SIGBUS this process sends itself goes to the handler, which sets
    // the default and returns, as without a pager.
    // SAFETY: raise is always safe to call.
    unsafe { libc::raise(libc::SIGBUS) };
    // The engine still serves its faults (each page's first touch is one).
    anon.as_mut_slice()[2 * PAGE] = 5;
    assert_eq!(anon.as_slice()[2 * PAGE], 5);
    eprintln!("CHILD: the engine served a fault after the sent SIGBUS");
    drop(anon);
    drop(pager);
    // And a SIGBUS that is not the engine's gets the default now.
    engine_then_foreign_sigbus();
}

/// A previous handler that sets SIGBUS to its default and returns (Rust's
/// std's, for any SIGBUS outside a stack guard page) used to leave the
/// default installed in the engine's place: after a sent SIGBUS, the next
/// fault on any region killed the process. Now the default becomes what
/// SIGBUSes that are not the engine's get, and the engine's handler stays.
#[test]
fn a_handler_that_sets_the_default_leaves_the_engine_serving() {
    if is_child() {
        return child_default_and_return();
    }
    let (out, killed) = run_child_with_deadline(
        "a_handler_that_sets_the_default_leaves_the_engine_serving",
        30,
    );
    assert!(!killed, "the child hung: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("DEFAULT-AND-RETURN\n")
            && err.contains("the engine served a fault after the sent SIGBUS")
            && err.contains(MARKER),
        "{}",
        describe(&out)
    );
    assert_eq!(exit_signal(&out), Some(libc::SIGBUS), "{}", describe(&out));
}

/// Child: SIGBUS ignored before the pager; a thread blocked in `read` on a
/// pipe is sent SIGBUS, then the pipe gets a byte.
#[test]
fn child_ignored_sigbus_during_a_read() {
    if !is_child() {
        return;
    }
    install(libc::SIG_IGN, 0, &[]);
    let _pager = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let mut b = 0u8;
        // SAFETY: a one-byte read into `b`.
        let n = unsafe { libc::read(fds[0], (&mut b as *mut u8).cast(), 1) };
        (n, errno())
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: a signal to a thread of this process.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGBUS) };
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: a one-byte write from a constant.
    assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
    let (n, e) = reader.join().unwrap();
    println!("read returned {n} (errno {e})");
}

/// An ignored SIGBUS another process sends is invisible, as without the
/// engine: the engine's handler took it, and without `SA_RESTART` the
/// `read` it interrupted failed with `EINTR`.
#[test]
fn an_ignored_sent_sigbus_does_not_interrupt_a_read() {
    if is_child() {
        return;
    }
    let (out, killed) = run_child_with_deadline("child_ignored_sigbus_during_a_read", 20);
    assert!(!killed, "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("read returned 1 "), "{}", describe(&out));
}

extern "C" {
    // glibc's; the `libc` crate does not declare it.
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

/// The cancel state the application's handler found (0: enabled).
static STATE_IN_HANDLER: AtomicU32 = AtomicU32::new(u32::MAX);

/// A SIGBUS handler that notes the cancel state it runs with, then exits.
extern "C" fn note_cancel_state_and_exit(_: libc::c_int) {
    let mut old = 0;
    // SAFETY: sets this thread's cancel state (and puts it back below);
    // `old` is writable.
    unsafe { pthread_setcancelstate(1, &mut old) };
    let mut ignored = 0;
    // SAFETY: as above.
    unsafe { pthread_setcancelstate(old, &mut ignored) };
    STATE_IN_HANDLER.store(old as u32, Ordering::SeqCst);
    say(if old == 0 {
        b"CANCEL-STATE-ENABLED\n"
    } else {
        b"CANCEL-STATE-DISABLED\n"
    });
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) };
}

/// The application's handler a SIGBUS not the engine's is chained to runs
/// with the thread's own cancel state. It ran with cancellation off (the
/// engine's, for its own work): one that leaves with `siglongjmp` skips
/// the engine's drops and left the thread uncancellable for good.
#[test]
fn the_previous_handler_runs_with_the_threads_cancel_state() {
    if is_child() {
        install(
            note_cancel_state_and_exit as *const () as libc::sighandler_t,
            0,
            &[],
        );
        return engine_then_foreign_sigbus();
    }
    let (out, killed) = run_child_with_deadline(
        "the_previous_handler_runs_with_the_threads_cancel_state",
        30,
    );
    assert!(!killed, "the child hung: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CANCEL-STATE-ENABLED") && out.status.success(),
        "{}",
        describe(&out)
    );
}

/// Child, the init of a PID namespace of its own: builds an in-thread
/// pager; Rust's std handler, the action before it, sets the default when
/// the first sent SIGBUS reaches it; a second sent SIGBUS then goes to the
/// default action, which an init does not take (the kernel drops it).
fn child_init_sent_sigbus() {
    // SAFETY: getpid has no preconditions.
    assert_eq!(unsafe { libc::getpid() }, 1, "not a namespace's init");
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut anon = pager.map_anonymous(4 * PAGE).unwrap();
    for _ in 0..2 {
        // SAFETY: raise is always safe to call.
        unsafe { libc::raise(libc::SIGBUS) };
    }
    // The engine still serves its faults.
    anon.as_mut_slice()[3 * PAGE] = 6;
    assert_eq!(anon.as_slice()[3 * PAGE], 6);
    eprintln!("CHILD: the init served a fault after the sent SIGBUSes");
}

/// An init (of a PID namespace: a container's first process) that is sent
/// SIGBUS while the default is SIGBUS's action keeps its pager. The engine
/// installs the default to raise the signal again, and an init's default
/// drops a sent signal, so the raise came back; the default stayed in the
/// engine's place, and the next fault on any region killed the init with
/// SIGBUS (found by review).
#[test]
fn an_init_sent_sigbus_keeps_the_engine_serving() {
    const NAME: &str = "an_init_sent_sigbus_keeps_the_engine_serving";
    if is_child() {
        return child_init_sent_sigbus();
    }
    if !is_root() {
        eprintln!("skipped: a PID namespace needs root");
        return;
    }
    let out = run_child_as_init(NAME, &[]).unwrap_or_else(|out| panic!("the init hung: {out}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("the init served a fault"),
        "{}",
        describe(&out)
    );
}
