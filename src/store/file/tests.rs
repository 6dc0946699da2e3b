//! Unit tests of the file store (`mod.rs`, `open.rs`).

use super::*;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// A temp file path removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        TempPath(std::env::temp_dir().join(format!(
            "uffd-pager-filestore-{tag}-{}-{n}-{nanos}",
            std::process::id()
        )))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[repr(C, align(4096))]
struct AlignedPage([u8; PAGE_SIZE]);

#[test]
fn round_trip_with_create() {
    let p = TempPath::new("rt");
    let opts = FileStoreOptions {
        writable: true,
        create_len: Some(4 * PAGE_SIZE as u64),
        ..Default::default()
    };
    let s = FileStore::open(&p.0, &opts).unwrap();
    assert_eq!(s.len(), 4 * PAGE_SIZE as u64);
    assert!(s.writable());
    assert_eq!(s.name(), "file");
    let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8).collect();
    s.write(PAGE_SIZE as u64, &page).unwrap();
    let mut back = vec![0xFFu8; PAGE_SIZE];
    s.read(PAGE_SIZE as u64, &mut back).unwrap();
    assert_eq!(back, page);
    s.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    s.sync().unwrap();
    drop(s);

    // Reopen read-only: the data persisted, writes are refused.
    let s = FileStore::open(&p.0, &FileStoreOptions::default()).unwrap();
    assert!(!s.writable());
    s.read(PAGE_SIZE as u64, &mut back).unwrap();
    assert_eq!(back, page);
    assert_eq!(s.write(0, &page), Err(StoreError(libc::EROFS)));
}

#[test]
fn partial_last_page_zero_fills_and_keeps_length() {
    let p = TempPath::new("tail");
    let data: Vec<u8> = (0..PAGE_SIZE + 100).map(|i| (i as u8) | 1).collect();
    File::create(&p.0).unwrap().write_all(&data).unwrap();
    let s = FileStore::open(
        &p.0,
        &FileStoreOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.len(), 2 * PAGE_SIZE as u64);
    assert_eq!(s.file_len(), data.len() as u64);
    let mut back = vec![0xEEu8; PAGE_SIZE];
    s.read(PAGE_SIZE as u64, &mut back).unwrap();
    assert_eq!(&back[..100], &data[PAGE_SIZE..]);
    assert!(back[100..].iter().all(|&b| b == 0));

    // Writing the last page writes only the in-file bytes.
    let page = vec![7u8; PAGE_SIZE];
    s.write(PAGE_SIZE as u64, &page).unwrap();
    let mut contents = Vec::new();
    File::open(&p.0)
        .unwrap()
        .read_to_end(&mut contents)
        .unwrap();
    assert_eq!(contents.len(), data.len());
    assert!(contents[PAGE_SIZE..].iter().all(|&b| b == 7));
    assert_eq!(&contents[..PAGE_SIZE], &data[..PAGE_SIZE]);
}

/// Under O_DIRECT the final partial page is written byte-exact: bytes
/// another writer appended after the open survive (an aligned write
/// then a truncate back to the length at open would cut them).
#[test]
fn direct_partial_page_write_keeps_what_was_appended() {
    let p = TempPath::new("direct-tail");
    let data: Vec<u8> = (0..PAGE_SIZE + 100).map(|i| (i as u8) | 1).collect();
    File::create(&p.0).unwrap().write_all(&data).unwrap();
    let s = match FileStore::open(
        &p.0,
        &FileStoreOptions {
            writable: true,
            direct: true,
            ..Default::default()
        },
    ) {
        Ok(s) => s,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!(
                "skipping: O_DIRECT unsupported in {:?}",
                std::env::temp_dir()
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    std::fs::OpenOptions::new()
        .append(true)
        .open(&p.0)
        .unwrap()
        .write_all(&[0xAB; 50])
        .unwrap();
    let page = AlignedPage([7u8; PAGE_SIZE]);
    s.write(PAGE_SIZE as u64, &page.0).unwrap();
    let contents = std::fs::read(&p.0).unwrap();
    assert_eq!(
        contents.len(),
        data.len() + 50,
        "the file kept its new length"
    );
    assert!(contents[PAGE_SIZE..PAGE_SIZE + 100].iter().all(|&b| b == 7));
    assert!(
        contents[PAGE_SIZE + 100..].iter().all(|&b| b == 0xAB),
        "appended bytes survive"
    );
}

/// A file truncated behind the store: reads past its new end fail (a
/// mapping of the file would get SIGBUS there) instead of reading
/// zeros, and write-back does not extend it again.
#[test]
fn truncated_underneath_reads_fail_and_writes_do_not_extend() {
    let p = TempPath::new("truncated");
    let data: Vec<u8> = (0..4 * PAGE_SIZE).map(|i| (i as u8) | 1).collect();
    File::create(&p.0).unwrap().write_all(&data).unwrap();
    let s = FileStore::open(
        &p.0,
        &FileStoreOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p.0)
        .unwrap()
        .set_len(PAGE_SIZE as u64 + 10)
        .unwrap();
    let mut back = vec![0u8; PAGE_SIZE];
    assert_eq!(
        s.read(3 * PAGE_SIZE as u64, &mut back),
        Err(StoreError(libc::EIO))
    );
    // A batch that holds a page past the new end fails too, as that page
    // alone does (it read as zeros before), and one within it reads.
    let mut batch = vec![0u8; 4 * PAGE_SIZE];
    assert_eq!(s.read_many(0, &mut batch), Err(StoreError(libc::EIO)));
    s.read_many(0, &mut batch[..2 * PAGE_SIZE]).unwrap();
    assert_eq!(&batch[..PAGE_SIZE + 10], &data[..PAGE_SIZE + 10]);
    // The page holding the new end reads its bytes, then zeros.
    s.read(PAGE_SIZE as u64, &mut back).unwrap();
    assert_eq!(&back[..10], &data[PAGE_SIZE..PAGE_SIZE + 10]);
    assert!(back[10..].iter().all(|&b| b == 0));
    s.write(3 * PAGE_SIZE as u64, &[9u8; PAGE_SIZE]).unwrap();
    s.write(PAGE_SIZE as u64, &[9u8; PAGE_SIZE]).unwrap();
    let contents = std::fs::read(&p.0).unwrap();
    assert_eq!(contents.len(), PAGE_SIZE + 10, "not extended again");
    assert!(contents[PAGE_SIZE..].iter().all(|&b| b == 9));
}

/// A file grown after the open (the application's own `write(2)` past
/// its end, which the shim follows with a refresh that reads the page):
/// the bytes a read handed out past the old end are written back, as a
/// kernel mapping's stores there reach the grown file. Before, every
/// write stopped at the length at open, and what was stored there was
/// lost. Bytes appended that no read saw are still left alone
/// (`direct_partial_page_write_keeps_what_was_appended`).
#[test]
fn bytes_read_past_the_end_at_open_are_written_back() {
    let p = TempPath::new("grown");
    File::create(&p.0).unwrap().write_all(&[1u8; 100]).unwrap();
    let s = FileStore::open(
        &p.0,
        &FileStoreOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p.0)
        .unwrap()
        .set_len(PAGE_SIZE as u64)
        .unwrap();
    let mut page = vec![0u8; PAGE_SIZE];
    s.read(0, &mut page).unwrap();
    page[2000] = 9;
    s.write(0, &page).unwrap();
    let contents = std::fs::read(&p.0).unwrap();
    assert_eq!(contents.len(), PAGE_SIZE, "the length is the file's");
    assert_eq!(contents[2000], 9, "the store past the old end is written");
    assert!(contents[..100].iter().all(|&b| b == 1));
}

#[test]
fn create_len_never_truncates() {
    let p = TempPath::new("grow");
    File::create(&p.0)
        .unwrap()
        .write_all(&vec![1u8; 3 * PAGE_SIZE])
        .unwrap();
    let s = FileStore::open(
        &p.0,
        &FileStoreOptions {
            create_len: Some(PAGE_SIZE as u64),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.len(), 3 * PAGE_SIZE as u64);
    assert!(!s.writable());
}

#[test]
fn from_file_checks_access_mode() {
    let p = TempPath::new("from");
    File::create(&p.0)
        .unwrap()
        .write_all(&vec![3u8; PAGE_SIZE])
        .unwrap();
    let ro = File::open(&p.0).unwrap();
    let err = FileStore::from_file(ro, true).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    let ro = File::open(&p.0).unwrap();
    let s = FileStore::from_file(ro, false).unwrap();
    assert!(!s.is_direct());
    let mut back = vec![0u8; PAGE_SIZE];
    s.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 3));
    let rw = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p.0)
        .unwrap();
    let s = FileStore::from_file(rw, true).unwrap();
    s.write(0, &vec![4u8; PAGE_SIZE]).unwrap();
    s.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 4));
}

/// A descriptor opened for appending is refused for a writable store:
/// Linux's `pwrite` appends there whatever the offset, and before, every
/// write-back grew the file and left the page's bytes as they were.
#[test]
fn from_file_refuses_append_for_writing() {
    let p = TempPath::new("append");
    File::create(&p.0)
        .unwrap()
        .write_all(&vec![1u8; 2 * PAGE_SIZE])
        .unwrap();
    let append = || {
        OpenOptions::new()
            .read(true)
            .append(true)
            .open(&p.0)
            .unwrap()
    };
    let err = FileStore::from_file(append(), true).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    assert_eq!(std::fs::read(&p.0).unwrap(), vec![1u8; 2 * PAGE_SIZE]);
    // Read-only use of such a descriptor is fine (`pread` honours the
    // offset).
    let s = FileStore::from_file(append(), false).unwrap();
    let mut back = vec![0u8; PAGE_SIZE];
    s.read(PAGE_SIZE as u64, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 1));
}

/// A writable store over a duplicate of a descriptor (the C API's
/// `uffd_pager_map_fd` where the file cannot be opened again) shares its
/// status flags: set to append after the store was made, Linux's `pwrite`
/// appended every write-back at the end of the file and left the page as
/// it was (found by review). The store writes with `RWF_NOAPPEND`.
#[test]
fn a_description_set_to_append_later_is_written_in_place() {
    use std::os::fd::AsRawFd;
    let p = TempPath::new("append-later");
    File::create(&p.0)
        .unwrap()
        .write_all(&vec![1u8; 2 * PAGE_SIZE])
        .unwrap();
    let rw = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p.0)
        .unwrap();
    let callers = rw.try_clone().unwrap();
    let s = FileStore::from_file(rw, true).unwrap();
    // SAFETY: F_SETFL on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::fcntl(callers.as_raw_fd(), libc::F_SETFL, libc::O_APPEND) },
        0
    );
    s.write(0, &vec![5u8; PAGE_SIZE]).unwrap();
    let now = std::fs::read(&p.0).unwrap();
    assert_eq!(now.len(), 2 * PAGE_SIZE, "the write-back grew the file");
    assert!(now[..PAGE_SIZE].iter().all(|&b| b == 5), "page 0 unchanged");
}

#[test]
fn missing_file_is_an_error() {
    let p = TempPath::new("missing");
    assert!(FileStore::open(&p.0, &FileStoreOptions::default()).is_err());
}

#[test]
fn out_of_bounds_is_einval() {
    let p = TempPath::new("oob");
    let s = FileStore::open(
        &p.0,
        &FileStoreOptions {
            writable: true,
            create_len: Some(PAGE_SIZE as u64),
            ..Default::default()
        },
    )
    .unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    assert_eq!(
        s.read(PAGE_SIZE as u64, &mut buf),
        Err(StoreError(libc::EINVAL))
    );
    assert_eq!(s.write(8, &buf), Err(StoreError(libc::EINVAL)));
}

#[test]
fn direct_io_round_trip_and_alignment() {
    let p = TempPath::new("direct");
    let opts = FileStoreOptions {
        writable: true,
        direct: true,
        create_len: Some(2 * PAGE_SIZE as u64 + 100),
    };
    let s = match FileStore::open(&p.0, &opts) {
        Ok(s) => s,
        // The temp filesystem may not support O_DIRECT (e.g. older tmpfs).
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!(
                "skipping: O_DIRECT unsupported in {:?}",
                std::env::temp_dir()
            );
            return;
        }
        Err(e) => panic!("open: {e}"),
    };
    assert!(s.is_direct());
    assert_eq!(s.len(), 3 * PAGE_SIZE as u64);
    let mut page = Box::new(AlignedPage([0x5A; PAGE_SIZE]));
    s.write(PAGE_SIZE as u64, &page.0).unwrap();
    // The final partial page: written whole, then the file is trimmed.
    s.write(2 * PAGE_SIZE as u64, &page.0).unwrap();
    assert_eq!(
        std::fs::metadata(&p.0).unwrap().len(),
        2 * PAGE_SIZE as u64 + 100
    );
    page.0.fill(0);
    s.read(PAGE_SIZE as u64, &mut page.0).unwrap();
    assert!(page.0.iter().all(|&b| b == 0x5A));
    s.read(2 * PAGE_SIZE as u64, &mut page.0).unwrap();
    assert!(page.0[..100].iter().all(|&b| b == 0x5A));
    assert!(page.0[100..].iter().all(|&b| b == 0));

    // Misaligned buffers are refused.
    let mut big = Box::new([AlignedPage([0; PAGE_SIZE]), AlignedPage([0; PAGE_SIZE])]);
    // SAFETY: the two pages are contiguous (an array of a repr(C) type
    // whose size equals its alignment), so this is a valid byte view.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(big.as_mut_ptr().cast::<u8>(), 2 * PAGE_SIZE) };
    assert_eq!(
        s.read(0, &mut bytes[1..PAGE_SIZE + 1]),
        Err(StoreError(libc::EINVAL))
    );
    assert_eq!(
        s.write(0, &bytes[8..PAGE_SIZE + 8]),
        Err(StoreError(libc::EINVAL))
    );
}

/// A file on tmpfs: its pages can be read in place, through the store's
/// view, and `read_to_fd` copies from there; elsewhere (or with
/// `O_DIRECT`) there is no view.
#[test]
fn tmpfs_file_is_read_in_place() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let path = shm.join(format!("uffd-pager-filestore-view-{}", std::process::id()));
    let data: Vec<u8> = (0..3 * PAGE_SIZE - 5).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let s = FileStore::from_file(File::open(&path).unwrap(), false).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(s.synchronous());
    let at = s.page_in_memory(PAGE_SIZE as u64).unwrap();
    // SAFETY: the view maps the whole (rounded-up) file for `s`'s life.
    let view = unsafe { std::slice::from_raw_parts(at as *const u8, PAGE_SIZE) };
    assert_eq!(view, &data[PAGE_SIZE..2 * PAGE_SIZE]);
    assert_eq!(s.page_in_memory(3 * PAGE_SIZE as u64), None);
    // Two pages, the last one partial: zeros past the end of file.
    let m = crate::sys::mem::Memfd::new("filestore-view-test", 2 * PAGE_SIZE).unwrap();
    s.read_to_fd(PAGE_SIZE as u64, 2 * PAGE_SIZE, m.as_fd(), 0)
        .unwrap();
    let mut out = vec![1u8; 2 * PAGE_SIZE];
    // SAFETY: pread into a live buffer from our memfd.
    let n = unsafe { libc::pread(m.fd(), out.as_mut_ptr().cast(), out.len(), 0) };
    assert_eq!(n, out.len() as isize);
    assert_eq!(&out[..2 * PAGE_SIZE - 5], &data[PAGE_SIZE..]);
    assert!(out[2 * PAGE_SIZE - 5..].iter().all(|&b| b == 0));

    // A file on disk has no view.
    let p = TempPath::new("noview");
    std::fs::write(&p.0, &data).unwrap();
    let s = FileStore::from_file(File::open(&p.0).unwrap(), false).unwrap();
    if !s.synchronous() {
        assert_eq!(s.page_in_memory(0), None);
    }
}

#[test]
fn two_stores_over_one_file_share_an_identity() {
    let (a, b) = (TempPath::new("id-a"), TempPath::new("id-b"));
    let opts = FileStoreOptions {
        create_len: Some(PAGE_SIZE as u64),
        ..FileStoreOptions::default()
    };
    let s1 = FileStore::open(&a.0, &opts).unwrap();
    let s2 = FileStore::open(&a.0, &opts).unwrap();
    let other = FileStore::open(&b.0, &opts).unwrap();
    assert!(s1.identity().is_some());
    assert_eq!(s1.identity(), s2.identity());
    assert_ne!(s1.identity(), other.identity());
}

/// A store opened `O_DIRECT` for writing in a thread with a descriptor
/// table of its own (`unshare(CLONE_FILES)`): its plain descriptor for a
/// partial last page is its own file opened again. Opened through
/// `/proc/self/fd` (the process's first thread's table), it was whatever
/// file that table held at the same number, and the page went there.
#[test]
fn direct_tail_in_a_thread_with_its_own_descriptor_table() {
    let (a, b) = (TempPath::new("own-table-a"), TempPath::new("own-table-b"));
    std::fs::write(&a.0, vec![1u8; PAGE_SIZE + 100]).unwrap();
    std::fs::write(&b.0, vec![2u8; PAGE_SIZE + 100]).unwrap();
    // B at number `m` in the process's first table.
    let held_b = File::open(&b.0).unwrap();
    let m = held_b.as_raw_fd();
    let path = a.0.clone();
    let wrote = std::thread::spawn(move || {
        // SAFETY: gives this thread a copy of the table; no descriptor of
        // anyone else's is touched.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_FILES) }, 0);
        // SAFETY: `m` in this thread's own copy of the table.
        assert_eq!(unsafe { libc::close(m) }, 0);
        // Every lower number taken, so the store's own open gets `m`.
        let mut lower = Vec::new();
        loop {
            let f = File::open("/dev/null").unwrap();
            if f.as_raw_fd() == m {
                break;
            }
            lower.push(f);
        }
        let opts = FileStoreOptions {
            writable: true,
            direct: true,
            ..Default::default()
        };
        let s = match FileStore::open(&path, &opts) {
            Ok(s) => s,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return false,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(s.file().as_raw_fd(), m);
        let page = AlignedPage([7u8; PAGE_SIZE]);
        s.write(PAGE_SIZE as u64, &page.0).unwrap();
        true
    })
    .join()
    .unwrap();
    if !wrote {
        eprintln!(
            "skipping: O_DIRECT unsupported in {:?}",
            std::env::temp_dir()
        );
        return;
    }
    assert!(
        std::fs::read(&b.0).unwrap().iter().all(|&x| x == 2),
        "another file took the store's page"
    );
    let got = std::fs::read(&a.0).unwrap();
    assert!(
        got[PAGE_SIZE..].iter().all(|&x| x == 7),
        "the page missed its file"
    );
    drop(held_b);
}
