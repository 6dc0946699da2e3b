//! The region lock: read-trylocks against a writer that drains readers
//! (WRITER_SLEEPING and a futex wake from the last reader) and detaches.

use crate::util::{check, Guarded};
use loom::thread;
use std::sync::Arc;
use uffd_pager::sync::model::{set_futex_mode, FutexMode};
use uffd_pager::sync::region_lock::{RegionLock, TryReadError};

struct Region {
    lock: RegionLock,
    /// What a read-locked fault reads and the writer changes or frees.
    data: Guarded,
}

const FREED: u64 = u64::MAX;

fn region() -> Arc<Region> {
    Arc::new(Region {
        lock: RegionLock::new(),
        data: Guarded::default(),
    })
}

/// A fault: read-trylock, read the region, unlock. Returns what it read.
fn fault(r: &Region) -> Result<u64, TryReadError> {
    r.lock.try_read()?;
    let v = r.data.read();
    r.lock.read_unlock();
    Ok(v)
}

/// Two readers and a writer that changes the region twice: a reader that
/// got the lock never overlaps the writer (loom sees the race otherwise),
/// the writer always wakes from its drain, and trylocks fail with
/// `WriteLocked` only while a writer is in.
fn readers_and_a_writer(mode: FutexMode) {
    check(move || {
        set_futex_mode(mode);
        let r = region();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let r = r.clone();
                thread::spawn(move || {
                    for _ in 0..2 {
                        match fault(&r) {
                            Ok(v) => assert!(v <= 2),
                            Err(e) => assert_eq!(e, TryReadError::WriteLocked),
                        }
                    }
                })
            })
            .collect();
        for _ in 0..2 {
            r.lock.write_lock();
            r.data.bump();
            r.lock.write_unlock();
        }
        for t in readers {
            t.join().unwrap();
        }
        assert_eq!(r.lock.readers(), 0);
        assert_eq!(r.lock.seq(), 2);
        assert_eq!(fault(&r), Ok(2));
    });
}

#[test]
fn readers_never_overlap_the_writer() {
    readers_and_a_writer(FutexMode::Exact);
}

/// As above with the writer's drain waits returning early (signals).
#[test]
fn readers_never_overlap_the_writer_with_spurious_wakeups() {
    readers_and_a_writer(FutexMode::Spurious(2));
}

/// Unmap: write-lock, detach, free, unlock. A reader either got in before
/// (and left before the free), or fails; once it has seen `Detached` it
/// never gets in again, and after the unmap every trylock is `Detached`.
#[test]
fn detached_fails_every_trylock() {
    check(|| {
        let r = region();
        let reader = {
            let r = r.clone();
            thread::spawn(move || {
                let mut detached = false;
                for _ in 0..3 {
                    match fault(&r) {
                        Ok(v) => {
                            assert!(!detached, "got in after Detached");
                            assert_ne!(v, FREED, "read a freed region");
                        }
                        Err(TryReadError::Detached) => detached = true,
                        Err(TryReadError::WriteLocked) => {}
                    }
                }
            })
        };
        r.lock.write_lock();
        r.lock.mark_detached();
        r.data.set(FREED);
        r.lock.write_unlock();
        assert!(r.lock.is_detached());
        assert_eq!(fault(&r), Err(TryReadError::Detached));
        reader.join().unwrap();
        assert_eq!(fault(&r), Err(TryReadError::Detached));
    });
}
