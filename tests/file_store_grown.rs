//! A writable shared mapping of a file that grew after the store opened
//! it: stores past the old end reach the file (3f948cd), on any file
//! system, and a write-back never puts zeros over bytes appended after a
//! truncation that no read saw.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use uffd_pager::store::{FileStore, FileStoreOptions, Store};
use uffd_pager::{MapOptions, Pager, PAGE_SIZE};

fn grown_then_stored(dir: &std::path::Path) -> Option<Vec<u8>> {
    if !dir.is_dir() {
        return None;
    }
    let path = dir.join(format!("uffd-pager-grown-{}", std::process::id()));
    std::fs::write(&path, [b'a'; 100]).unwrap();
    let store = FileStore::open(
        &path,
        &FileStoreOptions {
            writable: true,
            ..FileStoreOptions::default()
        },
    )
    .unwrap();
    // The application grows the file (its own pwrite past the end) before
    // the page is first read.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_at(b"z", PAGE_SIZE as u64 - 1)
        .unwrap();
    let pager = Pager::builder().build().unwrap();
    // SAFETY: nothing else writes the file while it is mapped.
    let mut region = unsafe {
        pager.map_store(
            Arc::new(store) as Arc<dyn Store>,
            PAGE_SIZE,
            &MapOptions::default(),
        )
    }
    .unwrap();
    assert_eq!(region.as_slice()[PAGE_SIZE - 1], b'z', "{dir:?}");
    region.as_mut_slice()[2000..2006].copy_from_slice(b"stored");
    region.flush().unwrap();
    drop(region);
    let got = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    Some(got)
}

/// On disk (what 3f948cd's test covers) and on tmpfs, where the store
/// fills pages from its view of the file (`read_to_fd`), not `read`.
#[test]
fn stores_past_the_old_end_reach_a_grown_file_on_tmpfs_too() {
    for dir in [std::env::temp_dir(), "/dev/shm".into()] {
        let Some(got) = grown_then_stored(&dir) else {
            continue;
        };
        assert_eq!(got.len(), PAGE_SIZE, "{dir:?}");
        assert_eq!(&got[2000..2006], b"stored", "{dir:?}: the store was lost");
        assert_eq!(got[PAGE_SIZE - 1], b'z', "{dir:?}");
    }
}

/// The file grew and a read saw it; then it was truncated back, the page
/// read again (zeros past the new end), and another writer appended: the
/// write-back of that page must leave the appended bytes, which no read
/// saw, alone (as `direct_partial_page_write_keeps_what_was_appended`).
#[test]
fn bytes_appended_after_a_truncation_are_not_overwritten() {
    let path = std::env::temp_dir().join(format!("uffd-pager-regrown-{}", std::process::id()));
    std::fs::write(&path, [1u8; 100]).unwrap();
    let s = FileStore::open(
        &path,
        &FileStoreOptions {
            writable: true,
            ..FileStoreOptions::default()
        },
    )
    .unwrap();
    let other = OpenOptions::new().write(true).open(&path).unwrap();
    other.set_len(PAGE_SIZE as u64).unwrap();
    let mut page = vec![0u8; PAGE_SIZE];
    s.read(0, &mut page).unwrap();
    // Truncated back; the page is read again (evicted and faulted anew).
    other.set_len(100).unwrap();
    s.read(0, &mut page).unwrap();
    assert!(page[100..].iter().all(|&b| b == 0));
    // Another writer appends 100 bytes no read sees.
    let mut app = OpenOptions::new().append(true).open(&path).unwrap();
    app.write_all(&[0xAB; 100]).unwrap();
    page[10] = 9;
    s.write(0, &page).unwrap();
    let got = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(got.len(), 200);
    assert_eq!(got[10], 9);
    assert!(
        got[100..200].iter().all(|&b| b == 0xAB),
        "appended bytes overwritten with the page's zeros: {:?}",
        &got[100..110]
    );
}
