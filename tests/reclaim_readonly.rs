//! A read-only anonymous region under a budget: its pages cannot change, so
//! reclaim drops them (`CLEAN`) without writing anything back, and a fault
//! reads them from the store again. Every page must read back intact. Once
//! the region is made writable, its pages are no longer clean: a write
//! must survive eviction.

use std::io::Write;
use std::sync::Arc;
use uffd_pager::store::{FileStore, MemoryStore, Store, StoreError};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager, Region};

const PAGE: usize = 4096;

/// Where the clean pages come from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A memory store: installs copy straight from its pages.
    Memory,
    /// A file on tmpfs: installs copy straight from the store's view.
    TmpfsFile,
    /// A store that offers an address the kernel cannot read: every
    /// install must fall back to reading the page.
    Unreadable,
}

/// A memory store whose pages claim to sit at an inaccessible address.
struct UnreadableView {
    inner: MemoryStore,
    guard: usize,
}

impl Store for UnreadableView {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(offset, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn synchronous(&self) -> bool {
        true
    }
    fn page_in_memory(&self, _offset: u64) -> Option<usize> {
        Some(self.guard)
    }
    fn name(&self) -> &'static str {
        "unreadable-view"
    }
}

fn store_over(source: Source, data: &[u8]) -> Arc<dyn Store> {
    match source {
        Source::Memory => Arc::new(MemoryStore::from_bytes(data).unwrap()),
        Source::TmpfsFile => {
            let path = std::path::Path::new("/dev/shm").join(format!(
                "uffd-pager-readonly-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::File::create(&path)
                .unwrap()
                .write_all(data)
                .unwrap();
            let file = std::fs::File::open(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            let store = FileStore::from_file(file, false).unwrap();
            assert!(store.synchronous() && store.page_in_memory(0).is_some());
            Arc::new(store)
        }
        Source::Unreadable => {
            // SAFETY: a fresh inaccessible page that is never unmapped (the
            // test process exits); only the kernel is ever given it.
            let guard = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    PAGE,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(guard, libc::MAP_FAILED);
            Arc::new(UnreadableView {
                inner: MemoryStore::from_bytes(data).unwrap(),
                guard: guard as usize,
            })
        }
    }
}

/// A pager with a 32-page budget, and `data` mapped read-only as an
/// anonymous region over a store of `source`.
fn read_only_region(delivery: Delivery, source: Source, data: &[u8]) -> (Pager, Region) {
    let pager = Pager::builder()
        .delivery(delivery)
        .budget_pages(32)
        .build()
        .unwrap();
    let store = store_over(source, data);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe {
        pager.map_store(
            store,
            data.len(),
            &MapOptions {
                kind: Some(InstallKind::Anonymous),
                writable: false,
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    (pager, r)
}

fn run(delivery: Delivery, source: Source) {
    let pages = 256;
    let data: Vec<u8> = (0..pages * PAGE)
        .map(|i| (i / PAGE) as u8 ^ (i as u8))
        .collect();
    let (pager, r) = read_only_region(delivery, source, &data);
    for round in 0..2 {
        for p in 0..pages {
            assert_eq!(
                &r.as_slice()[p * PAGE..(p + 1) * PAGE],
                &data[p * PAGE..(p + 1) * PAGE],
                "{delivery} {source:?} round {round} page {p}"
            );
        }
    }
    let s = pager.stats();
    assert!(s.get(Counter::PGSTEAL) > 0, "{s}");
    assert_eq!(
        s.get(Counter::WRITEBACK),
        0,
        "clean pages written back: {s}"
    );
    assert!(s.peak_resident_pages <= 32 + 16, "{s}");
}

fn made_writable(delivery: Delivery) {
    let pages = 256;
    let data: Vec<u8> = (0..pages * PAGE).map(|i| (i / PAGE) as u8 ^ 0x5a).collect();
    let (pager, mut r) = read_only_region(delivery, Source::Memory, &data);
    // Installed read-only (clean), then made writable and written.
    let hot = 16;
    for p in 0..hot {
        assert_eq!(r.as_slice()[p * PAGE], data[p * PAGE]);
    }
    r.protect(true).unwrap();
    for p in 0..hot {
        r.as_mut_slice()[p * PAGE + 7] = 0xee;
    }
    // Everything else, twice: the written pages are evicted meanwhile.
    for _ in 0..2 {
        for p in hot..pages {
            assert_eq!(r.as_slice()[p * PAGE + 1], data[p * PAGE + 1]);
        }
    }
    assert!(pager.stats().get(Counter::WRITEBACK) > 0);
    for p in 0..hot {
        assert_eq!(
            r.as_slice()[p * PAGE + 7],
            0xee,
            "{delivery} page {p} lost its write"
        );
        assert_eq!(
            r.as_slice()[p * PAGE],
            data[p * PAGE],
            "{delivery} page {p}"
        );
    }
}

#[test]
fn writes_after_protect_survive_eviction() {
    made_writable(Delivery::InThread);
    made_writable(Delivery::Threads {
        threads: 1,
        spin_us: 0,
    });
}

const SOURCES: [Source; 3] = [Source::Memory, Source::TmpfsFile, Source::Unreadable];

#[test]
fn read_only_anonymous_region_is_evicted_and_reread_in_thread() {
    for source in SOURCES {
        run(Delivery::InThread, source);
    }
}

#[test]
fn read_only_anonymous_region_is_evicted_and_reread_handler_threads() {
    for source in SOURCES {
        run(
            Delivery::Threads {
                threads: 1,
                spin_us: 0,
            },
            source,
        );
    }
}

/// Pages read back from a swap file (a store that waits on a device, so
/// they come through the cache area) into an anonymous region made
/// read-only: each is copied in (a move takes no write protection with
/// it), and the cache area's copy goes at once. It went only for pages
/// clean against their source, which a page read back from swap is not:
/// every such resident page was held twice, and the budget bounded only
/// half the memory (found by review).
#[test]
fn swapped_pages_read_into_a_read_only_region_are_held_once() {
    const PAGES: usize = 1024;
    let p = Pager::builder()
        .budget_pages(256)
        .kswapd(false)
        .swap_dir(std::env::temp_dir())
        .build()
        .unwrap();
    let mut r = p.map_anonymous(PAGES * PAGE).unwrap();
    for (k, page) in r.as_mut_slice().chunks_mut(PAGE).enumerate() {
        page.fill(k as u8 | 1);
    }
    p.reclaim_pages(PAGES as u64);
    r.protect(false).unwrap();
    for (k, page) in r.as_slice().chunks(PAGE).enumerate() {
        assert!(page.iter().all(|&b| b == k as u8 | 1), "page {k}");
    }
    let mem = p.memory_use();
    assert!(
        mem.cache_area_bytes <= (64 * PAGE) as u64,
        "{} KiB in the cache area beside {} resident pages",
        mem.cache_area_bytes / 1024,
        mem.resident_pages
    );
}
