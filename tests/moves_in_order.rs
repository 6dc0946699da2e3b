//! Two application threads move regions of two descriptors so that one
//! lands where the other just left (an anonymous region onto a shared
//! one's old range, or the other way round). Each move's event is posted
//! on its own descriptor, and the reader may read the later one first (it
//! drains one descriptor before the next): applied first, the later move
//! found the earlier-moved region still in the table at its destination,
//! took it for unmapped and dropped its pages, and the earlier move's own
//! event then found nothing to move (found by review). The earlier events
//! are applied first now.

#[path = "held_reader.rs"]
mod held;
#[path = "engine_util.rs"]
mod util;

use held::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};
use util::*;

const LEN: usize = 8 * PAGE;

/// One test at a time: each holds "the" reader thread it finds by name.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Waits until the kernel has freed the page at `addr` (`mincore` fails).
fn wait_freed(addr: usize) {
    wait_for("the move", || {
        let mut v = 0u8;
        // SAFETY: mincore only reads the page tables.
        unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) != 0 }
    });
}

/// A region of `kind` at `at` holding `data`, half its pages evicted.
fn region(p: &Pager, kind: InstallKind, at: usize, data: &[u8]) -> uffd_pager::Region {
    let opts = MapOptions {
        fixed_addr: Some(at),
        kind: Some(kind),
        ..MapOptions::default()
    };
    let mut r = match kind {
        InstallKind::Anonymous => p.map_anonymous_with(LEN, &opts).unwrap(),
        // SAFETY: the store is moved in; only the region changes it.
        InstallKind::Shared => {
            unsafe { p.map_store(Arc::new(MemoryStore::new(LEN as u64).unwrap()), LEN, &opts) }
                .unwrap()
        }
    };
    r.as_mut_slice().copy_from_slice(data);
    r
}

/// Which reader is held while the two moves are made.
enum Reader<'a> {
    /// The thread of this name (the pager's one reader): both events wait.
    Named(&'a str),
    /// Per-region delivery: the first region's own handler only, so the
    /// second move's event is read and applied at once, and the first's
    /// must be read from its descriptor then.
    FirstRegions,
}

/// `first` (of kind `first_kind`) moves from D to E, then `second` moves
/// onto D, with a reader held until both calls posted their events.
fn moves_onto_a_range_just_left(d: Delivery, first_kind: InstallKind, reader: Reader<'_>) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pager::builder()
        .delivery(d)
        .budget_pages(64)
        .build()
        .unwrap();
    let second_kind = match first_kind {
        InstallKind::Anonymous => InstallKind::Shared,
        InstallKind::Shared => InstallKind::Anonymous,
    };
    let (dd, e, a) = (free_range(LEN), free_range(LEN), free_range(LEN));
    let (first_data, second_data) = (pattern_vec(71, LEN), pattern_vec(72, LEN));
    let before = region_threads();
    let first = region(&p, first_kind, dd, &first_data);
    let firsts: Vec<_> = region_threads()
        .into_iter()
        .filter(|t| !before.contains(t))
        .collect();
    let second = region(&p, second_kind, a, &second_data);
    // Pages of both in the store or swap: a region taken for unmapped
    // loses them.
    p.reclaim_pages(LEN as u64 / PAGE as u64);
    let _held = match reader {
        Reader::Named(name) => hold(thread_named(name)),
        Reader::FirstRegions => {
            assert_eq!(firsts.len(), 1, "the first region's handler");
            hold(firsts[0])
        }
    };
    let t1 = std::thread::spawn(move || app_mremap(dd, LEN, LEN, e));
    wait_freed(dd);
    let t2 = std::thread::spawn(move || app_mremap(a, LEN, LEN, dd));
    wait_freed(a);
    HOLD.store(false, SeqCst);
    t1.join().unwrap();
    t2.join().unwrap();
    let ctx = format!("{d}, {first_kind:?} moved first");
    assert_eq!(first.mapped(), vec![e..e + LEN], "{ctx}: the first region");
    assert_eq!(second.mapped(), vec![dd..dd + LEN], "{ctx}: the second");
    // SAFETY: both ranges are the regions' now (checked above).
    let at = |addr: usize| unsafe { std::slice::from_raw_parts(addr as *const u8, LEN) };
    assert_bytes(
        at(e),
        &first_data,
        &format!("{ctx}: the first region's bytes"),
    );
    assert_bytes(at(dd), &second_data, &format!("{ctx}: the second's"));
    // (The regions are at their new places: unmapped from there.)
    drop(first);
    drop(second);
}

#[test]
fn in_thread_a_shared_region_moved_away_keeps_its_pages() {
    with_deadline(60, "moves", || {
        moves_onto_a_range_just_left(
            Delivery::InThread,
            InstallKind::Shared,
            Reader::Named("uffd-events"),
        );
    });
}

#[test]
fn in_thread_an_anonymous_region_moved_away_keeps_its_pages() {
    with_deadline(60, "moves", || {
        moves_onto_a_range_just_left(
            Delivery::InThread,
            InstallKind::Anonymous,
            Reader::Named("uffd-events"),
        );
    });
}

#[test]
fn handler_threads_a_region_moved_away_keeps_its_pages() {
    with_deadline(60, "moves", || {
        let d = Delivery::Threads {
            threads: 1,
            spin_us: 0,
        };
        for k in [InstallKind::Shared, InstallKind::Anonymous] {
            moves_onto_a_range_just_left(d, k, Reader::Named("uffd-handler"));
        }
    });
}

/// The second move's event is applied while the first's is still in the
/// kernel, on the first region's own descriptor: it is read from there.
#[test]
fn per_region_a_region_moved_away_keeps_its_pages() {
    with_deadline(60, "moves", || {
        for k in [InstallKind::Shared, InstallKind::Anonymous] {
            moves_onto_a_range_just_left(Delivery::PerRegion, k, Reader::FirstRegions);
        }
    });
}

/// The engine's own `Region::remap` grows a region into the range another
/// region (anonymous, half evicted) just left by the application's move,
/// whose event the held handler has not read: the remap waits for it now.
/// Before, it grew at once, took the moved region for unmapped and dropped
/// its pages, and the move's event found nothing to move.
#[test]
fn a_remap_into_a_range_a_move_just_left_waits_for_the_move() {
    with_deadline(60, "remap", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let p = one_handler_pager();
        let (x, to) = (free_range(2 * LEN), free_range(LEN));
        let low_data = pattern_vec(73, 2 * LEN);
        let store = Arc::new(MemoryStore::from_bytes(&low_data).unwrap());
        // SAFETY: the store is moved in; only the region changes it.
        let mut low = unsafe { p.map_store(store, LEN, &shared_at(x)) }.unwrap();
        let data = pattern_vec(74, LEN);
        let moved = region(&p, InstallKind::Anonymous, x + LEN, &data);
        p.reclaim_pages(2 * LEN as u64 / PAGE as u64);
        let _held = hold(the_handler());
        let mover = std::thread::spawn(move || app_mremap(x + LEN, LEN, LEN, to));
        wait_freed(x + LEN);
        let releaser = std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            HOLD.store(false, SeqCst);
        });
        low.remap(2 * LEN).unwrap();
        mover.join().unwrap();
        releaser.join().unwrap();
        assert_eq!(moved.mapped(), vec![to..to + LEN], "the moved region");
        // SAFETY: the moved region's range now (checked above; its
        // handle still names the old start).
        let at_to = unsafe { std::slice::from_raw_parts(to as *const u8, LEN) };
        assert_bytes(at_to, &data, "the moved region's bytes");
        assert_eq!(low.mapped(), vec![x..x + 2 * LEN], "the grown region");
        assert_bytes(low.as_slice(), &low_data, "the grown region's bytes");
    });
}
