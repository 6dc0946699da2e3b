//! A store that stops taking writes after pages of a shared region were
//! dirtied (a remote that went read-only, a file system remounted `ro`):
//! its `writable()` now says false and its `write` fails. The dirty
//! pages are owed to it all the same: a flush reports the failure and
//! reclaim keeps them, and once the store takes writes again they reach
//! it. Before, the engine asked `writable()` each time, took the pages
//! for clean ones of a read-only store, flushed "successfully" and
//! dropped them on eviction.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use uffd_pager::store::{MemoryStore, Store, StoreError};
use uffd_pager::{MapOptions, Pager};
use util::PAGE;

/// A memory store that takes writes while `writes` is set.
struct Switchable {
    bytes: MemoryStore,
    writes: AtomicBool,
}

impl Store for Switchable {
    fn len(&self) -> u64 {
        self.bytes.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.bytes.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        match self.writes.load(SeqCst) {
            true => self.bytes.write(offset, buf),
            false => Err(StoreError(libc::EROFS)),
        }
    }
    fn writable(&self) -> bool {
        self.writes.load(SeqCst)
    }
    fn name(&self) -> &'static str {
        "switchable"
    }
}

/// Whether every byte of `s` is `b`.
fn holds(s: &Switchable, b: u8, pages: usize) -> bool {
    let mut buf = vec![0; pages * PAGE];
    s.bytes.read(0, &mut buf).unwrap();
    buf.iter().all(|&x| x == b)
}

fn setup(pages: usize) -> (Pager, Arc<Switchable>, uffd_pager::Region) {
    let pager = Pager::builder()
        .budget_pages(64)
        .kswapd(false)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let store = Arc::new(Switchable {
        bytes: MemoryStore::new((pages * PAGE) as u64).unwrap(),
        writes: AtomicBool::new(true),
    });
    let opts = MapOptions {
        writable: true,
        ..MapOptions::default()
    };
    // SAFETY: the store changes only through the region.
    let r =
        unsafe { pager.map_store(store.clone() as Arc<dyn Store>, pages * PAGE, &opts) }.unwrap();
    (pager, store, r)
}

#[test]
fn a_flush_to_a_store_gone_read_only_fails_and_keeps_the_pages() {
    let (_pager, store, mut r) = setup(4);
    r.as_mut_slice().fill(7);
    store.writes.store(false, SeqCst);
    assert!(
        r.flush().is_err(),
        "a flush whose pages the store refused said Ok"
    );
    store.writes.store(true, SeqCst);
    r.flush().unwrap();
    assert!(holds(&store, 7, 4));
}

#[test]
fn reclaim_keeps_dirty_pages_of_a_store_gone_read_only() {
    let (pager, store, mut r) = setup(4);
    r.as_mut_slice().fill(7);
    store.writes.store(false, SeqCst);
    pager.reclaim_pages(4);
    assert!(
        r.as_slice().iter().all(|&b| b == 7),
        "dirty pages were dropped by reclaim: {}",
        pager.stats()
    );
    store.writes.store(true, SeqCst);
    r.flush().unwrap();
    assert!(holds(&store, 7, 4));
}
