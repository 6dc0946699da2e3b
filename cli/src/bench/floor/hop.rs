//! The worker hop's floor: what handing a page read to another thread
//! costs at the least. The faulting thread posts the source address in a
//! shared word and wakes a worker with `FUTEX_WAKE`; the worker copies the
//! page into a buffer of its own, marks it done and wakes the faulter, which
//! sleeps in `FUTEX_WAIT` on a word of its own meanwhile and then installs
//! from the buffer. Two futex wake-ups, a page copy and the install: what
//! the engine's I/O workers do for a store that is not signal-safe, with no
//! queue, no request table and no timeout.
//!
//! What it costs depends mostly on where the scheduler puts the two
//! threads: a wake-up onto the other vCPU (halted, or polling in the guest's
//! `haltpoll` idle loop) costs tens of microseconds, a switch on the same
//! vCPU a few. Compare engine and floor under the same placement (the
//! README runs both on one CPU with `taskset -c 0`).
//!
//! Async-signal-safe on the faulting side (atomics and futex calls), so
//! the in-thread floor's SIGBUS handler can use it.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};
use std::sync::Arc;
use uffd_pager::PAGE_SIZE;

const IDLE: u32 = 0;
const POSTED: u32 = 1;
const DONE: u32 = 2;
const STOP: u32 = 3;

/// A page-aligned page.
#[repr(C, align(4096))]
struct Page([u8; PAGE_SIZE]);

/// The shared state of one faulter–worker pair.
pub(super) struct Hop {
    /// The worker sleeps on this one: IDLE, POSTED or STOP.
    state: AtomicU32,
    /// The faulter sleeps on this one: 0, or DONE.
    done: AtomicU32,
    src: AtomicUsize,
    buf: std::cell::UnsafeCell<Page>,
}

// SAFETY: `buf` is written by the worker only between POSTED and DONE and
// read by the faulter only after DONE and before the next POSTED: the
// state word hands it from one to the other.
unsafe impl Sync for Hop {}

fn futex(word: &AtomicU32, op: i32, val: u32) {
    // SAFETY: FUTEX_WAIT/FUTEX_WAKE on a live, aligned u32; no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

impl Hop {
    /// Has the worker copy the page at `src` and returns where the copy is.
    /// Async-signal-safe. One faulter at a time (the in-thread floor's
    /// passes run on one thread).
    pub(super) fn fetch(&self, src: usize) -> usize {
        self.src.store(src, Relaxed);
        self.done.store(0, Relaxed);
        self.state.store(POSTED, Release);
        futex(&self.state, libc::FUTEX_WAKE, 1);
        while self.done.load(Acquire) != DONE {
            futex(&self.done, libc::FUTEX_WAIT, 0);
        }
        self.buf.get() as usize
    }

    fn work(&self) {
        loop {
            match self.state.load(Acquire) {
                POSTED => {
                    let src = self.src.load(Relaxed);
                    // SAFETY: POSTED: the buffer is the worker's, and `src`
                    // is a page of the floor's live source buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            src as *const u8,
                            (*self.buf.get()).0.as_mut_ptr(),
                            PAGE_SIZE,
                        )
                    };
                    self.state.store(IDLE, Relaxed);
                    self.done.store(DONE, Release);
                    futex(&self.done, libc::FUTEX_WAKE, 1);
                }
                STOP => return,
                s => futex(&self.state, libc::FUTEX_WAIT, s),
            }
        }
    }
}

/// A [`Hop`] and its worker thread, stopped and joined on drop.
pub(super) struct HopWorker {
    pub(super) hop: Arc<Hop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HopWorker {
    pub(super) fn start() -> std::io::Result<HopWorker> {
        let hop = Arc::new(Hop {
            state: AtomicU32::new(IDLE),
            done: AtomicU32::new(0),
            src: AtomicUsize::new(0),
            buf: std::cell::UnsafeCell::new(Page([0; PAGE_SIZE])),
        });
        let h = hop.clone();
        let thread = std::thread::Builder::new()
            .name("uffd-floor-hop".into())
            .spawn(move || h.work())?;
        Ok(HopWorker {
            hop,
            thread: Some(thread),
        })
    }
}

impl Drop for HopWorker {
    fn drop(&mut self) {
        self.hop.state.store(STOP, Release);
        futex(&self.hop.state, libc::FUTEX_WAKE, 1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
