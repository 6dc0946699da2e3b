//! The page lock: the LOCKED bit of a page's state word, with WAITERS and
//! a futex wake for its sleepers.

use crate::util::{check, Guarded};
use loom::thread;
use std::sync::Arc;
use uffd_pager::page_cache::{PageCache, LOCKED, REFERENCED, UPTODATE, WAITERS};
use uffd_pager::sync::model::{set_futex_mode, FutexMode};

struct Page {
    pc: PageCache,
    data: Guarded,
}

fn page() -> Arc<Page> {
    Arc::new(Page {
        pc: PageCache::new(1).unwrap(),
        data: Guarded::default(),
    })
}

/// Two lockers and a waiter: the lockers never overlap, the waiter always
/// wakes (a missing wake is a deadlock here), and the word ends unlocked
/// with no stale WAITERS bit.
fn two_lockers_and_a_waiter(mode: FutexMode) {
    check(move || {
        set_futex_mode(mode);
        let p = page();
        let lockers: Vec<_> = (0..2)
            .map(|_| {
                let p = p.clone();
                thread::spawn(move || {
                    p.pc.lock(0);
                    p.data.bump();
                    p.pc.unlock(0, UPTODATE, 0);
                })
            })
            .collect();
        p.pc.wait_unlocked(0);
        for t in lockers {
            t.join().unwrap();
        }
        assert_eq!(p.data.read(), 2);
        let w = p.pc.load(0);
        assert_eq!(w & (LOCKED | WAITERS), 0, "word {w:#x}");
        assert_ne!(w & UPTODATE, 0);
    });
}

#[test]
fn lockers_exclude_and_waiters_wake() {
    two_lockers_and_a_waiter(FutexMode::Exact);
}

/// The same with futex waits that return at once (a signal): every caller
/// re-checks the word.
#[test]
fn lockers_exclude_with_spurious_wakeups() {
    two_lockers_and_a_waiter(FutexMode::Spurious(2));
}

/// A waiter sleeping on a page that is being loaded sees, once it wakes,
/// the contents the loader published with its unlock (UPTODATE).
#[test]
fn a_woken_waiter_sees_the_loaded_contents() {
    check(|| {
        let p = page();
        assert_eq!(p.pc.try_lock(0), Ok(0));
        let loader = {
            let p = p.clone();
            thread::spawn(move || {
                p.data.set(7);
                p.pc.unlock(0, UPTODATE, 0);
            })
        };
        p.pc.wait_unlocked(0);
        assert_ne!(p.pc.load(0) & UPTODATE, 0);
        assert_eq!(p.data.read(), 7);
        loader.join().unwrap();
    });
}

/// A flag update racing an unlock (the reclaimer's REFERENCED, say) loses
/// neither change.
#[test]
fn flag_updates_do_not_race_the_unlock() {
    check(|| {
        let p = page();
        assert_eq!(p.pc.try_lock(0), Ok(0));
        let marker = {
            let p = p.clone();
            thread::spawn(move || {
                p.pc.update(0, REFERENCED, 0);
            })
        };
        p.pc.unlock(0, UPTODATE, 0);
        marker.join().unwrap();
        assert_eq!(p.pc.load(0), UPTODATE | REFERENCED);
    });
}
