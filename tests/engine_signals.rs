//! SIGBUS / SIGSEGV semantics, checked in child processes (the test binary
//! re-run with `UFFD_CHILD=1 --exact <child test>`): a poisoned page kills
//! the toucher with SIGBUS, a touch after unmap or a write to a read-only
//! region with SIGSEGV. Each child prints a marker right before the fatal
//! access, so a child that died earlier (in setup) does not pass.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore, Store};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};
use util::*;

const PAGES: usize = 8;
const LEN: usize = PAGES * PAGE;
const MARKER: &str = "CHILD-REACHED-FATAL-ACCESS";

/// The delivery the parent named (its `Display` form), in-thread if none.
fn child_delivery() -> Delivery {
    std::env::var("UFFD_DELIVERY").map_or(Delivery::InThread, |d| {
        d.parse().expect("a delivery mode the parent named")
    })
}

fn child_kind() -> InstallKind {
    match std::env::var("UFFD_KIND").as_deref() {
        Ok("shared") => InstallKind::Shared,
        _ => InstallKind::Anonymous,
    }
}

fn kind_name(k: InstallKind) -> &'static str {
    match k {
        InstallKind::Anonymous => "anonymous",
        InstallKind::Shared => "shared",
    }
}

fn marker() {
    eprintln!("{MARKER}");
}

/// Runs `child` with the given delivery and kind and asserts it was killed
/// by `signal` after reaching its fatal access.
fn expect_child_signal(child: &str, d: Delivery, k: InstallKind, signal: i32) {
    let out = run_child(
        child,
        &[
            ("UFFD_DELIVERY", &d.to_string()),
            ("UFFD_KIND", kind_name(k)),
        ],
    );
    let ctx = format!("{child} ({d}, {k})");
    assert_eq!(
        exit_signal(&out),
        Some(signal),
        "{ctx}: expected death by signal {signal}; {}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(MARKER),
        "{ctx}: child died before its fatal access; {}",
        describe(&out)
    );
}

/// Child: a store whose every read fails; touching a page must SIGBUS.
#[test]
fn child_touch_failing_page() {
    if !is_child() {
        return;
    }
    let p = Pager::builder().delivery(child_delivery()).build().unwrap();
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&pattern_vec(1, LEN)).unwrap());
    let sim = Arc::new(SimulatedStore::new(mem, LatencyModel::None, 0, 1));
    sim.fail_next_reads(u32::MAX);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe {
        p.map_store(
            sim,
            LEN,
            &MapOptions {
                kind: Some(child_kind()),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    marker();
    // SAFETY: inside the region.
    let v = unsafe { std::ptr::read_volatile(region.as_ptr().add(2 * PAGE)) };
    eprintln!("CHILD: survived reading a poisoned page: {v}");
}

/// Child: a good page, then a page whose reads fail: the good one reads
/// fine, the bad one SIGBUSes.
#[test]
fn child_touch_good_then_failing_page() {
    if !is_child() {
        return;
    }
    let p = Pager::builder().delivery(child_delivery()).build().unwrap();
    let data = pattern_vec(2, LEN);
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let sim = Arc::new(SimulatedStore::new(mem, LatencyModel::None, 0, 1));
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe {
        p.map_store(
            sim.clone(),
            LEN,
            &MapOptions {
                kind: Some(child_kind()),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    assert_bytes(&region.as_slice()[..PAGE], &data[..PAGE], "good page");
    sim.fail_next_reads(u32::MAX);
    marker();
    // SAFETY: inside the region.
    let v = unsafe { std::ptr::read_volatile(region.as_ptr().add(5 * PAGE + 7)) };
    eprintln!("CHILD: survived reading a poisoned page: {v}");
}

/// Child: touch a region's address after the region was unmapped.
#[test]
fn child_touch_after_unmap() {
    if !is_child() {
        return;
    }
    let p = Pager::builder().delivery(child_delivery()).build().unwrap();
    let data = pattern_vec(3, LEN);
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    // A fixed address in an area nothing else maps, so the range stays
    // unmapped once the region is gone.
    let at = free_range(LEN);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe {
        p.map_store(
            mem,
            LEN,
            &MapOptions {
                kind: Some(child_kind()),
                fixed_addr: Some(at),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    assert_bytes(&region.as_slice()[..PAGE], &data[..PAGE], "before unmap");
    let ptr = region.as_ptr();
    if std::env::var("UFFD_DROP").is_ok() {
        drop(region);
    } else {
        region.unmap().unwrap();
    }
    marker();
    // Page 0 was present before the unmap, page 3 never was; touch both.
    // SAFETY: deliberately touching an unmapped address; the process dies.
    let v = unsafe { std::ptr::read_volatile(ptr.add(3 * PAGE)) };
    // SAFETY: as above.
    let w = unsafe { std::ptr::read_volatile(ptr) };
    eprintln!("CHILD: survived touching an unmapped region: {v} {w}");
}

/// Child: write to a region made read-only (a present page with
/// `UFFD_PAGE=present`, else a never-touched one).
#[test]
fn child_write_after_protect_readonly() {
    if !is_child() {
        return;
    }
    let p = Pager::builder().delivery(child_delivery()).build().unwrap();
    let data = pattern_vec(4, LEN);
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region = unsafe {
        p.map_store(
            mem,
            LEN,
            &MapOptions {
                kind: Some(child_kind()),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    region.as_mut_slice()[PAGE] = 0x42;
    region.protect(false).unwrap();
    // Reading still works, absent pages included.
    let mut want = data.clone();
    want[PAGE] = 0x42;
    assert_bytes(
        &region.as_slice()[..4 * PAGE],
        &want[..4 * PAGE],
        "readonly",
    );
    let page = if std::env::var("UFFD_PAGE").as_deref() == Ok("present") {
        1
    } else {
        6
    };
    marker();
    // SAFETY: inside the region; the region is read-only, so this write
    // must kill the process.
    unsafe { std::ptr::write_volatile(region.as_ptr().add(page * PAGE + 1), 0x77) };
    eprintln!("CHILD: survived writing a read-only region");
}

#[test]
fn signals_failing_page_is_sigbus_in_thread() {
    for k in [InstallKind::Anonymous, InstallKind::Shared] {
        expect_child_signal(
            "child_touch_failing_page",
            Delivery::InThread,
            k,
            libc::SIGBUS,
        );
        expect_child_signal(
            "child_touch_good_then_failing_page",
            Delivery::InThread,
            k,
            libc::SIGBUS,
        );
    }
}

#[test]
fn signals_failing_page_is_sigbus_threads() {
    for k in [InstallKind::Anonymous, InstallKind::Shared] {
        expect_child_signal("child_touch_failing_page", THREADS, k, libc::SIGBUS);
    }
}

#[test]
fn signals_touch_after_unmap_is_sigsegv() {
    for d in DELIVERIES {
        for k in [InstallKind::Anonymous, InstallKind::Shared] {
            expect_child_signal("child_touch_after_unmap", d, k, libc::SIGSEGV);
        }
    }
    // Dropping (rather than unmap()) tears the mapping down just the same.
    let out = run_child(
        "child_touch_after_unmap",
        &[("UFFD_DROP", "1"), ("UFFD_KIND", "shared")],
    );
    assert_eq!(exit_signal(&out), Some(libc::SIGSEGV), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(MARKER));
}

#[test]
fn signals_write_to_readonly_is_sigsegv() {
    for d in DELIVERIES {
        for k in [InstallKind::Anonymous, InstallKind::Shared] {
            for page in ["present", "absent"] {
                let out = run_child(
                    "child_write_after_protect_readonly",
                    &[
                        ("UFFD_DELIVERY", &d.to_string()),
                        ("UFFD_KIND", kind_name(k)),
                        ("UFFD_PAGE", page),
                    ],
                );
                assert_eq!(
                    exit_signal(&out),
                    Some(libc::SIGSEGV),
                    "{d} {k} {page}: {}",
                    describe(&out)
                );
                assert!(
                    String::from_utf8_lossy(&out.stderr).contains(MARKER),
                    "{d} {k} {page}: {}",
                    describe(&out)
                );
            }
        }
    }
}

/// The application's SIGSEGV handler, for the child below: writes whether
/// it runs as engine code (`uffd_pager::in_engine`), then exits. Only
/// `write` and `_exit`: async-signal-safe.
extern "C" fn report_in_engine(_: libc::c_int) {
    // SAFETY: this thread's errno, read first.
    let errno = unsafe { *libc::__errno_location() };
    let msg: &[u8] = if uffd_pager::in_engine() {
        b"SEGV-HANDLER-IN-ENGINE\n"
    } else {
        b"SEGV-HANDLER-AS-APP\n"
    };
    let kept: &[u8] = if errno == FAULT_ERRNO {
        b"ERRNO-KEPT\n"
    } else {
        b"ERRNO-CHANGED\n"
    };
    // SAFETY: write(2) of static buffers, then _exit: async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::write(2, kept.as_ptr().cast(), kept.len());
        libc::_exit(0);
    }
}

/// The errno the child's access faults with.
const FAULT_ERRNO: i32 = 4321;

fn child_segv_handler_runs_as_the_application() {
    if !is_child() {
        return;
    }
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let data = pattern_vec(5, LEN);
    let store = Arc::new(MemoryStore::read_only(&data).unwrap());
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { p.map_store(store, LEN, &opts) }.unwrap();
    // The application makes it writable itself: the kernel lets the write
    // through to the engine, which refuses it (no write-back could keep it).
    // SAFETY: the region's own range.
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    assert_eq!(
        unsafe { libc::mprotect(region.as_ptr().cast(), LEN, rw) },
        0
    );
    // SAFETY: installs a handler whose body is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGSEGV,
            report_in_engine as *const () as libc::sighandler_t,
        )
    };
    marker();
    // SAFETY: this thread's errno; then inside the region, absent: the
    // engine answers the SIGBUS with a SIGSEGV, which the handler above
    // catches.
    unsafe {
        *libc::__errno_location() = FAULT_ERRNO;
        std::ptr::write_volatile(region.as_ptr().add(6 * PAGE), 0x77)
    };
    eprintln!("CHILD: survived writing a read-only region");
}

/// The SIGSEGV the engine raises for a write to a read-only region runs the
/// application's handler as application code: it used to run nested in the
/// engine's SIGBUS handler with the thread still marked as engine code (so
/// the LD_PRELOAD shim let its calls through unseen, and a handler that left
/// with `siglongjmp` kept the mark for good).
#[test]
fn signals_the_raised_sigsegv_runs_as_application_code() {
    if is_child() {
        return child_segv_handler_runs_as_the_application();
    }
    let out = run_child("signals_the_raised_sigsegv_runs_as_application_code", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(MARKER), "{}", describe(&out));
    assert!(err.contains("SEGV-HANDLER-AS-APP"), "{}", describe(&out));
    // And with the errno of the code it interrupted (it ran with the
    // engine's before).
    assert!(err.contains("ERRNO-KEPT"), "{}", describe(&out));
}

/// Runs child test `name` traced (`PTRACE_TRACEME`, its threads followed)
/// and returns the `si_code` of each SIGBUS its threads got, in order,
/// and the signal that ended it.
fn traced_sigbus_codes(name: &str, envs: &[(&str, &str)]) -> (Vec<i32>, Option<i32>) {
    use std::os::unix::process::CommandExt;
    let mut cmd = child_command(name, envs);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: ptrace(PTRACE_TRACEME) between fork and exec (one system
    // call, async-signal-safe).
    unsafe {
        cmd.pre_exec(|| match libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    // (Reaped by the `waitpid` loop below, which a tracer must run itself.)
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().expect("spawning the traced child");
    let pid = child.id() as libc::pid_t;
    let (mut tids, mut codes, mut first) = (vec![pid], Vec::new(), true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the traced child hangs"
        );
        let mut seen = false;
        for k in 0..tids.len() {
            let tid = tids[k];
            let mut st = 0;
            // SAFETY: waits for one traced thread of our child, no hang.
            let r = unsafe { libc::waitpid(tid, &mut st, libc::__WALL | libc::WNOHANG) };
            if r <= 0 {
                continue;
            }
            seen = true;
            if !libc::WIFSTOPPED(st) {
                if tid == pid {
                    // SAFETY: reads the end of our own child.
                    let sig = libc::WIFSIGNALED(st).then(|| libc::WTERMSIG(st));
                    return (codes, sig);
                }
                continue;
            }
            let (sig, event) = (libc::WSTOPSIG(st), st >> 16);
            let mut deliver = 0;
            // SAFETY (the block): ptrace requests on a stopped thread of
            // our traced child, with valid out-parameters.
            unsafe {
                if first {
                    // The exec's stop: follow its threads, and kill it if
                    // this process goes.
                    first = false;
                    let opts = libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_EXITKILL;
                    libc::ptrace(libc::PTRACE_SETOPTIONS, tid, 0, opts);
                } else if event == libc::PTRACE_EVENT_CLONE {
                    let mut new: libc::c_ulong = 0;
                    libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, &mut new);
                    tids.push(new as libc::pid_t);
                } else if sig != libc::SIGSTOP && sig != libc::SIGTRAP {
                    if sig == libc::SIGBUS {
                        let mut info: libc::siginfo_t = std::mem::zeroed();
                        libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0, &mut info);
                        codes.push(info.si_code);
                    }
                    deliver = sig;
                }
                libc::ptrace(libc::PTRACE_CONT, tid, 0, deliver);
            }
        }
        if !seen {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// The SIGBUS a failing page kills with is the kernel's own, with the
/// fault's siginfo (`BUS_MCEERR_AR`: the page the engine poisoned), as
/// without a pager: a core and crash tools see the fault. The engine set
/// the default action and raised SIGBUS from its handler: the process
/// died of an `SI_TKILL` with no address, in the handler's context.
#[test]
fn a_failing_page_kills_with_the_faults_own_sigbus() {
    if is_child() {
        return;
    }
    let (codes, sig) = traced_sigbus_codes(
        "child_touch_failing_page",
        &[("UFFD_DELIVERY", "in-thread"), ("UFFD_KIND", "anonymous")],
    );
    assert_eq!(sig, Some(libc::SIGBUS), "SIGBUSes: {codes:?}");
    assert!(
        codes.last().is_some_and(|&c| c > 0),
        "the fatal SIGBUS was not a fault's: si_code of each {codes:?}"
    );
}

/// Child: an in-thread pager, SIGBUS at its default; the thread queues
/// itself a SIGBUS with a fault's `si_code` (`BUS_ADRALN`, as the kernel's
/// split-lock trap sends after the instruction has completed: running it
/// again does not fault).
#[test]
fn child_queued_fault_sigbus() {
    if !is_child() {
        return;
    }
    // At the default action before the pager (Rust's std installs a
    // handler of its own for stack overflows, which sets the default and
    // returns).
    // SAFETY: a zeroed action with the default disposition.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
    let _p = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    // SAFETY: a zeroed siginfo filled in here, queued to this thread.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        info.si_signo = libc::SIGBUS;
        info.si_code = 1; // BUS_ADRALN
        marker();
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            libc::getpid(),
            libc::gettid(),
            libc::SIGBUS,
            &info,
        );
    }
    eprintln!("CHILD: survived a fault's SIGBUS at the default action");
}

/// A SIGBUS with a fault's `si_code` at the default action kills, also
/// where running the instruction again would not fault again: the engine
/// queues the signal's own siginfo and returns. Letting the access fault
/// again, the process ran on with SIGBUS at the default, and died of the
/// next fault the engine would have served (found by review).
#[test]
fn a_fault_sigbus_at_the_default_kills_without_a_second_fault() {
    if is_child() {
        return;
    }
    let (codes, sig) = traced_sigbus_codes("child_queued_fault_sigbus", &[]);
    assert_eq!(sig, Some(libc::SIGBUS), "SIGBUSes: {codes:?}");
    assert_eq!(
        codes.last(),
        Some(&1),
        "the fatal SIGBUS's si_code: {codes:?}"
    );
}
