//! The I/O workers' side: the loop that runs requests, frees abandoned
//! ones and gives back what a 2 MiB request's buffer left behind, and the
//! start and stop of the threads. A worker is an ordinary thread: it may
//! allocate, lock and log; the requests' callers are not.

use super::call::{read_in_place, write_in_place};
use super::*;

impl Io {
    /// One worker's loop: runs requests until the queue is stopped.
    fn work(&self) {
        while let Some(k) = self.queue.next_spinning(self.spin_ns) {
            let s = &self.slots[k as usize];
            // (SeqCst, as the loads in `store_full`: see there.)
            if s.state
                .compare_exchange(PENDING, RUNNING, SeqCst, SeqCst)
                .is_err()
            {
                // Given up on before it ran (DROPPED).
                self.release(s);
                continue;
            }
            if self.store_full(k as usize) {
                // Back to the queue, behind what other stores wait for;
                // a caller that gives up meanwhile (ABANDONED before the
                // call began) has its slot freed here.
                if s.state
                    .compare_exchange(RUNNING, PENDING, SeqCst, SeqCst)
                    .is_ok()
                {
                    self.queue.push(k);
                    self.queue.kick();
                    // (Not at once round again for the same request.)
                    std::thread::sleep(std::time::Duration::from_micros(100));
                } else {
                    self.release(s);
                }
                continue;
            }
            // SAFETY: RUNNING: this worker alone touches the cell.
            let store = unsafe { (*s.store.get()).take() };
            let len = s.len.load(Relaxed) as usize;
            // SAFETY: RUNNING: this worker alone touches the buffer, which
            // holds SLOT_BYTES (`submit` checked `len`).
            let buf = unsafe { std::slice::from_raw_parts_mut(self.buf(k as usize), len) };
            let op = s.op.load(Relaxed);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match (&store, op) {
                // Zeros first: what a store leaves unwritten must not be
                // the last request's bytes (another region's page, maybe),
                // as it is not on the callers' own paths (zeroed buffers).
                (Some(st), READ) => {
                    buf.fill(0);
                    read_in_place(&**st, s.offs[0].load(Relaxed), buf)
                }
                (Some(st), SYNC) => st.sync(),
                (Some(st), DISCARD) => {
                    st.discard(s.offs[0].load(Relaxed), s.offs[1].load(Relaxed));
                    Ok(())
                }
                (Some(st), _) if len == HUGE_PAGE_SIZE => {
                    write_in_place(&**st, &[(s.offs[0].load(Relaxed), buf)])
                }
                (Some(st), _) => {
                    // A worker may allocate: the batch's list is built here.
                    let pages: Vec<(u64, &[u8])> = buf
                        .chunks(PAGE_SIZE)
                        .enumerate()
                        .map(|(n, p)| (s.offs[n].load(Relaxed), p))
                        .collect();
                    write_in_place(&**st, &pages)
                }
                (None, _) => Err(StoreError(libc::EINVAL)),
            }));
            let errno = match r {
                Ok(Ok(())) => 0,
                Ok(Err(StoreError(e))) => e.max(1),
                Err(_) => {
                    tracing::error!("a store panicked; the call counts as failed");
                    libc::EIO
                }
            };
            s.result.store(errno, Relaxed);
            if s.state
                .compare_exchange(RUNNING, DONE, AcqRel, Acquire)
                .is_ok()
            {
                futex::wake_all(&s.state);
                drop_store(store);
            } else {
                // The caller gave up: nobody wants the answer, but a failed
                // sync's (see `sync`), recorded while the store is held.
                if let (SYNC, Some(st), true) = (op, &store, errno != 0) {
                    self.failed_sync_given_up(st);
                }
                drop_store(store);
                self.release(s);
            }
        }
    }

    /// Whether the store of slot `k` (RUNNING: this worker's) already has
    /// [`Io::per_store`] calls inside it on other workers (running, or
    /// given up on and not returned).
    ///
    /// Hazard: a store that stops answering (a hung server, a dead NFS
    /// mount) keeps every worker that calls it. Faults on its other pages,
    /// and its write-back, sent each call into it until no worker was left
    /// and every other store's requests queued, timed out and failed (found
    /// by review). So one store has at most `per_store` calls inside at a
    /// time, one fewer than there are workers: the last worker is always
    /// free for the other stores. (Several stores hung at once can still
    /// take every worker between them.)
    ///
    /// Exact, with no lock: this worker's move to RUNNING and its loads
    /// here are SeqCst, as every other worker's, so of two workers that
    /// enter the same store at once at least one sees the other (both may,
    /// and both put their request back: it runs a round later).
    fn store_full(&self, k: usize) -> bool {
        let id = self.slots[k].store_id.load(Relaxed);
        let limit = self.per_store.load(Relaxed);
        let mut inside = 0;
        for (j, s) in self.slots.iter().enumerate() {
            if j != k
                && matches!(s.state.load(SeqCst), RUNNING | ABANDONED)
                && s.store_id.load(Relaxed) == id
            {
                inside += 1;
                if inside >= limit {
                    return true;
                }
            }
        }
        false
    }

    /// Frees a slot its caller gave up on.
    fn release(&self, s: &Slot) {
        // SAFETY: the slot is ABANDONED or DROPPED: its caller left, and
        // only this worker (the one that popped it) touches it now.
        drop_store(unsafe { (*s.store.get()).take() });
        let k = self.slots.iter().position(|x| std::ptr::eq(x, s));
        if let Some(k) = k {
            self.give_back_tail(k);
        }
        s.state.store(FREE, Release);
    }

    /// A 2 MiB request leaves its buffer's pages behind: gives back what
    /// base-page requests never use. The caller owns slot `k` (DONE and
    /// its waiter's, or ABANDONED or DROPPED and its worker's).
    pub(super) fn give_back_tail(&self, k: usize) {
        if self.slots[k].len.load(Relaxed) as usize > REQUEST_BYTES {
            let tail = self.buf(k) as usize + REQUEST_BYTES;
            let _ = crate::sys::mem::madvise(tail, SLOT_BYTES - REQUEST_BYTES, libc::MADV_DONTNEED);
        }
    }

    /// Stops the workers.
    pub fn stop(&self) {
        self.queue.stop();
    }
}

/// Drops a worker's reference to a store, which may be the last (its
/// caller gave up and the region went meanwhile): a panic in the store's
/// `Drop` is caught and logged. (Unwound, it skipped the slot's release,
/// which stayed abandoned, and ended the worker: with each such drop one
/// worker fewer, until every later request timed out.)
fn drop_store(store: Option<Arc<dyn Store>>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(store))).is_err() {
        tracing::error!("dropping a store panicked; the I/O worker goes on");
    }
}

/// Starts `n` + 1 I/O worker threads over `io` (kept alive by `owner`):
/// `n` for any store, one kept from any single store ([`Io::store_full`]:
/// a store has at most `n` calls inside at a time).
pub fn start<T: Send + Sync + 'static>(
    owner: &Arc<T>,
    io: fn(&T) -> &Io,
    n: usize,
    started: &mut Vec<std::thread::JoinHandle<()>>,
) -> std::io::Result<()> {
    io(owner).per_store.store(n.max(1), Relaxed);
    for k in 0..=n {
        let owner = owner.clone();
        started.push(crate::sys::thread::spawn(
            format!("uffd-io-{k}"),
            move || io(&owner).work(),
        )?);
    }
    Ok(())
}
