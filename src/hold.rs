//! Address holds: a fixed range kept free of other mappings until a map
//! at that address takes it.
//!
//! A map at a fixed address ([`MapOptions::fixed_addr`]) makes mappings of
//! its own before the region's: the memfd's alias of a shared region, the
//! state words of a large one, the pager's threads and rings when it
//! starts. The kernel puts each where it finds room first, and a range the
//! application has just unmapped is such a place, so the region's own
//! mapping then found its range taken. The map therefore holds its range
//! first, with an inaccessible mapping, and maps the region over the hold
//! (`MAP_FIXED` over a mapping it owns, never over anyone else's).
//!
//! A caller with work of its own to do before the map (the preload shim
//! opens the store and may start the pager) takes an [`AddressHold`] first;
//! the map of exactly that range then takes the hold over.
//!
//! [`MapOptions::fixed_addr`]: crate::MapOptions::fixed_addr

use crate::error::{Error, Result};
use crate::sys::mem::Mapping;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// The holds not yet taken over, by id: the range, and its mapping (`None`
/// while a map has it: given back if the map is refused). A handful at
/// most (one per map in progress), so a vector.
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

struct Held {
    id: u64,
    addr: usize,
    len: usize,
    m: Option<Mapping>,
}
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn held() -> std::sync::MutexGuard<'static, Vec<Held>> {
    // (A panic while holding it leaves the vector whole.)
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// An address range held for a map at a fixed address: an inaccessible
/// mapping there, so that no other mapping (not the engine's own) lands in
/// it meanwhile.
///
/// The next map whose [`MapOptions::fixed_addr`] and length are exactly
/// this range takes the hold over once its region is made (a map refused
/// before, for its arguments, its store, the machine's settings or pages
/// still owed to the store, leaves the hold as it was); from then on the
/// range is the map's, and a map that fails later leaves it unmapped. Dropped before that, the hold unmaps
/// the range. [`Region::remap_over`](crate::Region::remap_over) refuses a
/// held range. A map at a fixed address holds its range by itself;
/// an `AddressHold` is for a caller that makes mappings of its own, or
/// starts the pager, between choosing the address and mapping there.
///
/// Cost: one `mmap` and one `munmap` (or the map's `MAP_FIXED`).
///
/// ```
/// use uffd_pager::{AddressHold, MapOptions, Pager, PAGE_SIZE};
///
/// let len = 4 * PAGE_SIZE;
/// let hold = AddressHold::new(0x3000_0000_0000, len)?;
/// let addr = hold.addr();
/// let pager = Pager::builder().build()?; // (its own mappings avoid the hold)
/// let opts = MapOptions { fixed_addr: Some(addr), ..MapOptions::default() };
/// let region = pager.map_anonymous_with(len, &opts)?;
/// assert_eq!(region.as_ptr() as usize, addr);
/// drop(hold); // taken over: nothing to unmap
/// # Ok::<(), uffd_pager::Error>(())
/// ```
///
/// [`MapOptions::fixed_addr`]: crate::MapOptions::fixed_addr
#[derive(Debug)]
pub struct AddressHold {
    id: u64,
    addr: usize,
    len: usize,
}

impl AddressHold {
    /// Holds `[addr, addr + len)`, which must be free.
    ///
    /// # Errors
    /// [`Error::ZeroLength`]; [`Error::Unaligned`] for an address or
    /// length that is not a multiple of the page size;
    /// [`Error::Overlap`] if anything is mapped in the range; a
    /// [`Error::Config`] for a range whose end overflows the address
    /// (`addr + len` past `usize::MAX`); [`Error::Sys`] if the kernel
    /// refuses the mapping (`ENOMEM` for a range past the end of the
    /// user address space, 128 TiB on x86-64 with 4-level page tables).
    pub fn new(addr: usize, len: usize) -> Result<AddressHold> {
        let page = crate::sys::PAGE_SIZE;
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        for (what, value) in [("address", addr), ("length", len)] {
            if value % page != 0 {
                return Err(Error::Unaligned {
                    what,
                    value,
                    page_size: page,
                });
            }
        }
        let m = reserve(addr, len)?;
        let id = NEXT_ID.fetch_add(1, Relaxed);
        held().push(Held {
            id,
            addr,
            len,
            m: Some(m),
        });
        Ok(AddressHold { id, addr, len })
    }

    /// The range's start.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The range's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty: never (a hold is of one page at least).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for AddressHold {
    fn drop(&mut self) {
        let mut h = held();
        if let Some(i) = h.iter().position(|e| e.id == self.id) {
            // Not taken over: unmapped as it leaves the vector. (One a map
            // has now stays that map's: unmapped if the map is refused.)
            h.swap_remove(i);
        }
    }
}

/// A hold a map has taken: an [`AddressHold`]'s, given back to it if the
/// map is refused before [`Taken::into_mapping`] (dropped), or the map's
/// own, unmapped then.
#[derive(Debug)]
pub(crate) struct Taken {
    m: Option<Mapping>,
    /// The [`AddressHold`] it was taken from.
    id: Option<u64>,
}

impl Taken {
    /// The range, the map's from now on.
    pub(crate) fn into_mapping(mut self) -> Mapping {
        if let Some(id) = self.id {
            held().retain(|e| e.id != id);
        }
        self.m.take().expect("taken once")
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let (Some(m), Some(id)) = (self.m.take(), self.id) else {
            return;
        };
        // Back to its `AddressHold`, if that still lives (dropped
        // meanwhile, the range is unmapped here, as its drop would have).
        let mut h = held();
        if let Some(e) = h.iter_mut().find(|e| e.id == id) {
            e.m = Some(m);
        }
    }
}

/// The hold for a map of exactly `[addr, addr + len)`: an
/// [`AddressHold`]'s, taken over, or a new one.
pub(crate) fn take_or_hold(addr: usize, len: usize) -> Result<Taken> {
    {
        let mut h = held();
        if let Some(e) = h
            .iter_mut()
            .find(|e| e.m.is_some() && e.addr == addr && e.len == len)
        {
            return Ok(Taken {
                m: e.m.take(),
                id: Some(e.id),
            });
        }
    }
    reserve(addr, len).map(|m| Taken {
        m: Some(m),
        id: None,
    })
}

/// Whether an [`AddressHold`] not yet taken over keeps part of
/// `[addr, addr + len)`.
pub(crate) fn overlaps(addr: usize, len: usize) -> bool {
    let end = addr.saturating_add(len);
    held().iter().any(|e| e.addr < end && addr < e.addr + e.len)
}

fn reserve(addr: usize, len: usize) -> Result<Mapping> {
    if addr.checked_add(len).is_none() {
        return Err(crate::mmap::past_the_end(addr, len));
    }
    Mapping::reserve_at(addr, len).map_err(|e| match e {
        libc::EEXIST => Error::Overlap { addr, len },
        e => Error::sys("mmap", e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::PAGE_SIZE;

    fn mapped(addr: usize) -> bool {
        let mut v = 0u8;
        // SAFETY: mincore only reads the page tables; it fails with ENOMEM
        // where nothing is mapped.
        unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, &mut v) == 0 }
    }

    #[test]
    fn a_hold_keeps_its_range_until_dropped_or_taken_over() {
        let len = 2 * PAGE_SIZE;
        // (Where nothing else in this test binary maps: a range another
        // test's mapping took after the drop would look like a leak.)
        let addr = 0x3100_0000_0000;
        let hold = AddressHold::new(addr, len).unwrap();
        assert!(mapped(addr));
        assert!(matches!(
            AddressHold::new(addr, len),
            Err(Error::Overlap { .. })
        ));
        drop(hold);
        assert!(!mapped(addr), "a dropped hold unmaps its range");
        let hold = AddressHold::new(addr, len).unwrap();
        assert!(take_or_hold(addr, PAGE_SIZE).is_err(), "not the same range");
        let taken = take_or_hold(addr, len).unwrap().into_mapping();
        drop(hold);
        assert!(mapped(addr), "taken over: the hold's drop leaves it");
        drop(taken);
        assert!(!mapped(addr));
        // A map refused after it took the hold over gives it back...
        let hold = AddressHold::new(addr, len).unwrap();
        drop(take_or_hold(addr, len).unwrap());
        assert!(mapped(addr), "given back to the hold");
        let again = take_or_hold(addr, len).unwrap();
        // ...unless the hold was dropped meanwhile: then it is unmapped
        // (it was kept for good, and `overlaps` refused the range).
        drop(hold);
        drop(again);
        assert!(!mapped(addr), "a refused map of a dropped hold unmaps it");
        assert!(!overlaps(addr, len));
        assert!(matches!(AddressHold::new(addr, 0), Err(Error::ZeroLength)));
        assert!(matches!(
            AddressHold::new(addr + 1, len),
            Err(Error::Unaligned { .. })
        ));
    }
}
