//! What a pager may be built with: the bounds [`PagerBuilder::build`]
//! checks, each far above any use and low enough that what the engine
//! sizes from it (the LRU rings, thread stacks) fits in memory and in
//! arithmetic. A value past one is [`Error::Config`], never an overflow,
//! an abort in a thread that cannot get its stack, or a spin with no end.
//!
//! [`PagerBuilder::build`]: crate::PagerBuilder::build

use crate::address_space::Config;
use crate::delivery::Delivery;
use crate::error::{Error, Result};

/// The largest budget in 4 KiB pages: 128 TiB, the whole x86-64 user
/// address space.
pub const MAX_BUDGET_PAGES: u64 = 1 << 35;

/// The smallest budget in 4 KiB pages (0 aside: no budget). One x86-64
/// access needs up to four pages resident at once (`movsq` between two
/// unaligned words, each across a page boundary); under a smaller budget
/// the fault for one page evicted another the access needs, and the
/// access ran again and faulted again, for ever (a load across one
/// boundary under a budget of one page, with kswapd off; found by
/// review).
pub const MIN_BUDGET_PAGES: u64 = 4;

/// The most threads of one kind: handler threads, I/O workers, readahead
/// threads.
pub const MAX_THREADS: usize = 1024;

/// The most LRU shards.
pub const MAX_LRU_SHARDS: usize = 1024;

/// The longest a handler thread polls before it blocks: one second.
pub const MAX_SPIN_US: u32 = 1_000_000;

/// Checks `config` against the bounds above.
pub(super) fn check(config: &Config) -> Result<()> {
    let over = |what: &str, v: u128, max: u128| {
        Err(Error::Config(format!(
            "{what} {v} is more than the most, {max}"
        )))
    };
    if config.budget_pages > MAX_BUDGET_PAGES {
        return over(
            "a budget of pages",
            config.budget_pages.into(),
            MAX_BUDGET_PAGES.into(),
        );
    }
    if config.budget_pages > 0 && config.budget_pages < MIN_BUDGET_PAGES {
        return Err(Error::Config(format!(
            "a budget of {} pages is under the least, {MIN_BUDGET_PAGES}: one access may \
             need that many resident at once (0 is no budget)",
            config.budget_pages
        )));
    }
    if config.lru_shards > MAX_LRU_SHARDS {
        return over(
            "LRU shards",
            config.lru_shards as u128,
            MAX_LRU_SHARDS as u128,
        );
    }
    let threads = [
        ("handler threads", config.delivery.pool_threads()),
        ("I/O workers", config.io_threads),
        ("readahead threads", config.readahead_threads),
    ];
    for (what, n) in threads {
        if n > MAX_THREADS {
            return over(what, n as u128, MAX_THREADS as u128);
        }
    }
    if let Delivery::Threads { threads: 0, .. } = config.delivery {
        return Err(Error::Config("handler threads must be at least 1".into()));
    }
    if let Delivery::Threads { spin_us, .. } = config.delivery {
        if spin_us > MAX_SPIN_US {
            return over("a spin of microseconds", spin_us.into(), MAX_SPIN_US.into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Pager;

    fn refused(b: crate::PagerBuilder, what: &str) {
        match b.build() {
            Err(Error::Config(m)) => assert!(m.contains(what), "{m}"),
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: built"),
        }
    }

    #[test]
    fn values_past_the_bounds_are_config_errors() {
        refused(Pager::builder().budget_pages(u64::MAX), "budget");
        refused(
            Pager::builder().budget_pages(MAX_BUDGET_PAGES + 1),
            "budget",
        );
        refused(Pager::builder().lru_shards(usize::MAX), "LRU shards");
        let many = Delivery::Threads {
            threads: 100_000,
            spin_us: 0,
        };
        refused(Pager::builder().delivery(many), "handler threads");
        let spin = Delivery::Threads {
            threads: 1,
            spin_us: u32::MAX,
        };
        refused(Pager::builder().delivery(spin), "spin");
        refused(Pager::builder().io_threads(usize::MAX), "I/O workers");
        refused(Pager::builder().readahead(32, 1 << 20), "readahead threads");
    }

    #[test]
    fn values_at_the_bounds_build() {
        let p = Pager::builder()
            .budget_pages(MAX_BUDGET_PAGES)
            .kswapd(false)
            .build();
        assert!(p.is_ok(), "{:?}", p.err());
    }
}
