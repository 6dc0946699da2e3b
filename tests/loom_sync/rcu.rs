//! The RCU cell: per-CPU reader counts with epoch parity, and an update
//! that waits for the old parity's readers before it hands the old
//! snapshot back (to be freed).

use crate::util::check;
use loom::cell::UnsafeCell;
use loom::thread;
use std::sync::Arc;
use uffd_pager::sync::model::set_cpu;
use uffd_pager::sync::rcu::Rcu;

/// A snapshot whose destruction loom sees: dropping it writes its `live`
/// cell, so a reader still reading it is a race (or, if ordered after
/// it, reads `false`).
struct Snapshot {
    /// Keeps `live` clear of what the allocator writes into a freed block,
    /// so that a use after free in a broken variant fails the model
    /// cleanly instead of reading a garbage loom handle.
    _pad: [u64; 4],
    version: u64,
    live: UnsafeCell<bool>,
}

// SAFETY: `live` is only accessed through loom's checked `with`/`with_mut`,
// which fail the model on a race instead of letting it happen.
unsafe impl Sync for Snapshot {}

impl Snapshot {
    fn new(version: u64) -> Snapshot {
        Snapshot {
            _pad: [0; 4],
            version,
            live: UnsafeCell::new(true),
        }
    }

    /// What a reader does with the snapshot: checks it is not freed.
    fn check(&self) -> u64 {
        // SAFETY: `p` points into `self`, which the RCU cell keeps alive for
        // the reader's closure (the property under test); loom fails the
        // model if the read races the write in `drop`.
        assert!(self.live.with(|p| unsafe { *p }), "read a freed snapshot");
        self.version
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        // SAFETY: `p` points into `self` (`&mut`, alive); loom fails the
        // model if a reader's access races this write.
        self.live.with_mut(|p| unsafe { *p = false });
    }
}

/// Readers on both CPUs (one reads twice, across the epoch flip) and an
/// update that frees the old snapshot: no reader ever reads it after (or
/// racing with) the free, and each read sees one whole version.
#[test]
fn readers_never_see_a_freed_snapshot() {
    check(|| {
        let c = Arc::new(Rcu::new(Snapshot::new(0)));
        let readers: Vec<_> = (0..2)
            .map(|cpu| {
                let c = c.clone();
                thread::spawn(move || {
                    set_cpu(cpu);
                    let a = c.read(|s| s.check());
                    if cpu == 0 {
                        let b = c.read(|s| s.check());
                        assert!(a <= b, "went back in time");
                    }
                })
            })
            .collect();
        let old = c.replace(Snapshot::new(1));
        assert_eq!(old.version, 0);
        drop(old);
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(c.read(|s| s.check()), 1);
    });
}

/// Two updates back to back (both parities) against a reader that moves
/// to the other CPU between reads: each update waits for its own parity.
#[test]
fn back_to_back_updates_wait_for_their_readers() {
    check(|| {
        let c = Arc::new(Rcu::new(Snapshot::new(0)));
        let reader = {
            let c = c.clone();
            thread::spawn(move || {
                c.read(|s| s.check());
                set_cpu(1);
                c.read(|s| s.check());
            })
        };
        for v in 1..=2 {
            drop(c.replace(Snapshot::new(v)));
        }
        reader.join().unwrap();
    });
}

/// Concurrent updates are serialised: neither is lost.
#[test]
fn concurrent_updates_are_not_lost() {
    check(|| {
        let c = Arc::new(Rcu::new(Snapshot::new(0)));
        let other = {
            let c = c.clone();
            thread::spawn(move || drop(c.update(|s| Snapshot::new(s.check() + 1))))
        };
        drop(c.update(|s| Snapshot::new(s.check() + 1)));
        other.join().unwrap();
        assert_eq!(c.read(|s| s.check()), 2);
    });
}
