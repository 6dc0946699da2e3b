//! A store of zero pages: every read yields zeros, writes are refused.

use super::{Store, StoreError};
use crate::sys::PAGE_SIZE;

/// Rounds `len` up to a whole number of pages (saturating at the largest
/// page multiple).
pub(super) fn round_up_to_page(len: u64) -> u64 {
    let page = PAGE_SIZE as u64;
    match len.checked_add(page - 1) {
        Some(v) => v & !(page - 1),
        None => !(page - 1),
    }
}

/// Whether `[offset, offset + n)` lies within `len` bytes.
#[inline]
pub(super) fn in_bounds(offset: u64, n: usize, len: u64) -> bool {
    match offset.checked_add(n as u64) {
        Some(end) => end <= len,
        None => false,
    }
}

/// A read-only store whose every page is zero.
///
/// ```
/// use uffd_pager::store::{Store, ZeroStore};
///
/// let z = ZeroStore::new(1 << 20);
/// let mut page = [1; uffd_pager::PAGE_SIZE];
/// z.read(0, &mut page)?;
/// assert!(page.iter().all(|&b| b == 0) && !z.writable());
/// # Ok::<(), uffd_pager::store::StoreError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroStore {
    len: u64,
}

impl ZeroStore {
    /// A zero store of `len_bytes`, rounded up to whole pages.
    ///
    /// Example: [`ZeroStore`](crate::store::ZeroStore).
    pub fn new(len_bytes: u64) -> Self {
        ZeroStore {
            len: round_up_to_page(len_bytes),
        }
    }
}

impl Store for ZeroStore {
    fn len(&self) -> u64 {
        self.len
    }

    /// Fills `buf` with zeros (a memset). Async-signal-safe.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if !in_bounds(offset, buf.len(), self.len) {
            return Err(StoreError(libc::EINVAL));
        }
        buf.fill(0);
        Ok(())
    }

    fn write(&self, _offset: u64, _buf: &[u8]) -> Result<(), StoreError> {
        Err(StoreError(libc::EROFS))
    }

    fn writable(&self) -> bool {
        false
    }

    /// Plain syscalls and copies: async-signal-safe.
    fn signal_safe(&self) -> bool {
        true
    }

    fn synchronous(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "zero"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_zeros_and_refuses_writes() {
        let s = ZeroStore::new(3 * PAGE_SIZE as u64);
        assert_eq!(s.len(), 3 * PAGE_SIZE as u64);
        assert!(!s.is_empty());
        let mut buf = vec![0xAAu8; PAGE_SIZE];
        s.read(PAGE_SIZE as u64, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(s.write(0, &buf), Err(StoreError(libc::EROFS)));
        assert!(!s.writable());
        assert_eq!(s.name(), "zero");
        assert!(s.latency_report().is_none());
    }

    #[test]
    fn length_rounds_up_and_bounds_are_checked() {
        assert_eq!(ZeroStore::new(0).len(), 0);
        assert!(ZeroStore::new(0).is_empty());
        assert_eq!(ZeroStore::new(1).len(), PAGE_SIZE as u64);
        assert_eq!(
            ZeroStore::new(PAGE_SIZE as u64 + 1).len(),
            2 * PAGE_SIZE as u64
        );
        let s = ZeroStore::new(PAGE_SIZE as u64);
        let mut buf = vec![0u8; PAGE_SIZE];
        assert_eq!(
            s.read(PAGE_SIZE as u64, &mut buf),
            Err(StoreError(libc::EINVAL))
        );
        assert_eq!(s.read(u64::MAX, &mut buf), Err(StoreError(libc::EINVAL)));
    }

    #[test]
    fn round_up_saturates() {
        assert_eq!(round_up_to_page(u64::MAX), !(PAGE_SIZE as u64 - 1));
        assert!(in_bounds(0, 0, 0));
        assert!(!in_bounds(u64::MAX, 1, u64::MAX));
    }
}
