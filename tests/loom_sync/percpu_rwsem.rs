//! The events gate (`PercpuRwsem`): the writer never gets in beside a
//! reader, and no side sleeps for good. In the `Exact` futex mode the
//! writer's 1 ms timed wait never times out, so a reader that leaves
//! without waking a waiting writer is a deadlock here, where the real
//! primitive would only have waited a millisecond.

use crate::util::check;
use loom::cell::UnsafeCell;
use loom::thread;
use std::sync::Arc;
use uffd_pager::sync::model::set_cpu;
use uffd_pager::sync::percpu_rwsem::PercpuRwsem;

/// The semaphore and a cell the readers read and the writer writes: loom
/// reports a race on it if the writer ever overlaps a reader.
struct Gate {
    sem: PercpuRwsem,
    data: UnsafeCell<u64>,
}

// SAFETY: `data` is only accessed through loom's checked `with`/`with_mut`,
// which fail the model on a race instead of letting it happen.
unsafe impl Sync for Gate {}

/// Two faults' read sections, on two CPUs, and one event applied under
/// the write side (the engine's faults and an application's `munmap`).
#[test]
fn the_writer_excludes_readers_and_everyone_gets_through() {
    check(|| {
        let gate = Arc::new(Gate {
            sem: PercpuRwsem::new(),
            data: UnsafeCell::new(0),
        });
        let readers: Vec<_> = (0..2)
            .map(|cpu| {
                let gate = gate.clone();
                thread::spawn(move || {
                    set_cpu(cpu);
                    let _r = gate.sem.read();
                    gate.data.with(|v| unsafe { *v })
                })
            })
            .collect();
        {
            let _w = gate.sem.write();
            gate.data.with_mut(|v| unsafe { *v += 1 });
        }
        for r in readers {
            let seen = r.join().unwrap();
            assert!(seen <= 1, "a reader saw {seen}");
        }
        // Open again: a later reader gets in.
        drop(gate.sem.read());
    });
}

/// A reader that enters while the writer holds waits, and is let in
/// when the writer leaves (the wake of `writers` going to zero).
#[test]
fn a_reader_waiting_for_the_writer_is_woken() {
    check(|| {
        let gate = Arc::new(Gate {
            sem: PercpuRwsem::new(),
            data: UnsafeCell::new(0),
        });
        let w = gate.sem.write();
        let reader = {
            let gate = gate.clone();
            thread::spawn(move || {
                set_cpu(1);
                let _r = gate.sem.read();
                gate.data.with(|v| unsafe { *v })
            })
        };
        gate.data.with_mut(|v| unsafe { *v = 7 });
        drop(w);
        assert_eq!(reader.join().unwrap(), 7);
    });
}
