//! Faults taken inside system calls: served by handler threads (the
//! descriptor is not user-mode-only when we are privileged), refused with
//! EFAULT under in-thread delivery until the buffer is prefaulted; and a
//! page whose store read fails for good is EFAULT to syscalls while the
//! rest of the region keeps working.

#[path = "engine_util.rs"]
mod util;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore, Store};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager, Region};
use util::*;

const PAGES: usize = 16;
const LEN: usize = PAGES * PAGE;

/// A region of `PAGES` pages: over a memory store with `pattern(seed)`, or
/// `map_anonymous` (zeros) when `kind` is `None`. Returns it with its
/// initial contents.
fn region(p: &Pager, kind: Option<InstallKind>, seed: u64) -> (Region, Vec<u8>) {
    match kind {
        None => (p.map_anonymous(LEN).unwrap(), vec![0; LEN]),
        Some(kind) => {
            let data = pattern_vec(seed, LEN);
            let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let r = unsafe {
                p.map_store(
                    store,
                    LEN,
                    &MapOptions {
                        kind: Some(kind),
                        ..MapOptions::default()
                    },
                )
            }
            .unwrap();
            (r, data)
        }
    }
}

const KINDS: [Option<InstallKind>; 3] = [
    Some(InstallKind::Anonymous),
    Some(InstallKind::Shared),
    None,
];

/// `read(2)` of `len` bytes from the start of `file` into `region + off`.
fn sys_read(file: &std::fs::File, region: &Region, off: usize, len: usize) -> isize {
    assert!(off + len <= region.len());
    // SAFETY: the destination lies inside the region's mapping.
    unsafe { libc::pread(file.as_raw_fd(), region.as_ptr().add(off).cast(), len, 0) }
}

/// `write(2)` of `len` bytes from `region + off` to the start of `file`.
fn sys_write(file: &std::fs::File, region: &Region, off: usize, len: usize) -> isize {
    assert!(off + len <= region.len());
    // SAFETY: the source lies inside the region's mapping.
    unsafe { libc::pwrite(file.as_raw_fd(), region.as_ptr().add(off).cast(), len, 0) }
}

fn open_rw(f: &TempFile) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(f.path())
        .unwrap()
}

#[test]
fn syscall_read_into_absent_pages_threads() {
    let p = pager(THREADS);
    for (n, kind) in KINDS.into_iter().enumerate() {
        let ctx = format!("threads {kind:?}");
        let (region, mut want) = region(&p, kind, 30 + n as u64);
        let src = pattern_vec(99, 3 * PAGE);
        let f = TempFile::with_contents("sysread", &src);
        let file = std::fs::File::open(f.path()).unwrap();
        // Three absent pages, the kernel's copy faults on each.
        let got = sys_read(&file, &region, 5 * PAGE, 3 * PAGE);
        assert_eq!(got, 3 * PAGE as isize, "{ctx}: read: errno {}", errno());
        want[5 * PAGE..8 * PAGE].copy_from_slice(&src);
        // Unaligned, straddling an absent page boundary.
        let got = sys_read(&file, &region, 10 * PAGE + 100, PAGE);
        assert_eq!(
            got,
            PAGE as isize,
            "{ctx}: unaligned read: errno {}",
            errno()
        );
        want[10 * PAGE + 100..11 * PAGE + 100].copy_from_slice(&src[..PAGE]);
        assert_bytes(region.as_slice(), &want, &ctx);
    }
    let s = p.stats();
    assert!(s.get(Counter::PGFAULT) >= 3 * 5, "{s}");
}

#[test]
fn syscall_write_from_absent_pages_threads() {
    let p = pager(THREADS);
    for (n, kind) in KINDS.into_iter().enumerate() {
        let ctx = format!("threads {kind:?}");
        let (region, want) = region(&p, kind, 40 + n as u64);
        let f = TempFile::with_contents("syswrite", &[]);
        let file = open_rw(&f);
        // The kernel reads two absent pages of the region.
        let got = sys_write(&file, &region, 2 * PAGE, 2 * PAGE);
        assert_eq!(got, 2 * PAGE as isize, "{ctx}: write: errno {}", errno());
        assert_bytes(&f.read(), &want[2 * PAGE..4 * PAGE], &ctx);
        assert_bytes(region.as_slice(), &want, &ctx);
    }
}

/// In-thread delivery: a syscall touching absent pages fails with EFAULT
/// (in both directions); after `prefault` it succeeds. `kinds` selects the
/// regions.
fn in_thread_efault_until_prefault(kinds: &[Option<InstallKind>]) {
    let p = pager(Delivery::InThread);
    for (n, &kind) in kinds.iter().enumerate() {
        let ctx = format!("in-thread {kind:?}");
        let (region, mut want) = region(&p, kind, 50 + n as u64);
        let src = pattern_vec(98, 2 * PAGE);
        let f = TempFile::with_contents("efault", &src);
        let file = open_rw(&f);

        // Into absent pages: the fault inside the syscall is not delivered.
        let got = sys_read(&file, &region, 6 * PAGE, 2 * PAGE);
        assert_eq!(got, -1, "{ctx}: read into absent pages succeeded");
        assert_eq!(errno(), libc::EFAULT, "{ctx}");
        let got = sys_write(&file, &region, 12 * PAGE, PAGE);
        assert_eq!(got, -1, "{ctx}: write from absent page succeeded");
        assert_eq!(errno(), libc::EFAULT, "{ctx}");

        // Prefaulted, the same calls succeed.
        region.prefault(12 * PAGE, PAGE).unwrap();
        let got = sys_write(&file, &region, 12 * PAGE, PAGE);
        assert_eq!(got, PAGE as isize, "{ctx}: write: errno {}", errno());
        let mut file_now = src.clone();
        file_now[..PAGE].copy_from_slice(&want[12 * PAGE..13 * PAGE]);
        assert_bytes(&f.read(), &file_now, &format!("{ctx}: file"));
        region.prefault(6 * PAGE, 2 * PAGE).unwrap();
        let got = sys_read(&file, &region, 6 * PAGE, 2 * PAGE);
        assert_eq!(got, 2 * PAGE as isize, "{ctx}: read: errno {}", errno());
        want[6 * PAGE..8 * PAGE].copy_from_slice(&file_now);

        // The failed calls left the region's data alone.
        assert_bytes(region.as_slice(), &want, &ctx);
    }
}

#[test]
fn syscall_in_thread_efault_until_prefault() {
    in_thread_efault_until_prefault(&[Some(InstallKind::Anonymous), None]);
}

/// Kernel reads from (write(2) out of) a prefaulted shared region work.
#[test]
fn syscall_in_thread_shared_write_from_prefaulted() {
    let p = pager(Delivery::InThread);
    let (region, want) = region(&p, Some(InstallKind::Shared), 55);
    let f = TempFile::with_contents("efault-shared", &[]);
    let file = open_rw(&f);
    let got = sys_write(&file, &region, 3 * PAGE, 2 * PAGE);
    assert_eq!(got, -1, "write from absent pages succeeded");
    assert_eq!(errno(), libc::EFAULT);
    region.prefault(3 * PAGE, 2 * PAGE).unwrap();
    let got = sys_write(&file, &region, 3 * PAGE, 2 * PAGE);
    assert_eq!(got, 2 * PAGE as isize, "errno {}", errno());
    assert_bytes(&f.read(), &want[3 * PAGE..5 * PAGE], "file");
}

#[test]
fn syscall_in_thread_shared_read_into_prefaulted() {
    in_thread_efault_until_prefault(&[Some(InstallKind::Shared)]);
}

/// Handler threads: read(2) into pages that are present but clean (a
/// shared region's read faults install them write-protected for dirty
/// tracking) works, and the kernel's writes count as writes: flush
/// writes them back to the store.
#[test]
fn syscall_threads_read_into_present_clean_pages_is_written_back() {
    let p = pager(THREADS);
    let data = pattern_vec(70, LEN);
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe {
        p.map_store(
            store.clone(),
            LEN,
            &MapOptions {
                kind: Some(InstallKind::Shared),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    // Every page present and clean.
    assert_bytes(region.as_slice(), &data, "read");
    let src = pattern_vec(71, 2 * PAGE);
    let f = TempFile::with_contents("clean", &src);
    let file = std::fs::File::open(f.path()).unwrap();
    let got = sys_read(&file, &region, 9 * PAGE, 2 * PAGE);
    assert_eq!(got, 2 * PAGE as isize, "errno {}", errno());
    let mut want = data.clone();
    want[9 * PAGE..11 * PAGE].copy_from_slice(&src);
    assert_bytes(region.as_slice(), &want, "region");
    region.flush().unwrap();
    assert_bytes(&store.snapshot(), &want, "store after flush");
    // Written again after the flush (which write-protects again).
    let got = sys_read(&file, &region, 2 * PAGE, PAGE);
    assert_eq!(got, PAGE as isize, "errno {}", errno());
    want[2 * PAGE..3 * PAGE].copy_from_slice(&src[..PAGE]);
    region.unmap().unwrap();
    assert_bytes(&store.snapshot(), &want, "store after unmap");
}

/// Handler threads: a page whose every store read fails is EFAULT to a
/// syscall, other pages of the region keep working, and the failure is
/// counted (IO_ERROR per try, POISONED once).
#[test]
fn syscall_poisoned_page_is_efault_threads() {
    for kind in [InstallKind::Anonymous, InstallKind::Shared] {
        let ctx = format!("threads {kind}");
        let p = pager(THREADS);
        let data = pattern_vec(60, LEN);
        let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        let sim = Arc::new(SimulatedStore::new(mem, LatencyModel::None, 0, 1));
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let region = unsafe {
            p.map_store(
                sim.clone(),
                LEN,
                &MapOptions {
                    kind: Some(kind),
                    ..MapOptions::default()
                },
            )
        }
        .unwrap();
        let src = pattern_vec(97, PAGE);
        let f = TempFile::with_contents("poison", &src);
        let file = std::fs::File::open(f.path()).unwrap();

        // Page 3 fails for good.
        sim.fail_next_reads(u32::MAX);
        let got = sys_read(&file, &region, 3 * PAGE, PAGE);
        assert_eq!(got, -1, "{ctx}: read into a failing page succeeded");
        assert_eq!(errno(), libc::EFAULT, "{ctx}");
        sim.fail_next_reads(0);

        // Other pages work, by syscall and by plain access.
        let got = sys_read(&file, &region, 4 * PAGE, PAGE);
        assert_eq!(got, PAGE as isize, "{ctx}: errno {}", errno());
        let mut want = data.clone();
        want[4 * PAGE..5 * PAGE].copy_from_slice(&src);
        let s = region.as_slice();
        for pg in (0..PAGES).filter(|&pg| pg != 3) {
            let r = pg * PAGE..(pg + 1) * PAGE;
            assert_bytes(&s[r.clone()], &want[r], &format!("{ctx}: page {pg}"));
        }

        // The poisoned page stays poisoned, even though the store would now
        // succeed: still EFAULT, no new store read.
        let reads = sim.reads();
        let got = sys_read(&file, &region, 3 * PAGE, PAGE);
        assert_eq!(got, -1, "{ctx}: poisoned page readable again");
        assert_eq!(errno(), libc::EFAULT, "{ctx}");
        assert_eq!(sim.reads(), reads, "{ctx}: poisoned page re-read");

        let st = p.stats();
        assert!(st.get(Counter::IO_ERROR) >= 1, "{ctx}: {st}");
        assert_eq!(st.get(Counter::POISONED), 1, "{ctx}: {st}");
        assert_eq!(sim.reads(), (PAGES - 1) as u64, "{ctx}: store reads");
    }
}
