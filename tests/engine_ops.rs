//! Address-space operations on live regions: protect and remap (shrink,
//! grow, move). Write-back is in `engine_writeback.rs`.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{MemoryStore, Store};
use uffd_pager::{InstallKind, MapOptions, Pager, Region};
use util::*;

const KINDS: [InstallKind; 2] = [InstallKind::Anonymous, InstallKind::Shared];

fn opts(kind: InstallKind) -> MapOptions {
    MapOptions {
        kind: Some(kind),
        ..MapOptions::default()
    }
}

fn mem_region(p: &Pager, kind: InstallKind, store_pages: usize, pages: usize, seed: u64) -> Region {
    let store: Arc<dyn Store> =
        Arc::new(MemoryStore::from_bytes(&pattern_vec(seed, store_pages * PAGE)).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    unsafe { p.map_store(store, pages * PAGE, &opts(kind)) }.unwrap()
}

#[test]
fn ops_protect_readonly_then_writable() {
    for d in DELIVERIES {
        for kind in KINDS {
            let ctx = format!("{d} {kind}");
            let p = pager(d);
            let mut region = mem_region(&p, kind, 16, 16, 1);
            let mut want = pattern_vec(1, 16 * PAGE);
            // Some pages present (one written), the rest absent.
            region.as_mut_slice()[2 * PAGE + 9] = 0x99;
            want[2 * PAGE + 9] = 0x99;
            region.protect(false).unwrap();
            // Read-only: every byte readable, absent pages fault in.
            assert_bytes(region.as_slice(), &want, &format!("{ctx}: read-only"));
            region.protect(true).unwrap();
            // Writable again: writes to present and absent pages work.
            let new = pattern_vec(2, 16 * PAGE);
            region.as_mut_slice()[..8 * PAGE].copy_from_slice(&new[..8 * PAGE]);
            want[..8 * PAGE].copy_from_slice(&new[..8 * PAGE]);
            assert_bytes(region.as_slice(), &want, &format!("{ctx}: writable again"));
            // A region mapped read-only can be made writable.
            let store: Arc<dyn Store> =
                Arc::new(MemoryStore::from_bytes(&pattern_vec(3, 4 * PAGE)).unwrap());
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let mut ro = unsafe {
                p.map_store(
                    store,
                    4 * PAGE,
                    &MapOptions {
                        kind: Some(kind),
                        writable: false,
                        ..MapOptions::default()
                    },
                )
            }
            .unwrap();
            assert_bytes(&ro.as_slice()[..PAGE], &pattern_vec(3, PAGE), &ctx);
            ro.protect(true).unwrap();
            ro.as_mut_slice()[..2 * PAGE].fill(0x5C);
            let mut w = pattern_vec(3, 4 * PAGE);
            w[..2 * PAGE].fill(0x5C);
            assert_bytes(ro.as_slice(), &w, &format!("{ctx}: ro made writable"));
        }
    }
}

/// map_anonymous, write a pattern, shrink, grow back, move: the pages that
/// remain keep their data; pages shrunk away come back as zeros (mremap
/// semantics for private anonymous memory).
#[test]
fn ops_remap_anonymous_shrink_grow_move() {
    for d in DELIVERIES {
        let ctx = format!("{d} anonymous");
        let p = pager(d);
        let pages = 64;
        let mut region = p.map_anonymous(pages * PAGE).unwrap();
        let data = pattern_vec(10, pages * PAGE);
        // Write every other page; the rest stay absent (zero).
        let mut want = vec![0u8; pages * PAGE];
        for pg in (0..pages).step_by(2) {
            let r = pg * PAGE..(pg + 1) * PAGE;
            region.as_mut_slice()[r.clone()].copy_from_slice(&data[r.clone()]);
            want[r.clone()].copy_from_slice(&data[r]);
        }

        region.remap(40 * PAGE).unwrap();
        assert_eq!(region.len(), 40 * PAGE);
        assert_bytes(
            region.as_slice(),
            &want[..40 * PAGE],
            &format!("{ctx}: shrunk"),
        );

        region.remap(pages * PAGE).unwrap();
        assert_eq!(region.len(), pages * PAGE);
        want[40 * PAGE..].fill(0);
        assert_bytes(region.as_slice(), &want, &format!("{ctx}: regrown"));

        // Writes into the regrown part work.
        region.as_mut_slice()[50 * PAGE..52 * PAGE].fill(0xAB);
        want[50 * PAGE..52 * PAGE].fill(0xAB);

        let to = free_range(pages * PAGE);
        region.remap_to(pages * PAGE, Some(to)).unwrap();
        assert_eq!(region.as_ptr() as usize, to);
        assert_bytes(region.as_slice(), &want, &format!("{ctx}: moved"));

        // Moved and shrunk at once.
        let to2 = free_range(16 * PAGE);
        region.remap_to(16 * PAGE, Some(to2)).unwrap();
        assert_eq!(region.as_ptr() as usize, to2);
        assert_bytes(
            region.as_slice(),
            &want[..16 * PAGE],
            &format!("{ctx}: moved+shrunk"),
        );

        // Growing past the original length is bounded by the swap store.
        let r = region.remap((pages + 1) * PAGE);
        assert!(
            matches!(r, Err(uffd_pager::Error::OutOfRange { .. })),
            "{r:?}"
        );
        // And the region still writes and reads after all that.
        region.as_mut_slice()[..PAGE].fill(0x3C);
        want[..PAGE].fill(0x3C);
        assert_bytes(
            region.as_slice(),
            &want[..16 * PAGE],
            &format!("{ctx}: final"),
        );
    }
}

/// A store-backed region mapped shorter than its store grows into the rest
/// of the store (new pages read from it), shrinks and moves, for both
/// install kinds; written pages keep their writes throughout.
#[test]
fn ops_remap_store_backed_grow_shrink_move() {
    for d in DELIVERIES {
        for kind in KINDS {
            let ctx = format!("{d} {kind}");
            let p = pager(d);
            let mut region = mem_region(&p, kind, 64, 32, 20);
            let mut want = pattern_vec(20, 64 * PAGE);
            // Touch half, write a few.
            assert_bytes(&region.as_slice()[..16 * PAGE], &want[..16 * PAGE], &ctx);
            region.as_mut_slice()[3 * PAGE..5 * PAGE].fill(0x11);
            want[3 * PAGE..5 * PAGE].fill(0x11);
            region.as_mut_slice()[20 * PAGE + 5] = 0x22;
            want[20 * PAGE + 5] = 0x22;

            region.remap(64 * PAGE).unwrap();
            assert_bytes(region.as_slice(), &want, &format!("{ctx}: grown"));

            let to = free_range(64 * PAGE);
            region.remap_to(64 * PAGE, Some(to)).unwrap();
            assert_eq!(region.as_ptr() as usize, to);
            assert_bytes(region.as_slice(), &want, &format!("{ctx}: moved"));

            region.remap(24 * PAGE).unwrap();
            assert_bytes(
                region.as_slice(),
                &want[..24 * PAGE],
                &format!("{ctx}: shrunk"),
            );
            region.as_mut_slice()[23 * PAGE..].fill(0x33);
            want[23 * PAGE..24 * PAGE].fill(0x33);
            assert_bytes(
                region.as_slice(),
                &want[..24 * PAGE],
                &format!("{ctx}: write"),
            );
        }
    }
}

/// A moved region's old range is no longer the region's: a new region can
/// be mapped at the old address, and each holds its own data.
#[test]
fn ops_remap_move_frees_old_range() {
    for d in DELIVERIES {
        let p = pager(d);
        // At an address the kernel does not pick on its own, so that the
        // vacated range stays free (the engine's own bookkeeping mappings
        // for the next region could otherwise land in it).
        let old = free_range(8 * PAGE);
        let store: Arc<dyn Store> =
            Arc::new(MemoryStore::from_bytes(&pattern_vec(30, 8 * PAGE)).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region = unsafe {
            p.map_store(
                store,
                8 * PAGE,
                &MapOptions {
                    fixed_addr: Some(old),
                    ..MapOptions::default()
                },
            )
        }
        .unwrap();
        assert_eq!(region.as_ptr() as usize, old);
        assert_bytes(region.as_slice(), &pattern_vec(30, 8 * PAGE), "before move");
        region
            .remap_to(8 * PAGE, Some(free_range(8 * PAGE)))
            .unwrap();
        assert_ne!(region.as_ptr() as usize, old);
        let store: Arc<dyn Store> =
            Arc::new(MemoryStore::from_bytes(&pattern_vec(31, 8 * PAGE)).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let again = unsafe {
            p.map_store(
                store,
                8 * PAGE,
                &MapOptions {
                    fixed_addr: Some(old),
                    ..MapOptions::default()
                },
            )
        }
        .unwrap();
        assert_bytes(
            again.as_slice(),
            &pattern_vec(31, 8 * PAGE),
            &format!("{d}: new at old address"),
        );
        assert_bytes(
            region.as_slice(),
            &pattern_vec(30, 8 * PAGE),
            &format!("{d}: moved"),
        );
    }
}

/// Kernel VMAs of this process (lines of /proc/self/maps).
fn vma_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

#[test]
fn small_anonymous_regions_cost_the_kernel_few_vmas() {
    // An anonymous region needs no mapping besides its own until a page is
    // swapped or read from a store, so adjacent regions registered alike
    // merge into one kernel VMA and the kernel's own fault path does not
    // slow down with the region count. Other threads may map meanwhile, so
    // the bound is loose: 400 regions must not cost anywhere near one VMA
    // each.
    let p = Pager::builder().readahead(0, 1).build().unwrap();
    let before = vma_count();
    let rs: Vec<Region> = (0..400)
        .map(|_| p.map_anonymous(2 * PAGE).unwrap())
        .collect();
    for (k, r) in rs.iter().enumerate() {
        // SAFETY: the region maps two writable pages and outlives the write.
        unsafe { std::ptr::write_volatile(r.as_ptr(), k as u8) };
    }
    let grown = vma_count().saturating_sub(before);
    assert!(grown < 100, "400 regions added {grown} kernel VMAs");
    for (k, r) in rs.iter().enumerate() {
        // SAFETY: as above.
        assert_eq!(unsafe { std::ptr::read_volatile(r.as_ptr()) }, k as u8);
    }
}

/// `{:?}` of a pager and a region says what they are in one line, not the
/// engine state behind them.
#[test]
fn debug_output_is_short() {
    let pager = Pager::builder().budget_pages(64).build().unwrap();
    let region = pager.map_anonymous(16 * PAGE).unwrap();
    let p = format!("{pager:?}");
    let r = format!("{region:?}");
    assert!(
        p.contains("budget_pages: 64") && p.contains("regions: 1"),
        "{p}"
    );
    assert!(
        r.contains(&format!("len: {}", 16 * PAGE)) && r.contains("Anonymous"),
        "{r}"
    );
    assert!(p.len() < 200 && r.len() < 200, "{p}\n{r}");
}

/// A writable anonymous region made read-only with `Region::protect` gives
/// its pages up to reclaim and keeps its data, after a residency guard too.
/// Made read-only with `mprotect`, its pages could not leave
/// (`UFFDIO_MOVE` moves only out of writable mappings): reclaim freed 0 of
/// 64, over the budget for good; and the guard's plain `mlock` faulted the
/// pages for write, which ended the write protection the same way.
#[test]
fn an_anonymous_region_made_read_only_gives_its_pages_up() {
    for d in DELIVERIES {
        let p = Pager::builder()
            .delivery(d)
            .budget_pages(256)
            .build()
            .unwrap();
        let (r, want) = filled_region(&p, InstallKind::Anonymous, 64, 5);
        r.protect(false).unwrap();
        // A guard's mlock does not write-fault the pages (a write would make
        // the region read-only for real: see `Region::protect`).
        drop(r.lock_resident(0, 64 * PAGE).unwrap());
        for round in 0..2 {
            assert_eq!(p.reclaim_pages(64), 64, "{d}: round {round}");
            assert_eq!(p.stats().resident_pages, 0, "{d}: round {round}");
            assert_bytes(r.as_slice(), &want, &format!("{d}: round {round}"));
        }
        // Writable again: writes land and stay.
        r.protect(true).unwrap();
        let mut want = want;
        // SAFETY: inside the region, writable again.
        unsafe { std::ptr::write_volatile(r.as_ptr().add(3 * PAGE + 1), 0xA5) };
        want[3 * PAGE + 1] = 0xA5;
        p.reclaim_pages(64);
        assert_bytes(r.as_slice(), &want, &format!("{d}: writable again"));
    }
}

/// Made read-only, then read-only in its mapping too
/// (`Region::protect_in_kernel`), an anonymous region takes the stores the
/// application's own `mprotect` allows in part of it: on a page that was
/// in and on one that was not, both kept through reclaim. The rest stays
/// read-only. (Without the call, the `mprotect` changes nothing in a
/// mapping that write protection keeps writable, and the engine refuses
/// the stores: SIGSEGV. The LD_PRELOAD shim's test
/// `an_anonymous_mapping_made_read_only_then_writable_in_part_takes_stores_there`
/// fails that way without it.)
#[test]
fn a_region_made_read_only_in_its_mapping_takes_stores_its_application_allows() {
    for d in DELIVERIES {
        let p = Pager::builder()
            .delivery(d)
            .budget_pages(256)
            .build()
            .unwrap();
        let (r, mut want) = filled_region(&p, InstallKind::Anonymous, 64, 9);
        r.protect(false).unwrap();
        p.reclaim_pages(32);
        assert_eq!(
            perms_at(r.as_ptr() as usize),
            "rw-p",
            "{d}: write-protected only"
        );
        r.protect_in_kernel().unwrap();
        let base = r.as_ptr() as usize;
        assert_eq!(perms_at(base), "r--p", "{d}");
        // SAFETY: part of the region's own mapping.
        let rc = unsafe {
            libc::mprotect(
                (base + 16 * PAGE) as *mut libc::c_void,
                32 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        assert_eq!(rc, 0, "{d}");
        for page in [20, 40] {
            // SAFETY: inside the part the application made writable.
            unsafe { std::ptr::write_volatile((base + page * PAGE + 7) as *mut u8, 0x5A) };
            want[page * PAGE + 7] = 0x5A;
        }
        assert_eq!(perms_at(base), "r--p", "{d}: the rest");
        p.reclaim_pages(64);
        assert_bytes(r.as_slice(), &want, &format!("{d}: after reclaim"));
    }
}
