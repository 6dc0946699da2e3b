//! The pin count: a pin taken before the owner waits is always waited for,
//! and the last unpin always wakes the owner (in the `Exact` futex mode a
//! lost wake-up is a deadlock: the 50 ms re-check never fires).

use crate::util::check;
use loom::sync::atomic::AtomicBool;
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use uffd_pager::sync::model::set_cpu;
use uffd_pager::sync::pins::Pins;

/// Two faults, on two CPUs, each pinned before the owner starts to wait
/// (as the handler pins inside the read section the owner's removal waits
/// out), each unpinning while the owner may be waiting.
#[test]
fn the_owner_waits_for_every_pin_and_is_woken() {
    check(|| {
        let pins = Arc::new(Pins::default());
        let pinned: Arc<[AtomicBool; 2]> =
            Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let done: Arc<[AtomicBool; 2]> = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let faults: Vec<_> = (0..2)
            .map(|cpu| {
                let (pins, pinned, done) = (pins.clone(), pinned.clone(), done.clone());
                thread::spawn(move || {
                    set_cpu(cpu);
                    let pin = pins.pin();
                    pinned[cpu].store(true, SeqCst);
                    done[cpu].store(true, SeqCst);
                    drop(pin);
                })
            })
            .collect();
        // The owner removed the entry: no pin can start from here on.
        while !(pinned[0].load(SeqCst) && pinned[1].load(SeqCst)) {
            thread::yield_now();
        }
        pins.wait_unpinned();
        assert!(
            done[0].load(SeqCst) && done[1].load(SeqCst),
            "returned with a fault running"
        );
        assert_eq!(pins.count(), 0);
        for f in faults {
            f.join().unwrap();
        }
    });
}
