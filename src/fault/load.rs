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
    /// No memory to read it into: the hugetlb pool is empty (`ENOSPC`
    /// from taking a 2 MiB page, `ENOMEM`). Not the page's fault: it stays
    /// absent (not poisoned), and the access gets SIGBUS this time.
    NoMemory,
}

/// Reads page `i` of `obj` from its store into the cache, retrying up to the
/// configured number of attempts. The caller holds the page lock.
pub(super) fn load(mm: &Mm, obj: &Object, i: usize) -> LoadResult {
    let mut no_memory = false;
    let r = read_with_retries(mm, || {
        // SAFETY: the caller holds page `i`'s lock and the page is neither
        // cached nor installed.
        let r = unsafe { obj.fill(i, &mm.io) };
        no_memory = matches!(
            r,
            Err(crate::store::StoreError(libc::ENOSPC | libc::ENOMEM))
        );
        r
    });
    match r {
        LoadResult::Failed if no_memory => LoadResult::NoMemory,
        r => r,
    }
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
