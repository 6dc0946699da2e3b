//! Where a store call runs: a read or write in the calling thread for a
//! signal-safe store (a panic in it caught), else through the I/O workers
//! ([`Io`]); `page_in_memory` and `discard` always in the calling thread.

use super::Io;
use crate::store::{Store, StoreError};
use crate::sys::huge::HUGE_PAGE_SIZE;
use crate::sys::PAGE_SIZE;
use std::sync::Arc;

/// One page (of either size) through [`Store::read`], a batch through
/// [`Store::read_many`].
pub(super) fn read_in_place(store: &dyn Store, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
    if buf.len() <= PAGE_SIZE || buf.len() == HUGE_PAGE_SIZE {
        store.read(off, buf)
    } else {
        store.read_many(off, buf)
    }
}

/// One page through [`Store::write`], a batch through [`Store::write_many`].
pub(super) fn write_in_place(store: &dyn Store, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
    match pages {
        [(off, page)] => store.write(*off, page),
        _ => store.write_many(pages),
    }
}

/// Reads `buf.len()` bytes (whole pages: at most [`MAX_BATCH`](crate::store::MAX_BATCH) of 4 KiB,
/// or one of 2 MiB, each in one [`Store::read`]) at `off` from `store`: in
/// the calling thread if it is signal-safe, else on a worker within the
/// timeout. Async-signal-safe.
#[inline]
pub fn read(io: &Io, store: &Arc<dyn Store>, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
    if store.signal_safe() {
        caught(|| read_in_place(&**store, off, buf))
    } else {
        io.read(store, off, buf)
    }
}

/// Writes a batch of whole pages (or one 2 MiB page) to `store`, as
/// [`read`]. Async-signal-safe.
#[inline]
pub fn write(io: &Io, store: &Arc<dyn Store>, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
    if store.signal_safe() {
        caught(|| write_in_place(&**store, pages))
    } else if pages.len() > 1 && pages[0].1.len() == HUGE_PAGE_SIZE {
        // 2 MiB pages (a write-back batch): one request each.
        pages
            .iter()
            .try_for_each(|p| io.write(store, std::slice::from_ref(p)))
    } else {
        io.write(store, pages)
    }
}

/// Runs `call`, a signal-safe store's, in the calling thread; a panic in
/// it fails the call (`EIO`), as on a worker. Unwound past, it left the
/// pages the caller holds locked for the call (a readahead thread's run,
/// a handler thread's fault), and every later fault on them waited for
/// ever. (In the SIGBUS handler the panic runs the panic hook there, which
/// is not async-signal-safe; an unwind out of the handler would abort the
/// process instead.) No cost where nothing panics.
#[inline]
pub(crate) fn caught(call: impl FnOnce() -> Result<(), StoreError>) -> Result<(), StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
        .unwrap_or(Err(StoreError(libc::EIO)))
}

/// [`Store::page_in_memory`], `None` if the store panics (see [`caught`]).
#[inline]
pub(crate) fn page_in_memory(store: &dyn Store, off: u64) -> Option<usize> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.page_in_memory(off)))
        .ok()
        .flatten()
}

/// [`Store::discard`], a panic in it ignored (see [`caught`]): the copy
/// is only never read again.
#[inline]
pub(crate) fn discard(store: &dyn Store, off: u64, len: u64) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.discard(off, len)));
}
