//! Out-of-core sort: a file of 4 Mi pseudo-random `u64`s (32 MiB), four
//! times the memory budget (2048 pages = 8 MiB), mapped through the pager
//! and sorted in place as a `&mut [u64]` with `slice::sort_unstable`, then
//! flushed and verified (sorted, same multiset by checksum, and read back
//! from the file with `std::fs`). The same input, in a second file, is then
//! sorted through the kernel's own `mmap(MAP_SHARED)` for comparison; the
//! kernel has no 8 MiB limit here, so it is the unconstrained reference.
//!
//! `cargo run --release --example out_of_core_sort`

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use uffd_pager::{Counter, InstallKind, MapOptions, Pager};

const WORDS: usize = 4 << 20;
const LEN: usize = WORDS * 8;
const BUDGET_PAGES: u64 = 2048;

/// Removes the file when dropped, whatever happens.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A multiset fingerprint: the wrapping sum of a mix of each value (order
/// does not matter, and any changed, lost or duplicated value shows).
fn checksum(v: &[u64]) -> u64 {
    v.iter().fold(0u64, |s, &x| {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        s.wrapping_add(z ^ (z >> 31))
    })
}

fn is_sorted(v: &[u64]) -> bool {
    v.windows(2).all(|w| w[0] <= w[1])
}

/// Reads the file back as `u64`s.
fn read_words(path: &Path) -> std::io::Result<Vec<u64>> {
    let bytes = std::fs::read(path)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

/// Sorts the file through the engine; returns (time, stats).
fn engine_sort(path: &Path) -> Result<(Duration, uffd_pager::Stats), uffd_pager::Error> {
    let pager = Pager::builder().budget_pages(BUDGET_PAGES).build()?;
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: true,
        ..MapOptions::default()
    };
    let t = Instant::now();
    // SAFETY: the file is this example's own, and nothing else writes it
    // while it is mapped (the store contract).
    let mut region = unsafe { pager.map_file(path, None, &opts) }?;
    // SAFETY: the region is page-aligned (no prefix or suffix), every bit
    // pattern is a valid u64, and `region` is borrowed mutably meanwhile.
    let (pre, words, post) = unsafe { region.as_mut_slice().align_to_mut::<u64>() };
    assert!(pre.is_empty() && post.is_empty() && words.len() == WORDS);
    words.sort_unstable();
    region.flush()?;
    region.unmap()?;
    Ok((t.elapsed(), pager.stats()))
}

/// Sorts the file through the kernel's `mmap(MAP_SHARED)`; returns the time.
fn kernel_sort(path: &Path) -> std::io::Result<Duration> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let t = Instant::now();
    // SAFETY: a fresh shared read-write mapping of an open file of LEN bytes.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `p` maps LEN bytes read-write, page-aligned, and nothing else
    // refers to it until munmap.
    let words = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, WORDS) };
    words.sort_unstable();
    // SAFETY: msync and munmap of exactly the mapping made above; `words`
    // is not used afterwards.
    let r = unsafe { libc::msync(p, LEN, libc::MS_SYNC) };
    let err = (r != 0).then(std::io::Error::last_os_error);
    // SAFETY: as above.
    unsafe { libc::munmap(p, LEN) };
    match err {
        Some(e) => Err(e),
        None => Ok(t.elapsed()),
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    // Scratch files go to the system's temporary directory (tmpfs or disk).
    let dir = std::env::temp_dir();
    let tag = std::process::id();
    // New files (never ones already there, nor links someone planted),
    // removed on the way out once made.
    let new = |name: String| -> std::io::Result<(TempFile, std::fs::File)> {
        let path = dir.join(name);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok((TempFile(path), f))
    };
    let (a, fa) = new(format!("uffd-sort-engine-{tag}.bin"))?;
    let (b, fb) = new(format!("uffd-sort-kernel-{tag}.bin"))?;
    // A fixed xorshift sequence: varied input, the same on every run.
    let mut x = 42u64;
    let input: Vec<u64> = (0..WORDS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect();
    let sum_in = checksum(&input);
    let bytes: Vec<u8> = input.iter().flat_map(|w| w.to_le_bytes()).collect();
    for mut f in [fa, fb] {
        f.write_all(&bytes)?;
    }
    drop((input, bytes));

    let (engine_t, s) = engine_sort(&a.0)?;
    let kernel_t = kernel_sort(&b.0)?;
    let (ea, eb) = (read_words(&a.0)?, read_words(&b.0)?);
    let (sorted, same) = (is_sorted(&ea), checksum(&ea) == sum_in);
    let agree = ea == eb;

    println!(
        "out_of_core_sort: {} Mi u64 ({} MiB) in {}, engine budget {} pages ({} MiB)",
        WORDS >> 20,
        LEN >> 20,
        dir.display(),
        BUDGET_PAGES,
        (BUDGET_PAGES as usize * 4096) >> 20
    );
    println!(
        "  engine (map_file, sort_unstable, flush): {:.0} ms; pgmajfault {} wp_fault {} pgsteal {} writeback {} peak resident {} pages",
        engine_t.as_secs_f64() * 1e3,
        s.get(Counter::PGMAJFAULT),
        s.get(Counter::WP_FAULT),
        s.get(Counter::PGSTEAL),
        s.get(Counter::WRITEBACK),
        s.peak_resident_pages
    );
    println!(
        "  kernel mmap(MAP_SHARED), no budget:      {:.0} ms; engine/kernel time ratio {:.2}",
        kernel_t.as_secs_f64() * 1e3,
        engine_t.as_secs_f64() / kernel_t.as_secs_f64()
    );
    println!(
        "  engine file sorted: {sorted}; same multiset (checksum {:#018x}): {same}; identical to the kernel's result: {agree}",
        sum_in
    );
    Ok(sorted && same && agree && s.get(Counter::PGSTEAL) > 0)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => {
            println!("out_of_core_sort: OK");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("out_of_core_sort: FAILED verification");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("out_of_core_sort: error: {e}");
            ExitCode::FAILURE
        }
    }
}
