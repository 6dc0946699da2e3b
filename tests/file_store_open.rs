//! `FileStore::open` and `FileStore::from_file` over what is not a
//! regular file, or a descriptor that cannot read: a typed error at once.
//! Before, the open of a FIFO waited for a writer for ever, and a
//! directory, an `O_WRONLY` or an `O_PATH` descriptor made a store whose
//! every read failed (each touch of a mapping a SIGBUS).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;
use uffd_pager::store::{FileStore, FileStoreOptions};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uffd-pager-open-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn errno(r: std::io::Result<FileStore>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let d = scratch("fifo");
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let f = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(errno(FileStore::open(&f, &FileStoreOptions::default())));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    if got.is_err() {
        // Let the open go, so the test process can end.
        let _ = OpenOptions::new().write(true).open(&fifo);
    }
    assert_eq!(got, Ok(Some(libc::ENODEV)), "the open of a FIFO");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_directory_is_refused() {
    let d = scratch("dir");
    let opts = FileStoreOptions::default();
    assert_eq!(errno(FileStore::open(&d, &opts)), Some(libc::EISDIR));
    let dir = File::open(&d).unwrap();
    assert_eq!(errno(FileStore::from_file(dir, false)), Some(libc::EISDIR));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_descriptor_that_cannot_read_is_refused() {
    let d = scratch("fd");
    let path = d.join("data");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let write_only = OpenOptions::new().write(true).open(&path).unwrap();
    assert_eq!(
        errno(FileStore::from_file(write_only, true)),
        Some(libc::EBADF)
    );
    let o_path = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(&path)
        .unwrap();
    assert_eq!(
        errno(FileStore::from_file(o_path, false)),
        Some(libc::EBADF)
    );
    // A readable one goes on as before.
    let s = FileStore::from_file(File::open(&path).unwrap(), false).unwrap();
    let mut page = [0u8; 4096];
    uffd_pager::store::Store::read(&s, 0, &mut page).unwrap();
    assert!(page.iter().all(|&b| b == 1));
    std::fs::remove_dir_all(&d).unwrap();
}
