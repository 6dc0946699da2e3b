//! Handler-thread delivery: a pool of threads reads fault messages (many per
//! read) from the pager's descriptor and resolves them, optionally spinning
//! on the non-blocking descriptor before blocking in poll(2).

use crate::address_space::Mm;
use crate::fault::{handle_fault, Resolution};
use crate::sys::uffd::{fault_flag, Msg, EVENT_PAGEFAULT};
use crate::sys::{now_ns, PAGE_SIZE};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Messages read per read(2).
const BATCH: usize = 16;

/// A running pool; stops and joins its threads on drop.
#[derive(Debug)]
pub struct HandlerPool {
    stop: OwnedFd,
    threads: Vec<JoinHandle<()>>,
}

impl HandlerPool {
    /// Starts `n` handler threads for `mm`.
    pub fn start(mm: &Arc<Mm>, n: usize, spin_us: u32) -> std::io::Result<HandlerPool> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that we now own.
        let stop = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let mm = mm.clone();
            let stopfd = stop.as_raw_fd();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("uffd-handler-{i}"))
                    .spawn(move || serve(&mm, stopfd, spin_us))?,
            );
        }
        Ok(HandlerPool { stop, threads })
    }
}

impl Drop for HandlerPool {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve(mm: &Mm, stopfd: i32, spin_us: u32) {
    let mut msgs = [Msg::default(); BATCH];
    loop {
        let n = match read_batch(mm, stopfd, spin_us, &mut msgs) {
            Some(n) => n,
            None => return,
        };
        for m in &msgs[..n] {
            if m.event != EVENT_PAGEFAULT {
                continue;
            }
            let addr = m.arg1 as usize;
            let write = m.arg0 & fault_flag::WRITE != 0;
            let page = addr & !(PAGE_SIZE - 1);
            match handle_fault(mm, addr, write) {
                Resolution::Resolved | Resolution::Bus => {}
                Resolution::Segv => {
                    // SAFETY: plain syscalls; the thread id came from the
                    // kernel (UFFD_FEATURE_THREAD_ID).
                    unsafe {
                        libc::syscall(
                            libc::SYS_tgkill,
                            libc::getpid(),
                            m.arg2 as libc::c_int,
                            libc::SIGSEGV,
                        )
                    };
                }
            }
            // Installs never wake (DONTWAKE): wake the faulter here. A
            // range that was unregistered meanwhile has no waiters left.
            let _ = mm.uffd.wake(page, PAGE_SIZE);
        }
    }
}

/// Reads a batch, spinning for `spin_us` then blocking in poll. `None` when
/// the pool is stopping.
fn read_batch(mm: &Mm, stopfd: i32, spin_us: u32, msgs: &mut [Msg]) -> Option<usize> {
    let deadline = now_ns() + spin_us as u64 * 1000;
    loop {
        match mm.uffd.read_msgs(msgs) {
            Ok(n) if n > 0 => return Some(n),
            Ok(_) => {}
            Err(libc::EINTR) => continue,
            Err(_) => return None,
        }
        if spin_us > 0 && now_ns() < deadline {
            std::hint::spin_loop();
            continue;
        }
        let mut fds = [
            libc::pollfd {
                fd: mm.uffd.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stopfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if fds[1].revents != 0 {
            return None;
        }
    }
}
