//! The engine's own `mprotect`, `MADV_DONTNEED`, `mlock2` and `munmap` of
//! a region whose range the application has unmapped, and mapped its own
//! memory in, before the unmap's event is applied.
//!
//! `Region::protect` and a quiet region's `dontneed` change a user range
//! with system calls that act on whatever is mapped there. The
//! application's `munmap` returns once its event is read, and the event
//! is applied only when the engine's call lets go of the global lock it
//! holds. The hook below does the application's part at the last moment,
//! inside the engine's call: before, `protect(false)` made the
//! application's new memory read-only (its next write was SIGSEGV), and
//! `dontneed` dropped its pages (it read zeros). Now the call looks for
//! events on their way right before its system call, and waits for them.
//! A second hook maps a new region of the same pager there instead: the
//! engine's own calls for the old region leave it alone.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::testing::{set_before_range_change, Site};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};
use util::{perms_at, PAGE, THREADS};

const LEN: usize = 4 * PAGE;

/// The region whose range the hook takes (0: none), and what it mapped
/// there (0: nothing yet).
static TARGET: AtomicUsize = AtomicUsize::new(0);
static THEIRS: AtomicUsize = AtomicUsize::new(0);
/// The tests share the hook: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Once, for the target region: the application's own `munmap` of its
/// range (it returns once the engine has read the event), then its own
/// anonymous mapping there, written with 0x5A.
fn unmap_and_map_ours(site: &Site<'_>) {
    let a = TARGET.load(SeqCst);
    if a == 0 || site.start() != a || TARGET.swap(0, SeqCst) == 0 {
        return;
    }
    // SAFETY: the region's whole range, which the test gives up here; the
    // new mapping is the test's own and goes nowhere anything else is
    // mapped (MAP_FIXED_NOREPLACE).
    unsafe {
        assert_eq!(libc::munmap(a as *mut _, LEN), 0);
        let p = libc::mmap(
            a as *mut _,
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        assert_eq!(p as usize, a, "the range was taken meanwhile");
        std::ptr::write_bytes(p as *mut u8, 0x5A, LEN);
    }
    THEIRS.store(a, SeqCst);
}

/// Runs `call` on a 4-page region of `kind` of a pager with `delivery`,
/// with the hook set to take the region's range inside it, and returns
/// the address of the application's mapping there and what `call`
/// returned. `call` has the region, and drops it (or unmaps it).
fn taken_inside(
    delivery: Delivery,
    kind: InstallKind,
    call: impl FnOnce(uffd_pager::Region) -> uffd_pager::Result<()>,
) -> (usize, uffd_pager::Result<()>) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pager = Pager::builder()
        .delivery(delivery)
        .kswapd(false)
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::from_bytes(&[0xAB; LEN]).unwrap());
    let opts = MapOptions {
        kind: Some(kind),
        ..MapOptions::default()
    };
    // SAFETY: only this region reads the store; nothing writes it.
    let region = unsafe { pager.map_store(store, LEN, &opts) }.unwrap();
    // (Each page in, so that dropping them changes something.)
    assert!(region.as_slice().iter().all(|&b| b == 0xAB));
    let base = region.as_ptr() as usize;
    THEIRS.store(0, SeqCst);
    TARGET.store(base, SeqCst);
    set_before_range_change(Some(unmap_and_map_ours));
    let r = call(region);
    set_before_range_change(None);
    TARGET.store(0, SeqCst);
    assert_eq!(THEIRS.load(SeqCst), base, "the hook never ran");
    drop(pager);
    (base, r)
}

/// The engine's own unmap of a region (`Region::unmap`, a drop) whose
/// range the application unmapped, and mapped its own memory in, while
/// the unmap waited for the global lock: the application's mapping stays
/// as it was. Before, the unmap's `mprotect` and `munmap` took it (the
/// range read `unmapped`).
fn unmap_leaves_ours_alone(delivery: Delivery, kind: InstallKind) {
    let (base, r) = taken_inside(delivery, kind, |region| region.unmap());
    assert_eq!(
        perms_at(base),
        "rw-p",
        "the engine's unmap took the application's own mapping"
    );
    assert!(ours_intact(base));
    r.unwrap();
    unmap_ours(base);
}

#[test]
fn unmap_leaves_the_applications_new_mapping_alone() {
    unmap_leaves_ours_alone(THREADS, InstallKind::Anonymous);
    unmap_leaves_ours_alone(Delivery::InThread, InstallKind::Anonymous);
    unmap_leaves_ours_alone(THREADS, InstallKind::Shared);
}

/// Whether the application's mapping at `base` still holds its 0x5A.
fn ours_intact(base: usize) -> bool {
    // SAFETY: the test's own mapping of LEN bytes, readable.
    let ours = unsafe { std::slice::from_raw_parts(base as *const u8, LEN) };
    ours.iter().all(|&b| b == 0x5A)
}

/// Unmaps the test's own mapping at `base`.
fn unmap_ours(base: usize) {
    // SAFETY: the test's own mapping, which nothing refers to now.
    assert_eq!(unsafe { libc::munmap(base as *mut _, LEN) }, 0);
}

fn protect_leaves_ours_writable(delivery: Delivery, kind: InstallKind) {
    let (base, r) = taken_inside(delivery, kind, |region| region.protect(false));
    // The region is gone, so there was nothing left to protect.
    r.unwrap();
    assert_eq!(
        perms_at(base),
        "rw-p",
        "the engine's mprotect changed the application's own mapping"
    );
    // SAFETY: the test's own mapping, writable (checked above).
    unsafe { *(base as *mut u8) = 1 };
    unmap_ours(base);
}

#[test]
fn protect_leaves_the_applications_new_mapping_alone_with_handler_threads() {
    protect_leaves_ours_writable(THREADS, InstallKind::Anonymous);
}

#[test]
fn protect_leaves_the_applications_new_mapping_alone_in_thread() {
    protect_leaves_ours_writable(Delivery::InThread, InstallKind::Anonymous);
}

#[test]
fn protect_of_a_shared_region_leaves_the_applications_new_mapping_alone() {
    protect_leaves_ours_writable(THREADS, InstallKind::Shared);
}

#[test]
fn dontneed_of_a_quiet_region_keeps_the_applications_new_pages() {
    let (base, r) = taken_inside(THREADS, InstallKind::Shared, |mut region| {
        region.dontneed(0, LEN)
    });
    assert!(
        ours_intact(base),
        "the engine's MADV_DONTNEED dropped the application's own pages"
    );
    // The region was gone by the time the call tried again.
    assert!(r.is_err(), "{r:?}");
    unmap_ours(base);
}

/// The pager of the test below, for its hook, and the region the hook
/// maps with it.
static PAGER: std::sync::Mutex<Option<Pager>> = std::sync::Mutex::new(None);
static MAPPED_THERE: std::sync::Mutex<Option<uffd_pager::Region>> = std::sync::Mutex::new(None);

/// Whether the hook below writes the region it maps.
static FILL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Once, for the target range: the application's own `munmap` of it,
/// then a new region of the same pager's there, written with 0x77 if
/// `FILL` says so.
fn unmap_and_map_a_region(addr: usize) {
    if TARGET.load(SeqCst) != addr || TARGET.swap(0, SeqCst) == 0 {
        return;
    }
    // SAFETY: the region's whole range, which the test gives up here.
    assert_eq!(unsafe { libc::munmap(addr as *mut _, LEN) }, 0);
    let _hold = uffd_pager::AddressHold::new(addr, LEN).unwrap();
    let fixed = MapOptions {
        kind: Some(InstallKind::Anonymous),
        fixed_addr: Some(addr),
        ..MapOptions::default()
    };
    let pager = PAGER.lock().unwrap();
    let mut theirs = pager
        .as_ref()
        .unwrap()
        .map_anonymous_with(LEN, &fixed)
        .unwrap();
    assert_eq!(theirs.as_ptr() as usize, addr);
    if FILL.load(SeqCst) {
        theirs.as_mut_slice().fill(0x77);
    }
    *MAPPED_THERE.lock().unwrap() = Some(theirs);
}

#[test]
fn dontneed_leaves_a_region_mapped_in_the_range_since_alone() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pager = Pager::builder()
        .delivery(THREADS)
        .kswapd(false)
        .build()
        .unwrap();
    let mut region = pager.map_anonymous(LEN).unwrap();
    region.as_mut_slice().fill(1);
    let base = region.as_ptr() as usize;
    *PAGER.lock().unwrap() = Some(pager);
    TARGET.store(base, SeqCst);
    uffd_pager::testing::set_before_own_range(Some(unmap_and_map_a_region));
    let r = region.dontneed(0, LEN);
    uffd_pager::testing::set_before_own_range(None);
    TARGET.store(0, SeqCst);
    let theirs = MAPPED_THERE
        .lock()
        .unwrap()
        .take()
        .expect("the hook never ran");
    assert!(
        theirs.as_slice().iter().all(|&b| b == 0x77),
        "the region's dontneed dropped the pages of the region mapped there since"
    );
    assert!(r.is_err(), "{r:?}");
    drop(theirs);
    drop(region);
    drop(PAGER.lock().unwrap().take());
}

/// The pages of `[addr, addr + len)` resident in memory (`mincore`).
fn resident_pages(addr: usize, len: usize) -> usize {
    let mut v = vec![0u8; len / PAGE];
    // SAFETY: `v` has a byte per page of the range, which is mapped.
    assert_eq!(
        unsafe { libc::mincore(addr as *mut _, len, v.as_mut_ptr()) },
        0
    );
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// The engine's own faults and guards for a region's call (`populate`,
/// `prefault`, `lock_resident`) where, between the call's check that the
/// range is the region's and its look by address, the application's
/// `munmap` of it was applied and a new region of the same pager mapped
/// there: they left that region alone and failed. Before, they were
/// looked up by address, and faulted in (and guarded, and `mlock`ed) the
/// new region's pages, and said Ok.
fn own_call_leaves_a_region_mapped_since_alone(
    what: &str,
    call: fn(&uffd_pager::Region) -> uffd_pager::Result<()>,
) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pager = Pager::builder()
        .delivery(THREADS)
        .kswapd(false)
        .build()
        .unwrap();
    let opts = MapOptions {
        writable: true,
        kind: Some(InstallKind::Anonymous),
        ..MapOptions::default()
    };
    let region = pager.map_anonymous_with(LEN, &opts).unwrap();
    let base = region.as_ptr() as usize;
    *PAGER.lock().unwrap() = Some(pager);
    FILL.store(false, SeqCst);
    TARGET.store(base, SeqCst);
    uffd_pager::testing::set_before_own_range(Some(unmap_and_map_a_region));
    let r = call(&region);
    uffd_pager::testing::set_before_own_range(None);
    TARGET.store(0, SeqCst);
    FILL.store(true, SeqCst);
    let theirs = MAPPED_THERE
        .lock()
        .unwrap()
        .take()
        .unwrap_or_else(|| panic!("{what}: the hook never ran"));
    assert_eq!(
        (resident_pages(base, LEN), locked_at(base)),
        (0, false),
        "{what} faulted in (or locked) the pages of the region mapped there since"
    );
    assert!(r.is_err(), "{what}: {r:?}");
    drop(theirs);
    drop(region);
    drop(PAGER.lock().unwrap().take());
}

#[test]
fn populate_prefault_and_lock_resident_leave_a_region_mapped_since_alone() {
    own_call_leaves_a_region_mapped_since_alone("populate", |r| r.populate(0, LEN));
    own_call_leaves_a_region_mapped_since_alone("prefault", |r| r.prefault(0, LEN));
    own_call_leaves_a_region_mapped_since_alone("lock_resident", |r| {
        r.lock_resident(0, LEN).map(drop)
    });
    own_call_leaves_a_region_mapped_since_alone("lock_resident_owned", |r| {
        r.lock_resident_owned(0, LEN, true).map(drop)
    });
}

/// Whether the mapping that holds `addr` is locked (`mlock`: `lo` among
/// its `VmFlags` in `/proc/self/smaps`).
fn locked_at(addr: usize) -> bool {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = (a..b).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.split_whitespace().any(|f| f == "lo");
            }
        }
    }
    panic!("no mapping at {addr:#x}");
}

fn lock_resident_leaves_ours_unlocked(delivery: Delivery, kind: InstallKind) {
    let (base, r) = taken_inside(delivery, kind, |region| {
        region.lock_resident(0, LEN).map(drop)
    });
    assert!(
        !locked_at(base),
        "the engine's mlock2 locked the application's own mapping"
    );
    assert!(ours_intact(base));
    // The region was gone by the time the call tried again.
    assert!(r.is_err(), "{r:?}");
    unmap_ours(base);
}

#[test]
fn lock_resident_leaves_the_applications_new_mapping_unlocked() {
    lock_resident_leaves_ours_unlocked(THREADS, InstallKind::Anonymous);
    lock_resident_leaves_ours_unlocked(Delivery::InThread, InstallKind::Anonymous);
    lock_resident_leaves_ours_unlocked(THREADS, InstallKind::Shared);
}
