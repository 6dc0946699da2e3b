//! One `munmap` over a range of another userfaultfd's (the application's
//! own, or another library's) and a pager's region: the kernel posts the
//! other descriptor's UNMAP event first and waits until it is read before
//! it posts the pager's, and meanwhile every install on the pager's
//! descriptor fails with EAGAIN (`mmap_changing`), in any of its regions.
//! In-thread delivery gave up after a second of EAGAIN with SIGBUS, which
//! killed the process at a valid access; now the fault waits for the
//! event.
//!
//! Checked in a child process (the test binary run again with
//! `UFFD_CHILD=1 --exact <child test>`).

#[path = "engine_util.rs"]
mod util;

use std::time::{Duration, Instant};
use uffd_pager::{MapOptions, Pager};
use util::*;

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct Register {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

/// `_IOWR(0xAA, 0x3F, struct uffdio_api)` and `_IOWR(0xAA, 0x00, struct
/// uffdio_register)`.
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const MODE_MISSING: u64 = 1;
/// `UFFD_USER_MODE_ONLY`: no privilege needed.
const USER_MODE_ONLY: libc::c_int = 1;

/// A userfaultfd of the application's own, with UNMAP events, over
/// `[at, at + len)`.
fn other_descriptor(at: usize, len: usize) -> libc::c_int {
    // SAFETY: plain syscalls on a descriptor this function owns; the
    // structures are the kernel's layouts.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC | libc::O_NONBLOCK | USER_MODE_ONLY,
        ) as libc::c_int;
        assert!(fd >= 0, "userfaultfd: {}", errno());
        let mut api = Api {
            api: 0xAA,
            features: FEATURE_EVENT_UNMAP,
            ioctls: 0,
        };
        assert_eq!(libc::ioctl(fd, UFFDIO_API, &mut api), 0, "UFFDIO_API");
        let mut reg = Register {
            start: at as u64,
            len: len as u64,
            mode: MODE_MISSING,
            ioctls: 0,
        };
        assert_eq!(
            libc::ioctl(fd, UFFDIO_REGISTER, &mut reg),
            0,
            "UFFDIO_REGISTER: {}",
            errno()
        );
        fd
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) },
        0
    );
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Child: the `munmap` waits on the other descriptor's reader for 3 s
/// while a thread writes a fresh page of another pager region.
#[test]
fn child_fault_while_another_descriptors_event_is_unread() {
    if !is_child() {
        return;
    }
    const LEN: usize = 16 * PAGE;
    let pager = Pager::builder().build().unwrap();
    // The other descriptor's page right below the pager's region `r1`.
    let base = free_range(PAGE + LEN);
    let r1 = pager
        .map_anonymous_with(
            LEN,
            &MapOptions {
                fixed_addr: Some(base + PAGE),
                ..MapOptions::default()
            },
        )
        .unwrap();
    // SAFETY: `base` is free (the page below r1, from free_range).
    let x = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(x as usize, base, "mmap below the region: {}", errno());
    let fd = other_descriptor(base, PAGE);
    let r3 = pager.map_anonymous(LEN).unwrap();
    let p3 = r3.as_ptr() as usize;
    let r1_start = r1.as_ptr() as usize;
    std::mem::forget(r1); // the application's munmap takes it
    let unmapper = std::thread::spawn(move || {
        // SAFETY: the other descriptor's page and r1, which the test gave
        // up (forget) for the application to unmap.
        let rc = unsafe { libc::munmap(base as *mut libc::c_void, PAGE + LEN) };
        assert_eq!(rc, 0);
        assert_eq!(r1_start, base + PAGE);
    });
    // Once the other descriptor's event is posted, the munmap waits on its
    // reader, and the pager's descriptor is changing.
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 10_000) }, 1, "no event");
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        let mut msg = [0u8; 32];
        // SAFETY: reads one message into `msg`.
        let n = unsafe { libc::read(fd, msg.as_mut_ptr().cast(), 32) };
        assert_eq!(n, 32, "reading the event: {}", errno());
    });
    let t = Instant::now();
    let cpu = thread_cpu();
    // SAFETY: inside r3, mapped until the end of the child.
    unsafe { std::ptr::write_volatile((p3 + 5 * PAGE) as *mut u8, 7) };
    let (waited, busy) = (t.elapsed(), thread_cpu() - cpu);
    eprintln!("the write waited {waited:?}, {busy:?} of it on the CPU");
    // The fault waits without keeping its CPU busy (it yielded in a loop
    // for the whole wait before: 3.0 s of CPU in 3.0 s).
    assert!(
        busy * 4 < waited,
        "the waiting fault was on the CPU {busy:?} of {waited:?}"
    );
    reader.join().unwrap();
    unmapper.join().unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { std::ptr::read_volatile((p3 + 5 * PAGE) as *const u8) },
        7
    );
    // SAFETY: the test's own descriptor.
    unsafe { libc::close(fd) };
}

#[test]
fn a_fault_waits_for_an_event_another_descriptor_holds_up() {
    let out = run_child("child_fault_while_another_descriptors_event_is_unread", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}
