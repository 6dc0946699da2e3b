//! Living inside someone else's process, the application's side
//! (`shared/design/guest.md`): its own `munmap`, `mremap`, `mprotect` and
//! `madvise` on region memory give what they give on a plain mapping, and
//! the engine never touches memory that is no longer the region's.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};
use util::*;

const KINDS: [InstallKind; 2] = [InstallKind::Anonymous, InstallKind::Shared];

/// A pager with a small budget, so that reclaim runs all the time.
fn small_pager(d: Delivery) -> Pager {
    Pager::builder()
        .delivery(d)
        .budget_pages(16)
        .build()
        .unwrap_or_else(|e| panic!("{d}: {e}"))
}

fn byte(addr: usize) -> u8 {
    // SAFETY: callers pass addresses inside live mappings.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

/// The application's own anonymous mapping at exactly `addr`.
fn app_mmap_at(addr: usize, len: usize) -> usize {
    // SAFETY: MAP_FIXED_NOREPLACE maps only free addresses.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p as usize != addr {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let near: Vec<&str> = maps
            .lines()
            .filter(|l| {
                let a = usize::from_str_radix(l.split('-').next().unwrap_or("0"), 16).unwrap_or(0);
                a.abs_diff(addr) < (1 << 24)
            })
            .collect();
        panic!(
            "the range {addr:#x}+{len:#x} is not free: {}\n{}",
            errno(),
            near.join("\n")
        );
    }
    p as usize
}

/// The application unmaps part of a region, and maps its own memory over
/// another part (`mmap(MAP_FIXED)`: an unmap and a map in one call, so no
/// other thread can take the range in between). Its memory is its own
/// (the engine never reads, zaps or moves it, however hard reclaim runs),
/// the rest of the region keeps its data, and dropping the region leaves
/// the application's mapping alone.
#[test]
fn munmap_of_part_then_the_applications_own_mmap_in_the_hole() {
    for d in DELIVERIES {
        for kind in KINDS {
            with_deadline(120, "munmap hole", move || {
                let ctx = format!("{d} {kind}");
                let p = small_pager(d);
                let pages = 64;
                let (r, want) = filled_region(&p, kind, pages, 21);
                let base = r.as_ptr() as usize;
                let gone = base + 16 * PAGE;
                // SAFETY: the application unmaps region memory itself.
                assert_eq!(
                    unsafe { libc::munmap(gone as *mut libc::c_void, 16 * PAGE) },
                    0
                );
                let mine = base + 40 * PAGE;
                // SAFETY: the application maps its own memory over region
                // memory.
                let q = unsafe {
                    libc::mmap(
                        mine as *mut libc::c_void,
                        8 * PAGE,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    )
                };
                assert_eq!(q as usize, mine, "mmap(MAP_FIXED): {}", errno());
                for k in 0..8 * PAGE {
                    // SAFETY: the application's own mapping.
                    unsafe { *((mine + k) as *mut u8) = 0xA5 };
                }
                let kept = (0..16).chain(32..40).chain(48..pages);
                for round in 0..4 {
                    for pg in kept.clone() {
                        let a = base + pg * PAGE;
                        assert_eq!(
                            byte(a + 5),
                            want[pg * PAGE + 5],
                            "{ctx}: page {pg} r{round}"
                        );
                    }
                    p.reclaim_pages(64);
                    for k in (0..8 * PAGE).step_by(512) {
                        assert_eq!(byte(mine + k), 0xA5, "{ctx}: the application's page");
                    }
                }
                assert!(
                    p.stats().get(Counter::EVENT_UNMAP) >= 2,
                    "{ctx}: {}",
                    p.stats()
                );
                drop(r);
                for k in (0..8 * PAGE).step_by(512) {
                    assert_eq!(byte(mine + k), 0xA5, "{ctx}: after the region went");
                }
                // SAFETY: the application's own mapping.
                assert_eq!(
                    unsafe { libc::munmap(mine as *mut libc::c_void, 8 * PAGE) },
                    0
                );
            });
        }
    }
}

/// The application moves a whole region with its own `mremap`: its data
/// (resident or evicted) is read at the new address, faults there are
/// served, and dropping the region unmaps it there. In a child process, as
/// it probes which ranges are free.
#[test]
fn mremap_by_the_application_moves_the_region() {
    if !is_child() {
        let out = run_child("mremap_by_the_application_moves_the_region", &[]);
        assert!(out.status.success(), "{}", describe(&out));
        return;
    }
    for d in DELIVERIES {
        for kind in KINDS {
            with_deadline(120, "mremap", move || {
                let ctx = format!("{d} {kind}");
                let p = small_pager(d);
                let pages = 64;
                let (r, want) = filled_region(&p, kind, pages, 22);
                let old = r.as_ptr() as usize;
                let to = free_range(pages * PAGE);
                app_mremap(old, pages * PAGE, pages * PAGE, to);
                for round in 0..3 {
                    for pg in 0..pages {
                        assert_eq!(
                            byte(to + pg * PAGE + 9),
                            want[pg * PAGE + 9],
                            "{ctx}: r{round}"
                        );
                    }
                    p.reclaim_pages(64);
                }
                assert!(
                    p.stats().get(Counter::EVENT_REMAP) >= 1,
                    "{ctx}: {}",
                    p.stats()
                );
                drop(r);
                // The moved range went with the region.
                app_mmap_at(to, pages * PAGE);
                // SAFETY: our own probe mapping.
                unsafe { libc::munmap(to as *mut libc::c_void, pages * PAGE) };
            });
        }
    }
}

/// `madvise(MADV_DONTNEED)` by the application on a private mapping of a
/// store (the anonymous install kind): written pages, resident or evicted,
/// read the store's contents again, as on a `MAP_PRIVATE` file mapping.
#[test]
fn dontneed_on_a_private_store_mapping_reads_the_store_again() {
    for d in DELIVERIES {
        with_deadline(60, "private dontneed", move || {
            let p = small_pager(d);
            let pages = 64;
            let data = pattern_vec(23, pages * PAGE);
            let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            let opts = MapOptions {
                kind: Some(InstallKind::Anonymous),
                ..MapOptions::default()
            };
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let mut r = unsafe { p.map_store(store, data.len(), &opts) }.unwrap();
            r.as_mut_slice().fill(0x3C);
            // SAFETY: the application's own call on region memory.
            let rc = unsafe { libc::madvise(r.as_ptr().cast(), r.len(), libc::MADV_DONTNEED) };
            assert_eq!(rc, 0);
            assert_bytes(r.as_slice(), &data, &format!("{d}: after DONTNEED"));
        });
    }
}

/// The application makes a writable anonymous region read-only with its
/// own `mprotect`: reads keep working while reclaim moves its pages in and
/// out, and its data survives.
#[test]
fn mprotect_read_only_by_the_application_keeps_data_through_reclaim() {
    for d in DELIVERIES {
        with_deadline(60, "mprotect ro", move || {
            let p = small_pager(d);
            let pages = 64;
            let (r, want) = filled_region(&p, InstallKind::Anonymous, pages, 24);
            // SAFETY: the application's own call on region memory.
            let rc = unsafe { libc::mprotect(r.as_ptr().cast(), r.len(), libc::PROT_READ) };
            assert_eq!(rc, 0);
            for round in 0..3 {
                assert_bytes(r.as_slice(), &want, &format!("{d}: round {round}"));
                p.reclaim_pages(64);
            }
        });
    }
}

/// A child writes to a shared region over a read-only store that the
/// application made writable with its own `mprotect`: the write is refused
/// with SIGSEGV (a write that no write-back could keep), as the kernel
/// refuses `PROT_WRITE` on a read-only file.
#[test]
fn child_write_to_read_only_store_after_mprotect() {
    if !is_child() {
        return;
    }
    let d: Delivery = std::env::var("UFFD_DELIVERY").unwrap().parse().unwrap();
    let p = pager(d);
    let data = pattern_vec(25, 4 * PAGE);
    let store = Arc::new(MemoryStore::read_only(&data).unwrap());
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(store, data.len(), &opts) }.unwrap();
    assert_eq!(byte(r.as_ptr() as usize), data[0]);
    make_writable_and_write(&r, PAGE);
}

#[test]
fn writes_to_a_read_only_store_are_refused_after_mprotect() {
    assert_child_write_refused("child_write_to_read_only_store_after_mprotect");
}

/// `dontneed` then `populate` of an evicted anonymous region reads zeros in
/// every delivery mode: `dontneed` returns only once its `REMOVE` event is
/// applied. (Before, with handler threads, the event was read but not yet
/// applied when `dontneed` returned, and `populate` put the swapped-out
/// contents back: about 1 round in 30 with `Threads`, 1 in 400 per-region.)
#[test]
fn dontneed_then_populate_reads_zeros_in_every_delivery_mode() {
    for d in [
        Delivery::InThread,
        Delivery::Threads {
            threads: 2,
            spin_us: 0,
        },
        Delivery::PerRegion,
    ] {
        let pager = Pager::builder()
            .delivery(d)
            .budget_pages(64)
            .build()
            .unwrap();
        let rounds = if d == Delivery::PerRegion { 1500 } else { 300 };
        for round in 0..rounds {
            let mut r = pager.map_anonymous(8 * PAGE).unwrap();
            r.as_mut_slice().fill(0x82);
            pager.reclaim_pages(64);
            r.dontneed(PAGE, 2 * PAGE).unwrap();
            r.populate(PAGE, 3 * PAGE).unwrap();
            let s = r.as_slice();
            let bad = (0..8 * PAGE).find(|&o| {
                let want = if (PAGE..3 * PAGE).contains(&o) {
                    0
                } else {
                    0x82
                };
                s[o] != want
            });
            assert!(
                bad.is_none(),
                "{d}: round {round}: offset {:#x}: {:#x}",
                bad.unwrap(),
                s[bad.unwrap()]
            );
        }
    }
}

/// The application unmaps a whole region while the engine's user still
/// holds a residency guard on it (`Region::lock_resident`), so the unmap
/// is not the object's last reference. Dropping the guard is, and it must
/// finish the unmap: the region's writes reach the store and its pages
/// leave the budget (before, the object was freed with its pages charged
/// and its dirty pages never written, while reclaim's reverse map still
/// pointed at it).
#[test]
fn a_residency_guard_held_across_the_applications_munmap_finishes_the_release() {
    for d in DELIVERIES {
        with_deadline(60, "guard across munmap", move || {
            let pages = 8;
            let store = Arc::new(MemoryStore::from_bytes(&vec![0u8; pages * PAGE]).unwrap());
            let p = Pager::builder()
                .delivery(d)
                .budget_pages(64)
                .keep_unmapped(0)
                .build()
                .unwrap();
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let r = unsafe { p.map_store(store.clone(), pages * PAGE, &MapOptions::default()) }
                .unwrap();
            let base = r.as_ptr() as usize;
            let guard = r.lock_resident(0, 2 * PAGE).unwrap();
            for k in 0..pages * PAGE {
                // SAFETY: inside the region, mapped writable.
                unsafe { std::ptr::write_volatile((base + k) as *mut u8, 0x5A) };
            }
            // SAFETY: the application unmaps region memory itself.
            assert_eq!(
                unsafe { libc::munmap(base as *mut libc::c_void, pages * PAGE) },
                0
            );
            let t = std::time::Instant::now();
            while p.stats().get(Counter::EVENT_UNMAP) == 0 {
                assert!(t.elapsed().as_secs() < 20, "{d}: no UNMAP event");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            drop(guard);
            let mut back = vec![0u8; pages * PAGE];
            uffd_pager::store::Store::read(&*store, 0, &mut back).unwrap();
            assert!(
                back.iter().all(|&b| b == 0x5A),
                "{d}: the writes did not reach the store"
            );
            assert_eq!(
                p.stats().resident_pages,
                0,
                "{d}: pages still charged: {}",
                p.stats()
            );
            drop(r);
        });
    }
}

/// In a child run by [`each_delivery_in_a_child`] with `env`: the
/// delivery mode it is to test, with an alarm 20 s away (a hang ends the
/// child).
fn child_delivery(env: &str) -> Option<Delivery> {
    let k = std::env::var(env).ok()?;
    // SAFETY: alarm has no preconditions.
    unsafe { libc::alarm(20) };
    Some(DELIVERIES[k.parse::<usize>().unwrap()])
}

/// Runs test `name` again in a child per delivery mode, which
/// [`child_delivery`] names to it through `env`; each child's output
/// (nothing, in a child itself).
fn each_delivery_in_a_child(name: &str, env: &str) -> Vec<(Delivery, std::process::Output)> {
    if is_child() {
        return Vec::new();
    }
    DELIVERIES
        .iter()
        .enumerate()
        .map(|(k, &d)| (d, run_child(name, &[(env, &k.to_string())])))
        .collect()
}

/// The application grows a region with its own `mremap`: the kernel keeps
/// the grown part registered, but the event reports the old length only,
/// so no region covers it. An access there ends in a signal (SIGSEGV;
/// SIGBUS in-thread). Under handler threads it faulted again for ever: the handler
/// found no region and only woke the thread (the child hung until its
/// alarm). One child per delivery mode, killed by the signal.
#[test]
fn an_access_past_a_region_the_application_grew_is_sigsegv() {
    if let Some(d) = child_delivery("GROW_DELIVERY") {
        let p = small_pager(d);
        let pages = 4;
        let (r, want) = filled_region(&p, InstallKind::Anonymous, pages, 23);
        let to = free_range(2 * pages * PAGE);
        app_mremap(r.as_ptr() as usize, pages * PAGE, 2 * pages * PAGE, to);
        assert_eq!(byte(to + 2 * PAGE + 9), want[2 * PAGE + 9], "{d}");
        println!("{d}: the access past the region");
        byte(to + 6 * PAGE);
        println!("{d}: the access past the region returned");
        std::process::exit(0);
    }
    let name = "an_access_past_a_region_the_application_grew_is_sigsegv";
    for (d, out) in each_delivery_in_a_child(name, "GROW_DELIVERY") {
        // In-thread delivery gets the kernel's SIGBUS for a registered
        // range it cannot serve (its handler passes it on: not ours).
        let want = if d == Delivery::InThread {
            libc::SIGBUS
        } else {
            libc::SIGSEGV
        };
        assert_eq!(exit_signal(&out), Some(want), "{d}: {}", describe(&out));
        // Killed at that access, not in its set-up.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("the access past the region\n"),
            "{d}: {}",
            describe(&out)
        );
    }
}

/// The application cuts a region of 9 pages into five pieces with its own
/// `munmap` of every odd page, then unmaps all but the last piece. An
/// object tracks at most four windows for reclaim, so the last piece had
/// none; with the other four gone, per-region delivery took the region
/// for gone and stopped its handler, while the last piece was still
/// registered on the region's descriptor: its next fault, and any later
/// `munmap` of it, waited for ever (found by review). One child per
/// delivery mode, with an alarm as its deadline.
#[test]
fn a_region_cut_into_five_pieces_serves_its_last_piece() {
    if let Some(d) = child_delivery("PIECES_DELIVERY") {
        let p = small_pager(d);
        let pages = 9;
        let (mut r, _) = filled_region(&p, InstallKind::Anonymous, pages, 31);
        let base = r.as_ptr() as usize;
        // Page 8 is absent again: its next touch is a fault.
        r.dontneed(8 * PAGE, PAGE).unwrap();
        for k in [1, 3, 5, 7] {
            // SAFETY: a page of the region, not used again.
            assert_eq!(
                unsafe { libc::munmap((base + k * PAGE) as *mut libc::c_void, PAGE) },
                0
            );
        }
        // SAFETY: the first eight pages (four pieces and four holes).
        assert_eq!(
            unsafe { libc::munmap(base as *mut libc::c_void, 8 * PAGE) },
            0
        );
        assert_eq!(
            byte(base + 8 * PAGE + 5),
            0,
            "{d}: a dropped page reads as zeros"
        );
        // SAFETY: the last piece, not used again.
        assert_eq!(
            unsafe { libc::munmap((base + 8 * PAGE) as *mut libc::c_void, PAGE) },
            0
        );
        drop(r);
        println!("{d}: the last piece was served");
        std::process::exit(0);
    }
    let name = "a_region_cut_into_five_pieces_serves_its_last_piece";
    for (d, out) in each_delivery_in_a_child(name, "PIECES_DELIVERY") {
        assert!(out.status.success(), "{d}: {}", describe(&out));
    }
}

/// After the application moved a region with its own `mremap` and a new
/// region was mapped at the old address, the old `Region`'s calls still
/// named the old address: `dontneed` dropped the new region's pages
/// (they read as zeros). They now refuse a range that is no longer the
/// region's.
#[test]
fn a_region_the_application_moved_does_not_act_at_its_old_address() {
    if !is_child() {
        let out = run_child(
            "a_region_the_application_moved_does_not_act_at_its_old_address",
            &[],
        );
        assert!(out.status.success(), "{}", describe(&out));
        return;
    }
    let p = small_pager(Delivery::InThread);
    let pages = 4;
    // The kernel may give the freed range to the process's own next
    // mapping (a thread's stack, the engine's staging memory) before the
    // new region takes it: then try again.
    let (mut r, mut other) = (0..50)
        .find_map(|_| {
            let (r, _) = filled_region(&p, InstallKind::Anonymous, pages, 24);
            let old = r.as_ptr() as usize;
            let to = free_range(pages * PAGE);
            app_mremap(old, pages * PAGE, pages * PAGE, to);
            let opts = MapOptions {
                fixed_addr: Some(old),
                ..MapOptions::default()
            };
            let other = p.map_anonymous_with(pages * PAGE, &opts).ok()?;
            Some((r, other))
        })
        .expect("the old range stayed free once in 50 tries");
    other.as_mut_slice().fill(0x5A);
    assert!(r.dontneed(0, pages * PAGE).is_err());
    assert!(r.populate(0, PAGE).is_err());
    assert!(r.prefault(0, PAGE).is_err());
    assert!(r.lock_resident(0, PAGE).is_err());
    assert!(other.as_slice().iter().all(|&b| b == 0x5A));
}

/// An anonymous region of `pages` mapped read-only over a store of
/// pattern `seed`, and the store's bytes.
fn read_only_anonymous(p: &Pager, pages: usize, seed: u64) -> (uffd_pager::Region, Vec<u8>) {
    let data = pattern_vec(seed, pages * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Anonymous),
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the store changes only through the region.
    let r = unsafe { p.map_store(store, data.len(), &opts) }.unwrap();
    (r, data)
}

/// The application makes `r` writable with its own `mprotect` and flips
/// the byte at `off` of every page (in `want` too); then reclaim runs
/// three times and every byte must be what was written.
fn app_writes_survive_reclaim(
    p: &Pager,
    r: &uffd_pager::Region,
    want: &mut [u8],
    off: usize,
    ctx: &str,
) {
    // SAFETY: the application's own call on region memory.
    let rc = unsafe {
        libc::mprotect(
            r.as_ptr() as *mut libc::c_void,
            r.len(),
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(rc, 0);
    for o in (off..r.len()).step_by(PAGE) {
        want[o] = !want[o];
        // SAFETY: inside the region, now writable.
        unsafe { std::ptr::write_volatile((r.as_ptr() as usize + o) as *mut u8, want[o]) };
    }
    for round in 0..3 {
        p.reclaim_pages(64);
        assert_bytes(r.as_slice(), want, &format!("{ctx}: round {round}"));
    }
}

/// An anonymous region mapped read-only over a store, made writable by the
/// application's own `mprotect` (not `Region::protect`): its writes survive
/// reclaim, both to pages read before the `mprotect` (installed clean) and
/// to pages first touched by the write.
#[test]
fn writes_after_the_applications_own_mprotect_survive_reclaim() {
    for d in DELIVERIES {
        with_deadline(60, "mprotect rw", move || {
            let p = small_pager(d);
            let pages = 64;
            let (r, mut want) = read_only_anonymous(&p, pages, 31);
            // Read the first half: installed clean.
            let half = pages / 2 * PAGE;
            assert_bytes(&r.as_slice()[..half], &want[..half], "read");
            app_writes_survive_reclaim(&p, &r, &mut want, 7, &d.to_string());
        });
    }
}

/// As above, after `Region::remap` moved the region: the move's unregister
/// cleared the write protection of its clean pages, and the new
/// registration did not put it back, so a write after the application's
/// own `mprotect(PROT_WRITE)` went unseen and reclaim dropped it.
#[test]
fn writes_after_a_remap_and_the_applications_own_mprotect_survive_reclaim() {
    for d in DELIVERIES {
        with_deadline(60, "remap then mprotect rw", move || {
            let p = small_pager(d);
            let (mut r, mut want) = read_only_anonymous(&p, 16, 37);
            assert_bytes(r.as_slice(), &want, "read");
            r.remap_to(r.len(), Some(free_range(r.len()))).unwrap();
            app_writes_survive_reclaim(&p, &r, &mut want, 5, &d.to_string());
        });
    }
}

/// The application `mlock`s a region whose clean pages reclaim batches
/// with another region's. The batch's `MADV_DONTNEED` stopped at the
/// locked range (the kernel refuses `VM_LOCKED`), and the whole batch went
/// back, the pages zapped before the failure marked mapped still: nothing
/// was freed while the lock held (found by review); then each page was
/// zapped on its own after such a failure, and the locked ones stayed.
/// Locked regions are paged within the budget as the others are (the
/// README's guest table; `mlockall_after_build`): the zap is
/// `MADV_DONTNEED_LOCKED` now, and both regions' pages go, every byte
/// read back right.
#[test]
fn a_batch_that_meets_a_locked_region_frees_its_pages_too() {
    const PAGES: usize = 8;
    let p = Pager::builder()
        .budget_pages(1024)
        .kswapd(false)
        .build()
        .unwrap();
    let read_only = MapOptions {
        kind: Some(InstallKind::Anonymous),
        writable: false,
        ..MapOptions::default()
    };
    let map = |seed| {
        let store = Arc::new(MemoryStore::from_bytes(&pattern_vec(seed, PAGES * PAGE)).unwrap());
        // SAFETY: the store was moved in; nothing else can change it.
        unsafe { p.map_store(store, PAGES * PAGE, &read_only) }.unwrap()
    };
    let (r1, r2) = (map(41), map(42));
    // Every page read (clean: its store holds it), the upper region
    // locked, so that the zap reaches the lower one's ranges first.
    let sum = |r: &uffd_pager::Region| r.as_slice().iter().step_by(PAGE).fold(0u8, |a, &b| a ^ b);
    let _ = (sum(&r1), sum(&r2));
    let (lo, lo_seed, hi, hi_seed) = if r1.as_ptr() < r2.as_ptr() {
        (&r1, 41, &r2, 42)
    } else {
        (&r2, 42, &r1, 41)
    };
    // SAFETY: the region's own range.
    assert_eq!(unsafe { libc::mlock(hi.as_ptr().cast(), PAGES * PAGE) }, 0);
    let freed = p.reclaim_pages(2 * PAGES as u64);
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::munlock(hi.as_ptr().cast(), PAGES * PAGE) },
        0
    );
    assert_eq!(freed, 2 * PAGES as u64, "both regions' pages go");
    for k in 0..PAGES {
        let at = k * PAGE + 3;
        assert_eq!(lo.as_slice()[at], pattern(lo_seed, at), "page {k}");
        assert_eq!(hi.as_slice()[at], pattern(hi_seed, at), "page {k}");
    }
}

/// Another thread asks where the region is (`Region::mapped`, which
/// `prefault`, `lock_resident` and `populate` ask too) while the
/// application unmaps it with its own `munmap`: the region's dirty pages
/// still reach the store. The pieces it read held references to the
/// object, and dropped after the unmap was applied, the last of them freed
/// the object without its write-back (the rmap still pointing at it).
#[test]
fn asking_where_a_region_is_beside_its_munmap_loses_no_write() {
    let p = Pager::builder()
        .budget_pages(64)
        .keep_unmapped(0)
        .build()
        .unwrap();
    for round in 0..3000u32 {
        let store = Arc::new(MemoryStore::from_bytes(&[0u8; 4 * PAGE]).unwrap());
        // SAFETY: only this region changes the store.
        let r = unsafe { p.map_store(store.clone(), 4 * PAGE, &MapOptions::default()) }.unwrap();
        let base = r.as_ptr() as usize;
        let mark = (round % 250) as u8 + 1;
        // SAFETY: inside the region, mapped writable.
        unsafe { std::ptr::write_volatile((base + PAGE) as *mut u8, mark) };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let r = &r;
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = r.mapped();
                }
            });
            // SAFETY: the application unmaps region memory itself.
            assert_eq!(
                unsafe { libc::munmap(base as *mut libc::c_void, 4 * PAGE) },
                0
            );
            while !r.mapped().is_empty() {
                std::thread::yield_now();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        p.flush_unmapped().unwrap();
        let mut back = [0u8; 1];
        uffd_pager::store::Store::read(&*store, PAGE as u64, &mut back).unwrap();
        assert_eq!(back[0], mark, "round {round}: the write was lost");
    }
}

/// Another thread asks where the region is while the application unmaps
/// its first page with its own `munmap`: the answer is the region before
/// or after, never a region with no piece at all (the table was updated
/// before the index of its pieces' starts, and a read in between found
/// the new table and the old start, where no piece was left).
#[test]
fn a_region_whose_head_the_application_unmaps_never_reads_as_empty() {
    let p = Pager::builder().budget_pages(64).build().unwrap();
    for round in 0..2000u32 {
        let r = p.map_anonymous(8 * PAGE).unwrap();
        let base = r.as_ptr() as usize;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let r = &r;
        let empty = std::thread::scope(|s| {
            let asker = s.spawn(|| {
                let mut empty = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if r.mapped().is_empty() {
                        empty += 1;
                    }
                }
                empty
            });
            // SAFETY: the application unmaps region memory itself.
            assert_eq!(unsafe { libc::munmap(base as *mut libc::c_void, PAGE) }, 0);
            while r.mapped().first().map(|m| m.start) != Some(base + PAGE) {
                std::thread::yield_now();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            asker.join().unwrap()
        });
        assert_eq!(
            empty, 0,
            "round {round}: the region read as having no piece"
        );
    }
}
