//! Write-back to a file opened `O_DIRECT`, whose every transfer must be
//! page-aligned.
//!
//! A page held by a residency guard stays writable while it is written
//! back, so the engine copies it through the kernel first. That copy was a
//! `Vec<u8>` (16-byte aligned), and the file store refused it with
//! `EINVAL` before reaching the kernel: `flush` failed every time while the
//! guard was held, and the pages batched with it were not written either.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{FileStore, FileStoreOptions};
use uffd_pager::{MapOptions, Pager};
use util::PAGE;

#[test]
fn a_guarded_pages_write_back_to_an_o_direct_file_is_written() {
    let path = std::env::temp_dir().join(format!("uffd-direct-guard-{}.bin", std::process::id()));
    std::fs::write(&path, vec![0u8; 4 * PAGE]).unwrap();
    let opts = FileStoreOptions {
        writable: true,
        direct: true,
        ..FileStoreOptions::default()
    };
    let store = FileStore::open(&path, &opts).unwrap();
    let pager = Pager::builder().build().unwrap();
    // SAFETY: the file is this test's own; nothing else writes it.
    let mut region =
        unsafe { pager.map_store(Arc::new(store), 4 * PAGE, &MapOptions::default()) }.unwrap();
    region.as_mut_slice()[0] = 0xA1;
    region.as_mut_slice()[PAGE] = 0xB2;
    let guard = region.lock_resident(0, PAGE).unwrap();
    let r = region.flush();
    drop(guard);
    let on_disk = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    r.unwrap();
    assert_eq!((on_disk[0], on_disk[PAGE]), (0xA1, 0xB2));
}
