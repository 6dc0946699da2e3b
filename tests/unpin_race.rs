//! A pager dropped while the SIGBUS handler is still leaving a fault it
//! served on it: the handler's last unpin reads the pager's registry entry
//! after the count that the drop waits for is zero. The drop freed the
//! entry then, and the unpin bumped a word of whatever the allocator
//! handed out next. The unpin is held open on purpose
//! (`testing::set_after_unpin`), and the memory handed out next is
//! checked.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;
use uffd_pager::{Delivery, Pager};
use util::*;

/// Whether the next unpin sleeps.
static ARMED: AtomicBool = AtomicBool::new(false);
/// Set once an unpin is asleep.
static ASLEEP: AtomicBool = AtomicBool::new(false);

/// The unpin hook: the first unpin after arming sleeps 300 ms (nanosleep:
/// async-signal-safe).
fn slow_unpin() {
    if ARMED.swap(false, SeqCst) {
        ASLEEP.store(true, SeqCst);
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 300_000_000,
        };
        // SAFETY: a valid timespec; no remainder wanted.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

#[test]
fn child_unpin_race() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(30) };
    const WORDS: u32 = 0x0101_0101;
    let mut clean = 0;
    for round in 0..5 {
        let p = Pager::builder()
            .delivery(Delivery::InThread)
            .build()
            .unwrap();
        let r = p.map_anonymous(PAGE).unwrap();
        let at = r.as_ptr() as usize;
        uffd_pager::testing::set_after_unpin(Some(slow_unpin));
        ARMED.store(true, SeqCst);
        ASLEEP.store(false, SeqCst);
        let toucher = std::thread::spawn(move || {
            // SAFETY: the region's page; once the fault is served (the unpin
            // comes after), the application's own page.
            unsafe { std::ptr::write_volatile(at as *mut u8, 1) };
        });
        while !ASLEEP.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(r);
        // The access runs again when the handler returns: it lands in
        // memory of the application's own mapped there now.
        // SAFETY: the range the region's drop just unmapped.
        let own = unsafe { map_own_fixed(at, PAGE) };
        assert_eq!(own, at);
        drop(p);
        // Whatever 32-byte blocks the allocator hands out now, among them
        // the entry's if the drop freed it.
        let blocks: Vec<Box<[u32; 8]>> = (0..4096).map(|_| Box::new([WORDS; 8])).collect();
        toucher.join().unwrap();
        uffd_pager::testing::set_after_unpin(None);
        // SAFETY: the application's own page, mapped above.
        unsafe { libc::munmap(at as *mut libc::c_void, PAGE) };
        let bad = blocks
            .iter()
            .filter(|b| b.iter().any(|&w| w != WORDS))
            .count();
        println!("round {round}: {bad} blocks changed");
        assert_eq!(bad, 0, "round {round}: the unpin wrote to freed memory");
        clean += 1;
    }
    println!("ok {clean}");
    std::process::exit(0);
}

#[test]
fn a_pager_dropped_while_its_last_fault_unpins_frees_its_entry_after() {
    let out = run_child("child_unpin_race", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}
