//! Which of a store's writes are durable: the write-back's view of
//! [`Store::sync`](crate::store::Store::sync) (the kernel's `fsync` and its
//! per-file `errseq`).
//!
//! Every store write (reclaim's, a write-back's) is counted twice
//! ([`Durability::write`]): as begun before the store call, and as done
//! after it returns (a failed one may have reached the file in part). A
//! write-back that wrote, or found writes from before it, syncs the store
//! once, under this object's mutex, unless a sync that began after its
//! writes were done already succeeded. A failed sync is taken to have
//! covered every write begun before it returned: a write in flight may
//! have landed before the `fsync` and been dropped with the rest, and
//! counted only once done, it went unseen by its writer, whose own sync
//! then got 0 and said Ok. So:
//! - a write-back of a store nobody wrote calls no `sync` (an `fdatasync`
//!   per `munmap` of a mapping nobody wrote was pure cost, and under the
//!   `LD_PRELOAD` shim it ran on the program's own open file, where it took
//!   the program's pending write-back error);
//! - two write-backs at once never let the second report success while
//!   the first's `sync` is still running: the second waits for it;
//! - a write-back whose own pages a failed `sync` covered reports the
//!   failure too (its pages go dirty again), even when a later `sync`
//!   succeeded: after a failed `fsync` the kernel may have dropped them,
//!   and a second `fsync` says 0 (the error was reported once).
//!
//! Cost: one atomic add per store write; one mutex per write-back of an
//! object that was ever written (never taken in a signal handler).

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;

/// One object's store writes and syncs.
#[derive(Debug, Default)]
pub struct Durability {
    /// Store writes begun so far.
    begun: AtomicU64,
    /// Store writes done (returned, either way) so far.
    written: AtomicU64,
    syncs: Mutex<Syncs>,
}

#[derive(Debug, Default)]
struct Syncs {
    /// `written` as it stood when the last successful sync began.
    synced: u64,
    /// `begun` as it stood when the last failed sync returned.
    failed: u64,
}

/// How [`Durability::sync`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Synced<E> {
    /// The writes are durable (or there were none).
    Done,
    /// This call's sync failed.
    Failed(E),
    /// A sync that covered the caller's own writes failed earlier.
    FailedBefore,
}

impl Durability {
    /// Runs `call`, one store write, counted as begun before it and as
    /// done after it returns (either way: a failed one may have reached
    /// the file in part). Async-signal-safe.
    #[inline]
    pub fn write<R>(&self, call: impl FnOnce() -> R) -> R {
        self.begun.fetch_add(1, SeqCst);
        let r = call();
        self.written.fetch_add(1, SeqCst);
        r
    }

    /// The writes begun so far: what a write-back takes before its first
    /// write (`first` of [`sync`](Self::sync)).
    pub fn first_mark(&self) -> u64 {
        self.begun.load(SeqCst)
    }

    /// The writes done so far: what a write-back that has just written
    /// needs durable (`mine` of [`sync`](Self::sync)).
    pub fn mark(&self) -> u64 {
        self.written.load(SeqCst)
    }

    /// Makes the writes up to `mine` (a [`mark`](Self::mark) taken after
    /// the caller's own writes) durable with `sync`, unless a sync that
    /// began after them succeeded. `own`: the caller wrote pages it then
    /// marked clean, which a failed sync may have lost; `first`, a
    /// [`first_mark`](Self::first_mark) taken before its first write, says
    /// which failed syncs may have covered any of them. (Compared with `mine` alone, a failed sync that covered
    /// only the caller's earlier batches, another write-back's between two
    /// of them, went unseen: the caller's own sync then got 0, the error
    /// having been reported once, and said Ok for pages the kernel may have
    /// dropped.)
    pub fn sync<E>(
        &self,
        first: u64,
        mine: u64,
        own: bool,
        sync: impl FnOnce() -> Result<(), E>,
    ) -> Synced<E> {
        if mine == 0 {
            return Synced::Done;
        }
        let mut s = self.syncs.lock().unwrap_or_else(|e| e.into_inner());
        if own && s.failed > first {
            return Synced::FailedBefore;
        }
        if s.synced >= mine {
            return Synced::Done;
        }
        let upto = self.mark();
        match sync() {
            Ok(()) => {
                s.synced = upto;
                Synced::Done
            }
            Err(e) => {
                // (Read after the sync: every write that landed before it
                // had begun by then.)
                s.failed = self.first_mark();
                Synced::Failed(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncs_only_writes_not_yet_synced_and_reports_a_failure_to_its_writers() {
        let d = Durability::default();
        let calls = std::cell::Cell::new(0);
        let ok = || {
            calls.set(calls.get() + 1);
            Ok::<(), i32>(())
        };
        // Nothing written: no sync.
        assert_eq!(d.sync(0, d.mark(), false, ok), Synced::Done);
        assert_eq!(calls.get(), 0);
        let first = d.first_mark();
        d.write(|| ());
        let mine = d.mark();
        assert_eq!(d.sync(first, mine, true, ok), Synced::Done);
        assert_eq!(calls.get(), 1);
        // Already synced: not again.
        assert_eq!(d.sync(first, mine, false, ok), Synced::Done);
        assert_eq!(calls.get(), 1);
        // A failed sync: its writer and every writer before it hear of it,
        // even after a later sync succeeded; a later writer does not.
        let first = d.first_mark();
        d.write(|| ());
        let before = d.mark();
        assert_eq!(d.sync(first, before, true, || Err(5)), Synced::Failed(5));
        assert_eq!(d.sync(first, before, true, ok), Synced::FailedBefore);
        let later = d.first_mark();
        d.write(|| ());
        let after = d.mark();
        assert_eq!(d.sync(later, after, true, ok), Synced::Done);
        assert_eq!(calls.get(), 2);
        assert_eq!(d.sync(first, before, true, ok), Synced::FailedBefore);
        // One that wrote nothing of its own is not told again.
        assert_eq!(d.sync(first, before, false, ok), Synced::Done);
    }

    /// A write in flight while another write-back's sync fails (it
    /// landed before the `fsync`, which dropped it): its writer hears of
    /// the failure. Counted only once done, it went unseen, and the
    /// writer's own sync (0: the kernel reports a failure once) said Ok.
    #[test]
    fn a_sync_that_failed_while_a_write_was_in_flight_is_reported_to_its_writer() {
        let d = Durability::default();
        d.write(|| ()); // an earlier write, not synced yet
        let first = d.first_mark();
        d.write(|| {
            let other = d.mark();
            assert_eq!(d.sync(0, other, false, || Err(5)), Synced::Failed(5));
        });
        let mine = d.mark();
        assert_eq!(
            d.sync(first, mine, true, || Ok::<(), i32>(())),
            Synced::FailedBefore
        );
    }

    /// A failed sync between a write-back's two batches (another
    /// write-back's) covered its first batch: it hears of it, though its
    /// own sync, after its last batch, would get 0 (the kernel reports a
    /// failed write-back once).
    #[test]
    fn a_failed_sync_between_two_batches_is_reported_to_their_writer() {
        let d = Durability::default();
        let first = d.first_mark();
        d.write(|| ()); // the first batch
        let other = d.mark();
        assert_eq!(
            d.sync(d.first_mark(), other, false, || Err(5)),
            Synced::Failed(5)
        );
        d.write(|| ()); // the second batch
        let mine = d.mark();
        assert_eq!(
            d.sync(first, mine, true, || Ok::<(), i32>(())),
            Synced::FailedBefore
        );
    }
}
