//! Handler-thread delivery for the floor: threads that block in poll(2)
//! (after an optional spin, as the engine's pool does) and resolve one page
//! per fault message.

use super::{resolve, Target};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use uffd_pager::error::{Error, Result};
use uffd_pager::sys::now_ns;
use uffd_pager::sys::uffd::{Msg, Uffd, EVENT_PAGEFAULT};

/// Handler threads of the floor; stopped and joined on drop.
pub(super) struct Handlers {
    stop: OwnedFd,
    pub(super) threads: Vec<JoinHandle<()>>,
}

impl Drop for Handlers {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve(uffd: &Uffd, t: Target, stop: RawFd, spin_us: u32) {
    let mut msgs = [Msg::default(); 16];
    let spin_ns = spin_us as u64 * 1000;
    let mut deadline = now_ns() + spin_ns;
    loop {
        match uffd.read_msgs(&mut msgs) {
            Ok(n) if n > 0 => {
                for m in msgs[..n].iter().filter(|m| m.event == EVENT_PAGEFAULT) {
                    if let Err(e) = resolve(uffd, &t, m.arg1 as usize) {
                        let e = std::io::Error::from_raw_os_error(e);
                        eprintln!("uffd-pager floor: install failed in a handler thread: {e}");
                        std::process::abort();
                    }
                }
                deadline = now_ns() + spin_ns;
                continue;
            }
            Ok(_) | Err(libc::EINTR) => {}
            Err(e) => {
                let e = std::io::Error::from_raw_os_error(e);
                eprintln!("uffd-pager floor: reading fault messages: {e}");
                std::process::abort();
            }
        }
        if spin_ns > 0 && now_ns() < deadline {
            std::hint::spin_loop();
            continue;
        }
        if uffd.wait_or_stop(stop) {
            return;
        }
    }
}

impl Handlers {
    /// Starts `n` threads serving `target`.
    pub(super) fn start(
        uffd: &Arc<Uffd>,
        target: Target,
        n: usize,
        spin_us: u32,
    ) -> Result<Handlers> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(crate::sys_error("eventfd", uffd_pager::sys::errno()));
        }
        // SAFETY: a fresh descriptor that we now own.
        let stop = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut h = Handlers {
            stop,
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let uffd = uffd.clone();
            let stopfd = h.stop.as_raw_fd();
            let t = std::thread::Builder::new()
                .name(format!("uffd-floor-{i}"))
                .spawn(move || serve(&uffd, target, stopfd, spin_us))
                .map_err(|e| Error::Io {
                    context: "starting floor handler threads".into(),
                    source: e,
                })?;
            h.threads.push(t);
        }
        Ok(h)
    }
}
