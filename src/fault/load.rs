//! Reading a page from the store into the page cache.

use crate::address_space::Mm;
use crate::object::Object;
use crate::stats::Counter::*;

/// How a load ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LoadResult {
    /// The page's contents are in the cache.
    Ok,
    /// Every read attempt failed.
    Failed,
}

/// Reads page `i` of `obj` from its store into the cache, retrying up to the
/// configured number of attempts. The caller holds the page lock.
pub(super) fn load(mm: &Mm, obj: &Object, i: usize) -> LoadResult {
    // SAFETY: the caller holds page `i`'s lock and the page is neither
    // cached nor installed.
    read_with_retries(mm, || unsafe { obj.fill(i, &mm.io) })
}

/// Runs `read` up to the configured number of attempts, counting reads and
/// errors.
pub(super) fn read_with_retries(
    mm: &Mm,
    mut read: impl FnMut() -> Result<(), crate::store::StoreError>,
) -> LoadResult {
    for _ in 0..mm.config.read_attempts.max(1) {
        match read() {
            Ok(()) => {
                mm.counters.inc(PGREAD);
                return LoadResult::Ok;
            }
            Err(_) => mm.counters.inc(IO_ERROR),
        }
    }
    LoadResult::Failed
}
