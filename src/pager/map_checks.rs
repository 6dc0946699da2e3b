//! The checks on what a map asks for: a length and a fixed address
//! aligned to the region's page size, and what a 2 MiB region needs
//! first.

use super::MapOptions;
use crate::error::{Error, Result};
use crate::object::InstallKind;
use crate::sys::PAGE_SIZE;

pub(super) fn check_len(len: usize) -> Result<()> {
    check_len_in(len, PAGE_SIZE)
}

fn check_len_in(len: usize, page_size: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::ZeroLength);
    }
    if !len.is_multiple_of(page_size) {
        return Err(Error::Unaligned {
            what: "length",
            value: len,
            page_size,
        });
    }
    Ok(())
}

pub(super) fn check_fixed(a: Option<usize>, page_size: usize) -> Result<()> {
    match a {
        Some(a) if a % page_size != 0 || a == 0 => Err(Error::Unaligned {
            what: "address",
            value: a,
            page_size,
        }),
        _ => Ok(()),
    }
}

/// The page shift for `opts.page_size`, and for 2 MiB pages the checks a
/// huge region needs first: a budget that holds one, enough free pages in
/// the kernel's pool for what the region may hold at once, and
/// `/proc/self/mem` (which evicting a huge anonymous page reads).
pub(super) fn page_shift(
    mm: &crate::address_space::Mm,
    opts: &MapOptions,
    len: usize,
) -> Result<u32> {
    let budget = mm.config.budget_pages;
    use crate::sys::huge::{Pool, HUGE_PAGE_SHIFT, HUGE_PAGE_SIZE};
    match opts.page_size {
        PAGE_SIZE => return Ok(crate::sys::PAGE_SHIFT),
        HUGE_PAGE_SIZE => {}
        other => return Err(Error::PageSize(other)),
    }
    check_len_in(len, HUGE_PAGE_SIZE)?;
    check_fixed(opts.fixed_addr, HUGE_PAGE_SIZE)?;
    let units = (HUGE_PAGE_SIZE / PAGE_SIZE) as u64;
    // kswapd keeps residency a thirty-second of the budget below it
    // (`watermarks`), so a budget of N huge pages (N < 32) keeps N - 1 of
    // them: two is the least that keeps one.
    if budget > 0 && budget < 2 * units {
        return Err(Error::Config(format!(
            "a budget of {budget} pages (4 KiB) is under two 2 MiB pages: it needs {} at least",
            2 * units
        )));
    }
    // What all of the pager's huge regions, this one with them, may hold
    // at once, against the pool's free pages and those they hold now:
    // - a pinned region's pages are never evicted, so the budget does not
    //   bound what it holds: all of them (checked against the budget
    //   alone, its fault past the pool's last page got SIGBUS);
    // - the others hold at most the budget's worth (`Pool::needed_for`),
    //   together: pages another region holds come back to the pool as
    //   reclaim makes room under the shared budget (a second region was
    //   refused while they would have done), but only under it. Counted
    //   for this region alone, less what the others held, a region was
    //   mapped with no free page at all beside a resident one under a
    //   larger budget, and its first access got SIGBUS (found by review).
    let pages = (len / HUGE_PAGE_SIZE) as u64;
    let mut u = mm.huge_pages_use();
    if opts.pinned {
        u.pinned += pages;
    } else {
        u.unpinned += pages;
    }
    let needed = Pool::needed_for(u.unpinned, budget) + u.pinned;
    Pool::require(needed.saturating_sub(u.held))?;
    if opts.install_kind() == InstallKind::Anonymous {
        crate::sys::huge::open_self_mem().map_err(|e| Error::Io {
            context: "opening /proc/self/mem (evicting 2 MiB anonymous pages reads it)".into(),
            source: std::io::Error::from_raw_os_error(e),
        })?;
    }
    Ok(HUGE_PAGE_SHIFT)
}
