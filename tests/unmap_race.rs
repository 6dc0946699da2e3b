//! An access racing the unmap of a shared region, on real faults: it reads
//! the store's bytes or gets SIGSEGV, as on a plain mapping being unmapped,
//! never zeros; and the object kept after the unmap holds no page the
//! kernel made up in the moment the range was no longer registered (the
//! next map reads every byte right).
//!
//! Checked in child processes (the test binary re-run with `UFFD_CHILD=1
//! --exact <child test>`): readers spin over a region at a fixed address
//! while the main thread unmaps it, round after round. The child's SIGSEGV
//! handler maps a page of sentinel words where the access failed, so the
//! reader sees the sentinel, stops, and the round goes on; the main thread
//! unmaps those pages before it maps the region there again. The budget is
//! half the region, so reclaim keeps punching holes the race can hit.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;
use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore, Store};
use uffd_pager::{Delivery, MapOptions, Pager};
use util::*;

const PAGES: usize = 64;
const ROUNDS: usize = 40;
const READERS: usize = 2;
const SENTINEL: u64 = 0x5e47_1e15_e471_e15e;

/// The range the child's regions are mapped at (0 until chosen).
static BASE: AtomicUsize = AtomicUsize::new(0);
/// A memfd of one page of [`SENTINEL`] words.
static SENTINELS: AtomicI32 = AtomicI32::new(-1);

/// SIGSEGV inside `BASE`: maps a page of [`SENTINEL`] words there, unless
/// something is still mapped (the region on its way out, made
/// inaccessible first: the access faults again until the munmap is done).
/// One the engine sent (`si_code` ≤ 0: a fault on a region being unmapped)
/// is let go the same way: the access runs again. Anywhere else: back to
/// the default action, so the re-run access ends the process as it would
/// have.
extern "C" fn on_segv(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: errno is thread-local; saved and restored around the calls
    // below, which are async-signal-safe system calls (no allocation, no
    // locks). `info` is the kernel's siginfo for this SIGSEGV.
    unsafe {
        let errno = *libc::__errno_location();
        let addr = (*info).si_addr() as usize & !(PAGE - 1);
        let base = BASE.load(Relaxed);
        if (*info).si_code <= 0 && base != 0 {
            // Sent, not raised by the access itself: run it again.
        } else if base == 0 || addr < base || addr >= base + PAGES * PAGE {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        } else {
            // The page comes already filled (a memfd of sentinels), so a
            // reader on the other CPU never sees it half made.
            let p = libc::mmap(
                addr as *mut libc::c_void,
                PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                SENTINELS.load(Relaxed),
                0,
            );
            if p != libc::MAP_FAILED && p as usize != addr {
                libc::munmap(p, PAGE);
            }
        }
        *libc::__errno_location() = errno;
    }
}

/// The word the readers check on page `pg`.
fn word(data: &[u8], pg: usize) -> u64 {
    let off = pg * PAGE + (pg * 40) % PAGE;
    u64::from_ne_bytes(data[off..off + 8].try_into().unwrap())
}

/// Child: `ROUNDS` rounds of map → readers spin → unmap under them; then a
/// last map checked byte by byte. Prints what it saw; exits non-zero on a
/// wrong word.
#[test]
fn child_readers_race_the_unmap() {
    if !is_child() {
        return;
    }
    let delivery = match std::env::var("UFFD_DELIVERY").as_deref() {
        Ok("threads") => THREADS,
        Ok("per-region") => Delivery::PerRegion,
        _ => Delivery::InThread,
    };
    let kernel_maps = std::env::var("UFFD_KERNEL_MAPS").is_ok();
    let page: Vec<u8> = (0..PAGE / 8).flat_map(|_| SENTINEL.to_ne_bytes()).collect();
    // SAFETY: memfd_create with a valid name; the descriptor is then owned
    // here and lives as long as the process.
    let fd = unsafe { libc::memfd_create(c"sentinels".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: `page` is a valid buffer of PAGE bytes.
    assert_eq!(
        unsafe { libc::pwrite(fd, page.as_ptr().cast(), PAGE, 0) },
        PAGE as isize
    );
    SENTINELS.store(fd, Relaxed);
    // SAFETY: installs a handler that only makes system calls (above).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_segv
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()), 0);
    }
    let data = Arc::new(pattern_vec(41, PAGES * PAGE));
    for pg in 0..PAGES {
        assert_ne!(word(&data, pg), SENTINEL);
    }
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let store: Arc<dyn Store> = Arc::new(SimulatedStore::new(mem, LatencyModel::None, 8, 1));
    let p = Pager::builder()
        .delivery(delivery)
        .budget_pages((PAGES / 2) as u64)
        .keep_unmapped(4)
        .build()
        .unwrap();
    let base = free_range(PAGES * PAGE);
    BASE.store(base, Relaxed);
    let opts = MapOptions {
        writable: false,
        fixed_addr: Some(base),
        kernel_maps,
        ..MapOptions::default()
    };
    let cut = Arc::new(AtomicU64::new(0));
    for round in 0..ROUNDS {
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe { p.map_store(store.clone(), PAGES * PAGE, &opts) }.unwrap();
        assert_eq!(r.as_ptr() as usize, base);
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..READERS)
            .map(|t| {
                let (stop, data, cut) = (stop.clone(), data.clone(), cut.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    let mut k = t * 7;
                    while !stop.load(Relaxed) {
                        let pg = k % PAGES;
                        let off = pg * PAGE + (pg * 40) % PAGE;
                        // SAFETY: the address is in `BASE`'s range: a
                        // region's page, or (once it is unmapped) a fault
                        // that the SIGSEGV handler answers with a page of
                        // sentinels. Nothing writes the range meanwhile.
                        let w = unsafe { std::ptr::read_volatile((base + off) as *const u64) };
                        if w == SENTINEL {
                            cut.fetch_add(1, Relaxed);
                            return Ok(());
                        }
                        if w != word(&data, pg) {
                            return Err(format!("round {round}: page {pg} read {w:#x}"));
                        }
                        k += 5;
                    }
                    Ok(())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(300 + 700 * (round % 4) as u64));
        drop(r);
        stop.store(true, Relaxed);
        for h in readers {
            if let Err(e) = h.join().unwrap() {
                println!("WRONG DATA: {e}");
                std::process::exit(3);
            }
        }
        // The sentinel pages go, so the range is free for the next map.
        // SAFETY: nothing of the engine's is mapped in the range now.
        unsafe { libc::munmap(base as *mut libc::c_void, PAGES * PAGE) };
    }
    BASE.store(0, Relaxed);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(store, PAGES * PAGE, &opts) }.unwrap();
    assert_bytes(r.as_slice(), &data, "the last map, after the races");
    println!("cut off {} times in {ROUNDS} rounds", cut.load(Relaxed));
}

/// In-thread delivery failed this (the process died of SIGBUS) until a
/// SIGBUS that no pager claims was run again once before it is passed on:
/// a fault raised while the range was registered, handled after the unmap
/// had finished.
#[test]
fn readers_racing_the_unmap_read_the_store_or_get_sigsegv() {
    for (d, unprivileged) in [
        ("in-thread", false),
        ("in-thread", true),
        ("threads", false),
        ("per-region", false),
    ] {
        for km in [false, true] {
            let mut envs = vec![("UFFD_DELIVERY", d)];
            if km {
                envs.push(("UFFD_KERNEL_MAPS", "1"));
            }
            let name = "child_readers_race_the_unmap";
            let out = if unprivileged {
                run_child_unprivileged(name, &envs)
            } else {
                run_child(name, &envs)
            };
            let stdout = String::from_utf8_lossy(&out.stdout);
            let ctx = format!(
                "{d}, unprivileged {unprivileged}, kernel_maps {km}: {}",
                describe(&out)
            );
            assert!(out.status.success(), "{ctx}");
            assert!(!stdout.contains("WRONG DATA"), "{ctx}");
            // The race was run: readers were cut off by the unmap.
            let cut: u64 = stdout
                .split("cut off ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no count: {ctx}"));
            assert!(cut > 0, "no reader was cut off by an unmap: {ctx}");
        }
    }
}
