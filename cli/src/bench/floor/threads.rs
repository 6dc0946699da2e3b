//! Handler-thread delivery for the floor: threads that block in poll(2)
//! (after an optional spin, as the engine's pool does) and resolve one page
//! per fault message.

use super::{resolve, Target};
use crate::os::uffd::{EventBuffer, Uffd};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uffd_pager::{Error, Result};

/// Fault messages one read takes at most.
const BATCH: usize = 16;

/// Handler threads of the floor; stopped and joined on drop.
pub(super) struct Handlers {
    stop: Arc<EventFd>,
    pub(super) threads: Vec<JoinHandle<()>>,
}

impl Drop for Handlers {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve(uffd: &Uffd, t: Target, stop: &EventFd, spin_us: u32) {
    let mut events = EventBuffer::new(BATCH);
    let spin = Duration::from_micros(spin_us as u64);
    let mut deadline = Instant::now() + spin;
    loop {
        match uffd.read_faults(&mut events) {
            Ok(faults) => {
                let mut any = false;
                for addr in faults {
                    any = true;
                    if let Err(e) = resolve(uffd, &t, addr) {
                        let e = std::io::Error::from_raw_os_error(e);
                        eprintln!("uffd-pager floor: install failed in a handler thread: {e}");
                        std::process::abort();
                    }
                }
                if any {
                    deadline = Instant::now() + spin;
                    continue;
                }
            }
            Err(libc::EINTR) => {}
            Err(e) => {
                let e = std::io::Error::from_raw_os_error(e);
                eprintln!("uffd-pager floor: reading fault messages: {e}");
                std::process::abort();
            }
        }
        if spin_us > 0 && Instant::now() < deadline {
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
        let stop = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| crate::sys_error("eventfd", e as i32))?;
        let mut h = Handlers {
            stop: Arc::new(stop),
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let uffd = uffd.clone();
            let stop = h.stop.clone();
            let t = std::thread::Builder::new()
                .name(format!("uffd-floor-{i}"))
                .spawn(move || serve(&uffd, target, &stop, spin_us))
                .map_err(|e| Error::Io {
                    context: "starting floor handler threads".into(),
                    source: e,
                })?;
            h.threads.push(t);
        }
        Ok(h)
    }
}
