//! Embeds a file larger than the memory budget as an ordinary byte slice:
//! a 64 MiB file mapped through the pager with a 16 MiB budget (4096
//! pages), read and written as `&mut [u8]`, flushed, and checked byte for
//! byte by reading the file back with `std::fs`.
//!
//! `cargo run --release --example embed_file`

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use uffd_pager::{Counter, InstallKind, MapOptions, Pager};

const FILE_LEN: usize = 64 << 20;
const BUDGET_PAGES: u64 = 4096;
const PAGE: usize = 4096;

/// The byte written at `offset`: differs between neighbours and pages.
fn byte(offset: usize) -> u8 {
    let page = (offset / PAGE) as u64;
    (page.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (offset as u8).wrapping_mul(7)
}

/// Removes the file when dropped, whatever happens.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("uffd-embed-{}.bin", std::process::id()));
    // A new file (never one already there, nor a link someone planted):
    // what the SAFETY comment below relies on. Removed on the way out,
    // once made.
    let new = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let file = TempFile(path);
    new.set_len(FILE_LEN as u64)?;

    let pager = Pager::builder().budget_pages(BUDGET_PAGES).build()?;
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: true,
        ..MapOptions::default()
    };
    // SAFETY: the file was made above for this example alone, and nothing
    // else writes it while it is mapped (the store contract).
    let mut region = unsafe { pager.map_file(&file.0, None, &opts) }?;
    let t = Instant::now();
    let data = region.as_mut_slice();
    // Read it: a new sparse file is all zeros.
    let nonzero = data.iter().step_by(PAGE / 4).filter(|&&b| b != 0).count();
    // Write a pattern to every byte of every page.
    for (i, b) in data.iter_mut().enumerate() {
        *b = byte(i);
    }
    // Read it back through the pager (most pages were evicted meanwhile).
    let bad_in_place = data
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != byte(i))
        .count();
    region.flush()?;
    let elapsed = t.elapsed();
    let stats = pager.stats();
    drop(region);
    drop(pager);

    let back = std::fs::read(&file.0)?;
    let bad_on_disk = back
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != byte(i))
        .count();
    println!(
        "embed_file: {} MiB file, budget {} pages ({} MiB), read+write+read+flush in {:.0} ms",
        FILE_LEN >> 20,
        BUDGET_PAGES,
        (BUDGET_PAGES as usize * PAGE) >> 20,
        elapsed.as_secs_f64() * 1e3
    );
    println!(
        "  pgmajfault {}  wp_fault {}  pgsteal {}  writeback {}  peak resident {} pages",
        stats.get(Counter::PGMAJFAULT),
        stats.get(Counter::WP_FAULT),
        stats.get(Counter::PGSTEAL),
        stats.get(Counter::WRITEBACK),
        stats.peak_resident_pages
    );
    println!(
        "  initial nonzero bytes sampled: {nonzero}; bad bytes in the mapping: {bad_in_place}; \
         bad bytes in the file read back with std::fs: {bad_on_disk} of {}",
        back.len()
    );
    let ok = nonzero == 0
        && bad_in_place == 0
        && back.len() == FILE_LEN
        && bad_on_disk == 0
        && stats.get(Counter::PGSTEAL) > 0
        && stats.get(Counter::WRITEBACK) > 0;
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => {
            println!("embed_file: OK, every byte verified");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("embed_file: FAILED verification");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("embed_file: error: {e}");
            ExitCode::FAILURE
        }
    }
}
