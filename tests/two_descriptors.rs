//! Regions registered with two descriptors.
//!
//! The application's own `munmap` over regions registered with two
//! descriptors (per-region delivery here; with the pager's two, an
//! anonymous region beside a shared one) posts an `UNMAP` on each, each
//! with the whole range, the second only once the first is read. Each is
//! the unmap of its own descriptor's regions: applied to every region in
//! the range, the first cleared it, a new region mapped there meanwhile
//! was then cut by the second (its `mapped()` empty, an access SIGSEGV).
//!
//! The second descriptor's reader is held, outside any engine work, by a
//! signal whose handler waits: its event stays unread meanwhile. (SIGTRAP:
//! the engine's threads block every asynchronous signal and leave open
//! only those the kernel raises for an instruction, SIGTRAP among them.)
//!
//! And a handler thread reads both of the pager's descriptors fairly: it
//! read the other only once the one its last batch came from ran dry, so
//! a stream of anonymous faults kept a shared region's faults (and the
//! application's `munmap` of it) waiting as long as it lasted.

#[path = "held_reader.rs"]
mod held;
#[path = "engine_util.rs"]
mod util;

use held::{hold, per_region_pager, region_threads, shared_at, wait_for, HOLD};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{MemoryStore, Store, StoreError};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};
use util::{free_range, with_deadline, PAGE};

/// Serialises this file's tests: some count this process's `uffd-region`
/// threads and userfaultfd descriptors.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_late_unmap_event_leaves_a_region_mapped_after_the_first() {
    with_deadline(60, "late unmap event", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        const LEN: usize = SIDE;
        let at = shared_at;
        let store = || Arc::new(MemoryStore::from_bytes(&[5u8; LEN]).unwrap());
        let (pager, x, low, high, reader) = side_by_side(store(), store());
        assert_eq!(high.as_slice()[0], 5);

        // The kernel posts the lower region's event first: hold the higher
        // one's reader, so its event waits.
        let _held = hold(reader);
        let unmapper = std::thread::spawn(move || {
            // SAFETY: the application gives both regions' memory up.
            unsafe { libc::munmap(x as *mut _, 2 * LEN) }
        });
        let p = pager.clone();
        wait_for("the first event", move || {
            p.stats().get(Counter::EVENT_UNMAP) >= 1
        });
        // The kernel has the lower range free; the second event waits.
        // SAFETY: as above.
        let new = unsafe { pager.map_store(store(), LEN, &at(x)) }.unwrap();
        HOLD.store(false, SeqCst);
        assert_eq!(unmapper.join().unwrap(), 0);
        let p = pager.clone();
        wait_for("the second event", move || {
            p.stats().get(Counter::EVENT_UNMAP) >= 2
        });
        assert_eq!(
            new.mapped(),
            vec![x..x + LEN],
            "the new region was cut by the other descriptor's event"
        );
        assert_eq!(new.as_slice()[LEN - 1], 5);
        assert!(low.mapped().is_empty() && high.mapped().is_empty());
    });
}

/// A store whose reads take 100 ms.
struct Slow(MemoryStore);

impl Store for Slow {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        std::thread::sleep(Duration::from_millis(100));
        self.0.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.0.write(off, buf)
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "slow"
    }
}

#[test]
fn a_stream_of_anonymous_faults_does_not_starve_a_shared_one() {
    with_deadline(60, "starved descriptor", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pager = Arc::new(
            Pager::builder()
                .delivery(Delivery::Threads {
                    threads: 1,
                    spin_us: 0,
                })
                .readahead(0, 1)
                .fault_around(0)
                .build()
                .unwrap(),
        );
        const PAGES: usize = 1024;
        let slow = Arc::new(Slow(
            MemoryStore::from_bytes(&vec![3u8; PAGES * PAGE]).unwrap(),
        ));
        let anon = MapOptions {
            kind: Some(InstallKind::Anonymous),
            ..MapOptions::default()
        };
        // SAFETY: the stores are moved in; nothing changes them.
        let busy = unsafe { pager.map_store(slow, PAGES * PAGE, &anon) }.unwrap();
        let shared = MapOptions {
            kind: Some(InstallKind::Shared),
            ..MapOptions::default()
        };
        let store = Arc::new(MemoryStore::from_bytes(&[7u8; 4 * PAGE]).unwrap());
        // SAFETY: as above.
        let quiet = unsafe { pager.map_store(store, 4 * PAGE, &shared) }.unwrap();
        let base = busy.as_ptr() as usize;
        let stop = Arc::new(AtomicBool::new(false));
        // Six threads keep the anonymous descriptor full for 5 s.
        let faulters: Vec<_> = (0..6)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut pg = t * (PAGES / 6);
                    let t0 = Instant::now();
                    while !stop.load(SeqCst) && t0.elapsed() < Duration::from_secs(5) {
                        // SAFETY: inside the region, alive until joined.
                        let v = unsafe { std::ptr::read_volatile((base + pg * PAGE) as *const u8) };
                        assert_eq!(v, 3);
                        pg += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        assert_eq!(quiet.as_slice()[0], 7);
        let took = t.elapsed();
        stop.store(true, SeqCst);
        for f in faulters {
            f.join().unwrap();
        }
        eprintln!("a shared fault beside a stream of anonymous ones took {took:?}");
        // One batch of anonymous faults (6 × 100 ms) and its own, with room
        // for a noisy machine; it waited for the stream's end (4.7 s).
        assert!(
            took < Duration::from_millis(3000),
            "a shared fault took {took:?} beside a stream of anonymous faults"
        );
    });
}

/// The userfaultfd descriptors this process holds.
fn uffds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains("userfaultfd"))
        .count()
}

/// Per-region delivery: a region the application unmapped itself gives
/// its descriptor and handler thread up once its event is applied. They
/// stayed until the pager went: 20 regions left 20 threads.
#[test]
fn a_region_the_application_unmapped_gives_its_handler_up() {
    with_deadline(60, "per-region handlers", || handlers_given_up(20, true));
}

/// The same for regions the engine unmaps: a region's reader lingers past
/// its region until the object lets the descriptor go, and leaves as soon
/// as it has, so mapping and unmapping in a loop does not pile up threads
/// and descriptors (a pile of 2,000 would run a default process out of
/// descriptors).
#[test]
fn regions_the_engine_unmapped_give_their_handlers_up() {
    with_deadline(60, "per-region handlers after engine unmaps", || {
        handlers_given_up(1000, false)
    });
}

/// Maps `rounds` regions one after another with per-region delivery, each
/// unmapped by the application (`app_unmaps`) or by its drop, and checks
/// that their threads and descriptors go (and never pile up meanwhile).
fn handlers_given_up(rounds: usize, app_unmaps: bool) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pager = per_region_pager();
    let _first = pager.map_anonymous(4 * PAGE).unwrap();
    wait_for("the first handler", || region_threads().len() == 1);
    let (threads, descriptors) = (region_threads().len(), uffds());
    let mut most = 0;
    for round in 0..rounds {
        let mut r = pager.map_anonymous(4 * PAGE).unwrap();
        r.as_mut_slice().fill(round as u8);
        if app_unmaps {
            let a = r.as_ptr() as usize;
            // SAFETY: the application gives the region's memory up itself.
            assert_eq!(unsafe { libc::munmap(a as *mut libc::c_void, 4 * PAGE) }, 0);
            assert!(r.mapped().is_empty());
        }
        drop(r);
        if round % 10 == 0 {
            most = most.max(uffds());
        }
    }
    assert!(
        most < descriptors + 100,
        "{most} descriptors open at once (from {descriptors})"
    );
    wait_for("the handlers' end", || region_threads().len() == threads);
    // (The last one's descriptor goes with its thread.)
    wait_for("the descriptors' end", || uffds() == descriptors);
}

/// The length of each of [`side_by_side`]'s regions.
const SIDE: usize = 4 * PAGE;

/// A per-region pager with two shared regions of [`SIDE`] bytes side by
/// side, over `low` and `high`, at a free range; the range's start, and
/// the second region's handler thread.
fn side_by_side(
    low: Arc<MemoryStore>,
    high: Arc<MemoryStore>,
) -> (
    Arc<Pager>,
    usize,
    uffd_pager::Region,
    uffd_pager::Region,
    libc::pid_t,
) {
    let pager = Arc::new(per_region_pager());
    let x = free_range(2 * SIDE);
    // SAFETY: the stores are moved in; only the regions change them.
    let first = unsafe { pager.map_store(low, SIDE, &shared_at(x)) }.unwrap();
    // (A handler thread names itself once it runs; this file's tests,
    // one at a time, are the only ones to make threads of that name.)
    wait_for("the first handler", || region_threads().len() == 1);
    let before = region_threads();
    // SAFETY: as above.
    let second = unsafe { pager.map_store(high, SIDE, &shared_at(x + SIDE)) }.unwrap();
    wait_for("the second handler", || region_threads().len() == 2);
    let reader = *region_threads()
        .iter()
        .find(|t| !before.contains(t))
        .unwrap();
    (pager, x, first, second, reader)
}

/// With the higher region's reader held: the application unmaps the
/// higher region (on a thread of its own: the call waits for its event to
/// be read) and moves the lower onto its range, and the move's event is
/// applied. Returns the unmapping thread (its `munmap`'s result).
fn unmap_high_then_move_low_there(
    pager: &Arc<Pager>,
    x: usize,
) -> std::thread::JoinHandle<libc::c_int> {
    const LEN: usize = SIDE;
    let unmapper = std::thread::spawn(move || {
        // SAFETY: the application gives the higher region's memory up.
        unsafe { libc::munmap((x + LEN) as *mut _, LEN) }
    });
    wait_for("the unmap", || {
        let mut v = 0u8;
        // SAFETY: mincore only reads the page tables.
        unsafe { libc::mincore((x + LEN) as *mut libc::c_void, PAGE, &mut v) != 0 }
    });
    util::app_mremap(x, LEN, LEN, x + LEN);
    let p = pager.clone();
    wait_for("the move's event", move || {
        p.stats().get(Counter::EVENT_REMAP) >= 1
    });
    unmapper
}

/// The application moves a region (its own `mremap`) onto the range of a
/// region of another descriptor it has just unmapped, whose event is not
/// read yet (per-region delivery: each region its own descriptor). The
/// move's event was applied first, and the moved region sat in the table
/// beside the stale one at the same start: the lookup found the stale
/// one, so the moved region's `mapped()` was empty, its faults were served
/// with the other region's object, and its unmap unmapped nothing (found
/// by review). The move takes the regions still in the table at its
/// destination for unmapped now.
#[test]
fn a_region_moved_onto_a_range_whose_unmap_is_unread_is_found_there() {
    with_deadline(60, "moved onto a freed range", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        const LEN: usize = SIDE;
        let data: Vec<u8> = (0..LEN).map(|i| (i / PAGE) as u8 + 1).collect();
        let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        let other = Arc::new(MemoryStore::from_bytes(&[9u8; LEN]).unwrap());
        let (pager, x, moved, gone, reader) = side_by_side(store, other);
        assert_eq!(moved.as_slice()[0], 1);
        assert_eq!(gone.as_slice()[0], 9);
        let _held = hold(reader);
        let unmapper = unmap_high_then_move_low_there(&pager, x);
        assert_eq!(
            moved.mapped(),
            vec![x + LEN..x + 2 * LEN],
            "the moved region"
        );
        // SAFETY: the moved region's memory, mapped there now.
        let there = unsafe { std::slice::from_raw_parts((x + LEN) as *const u8, LEN) };
        assert_eq!(there, &data[..], "the moved region's bytes");
        HOLD.store(false, SeqCst);
        assert_eq!(unmapper.join().unwrap(), 0);
        let p = pager.clone();
        wait_for("the late unmap", move || {
            p.stats().get(Counter::EVENT_UNMAP) >= 1
        });
        assert_eq!(
            moved.mapped(),
            vec![x + LEN..x + 2 * LEN],
            "after the late unmap"
        );
        assert!(gone.mapped().is_empty());
    });
}

/// The same with the unmapped region's object held by a residency guard
/// (its descriptor stays open): the move takes that region for unmapped
/// and stops its reader, which left without reading the unmap the
/// application's `munmap` waits on, and the call waited for ever (found by
/// review). A reader told to stop reads what its descriptor holds first.
#[test]
fn a_region_taken_for_unmapped_still_reads_its_own_unmap() {
    with_deadline(30, "the late unmap is read", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        const LEN: usize = SIDE;
        let data: Vec<u8> = (0..LEN).map(|i| (i / PAGE) as u8 + 1).collect();
        let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        let other = Arc::new(MemoryStore::from_bytes(&[9u8; LEN]).unwrap());
        let (pager, x, moved, gone, reader) = side_by_side(store, other);
        assert_eq!(gone.as_slice()[0], 9);
        let guard = gone.lock_resident(0, PAGE).unwrap();
        let _held = hold(reader);
        let unmapper = unmap_high_then_move_low_there(&pager, x);
        HOLD.store(false, SeqCst);
        assert_eq!(unmapper.join().unwrap(), 0);
        drop(guard);
        // SAFETY: the moved region's memory, mapped there now.
        let there = unsafe { std::slice::from_raw_parts((x + LEN) as *const u8, LEN) };
        assert_eq!(there, &data[..], "the moved region's bytes");
        drop(moved);
    });
}

/// A per-region pager with a shared region of [`SIDE`] bytes at a free
/// range, which the application has grown in place to twice that with its
/// own `mremap`: the pager, the range's start, the region.
fn grown_in_place() -> (Arc<Pager>, usize, uffd_pager::Region) {
    let pager = Arc::new(per_region_pager());
    let x = free_range(2 * SIDE);
    let store = Arc::new(MemoryStore::from_bytes(&[7u8; SIDE]).unwrap());
    // SAFETY: the store is moved in; only the region changes it.
    let r = unsafe { pager.map_store(store, SIDE, &shared_at(x)) }.unwrap();
    assert_eq!(r.as_slice()[0], 7);
    // SAFETY: the application grows the region's mapping in place over the
    // free range after it.
    let q = unsafe { libc::mremap(x as *mut libc::c_void, SIDE, 2 * SIDE, 0) };
    assert_eq!(q as usize, x, "mremap in place: {}", util::errno());
    (pager, x, r)
}

/// Per-region delivery: the application grows a region in place with its
/// own `mremap` (no event reports that: the engine lists the old length,
/// the kernel keeps the whole registered on the region's descriptor), then
/// unmaps the listed part while a residency guard holds the region's
/// object. The region's reader left with its region, and the
/// application's `munmap` of the tail then waited, its event unread, for
/// as long as the guard held the descriptor open (on the list of things
/// found and not fixed since an earlier review). The reader now lingers
/// until its object lets the descriptor go.
#[test]
fn the_unlisted_tail_of_a_region_grown_in_place_is_still_served() {
    with_deadline(30, "the tail's unmap is read", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (pager, x, r) = grown_in_place();
        // (After the `mremap`: the guard's `mlock` splits the mapping.)
        let guard = r.lock_resident(0, PAGE).unwrap();
        // SAFETY: the application gives the listed part up.
        assert_eq!(unsafe { libc::munmap(x as *mut libc::c_void, SIDE) }, 0);
        assert!(r.mapped().is_empty());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: the application gives the grown tail up.
            let rc = unsafe { libc::munmap((x + SIDE) as *mut libc::c_void, SIDE) };
            let _ = tx.send(rc);
        });
        let got = rx.recv_timeout(Duration::from_secs(5));
        drop(guard);
        assert_eq!(got, Ok(0), "the tail's munmap, with the guard held");
        drop(r);
        // The reader leaves once the object has let the descriptor go.
        wait_for("the reader's end", || region_threads().is_empty());
        drop(pager);
    });
}

/// The same tail, with no guard but a child `fork()`ed before: the region's
/// object goes with its region, and its reader with it, but the child's
/// copy of the descriptor kept the kernel's context, with the tail still
/// registered, and the application's `munmap` of the tail waited, unread,
/// until the child exited. The fork handler now replaces the child's
/// copies of the engine's descriptors with `/dev/null`.
#[test]
fn a_forked_child_does_not_keep_a_gone_regions_tail_registered() {
    with_deadline(30, "the tail's unmap with a child alive", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (pager, x, r) = grown_in_place();
        // SAFETY: the child only sleeps and exits (async-signal-safe calls).
        let child = unsafe { libc::fork() };
        if child == 0 {
            let t = libc::timespec {
                tv_sec: 60,
                tv_nsec: 0,
            };
            // SAFETY: as above.
            unsafe {
                libc::nanosleep(&t, std::ptr::null_mut());
                libc::_exit(0);
            }
        }
        assert!(child > 0, "fork: {}", util::errno());
        // SAFETY: the application gives the listed part up.
        assert_eq!(unsafe { libc::munmap(x as *mut libc::c_void, SIDE) }, 0);
        assert!(r.mapped().is_empty());
        drop(r);
        wait_for("the reader's end", || region_threads().is_empty());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: the application gives the grown tail up.
            let rc = unsafe { libc::munmap((x + SIDE) as *mut libc::c_void, SIDE) };
            let _ = tx.send(rc);
        });
        let got = rx.recv_timeout(Duration::from_secs(5));
        // SAFETY: our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert_eq!(got, Ok(0), "the tail's munmap, with a child alive");
        drop(pager);
    });
}
