//! Anonymous memory larger than the memory budget, through swap: 64 MiB
//! with a 16 MiB budget, written with a pattern, read back and verified,
//! once with the default in-memory swap store and once swapping to an
//! unlinked file in the temp directory.
//!
//! `cargo run --release --example anon_swap`

use std::process::ExitCode;
use std::time::Instant;
use uffd_pager::{Counter, Pager, PagerBuilder};

const LEN: usize = 64 << 20;
const BUDGET_PAGES: u64 = 4096;

/// The word at word index `i`.
fn word(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555
}

/// Writes, reads back and verifies; returns whether all went as expected.
fn run(name: &str, builder: PagerBuilder) -> Result<bool, uffd_pager::Error> {
    let pager: Pager = builder.budget_pages(BUDGET_PAGES).build()?;
    let mut region = pager.map_anonymous(LEN)?;
    let t = Instant::now();
    // SAFETY: the region is page-aligned, so the u64 view has no prefix or
    // suffix; every bit pattern is a valid u64; `region` is borrowed
    // mutably for the view's life.
    let (pre, words, post) = unsafe { region.as_mut_slice().align_to_mut::<u64>() };
    assert!(pre.is_empty() && post.is_empty());
    let zeros = words.iter().step_by(512).all(|&w| w == 0);
    for (i, w) in words.iter_mut().enumerate() {
        *w = word(i);
    }
    let bad = words
        .iter()
        .enumerate()
        .filter(|&(i, &w)| w != word(i))
        .count();
    let elapsed = t.elapsed();
    let s = pager.stats();
    println!(
        "anon_swap ({name}): {} MiB anonymous, budget {} pages ({} MiB), write+read in {:.0} ms",
        LEN >> 20,
        BUDGET_PAGES,
        (BUDGET_PAGES as usize * 4096) >> 20,
        elapsed.as_secs_f64() * 1e3
    );
    println!(
        "  pgsteal {}  writeback {}  pgmajfault {}  pgfault {}  peak resident {} pages",
        s.get(Counter::PGSTEAL),
        s.get(Counter::WRITEBACK),
        s.get(Counter::PGMAJFAULT),
        s.get(Counter::PGFAULT),
        s.peak_resident_pages
    );
    println!(
        "  zero-filled at first: {zeros}; bad words: {bad} of {}",
        words.len()
    );
    region.unmap()?;
    Ok(zeros && bad == 0 && s.get(Counter::PGSTEAL) > 0 && s.get(Counter::WRITEBACK) > 0)
}

fn main() -> ExitCode {
    let mut ok = true;
    for (name, b) in [
        ("in-memory swap", Pager::builder()),
        ("swap file", Pager::builder().swap_dir(std::env::temp_dir())),
    ] {
        match run(name, b) {
            Ok(good) => ok &= good,
            Err(e) => {
                eprintln!("anon_swap ({name}): error: {e}");
                ok = false;
            }
        }
    }
    if ok {
        println!("anon_swap: OK, every word verified after swapping out and in");
        ExitCode::SUCCESS
    } else {
        eprintln!("anon_swap: FAILED");
        ExitCode::FAILURE
    }
}
