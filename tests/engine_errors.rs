//! Bad inputs get their typed errors, and leave the pager (and any region
//! they were aimed at) usable.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{FileStore, FileStoreOptions, MemoryStore, Store, ZeroStore};
use uffd_pager::{Delivery, Error, InstallKind, MapOptions, Pager};
use util::*;

fn shared(writable: bool) -> MapOptions {
    MapOptions {
        kind: Some(InstallKind::Shared),
        writable,
        ..MapOptions::default()
    }
}

fn anon_opts(writable: bool) -> MapOptions {
    MapOptions {
        kind: Some(InstallKind::Anonymous),
        writable,
        ..MapOptions::default()
    }
}

fn mem(pages: usize, seed: u64) -> Arc<dyn Store> {
    Arc::new(MemoryStore::from_bytes(&pattern_vec(seed, pages * PAGE)).unwrap())
}

#[test]
fn errors_zero_length() {
    let p = pager(Delivery::InThread);
    let r = p.map_anonymous(0);
    assert!(matches!(r, Err(Error::ZeroLength)), "{r:?}");
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(mem(1, 1), 0, &shared(true)) };
    assert!(matches!(r, Err(Error::ZeroLength)), "{r:?}");
    let r = p.map_zero(0, InstallKind::Shared);
    assert!(matches!(r, Err(Error::ZeroLength)), "{r:?}");
    let f = TempFile::with_contents("zero-len", &pattern_vec(2, PAGE));
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_file(f.path(), Some(0), &shared(true)) };
    assert!(matches!(r, Err(Error::ZeroLength)), "{r:?}");
    // An empty file mapped whole is a zero-length region.
    let empty = TempFile::with_contents("empty", &[]);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_file(empty.path(), None, &shared(false)) };
    assert!(matches!(r, Err(Error::ZeroLength)), "{r:?}");
}

#[test]
fn errors_unaligned_length() {
    let p = pager(Delivery::InThread);
    for len in [1, 100, PAGE - 1, PAGE + 1, 3 * PAGE + 7] {
        let r = p.map_anonymous(len);
        assert!(
            matches!(r, Err(Error::Unaligned { value, .. }) if value == len),
            "map_anonymous({len}): {r:?}"
        );
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe { p.map_store(mem(4, 1), len, &shared(true)) };
        assert!(
            matches!(r, Err(Error::Unaligned { .. })),
            "map_store({len}): {r:?}"
        );
        let r = p.map_zero(len, InstallKind::Anonymous);
        assert!(
            matches!(r, Err(Error::Unaligned { .. })),
            "map_zero({len}): {r:?}"
        );
    }
    let f = TempFile::with_contents("unaligned", &pattern_vec(2, 4 * PAGE));
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_file(f.path(), Some(PAGE + 1), &shared(true)) };
    assert!(matches!(r, Err(Error::Unaligned { .. })), "{r:?}");
}

#[test]
fn errors_store_shorter_than_region() {
    let p = pager(Delivery::InThread);
    for kind in [InstallKind::Anonymous, InstallKind::Shared] {
        let opts = MapOptions {
            kind: Some(kind),
            ..MapOptions::default()
        };
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe { p.map_store(mem(4, 3), 5 * PAGE, &opts) };
        assert!(
            matches!(
                r,
                Err(Error::FileTooShort { file_len, needed })
                    if file_len == 4 * PAGE as u64 && needed == 5 * PAGE as u64
            ),
            "{kind}: {r:?}"
        );
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe { p.map_store(Arc::new(ZeroStore::new(PAGE as u64)), 2 * PAGE, &opts) };
        assert!(
            matches!(r, Err(Error::FileTooShort { .. })),
            "{kind}: {r:?}"
        );
        // Exactly as long is fine.
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let ok = unsafe { p.map_store(mem(4, 3), 4 * PAGE, &opts) }.unwrap();
        assert_bytes(ok.as_slice(), &pattern_vec(3, 4 * PAGE), "exact length");
    }
}

#[test]
fn errors_file_shorter_than_len() {
    let p = pager(Delivery::InThread);
    let f = TempFile::with_contents("short", &pattern_vec(4, 3 * PAGE));
    for opts in [shared(true), shared(false), anon_opts(true)] {
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe { p.map_file(f.path(), Some(4 * PAGE), &opts) };
        assert!(
            matches!(
                r,
                Err(Error::FileTooShort { file_len, needed })
                    if file_len == 3 * PAGE as u64 && needed == 4 * PAGE as u64
            ),
            "{opts:?}: {r:?}"
        );
    }
    // A partial last page rounds up: 3 pages + 1 byte maps as 4 pages, the
    // tail reading as zeros.
    let mut content = pattern_vec(5, 3 * PAGE + 1);
    let g = TempFile::with_contents("partial", &content);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_file(g.path(), Some(5 * PAGE), &shared(false)) };
    assert!(matches!(r, Err(Error::FileTooShort { .. })), "{r:?}");
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { p.map_file(g.path(), None, &shared(false)) }.unwrap();
    assert_eq!(region.len(), 4 * PAGE);
    content.resize(4 * PAGE, 0);
    assert_bytes(region.as_slice(), &content, "partial last page");
}

#[test]
fn errors_read_only_store_mapped_writable() {
    let p = pager(Delivery::InThread);
    // The zero store never accepts writes.
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe {
        p.map_store(
            Arc::new(ZeroStore::new(4 * PAGE as u64)),
            4 * PAGE,
            &shared(true),
        )
    };
    assert!(matches!(r, Err(Error::ReadOnlyStore)), "{r:?}");
    // A read-only memory store.
    let ro = Arc::new(MemoryStore::read_only(&pattern_vec(6, 4 * PAGE)).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(ro.clone(), 4 * PAGE, &shared(true)) };
    assert!(matches!(r, Err(Error::ReadOnlyStore)), "{r:?}");
    // A file store opened read-only (permission bits would not stop root,
    // so the store itself is opened read-only).
    let f = TempFile::with_contents("ro", &pattern_vec(7, 4 * PAGE));
    let fs = FileStore::open(
        f.path(),
        &FileStoreOptions {
            writable: false,
            ..FileStoreOptions::default()
        },
    )
    .unwrap();
    let fs: Arc<dyn Store> = Arc::new(fs);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(fs.clone(), 4 * PAGE, &shared(true)) };
    assert!(matches!(r, Err(Error::ReadOnlyStore)), "{r:?}");

    // Mapped read-only, the same stores work.
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { p.map_store(fs.clone(), 4 * PAGE, &shared(false)) }.unwrap();
    assert_bytes(
        region.as_slice(),
        &pattern_vec(7, 4 * PAGE),
        "ro file, shared",
    );
    drop(region);
    // A private (anonymous-install) mapping of a read-only store may be
    // writable: writes stay in memory and never reach the store.
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region = unsafe { p.map_store(fs, 4 * PAGE, &anon_opts(true)) }.unwrap();
    region.as_mut_slice()[PAGE..2 * PAGE].fill(0xEE);
    let mut want = pattern_vec(7, 4 * PAGE);
    want[PAGE..2 * PAGE].fill(0xEE);
    assert_bytes(region.as_slice(), &want, "ro file, private writable");
    region.flush().unwrap();
    region.unmap().unwrap();
    assert_bytes(&f.read(), &pattern_vec(7, 4 * PAGE), "file untouched");
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { p.map_store(ro.clone(), 4 * PAGE, &anon_opts(true)) }.unwrap();
    drop(region);
    assert_bytes(
        &ro.snapshot(),
        &pattern_vec(6, 4 * PAGE),
        "ro store untouched",
    );
}

#[test]
fn errors_fixed_address_overlap() {
    for d in DELIVERIES {
        let p = pager(d);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let first = unsafe { p.map_store(mem(8, 8), 8 * PAGE, &shared(true)) }.unwrap();
        let base = first.as_ptr() as usize;
        for (addr, len) in [
            (base, 8 * PAGE),
            (base, PAGE),
            (base + 3 * PAGE, 2 * PAGE),
            (base + 7 * PAGE, 4 * PAGE),
            (base - 2 * PAGE, 3 * PAGE),
        ] {
            for kind in [InstallKind::Shared, InstallKind::Anonymous] {
                // SAFETY: the test changes this store only through the region (the
                // store contract).
                let r = unsafe {
                    p.map_store(
                        mem(16, 9),
                        len,
                        &MapOptions {
                            kind: Some(kind),
                            fixed_addr: Some(addr),
                            ..MapOptions::default()
                        },
                    )
                };
                assert!(
                    matches!(r, Err(Error::Overlap { addr: a, .. }) if a == addr),
                    "{d} {kind} at {addr:#x}+{len:#x}: {r:?}"
                );
            }
        }
        // A fixed address over a mapping that is not a region (another
        // pager's region) is refused too, and never replaces it.
        let other = pager(Delivery::InThread);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe {
            other.map_store(
                mem(8, 10),
                8 * PAGE,
                &MapOptions {
                    fixed_addr: Some(base),
                    ..MapOptions::default()
                },
            )
        };
        assert!(matches!(r, Err(Error::Overlap { .. })), "{d}: {r:?}");
        // The first region is intact.
        assert_bytes(first.as_slice(), &pattern_vec(8, 8 * PAGE), "first region");
        // Right after the first region is free space (or at least not a
        // region): mapping exactly adjacent does not report an overlap with
        // the first region.
        let free = free_range(4 * PAGE);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let at = unsafe {
            p.map_store(
                mem(4, 11),
                4 * PAGE,
                &MapOptions {
                    fixed_addr: Some(free),
                    ..MapOptions::default()
                },
            )
        }
        .unwrap();
        assert_eq!(at.as_ptr() as usize, free);
        assert_bytes(at.as_slice(), &pattern_vec(11, 4 * PAGE), "fixed region");
    }
}

#[test]
fn errors_fixed_address_unaligned_or_null() {
    let p = pager(Delivery::InThread);
    for addr in [0usize, 1, PAGE + 8, free_range(PAGE) + 1] {
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe {
            p.map_store(
                mem(1, 12),
                PAGE,
                &MapOptions {
                    fixed_addr: Some(addr),
                    ..MapOptions::default()
                },
            )
        };
        assert!(
            matches!(r, Err(Error::Unaligned { value, .. }) if value == addr),
            "{addr:#x}: {r:?}"
        );
    }
}

#[test]
fn errors_prefault_out_of_range() {
    let p = pager(Delivery::InThread);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { p.map_store(mem(4, 13), 4 * PAGE, &shared(true)) }.unwrap();
    for (off, len) in [
        (0, 4 * PAGE + 1),
        (4 * PAGE, 1),
        (8 * PAGE, PAGE),
        (PAGE, usize::MAX - 2 * PAGE),
        (usize::MAX & !(PAGE - 1), PAGE),
    ] {
        let r = region.prefault(off, len);
        assert!(
            matches!(r, Err(Error::OutOfRange { region_len, .. }) if region_len == 4 * PAGE),
            "prefault({off:#x}, {len:#x}): {r:?}"
        );
    }
    // In range: fine, and the data is there.
    region.prefault(0, 4 * PAGE).unwrap();
    region.prefault(PAGE + 5, 10).unwrap();
    region.prefault(4 * PAGE, 0).unwrap();
    assert_bytes(
        region.as_slice(),
        &pattern_vec(13, 4 * PAGE),
        "after prefault",
    );
}

/// Child: `prefault` with an unaligned offset whose end lies past the
/// region must be refused, not touch the page after the region.
#[test]
fn child_prefault_unaligned_past_end() {
    if !is_child() {
        return;
    }
    let p = pager(Delivery::InThread);
    // Place a one-page region so that the page after it is unmapped.
    let free = free_range(2 * PAGE);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe {
        p.map_store(
            mem(1, 14),
            PAGE,
            &MapOptions {
                fixed_addr: Some(free),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    eprintln!("CHILD: calling prefault");
    let r = region.prefault(PAGE - 1, 2);
    eprintln!("CHILD: prefault returned {r:?}");
    assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
    let r = region.prefault(1, PAGE);
    assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
}

#[test]
fn errors_prefault_unaligned_offset_past_end() {
    let out = run_child("child_prefault_unaligned_past_end", &[]);
    assert!(
        out.status.success(),
        "child died instead of getting OutOfRange: {}",
        describe(&out)
    );
}

#[test]
fn errors_remap_bad_arguments() {
    for d in DELIVERIES {
        let p = pager(d);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region = unsafe { p.map_store(mem(8, 15), 4 * PAGE, &shared(true)) }.unwrap();
        let start = region.as_ptr() as usize;
        let r = region.remap(0);
        assert!(matches!(r, Err(Error::ZeroLength)), "{r:?}");
        let r = region.remap(PAGE + 1);
        assert!(matches!(r, Err(Error::Unaligned { .. })), "{r:?}");
        let r = region.remap_to(4 * PAGE, Some(0));
        assert!(matches!(r, Err(Error::Unaligned { value: 0, .. })), "{r:?}");
        let r = region.remap_to(4 * PAGE, Some(free_range(4 * PAGE) + 16));
        assert!(matches!(r, Err(Error::Unaligned { .. })), "{r:?}");
        let r = region.remap_to(0, Some(free_range(PAGE)));
        assert!(matches!(r, Err(Error::ZeroLength)), "{r:?}");
        // Growing past the store is out of range.
        let r = region.remap(9 * PAGE);
        assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
        // Moving onto another region overlaps.
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let other = unsafe { p.map_store(mem(4, 16), 4 * PAGE, &shared(true)) }.unwrap();
        let r = region.remap_to(4 * PAGE, Some(other.as_ptr() as usize));
        assert!(matches!(r, Err(Error::Overlap { .. })), "{d}: {r:?}");
        // Nothing moved, and both regions still hold their data.
        assert_eq!(region.as_ptr() as usize, start);
        assert_eq!(region.len(), 4 * PAGE);
        assert_bytes(
            region.as_slice(),
            &pattern_vec(15, 4 * PAGE),
            "after bad remaps",
        );
        assert_bytes(other.as_slice(), &pattern_vec(16, 4 * PAGE), "other region");
        // And a good remap still works afterwards.
        region.remap(8 * PAGE).unwrap();
        assert_bytes(
            region.as_slice(),
            &pattern_vec(15, 8 * PAGE),
            "after growing",
        );
    }
}

#[test]
fn errors_zero_handler_threads_is_config() {
    let r = Pager::builder()
        .delivery(Delivery::Threads {
            threads: 0,
            spin_us: 0,
        })
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    let r = Pager::builder()
        .delivery(Delivery::Threads {
            threads: 0,
            spin_us: 10,
        })
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    // One thread is fine.
    let p = Pager::builder()
        .delivery(Delivery::Threads {
            threads: 1,
            spin_us: 0,
        })
        .build()
        .unwrap();
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(mem(2, 17), 2 * PAGE, &shared(true)) }.unwrap();
    assert_bytes(
        r.as_slice(),
        &pattern_vec(17, 2 * PAGE),
        "one handler thread",
    );
}

/// After each refused request the pager still maps and serves regions.
#[test]
fn errors_leave_pager_usable() {
    for d in DELIVERIES {
        let p = pager(d);
        let _ = p.map_anonymous(0);
        let _ = p.map_anonymous(3);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let _ = unsafe { p.map_store(mem(1, 1), 2 * PAGE, &shared(true)) };
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let _ = unsafe { p.map_store(Arc::new(ZeroStore::new(PAGE as u64)), PAGE, &shared(true)) };
        let mut r = p.map_anonymous(16 * PAGE).unwrap();
        let want = pattern_vec(18, 16 * PAGE);
        r.as_mut_slice().copy_from_slice(&want);
        assert_bytes(r.as_slice(), &want, "after errors");
    }
}

/// A directory (or any path that is not a regular file) is refused at map
/// time, instead of a region whose first touch dies of SIGBUS.
#[test]
fn errors_map_file_of_a_directory() {
    let p = pager(Delivery::InThread);
    let dir = std::env::temp_dir();
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_file(&dir, Some(PAGE), &MapOptions::default()) };
    assert!(matches!(r, Err(Error::NotRegularFile(_))), "{r:?}");
    // Read-only too (a directory opens read-only; the old code mapped it,
    // and the first touch died of SIGBUS).
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_file(&dir, Some(PAGE), &shared(false)) };
    assert!(matches!(r, Err(Error::NotRegularFile(_))), "{r:?}");
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe {
        p.map_file(
            std::path::Path::new("/dev/null"),
            Some(PAGE),
            &shared(false),
        )
    };
    assert!(matches!(r, Err(Error::NotRegularFile(_))), "{r:?}");
    // The pager still works.
    let mut a = p.map_anonymous(PAGE).unwrap();
    a.as_mut_slice()[0] = 1;
    assert_eq!(a.as_slice()[0], 1);
}

/// A shared region over a read-only store cannot be made writable (its
/// writes would have nowhere to go), as mprotect(PROT_WRITE) on a file
/// opened read-only fails.
#[test]
fn errors_protect_writable_over_a_read_only_store() {
    let p = pager(Delivery::InThread);
    let data = pattern_vec(5, 4 * PAGE);
    let store = Arc::new(MemoryStore::read_only(&data).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(store, data.len(), &shared(false)) }.unwrap();
    let e = r.protect(true);
    assert!(matches!(e, Err(Error::ReadOnlyStore)), "{e:?}");
    assert_bytes(r.as_slice(), &data, "still readable");
}

/// An anonymous (private) mapping of a read-only store may be writable:
/// its writes go to its own swap, never to the store, and survive eviction.
#[test]
fn private_mapping_of_a_read_only_store_keeps_its_writes_through_eviction() {
    for d in DELIVERIES {
        let p = Pager::builder()
            .delivery(d)
            .budget_pages(8)
            .build()
            .unwrap();
        let data = pattern_vec(6, 64 * PAGE);
        let store = Arc::new(MemoryStore::read_only(&data).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut r = unsafe { p.map_store(store.clone(), data.len(), &anon_opts(true)) }.unwrap();
        let mut want = data.clone();
        for pg in 0..64 {
            r.as_mut_slice()[pg * PAGE + 3] = 0x77;
            want[pg * PAGE + 3] = 0x77;
        }
        p.reclaim_pages(1000);
        assert_bytes(r.as_slice(), &want, &format!("{d}: after eviction"));
        assert_bytes(
            &store.snapshot(),
            &data,
            &format!("{d}: the store is untouched"),
        );
    }
}

/// `remap_to` onto memory that is not a region's (the heap, a stack, the
/// application's own mapping) is refused, and that memory is untouched:
/// a safe call must not replace whatever is mapped there.
#[test]
fn errors_remap_onto_a_foreign_mapping_is_refused() {
    for d in DELIVERIES {
        let p = pager(d);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region = unsafe { p.map_store(mem(8, 17), 4 * PAGE, &shared(true)) }.unwrap();
        // The application's own mapping, holding its data.
        let mut mine = vec![0x5Au8; 8 * PAGE];
        let heap = mine.as_mut_ptr() as usize;
        let page_in_heap = (heap + PAGE - 1) & !(PAGE - 1);
        let r = region.remap_to(4 * PAGE, Some(page_in_heap));
        assert!(matches!(r, Err(Error::Overlap { .. })), "{d}: {r:?}");
        assert!(
            mine.iter().all(|&b| b == 0x5A),
            "{d}: the heap was replaced"
        );
        // SAFETY: a fresh anonymous mapping of the test's own.
        let own = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        // SAFETY: our own mapping.
        unsafe { *(own as *mut u8) = 0x3C };
        let r = region.remap_to(4 * PAGE, Some(own));
        assert!(matches!(r, Err(Error::Overlap { .. })), "{d}: {r:?}");
        // SAFETY: still our own mapping, untouched.
        assert_eq!(unsafe { *(own as *const u8) }, 0x3C, "{d}");
        // SAFETY: our own mapping.
        unsafe { libc::munmap(own as *mut libc::c_void, 4 * PAGE) };
        assert_bytes(
            region.as_slice(),
            &pattern_vec(17, 4 * PAGE),
            "region intact",
        );
    }
}
