//! A fixed map into a range that was free when the map was asked for.
//!
//! The engine makes mappings of its own on the way to the region's (the
//! memfd's alias of a shared region, the state words of a large one), and
//! the kernel puts each where it finds room first: a range the
//! application just unmapped is such a place. The map then found its own
//! range taken and failed with `Overlap`; a program whose `MAP_FIXED`
//! the preload shim handed to the kernel after that failure had the
//! engine's alias replaced by its file.
//!
//! One test in its own binary: another test's mappings, made in the same
//! moments, could take the freed range too.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, InstallKind, MapOptions};
use util::*;

/// A range the kernel hands out for `len` bytes, unmapped again.
fn just_freed(len: usize) -> usize {
    // SAFETY: a fresh inaccessible mapping, unmapped at once; nothing
    // else refers to it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::munmap(p, len), 0);
        p as usize
    }
}

#[test]
fn a_fixed_map_into_a_range_just_freed_lands_there() {
    for d in [Delivery::InThread, Delivery::PerRegion] {
        let p = pager(d);
        for kind in [InstallKind::Shared, InstallKind::Anonymous] {
            for pages in [16, 4096] {
                let len = pages * PAGE;
                let seed = pages as u64;
                let store = Arc::new(MemoryStore::from_bytes(&pattern_vec(seed, len)).unwrap());
                let addr = just_freed(len);
                let opts = MapOptions {
                    kind: Some(kind),
                    fixed_addr: Some(addr),
                    ..MapOptions::default()
                };
                // SAFETY: the test changes this store only through the
                // region (the store contract).
                let r = unsafe { p.map_store(store, len, &opts) };
                let r = r.unwrap_or_else(|e| panic!("{d} {kind} {pages} pages: {e}"));
                assert_eq!(r.as_ptr() as usize, addr, "{d} {kind} {pages} pages");
                assert_bytes(r.as_slice(), &pattern_vec(seed, len), "read back");
                r.unmap().unwrap();
            }
        }
    }
}
