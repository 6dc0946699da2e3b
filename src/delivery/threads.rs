//! Handler-thread delivery: a pool of threads reads fault messages (many per
//! read) from the pager's descriptor and resolves them, optionally spinning
//! on the non-blocking descriptor before blocking in poll(2).

use crate::address_space::Mm;
use crate::fault::{handle_fault, Resolution};
use crate::stats::Counter::UFFD_WAKE;
use crate::sys::uffd::{fault_flag, Msg, Uffd, EVENT_PAGEFAULT};
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
    /// Starts `n` handler threads for `mm`, serving its descriptor.
    pub fn start(mm: &Arc<Mm>, n: usize, spin_us: u32) -> std::io::Result<HandlerPool> {
        Self::start_on(mm, None, n, spin_us, "uffd-handler")
    }

    /// Starts `n` handler threads for `mm`, serving `uffd` (one region's
    /// descriptor), or `mm`'s own descriptor if `None`.
    pub fn start_on(
        mm: &Arc<Mm>,
        uffd: Option<Arc<Uffd>>,
        n: usize,
        spin_us: u32,
        name: &str,
    ) -> std::io::Result<HandlerPool> {
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
            let own = uffd.clone();
            let stopfd = stop.as_raw_fd();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        serve(&mm, own.as_deref().unwrap_or(&mm.uffd), stopfd, spin_us)
                    })?,
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

fn serve(mm: &Mm, uffd: &Uffd, stopfd: i32, spin_us: u32) {
    let mut msgs = [Msg::default(); BATCH];
    let mut done = [0usize; BATCH];
    loop {
        let n = match read_batch(uffd, stopfd, spin_us, &mut msgs) {
            Some(n) => n,
            None => return,
        };
        let (mut nd, mut oldest) = (0, 0);
        for m in &msgs[..n] {
            if m.event != EVENT_PAGEFAULT {
                continue;
            }
            let addr = m.arg1 as usize;
            let access = crate::fault::Access {
                write: m.arg0 & fault_flag::WRITE != 0,
                present: Some(m.arg0 & fault_flag::WP != 0),
            };
            match handle_fault(mm, addr, access) {
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
            done[nd] = addr & !(PAGE_SIZE - 1);
            nd += 1;
            // A slow fault (a store read) must not hold back the wake-ups
            // of the ones handled before it: wake early when the first
            // pending one has waited long enough.
            let now = now_ns();
            if nd == 1 {
                oldest = now;
            } else if now - oldest > WAKE_DELAY_NS {
                wake_batch(mm, uffd, &mut done[..nd]);
                nd = 0;
            }
        }
        wake_batch(mm, uffd, &mut done[..nd]);
    }
}

/// How long a resolved fault may wait for the rest of its batch before its
/// thread is woken anyway.
const WAKE_DELAY_NS: u64 = 10_000;

/// Wakes the faulters of a handled batch. Installs never wake (DONTWAKE),
/// so this is the one place they are woken: one `UFFDIO_WAKE` per run of
/// adjacent pages (several threads faulting one page, or a run of
/// neighbours, take one call). Runs are not merged across gaps: a waiter
/// in a gap may be a fault not handled yet, which a wake would only send
/// back to fault again. A range that was unregistered meanwhile has no
/// waiters left, so errors are ignored.
fn wake_batch(mm: &Mm, uffd: &Uffd, pages: &mut [usize]) {
    pages.sort_unstable();
    for (start, len) in runs(pages) {
        let _ = uffd.wake(start, len);
        mm.counters.inc(UFFD_WAKE);
    }
}

/// The runs of adjacent (or equal) pages in sorted `pages`, as (start,
/// length in bytes).
fn runs(pages: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = *pages.get(i)?;
        let mut end = start + PAGE_SIZE;
        i += 1;
        while i < pages.len() && pages[i] <= end {
            end = pages[i] + PAGE_SIZE;
            i += 1;
        }
        Some((start, end - start))
    })
}

/// Reads a batch, spinning for `spin_us` then blocking in poll. `None` when
/// the pool is stopping.
fn read_batch(uffd: &Uffd, stopfd: i32, spin_us: u32, msgs: &mut [Msg]) -> Option<usize> {
    let deadline = now_ns() + spin_us as u64 * 1000;
    loop {
        match uffd.read_msgs(msgs) {
            Ok(n) if n > 0 => return Some(n),
            Ok(_) => {}
            Err(libc::EINTR) => continue,
            Err(_) => return None,
        }
        if spin_us > 0 && now_ns() < deadline {
            std::hint::spin_loop();
            continue;
        }
        if uffd.wait_or_stop(stopfd) {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_runs_merge_equal_and_adjacent_pages_only() {
        let p = PAGE_SIZE;
        let pages = [p, p, 2 * p, 3 * p, 5 * p, 9 * p, 9 * p];
        let got: Vec<_> = runs(&pages).collect();
        assert_eq!(got, vec![(p, 3 * p), (5 * p, p), (9 * p, p)]);
        assert_eq!(runs(&[]).count(), 0);
    }
}
