//! A late `UNMAP`: the application unmaps a region, the kernel frees the
//! range at once and posts the event once its call lets go of
//! `mmap_lock`; the engine's reader is held meanwhile, so the event is
//! still unread when the engine's own `map` or `remap` is given that
//! range. The engine takes the stale region for unmapped then and leaves
//! a record the late event takes, so that the event, when it is read,
//! leaves the new region there alone.

#[path = "held_reader.rs"]
mod held;
#[path = "engine_util.rs"]
mod util;

use held::{hold, one_handler_pager, shared_at, the_handler, wait_for, HOLD};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;
use uffd_pager::store::MemoryStore;
use uffd_pager::testing::skip_next_remap_wait;
use uffd_pager::{Counter, MapOptions, Pager};
use util::{free_range, with_deadline, PAGE};

/// Serialises this file's tests: each holds the one handler thread of
/// its pager through the process-wide `HOLD`.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A map that waited the whole patience for an event on its own region's
/// descriptor (one the engine knows nothing of: another region's, whose
/// reader is stuck) goes ahead without taking its own range for one an
/// event is still due on. It recorded its range then, and the
/// application's later `munmap` of the new region, the first unmap over
/// that record, was taken for the awaited one and left the region in the
/// table (`mapped()` still listed it).
#[test]
fn a_map_that_gave_up_on_its_descriptor_records_nothing() {
    with_deadline(60, "a map that gave up", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pager = one_handler_pager();
        let old = pager.map_anonymous(4 * PAGE).unwrap();
        let a = old.as_ptr() as usize;
        let handler = the_handler();
        let _held = hold(handler);
        // The application unmaps the old region: its event waits.
        let unmapper = std::thread::spawn(move || {
            // SAFETY: the application gives the old region's memory up.
            unsafe { libc::munmap(a as *mut _, 4 * PAGE) }
        });
        std::thread::sleep(Duration::from_millis(50));
        // A new region elsewhere, on the same descriptor: its map waits
        // out its patience, then goes ahead.
        let away = MapOptions {
            fixed_addr: Some(free_range(4 * PAGE)),
            ..MapOptions::default()
        };
        let new = pager.map_anonymous_with(4 * PAGE, &away).unwrap();
        HOLD.store(false, SeqCst);
        assert_eq!(unmapper.join().unwrap(), 0);
        assert!(old.mapped().is_empty());
        // The application unmaps the new region itself.
        let b = new.as_ptr() as usize;
        // SAFETY: as above.
        assert_eq!(unsafe { libc::munmap(b as *mut _, 4 * PAGE) }, 0);
        assert!(
            new.mapped().is_empty(),
            "the application's munmap of the new region was not applied: {:x?}",
            new.mapped()
        );
    });
}

/// A region grown with `Region::remap` into the range of a region beside
/// it that the application has just unmapped, while that unmap's event is
/// still unread (the kernel gives the freed range at once): the late
/// event was applied to every region of the descriptor in its range, so
/// it cut the grown region's new half (its `mapped()` shrank to the old
/// length, its new half's pages were lost; found by review). The remap
/// now takes what the table still holds in the range it was given for
/// unmapped, and the late event leaves the grown region alone.
#[test]
fn a_region_grown_into_a_range_whose_unmap_is_unread_keeps_it() {
    with_deadline(60, "grown into a freed range", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pager = one_handler_pager();
        const LEN: usize = 4 * PAGE;
        let x = free_range(2 * LEN);
        let (mut low, data, high) = low_and_beside(&pager, x, LEN, 2 * LEN, x + LEN);
        let _held = hold(the_handler());
        // The kernel has freed the range; its event waits for the reader.
        let unmapper = unmap_aside(x + LEN, LEN);
        skip_next_remap_wait();
        low.remap(2 * LEN).unwrap();
        HOLD.store(false, SeqCst);
        assert_eq!(unmapper.join().unwrap(), 0);
        assert!(high.mapped().is_empty());
        assert_grown(&low, &data);
    });
}

/// The same with two regions beside it, unmapped by two calls (two late
/// events on its descriptor): the first event took the one record the
/// remap left, and the second cut the grown region (found by review).
/// Each stale region leaves a record of its own now, taken by its event.
#[test]
fn a_region_grown_over_two_freed_ranges_keeps_them() {
    with_deadline(60, "grown over two freed ranges", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pager = one_handler_pager();
        const LEN: usize = 4 * PAGE;
        let x = free_range(3 * LEN);
        let (mut low, data, second) = low_and_beside(&pager, x, LEN, 3 * LEN, x + LEN);
        let s = Arc::new(MemoryStore::from_bytes(&[9u8; LEN]).unwrap());
        // SAFETY: the store is moved in; only the region changes it.
        let third = unsafe { pager.map_store(s, LEN, &shared_at(x + 2 * LEN)) }.unwrap();
        let _held = hold(the_handler());
        let unmappers = [unmap_aside(x + LEN, LEN), unmap_aside(x + 2 * LEN, LEN)];
        skip_next_remap_wait();
        low.remap(3 * LEN).unwrap();
        HOLD.store(false, SeqCst);
        late_unmaps(unmappers, 2, &pager);
        assert_grown(&low, &data);
        assert!(second.mapped().is_empty() && third.mapped().is_empty());
    });
}

/// Waits until the kernel has freed the page at `addr` (`mincore` fails).
fn wait_freed(addr: usize) {
    wait_for("the unmap", || {
        let mut v = 0u8;
        // SAFETY: mincore only reads the page tables.
        unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) != 0 }
    });
}

/// The application unmaps `[addr, addr + len)` on a thread of its own (the
/// call waits for its event to be read); returns once the kernel has freed
/// the range.
fn unmap_aside(addr: usize, len: usize) -> std::thread::JoinHandle<libc::c_int> {
    let t = std::thread::spawn(move || {
        // SAFETY: the application gives that memory up.
        unsafe { libc::munmap(addr as *mut _, len) }
    });
    wait_freed(addr);
    t
}

/// Joins the application's unmapping threads (each call succeeded) and
/// waits until the engine has applied `events` unmaps. (The counter is
/// raised as an event's application starts: a short sleep lets the last
/// one finish.)
fn late_unmaps<const N: usize>(
    unmappers: [std::thread::JoinHandle<libc::c_int>; N],
    events: u64,
    pager: &Pager,
) {
    for u in unmappers {
        assert_eq!(u.join().unwrap(), 0);
    }
    wait_for("the late unmaps", || {
        pager.stats().get(Counter::EVENT_UNMAP) >= events
    });
    std::thread::sleep(Duration::from_millis(20));
}

/// Asserts that `low`, grown, is listed whole and reads `data`.
fn assert_grown(low: &uffd_pager::Region, data: &[u8]) {
    let grown = low.as_ptr() as usize;
    assert_eq!(
        low.mapped(),
        vec![grown..grown + data.len()],
        "the grown region was cut"
    );
    assert_eq!(low.as_slice(), data, "the grown region's bytes");
}

/// A low shared region of `len` bytes at `x` over distinct page bytes,
/// and a shared region of 9s at `at`: the low region, its bytes when
/// grown to `grown_len`, and the other region.
fn low_and_beside(
    pager: &Pager,
    x: usize,
    len: usize,
    grown_len: usize,
    at: usize,
) -> (uffd_pager::Region, Vec<u8>, uffd_pager::Region) {
    let data: Vec<u8> = (0..grown_len).map(|i| (i / PAGE) as u8 + 1).collect();
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    // SAFETY: the stores are moved in; only the regions change them.
    let low = unsafe { pager.map_store(store, len, &shared_at(x)) }.unwrap();
    let s = Arc::new(MemoryStore::from_bytes(&[9u8; 4 * PAGE]).unwrap());
    // SAFETY: as above.
    let beside = unsafe { pager.map_store(s, 4 * PAGE, &shared_at(at)) }.unwrap();
    assert_eq!(beside.as_slice()[0], 9);
    (low, data, beside)
}

/// One region beside it, unmapped by two calls, half each (two late
/// events on its descriptor, each over part of the range the remap
/// recorded): the first took the whole record, and the second cut the
/// grown region's upper quarter (found by review). An unmap takes only
/// the part of a record it covers now.
#[test]
fn a_region_grown_over_a_range_unmapped_in_two_calls_keeps_it() {
    with_deadline(60, "grown over a range unmapped in halves", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pager = one_handler_pager();
        const LEN: usize = 4 * PAGE;
        let x = free_range(2 * LEN);
        let (mut low, data, beside) = low_and_beside(&pager, x, LEN, 2 * LEN, x + LEN);
        let _held = hold(the_handler());
        let halves = [
            unmap_aside(x + LEN, LEN / 2),
            unmap_aside(x + LEN + LEN / 2, LEN / 2),
        ];
        skip_next_remap_wait();
        low.remap(2 * LEN).unwrap();
        HOLD.store(false, SeqCst);
        late_unmaps(halves, 2, &pager);
        assert_grown(&low, &data);
        assert!(beside.mapped().is_empty());
    });
}

/// An anonymous region between them, registered with the pager's other
/// descriptor, unmapped together with the region beside in one call: an
/// event on each descriptor, each over the whole range, the lower
/// region's first. The other descriptor's event took the record the
/// remap left for the shared descriptor's, and that one then cut the
/// grown region (found by review). A record is taken only by an unmap
/// from the descriptor of the region it keeps.
#[test]
fn a_region_grown_over_a_range_unmapped_with_another_descriptors_keeps_it() {
    grown_over_a_call_over_two_descriptors(3);
}

/// The same, with the region grown only over the anonymous one: the table
/// held nothing of its own descriptor's in the range it took, so nothing
/// was recorded, and that descriptor's event (over the whole range the
/// call unmapped) cut it (found by review). With an event on its way on
/// its own descriptor, a region records every range it takes.
#[test]
fn a_region_grown_over_another_descriptors_range_keeps_it() {
    grown_over_a_call_over_two_descriptors(2);
}

/// A shared region at `x` of [`PAGE`] × 4 bytes, an anonymous one after it
/// (the pager's other descriptor) and a shared one after that; the
/// application unmaps the two above with one call while the reader is
/// held, and the lowest is grown to `times` its length over what that
/// call freed.
fn grown_over_a_call_over_two_descriptors(times: usize) {
    with_deadline(60, "grown over a call over two descriptors", move || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pager = one_handler_pager();
        const LEN: usize = 4 * PAGE;
        let x = free_range(3 * LEN);
        let anon = MapOptions {
            fixed_addr: Some(x + LEN),
            ..MapOptions::default()
        };
        let between = pager.map_anonymous_with(LEN, &anon).unwrap();
        let grown = times * LEN;
        let (mut low, data, beside) = low_and_beside(&pager, x, LEN, grown, x + 2 * LEN);
        let _held = hold(the_handler());
        let both = unmap_aside(x + LEN, 2 * LEN);
        skip_next_remap_wait();
        low.remap(grown).unwrap();
        HOLD.store(false, SeqCst);
        // (One call, an event on each descriptor.)
        late_unmaps([both], 2, &pager);
        assert_grown(&low, &data);
        assert!(beside.mapped().is_empty() && between.mapped().is_empty());
    });
}

/// A record no event takes is dropped once its descriptor has none left
/// to apply: with an unrelated unmap on its way on the grown region's
/// descriptor, the remap recorded the range it took from another
/// descriptor's region, and no event of its own descriptor covered that
/// range. Kept, the record took the application's own later `munmap` of
/// the grown part for the late event, and the region stayed listed there.
/// Here an event on the other descriptor is applied in between.
#[test]
fn a_record_no_event_takes_does_not_hide_a_later_unmap() {
    with_deadline(60, "a record no event takes", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        record_no_event_takes(true);
    });
}

/// The same with no event in between: the kernel counts an event on its
/// descriptor until the thread that posted it runs again, after the read,
/// so right after the last event was applied the descriptor often still
/// read as changing, and the record was kept (found by review; the
/// application's munmap went unapplied in most runs). Five runs.
#[test]
fn a_record_no_event_takes_is_dropped_once_its_posters_have_run() {
    with_deadline(60, "a record no event takes, no event after", || {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..5 {
            record_no_event_takes(false);
        }
    });
}

/// [`a_record_no_event_takes_does_not_hide_a_later_unmap`]'s steps, with
/// or without an event on the other descriptor before the application's
/// own unmap.
fn record_no_event_takes(other_event_between: bool) {
    let pager = one_handler_pager();
    const LEN: usize = 4 * PAGE;
    let x = free_range(2 * LEN);
    let anon = |at: usize| MapOptions {
        fixed_addr: Some(at),
        ..MapOptions::default()
    };
    let between = pager.map_anonymous_with(LEN, &anon(x + LEN)).unwrap();
    let spare = pager
        .map_anonymous_with(LEN, &anon(free_range(LEN)))
        .unwrap();
    let elsewhere = free_range(LEN);
    let (mut low, data, other) = low_and_beside(&pager, x, LEN, 2 * LEN, elsewhere);
    let _held = hold(the_handler());
    let unrelated = unmap_aside(elsewhere, LEN);
    let taken = unmap_aside(x + LEN, LEN);
    skip_next_remap_wait();
    low.remap(2 * LEN).unwrap();
    HOLD.store(false, SeqCst);
    late_unmaps([unrelated, taken], 2, &pager);
    assert_grown(&low, &data);
    assert!(between.mapped().is_empty() && other.mapped().is_empty());
    if other_event_between {
        let s = spare.as_ptr() as usize;
        // SAFETY: the application gives the spare region up.
        assert_eq!(unsafe { libc::munmap(s as *mut _, LEN) }, 0);
        wait_for("the other descriptor's unmap", || {
            pager.stats().get(Counter::EVENT_UNMAP) >= 3
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    // The application unmaps the grown part itself.
    let top = low.as_ptr() as usize + LEN;
    // SAFETY: the application gives that part of the region up.
    assert_eq!(unsafe { libc::munmap(top as *mut _, LEN) }, 0);
    let left = low.as_ptr() as usize..low.as_ptr() as usize + LEN;
    wait_for("the application's unmap", || {
        low.mapped() == std::slice::from_ref(&left)
    });
}
