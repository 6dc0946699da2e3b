//! Unit tests of `redis.rs`: a server killed, stopped or stalled under
//! the store, each failing within its time budget and recovering after.

use super::servers::{opts, page, Server, P};
use super::*;
use std::time::Instant;

/// What `timeout × attempts` allows, with room for a noisy machine.
fn bound(o: &RedisOptions) -> Duration {
    o.timeout * o.attempts * 3 + Duration::from_secs(2)
}

#[test]
fn killed_server_fails_in_bounded_time_then_recovers() {
    if !have_redis() {
        return;
    }
    let mut srv = Server::start();
    let o = opts("t5");
    let s = RedisStore::open(&srv.url(), 64 * P as u64, &o).unwrap();
    s.write(P as u64, &page(1)).unwrap();
    srv.kill();
    let mut back = vec![0; P];
    let mut many = vec![0; 4 * P];
    for _ in 0..2 {
        let t = Instant::now();
        let r = s.read(P as u64, &mut back);
        assert!(
            matches!(r, Err(StoreError(libc::EIO | libc::ETIMEDOUT))),
            "{r:?}"
        );
        let r = s.read_many(0, &mut many);
        assert!(
            matches!(r, Err(StoreError(libc::EIO | libc::ETIMEDOUT))),
            "{r:?}"
        );
        let r = s.write(2 * P as u64, &page(2));
        assert!(
            matches!(r, Err(StoreError(libc::EIO | libc::ETIMEDOUT))),
            "{r:?}"
        );
        eprintln!("three calls on a dead server failed in {:?}", t.elapsed());
        assert!(
            t.elapsed() < bound(&o) * 3,
            "three calls took {:?}",
            t.elapsed()
        );
    }
    // Back (empty: no persistence): the next call connects again.
    srv.restart();
    s.read(P as u64, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "the new server has no page 1");
    s.write(P as u64, &page(11)).unwrap();
    s.read(P as u64, &mut back).unwrap();
    assert_eq!(back, page(11));
}

#[test]
fn stopped_server_times_out_then_recovers_without_stale_replies() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let o = opts("t6");
    let s = Arc::new(RedisStore::open(&srv.url(), 64 * P as u64, &o).unwrap());
    for p in 0..8u64 {
        s.write(p * P as u64, &page(p + 100)).unwrap();
    }
    srv.signal(libc::SIGSTOP);
    let t = Instant::now();
    let mut back = vec![0; P];
    assert_eq!(s.read(0, &mut back), Err(StoreError(libc::ETIMEDOUT)));
    let took = t.elapsed();
    eprintln!("a read from a stopped server timed out in {took:?}");
    assert!(took >= o.timeout / 2, "timed out after only {took:?}");
    assert!(took < bound(&o), "took {took:?}");
    let t = Instant::now();
    let r = s.write_many(&[(P as u64, &page(1)), (2 * P as u64, &page(2))]);
    assert_eq!(r, Err(StoreError(libc::ETIMEDOUT)));
    assert!(t.elapsed() < bound(&o), "took {:?}", t.elapsed());
    srv.signal(libc::SIGCONT);
    // The server now answers the commands that timed out; none of those
    // replies may be read as the answer to these.
    for p in (3..8u64).rev() {
        s.read(p * P as u64, &mut back).unwrap();
        assert_eq!(back, page(p + 100), "page {p}");
    }
}

/// A batch to a stalled server (stopped, its connections open) fails
/// within the call's budget, `timeout × attempts`: a batch went as a
/// pipeline, whose replies the client read one by one, each waiting the
/// full timeout after the first timed out. A 32-page `write_many` took
/// about 10 s with a 300 ms timeout and 3 attempts, a 2 MiB `write` (512
/// pages) 29 s with 50 ms and 2.
#[test]
fn a_batch_to_a_stalled_server_fails_within_the_budget() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let o = opts("t9");
    let s = RedisStore::open(&srv.url(), 1024 * P as u64, &o).unwrap();
    let pages: Vec<Vec<u8>> = (0..32u64).map(page).collect();
    let batch: Vec<(u64, &[u8])> = (0..32u64)
        .map(|p| (p * P as u64, &pages[p as usize][..]))
        .collect();
    s.write_many(&batch).unwrap();
    let big = vec![7u8; 512 * P];
    let mut window = vec![0u8; 32 * P];
    srv.signal(libc::SIGSTOP);
    let budget = o.timeout * o.attempts;
    let t = Instant::now();
    let w = s.write_many(&batch);
    let w_took = t.elapsed();
    let t = Instant::now();
    let h = s.write(512 * P as u64, &big);
    let h_took = t.elapsed();
    let t = Instant::now();
    let r = s.read_many(0, &mut window);
    let r_took = t.elapsed();
    srv.signal(libc::SIGCONT);
    eprintln!("to a stopped server: 32 pages written in {w_took:?}, 512 in {h_took:?}, 32 read in {r_took:?} (budget {budget:?})");
    for (what, r, took) in [
        ("write_many", w, w_took),
        ("2 MiB write", h, h_took),
        ("read_many", r, r_took),
    ] {
        assert!(
            matches!(r, Err(StoreError(libc::ETIMEDOUT | libc::EIO))),
            "{what}: {r:?}"
        );
        // (A blocked send may wait out its timeout twice: once for what
        // fit in the socket, once for the rest.)
        assert!(
            took < budget * 2,
            "{what} took {took:?} for a budget of {budget:?}"
        );
    }
    // Back: every page as the last successful write left it.
    s.read_many(0, &mut window).unwrap();
    for p in 0..32 {
        assert_eq!(&window[p * P..(p + 1) * P], &pages[p][..], "page {p}");
    }
}
