//! Two in-thread pagers in one process taking turns at the same address
//! range: one unmaps a region there while the other maps one in its place.
//! Every fault must go to the pager whose region is live (a range the
//! first is still tearing down must not claim the second's faults).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering};
use uffd_pager::{Delivery, Error, MapOptions, Pager};
use util::*;

const PAGES: usize = 16;

fn cycle(p: &Pager, at: usize, v: u8, stop: &AtomicBool) -> u64 {
    let opts = MapOptions {
        kind: Some(uffd_pager::InstallKind::Anonymous),
        fixed_addr: Some(at),
        ..MapOptions::default()
    };
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        let store = std::sync::Arc::new(uffd_pager::store::ZeroStore::new((PAGES * PAGE) as u64));
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut r = match unsafe { p.map_store(store, PAGES * PAGE, &opts) } {
            Ok(r) => r,
            Err(Error::Overlap { .. }) => {
                std::hint::spin_loop();
                continue;
            }
            Err(e) => panic!("map: {e}"),
        };
        for pg in 0..PAGES {
            r.as_mut_slice()[pg * PAGE] = v;
        }
        for pg in 0..PAGES {
            assert_eq!(r.as_slice()[pg * PAGE], v);
        }
        drop(r);
        done += 1;
    }
    done
}

#[test]
fn child_two_pagers_share_a_range() {
    if !is_child() {
        return;
    }
    let a = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let b = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let at = free_range(PAGES * PAGE);
    let stop = AtomicBool::new(false);
    let (na, nb) = std::thread::scope(|s| {
        let ta = s.spawn(|| cycle(&a, at, 0xA1, &stop));
        let tb = s.spawn(|| cycle(&b, at, 0xB2, &stop));
        std::thread::sleep(std::time::Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
        (ta.join().unwrap(), tb.join().unwrap())
    });
    println!("cycles {na} {nb}");
    assert!(na > 10 && nb > 10, "both pagers took turns: {na} {nb}");
}

#[test]
fn two_pagers_taking_turns_at_one_range_never_misroute_a_fault() {
    let out = run_child("child_two_pagers_share_a_range", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}
