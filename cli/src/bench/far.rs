//! Far-memory benches over a real Redis server or cluster, each a ratio of
//! two figures measured in the same run:
//!
//! - [`far_miss`]: a major fault whose page comes from Redis (fault, I/O
//!   worker hop, `GET`, install) against the floor of the same round trip,
//!   a plain client's `GET` of the same page on the same loopback, one at
//!   a time.
//! - [`far_scan`]: a sequential scan of a Redis-backed region with
//!   readahead (each window one `MGET` through `Store::read_many`) and
//!   fault-around, against the same scan with neither (one `GET` per
//!   fault).

use super::{min, pattern, touch, EngineLoop};
use crate::far::{plain_connection, Far};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{page_key, Store};
use uffd_pager::{Delivery, Error, InstallKind, MapOptions, Pager, Result, PAGE_SIZE};

/// What [`far_miss`] found: microseconds per page, best pass of each side.
#[derive(Debug, Clone, PartialEq)]
pub struct FarMissReport {
    /// Pages per pass.
    pub pages: usize,
    /// A plain client's `GET` of one page.
    pub floor_us: f64,
    /// A major fault served from Redis.
    pub engine_us: f64,
    /// `engine_us / floor_us`.
    pub ratio: f64,
    /// With an I/O spin: the same `GET` by a raw client that busy-polls its
    /// non-blocking socket for as long as the engine spins (standalone
    /// servers and 4 KiB pages only), and the engine against it.
    pub spinning_floor_us: Option<f64>,
    /// `engine_us / spinning_floor_us`.
    pub spinning_ratio: Option<f64>,
    /// With an I/O spin and no spinning floor: why it was left out.
    pub spinning_left_out: Option<&'static str>,
}

/// A raw RESP client of one standalone server that busy-polls its
/// non-blocking socket for up to `spin` before it sleeps in `poll(2)`:
/// the floor of a round trip for a waiter that spins as the engine's
/// (`PagerBuilder::io_spin`) do.
struct SpinningClient {
    sock: std::net::TcpStream,
    spin: Duration,
    buf: Vec<u8>,
}

impl SpinningClient {
    /// The client, or why there is none (said beside the report).
    fn connect(
        url: &crate::far::StoreUrl,
        spin: Duration,
    ) -> std::result::Result<SpinningClient, &'static str> {
        let Ok(uffd_pager::store::RedisUrl::Standalone { host, port, db: 0 }) =
            uffd_pager::store::RedisUrl::parse(&url.0)
        else {
            return Err("the raw client speaks to a standalone server's database 0 only");
        };
        let sock = std::net::TcpStream::connect((host.as_str(), port))
            .map_err(|_| "the raw client could not connect")?;
        sock.set_nodelay(true)
            .and_then(|()| sock.set_nonblocking(true))
            .map_err(|_| "the raw client could not set up its socket")?;
        Ok(SpinningClient {
            sock,
            spin,
            buf: Vec::with_capacity(2 * PAGE_SIZE),
        })
    }

    /// `GET key`; the value's bytes (a page is expected).
    fn get(&mut self, key: &str) -> std::io::Result<&[u8]> {
        use std::io::{Read, Write};
        let req = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
        let mut w = req.as_bytes();
        while !w.is_empty() {
            match self.sock.write(w) {
                Ok(n) => w = &w[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.wait(libc::POLLOUT),
                Err(e) => return Err(e),
            }
        }
        self.buf.clear();
        let head = format!("${PAGE_SIZE}\r\n");
        let want = head.len() + PAGE_SIZE + 2;
        let mut chunk = [0u8; 2 * PAGE_SIZE];
        let start = Instant::now();
        while self.buf.len() < want {
            // A reply that is not a page (a nil `$-1` for a key the server
            // lost, an error) is shorter than one: known by its first
            // line. (The loop waited for a page's bytes for ever.)
            let line = self.buf.windows(2).position(|w| w == b"\r\n");
            if line.is_some_and(|e| self.buf[..e + 2] != *head.as_bytes()) {
                return Err(std::io::Error::other(format!(
                    "not a page's bulk string reply: {}",
                    String::from_utf8_lossy(&self.buf[..line.unwrap_or(0)])
                )));
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            match self.sock.read(&mut chunk) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= self.spin {
                        self.wait(libc::POLLIN);
                    } else {
                        std::hint::spin_loop();
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if self.buf.first() != Some(&b'$') || self.buf.len() != want {
            return Err(std::io::Error::other("not a page's bulk string reply"));
        }
        let head = want - PAGE_SIZE - 2;
        Ok(&self.buf[head..head + PAGE_SIZE])
    }

    fn wait(&self, events: i16) {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a bounded timeout.
        unsafe { libc::poll(&mut p, 1, 1000) };
    }
}

fn io_error(context: &str) -> impl Fn(String) -> Error + '_ {
    move |m| Error::Io {
        context: context.to_string(),
        source: std::io::Error::other(m),
    }
}

/// Per-miss cost against a plain `GET`; see the module docs. `passes`
/// timed passes of `pages` pages of `page_size` each side, interleaved,
/// after one warm-up pass each. The store keeps 4 KiB per key, so with
/// 2 MiB pages a miss reads 512 keys and the floor is one plain `MGET` of
/// them.
pub fn far_miss(
    far: &Far,
    pages: usize,
    passes: usize,
    kind: InstallKind,
    delivery: Delivery,
    io_spin: Duration,
    page_size: usize,
) -> Result<FarMissReport> {
    if pages == 0 || passes == 0 {
        return Err(Error::Config("far-miss needs pages and passes".into()));
    }
    let units = page_size / PAGE_SIZE;
    let store = far.filled("miss", pages * units, |o| pattern(o / page_size))?;
    let prefix = store.prefix().to_string();
    let mut engine = EngineLoop::over(Arc::new(store), kind, delivery, io_spin, page_size)?;
    let mut con = plain_connection(far.url()).map_err(io_error("the floor's plain client"))?;
    let keys: Vec<Vec<String>> = (0..pages)
        .map(|p| {
            (0..units)
                .map(|u| page_key(&prefix, (p * units + u) as u64))
                .collect()
        })
        .collect();
    let mut floor_pass = || -> Result<Duration> {
        let t = Instant::now();
        for (p, ks) in keys.iter().enumerate() {
            let wrong = |k: &str| io_error("the floor's GET")(format!("{k}: wrong page"));
            let err = |e: redis::RedisError| io_error("the floor's GET")(e.to_string());
            if let [k] = &ks[..] {
                let v: Vec<u8> = redis::cmd("GET").arg(k).query(&mut *con).map_err(err)?;
                if v.len() != PAGE_SIZE || v[0] != pattern(p) {
                    return Err(wrong(k));
                }
            } else {
                let v: Vec<Vec<u8>> = redis::cmd("MGET").arg(ks).query(&mut *con).map_err(err)?;
                if v.len() != units || v.iter().any(|v| v.len() != PAGE_SIZE || v[0] != pattern(p))
                {
                    return Err(wrong(&ks[0]));
                }
            }
        }
        Ok(t.elapsed())
    };
    let (mut spinning, spinning_left_out) = if io_spin.is_zero() {
        (None, None)
    } else if units > 1 {
        (None, Some("with 2 MiB pages, whose floor is an MGET"))
    } else {
        match SpinningClient::connect(far.url(), io_spin) {
            Ok(c) => (Some(c), None),
            Err(why) => (None, Some(why)),
        }
    };
    let spinning_pass = |c: &mut SpinningClient| -> Result<Duration> {
        let t = Instant::now();
        for (p, k) in keys.iter().map(|ks| &ks[0]).enumerate() {
            let v = c
                .get(k)
                .map_err(|e| io_error("the spinning floor's GET")(e.to_string()))?;
            if v[0] != pattern(p) {
                return Err(io_error("the spinning floor's GET")(format!(
                    "{k}: wrong page"
                )));
            }
        }
        Ok(t.elapsed())
    };
    floor_pass()?;
    if let Some(c) = spinning.as_mut() {
        spinning_pass(c)?;
    }
    engine.pass(pages)?;
    let us = |d: Duration| d.as_secs_f64() * 1e6 / pages as f64;
    let (mut floor, mut spin_floor, mut eng) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        floor.push(us(floor_pass()?));
        if let Some(c) = spinning.as_mut() {
            spin_floor.push(us(spinning_pass(c)?));
        }
        eng.push(us(engine.pass(pages)?));
    }
    let (floor_us, engine_us) = (min(&floor), min(&eng));
    let spinning_floor_us = (!spin_floor.is_empty()).then(|| min(&spin_floor));
    Ok(FarMissReport {
        pages,
        floor_us,
        engine_us,
        ratio: engine_us / floor_us,
        spinning_floor_us,
        spinning_ratio: spinning_floor_us.map(|f| engine_us / f),
        spinning_left_out,
    })
}

/// What [`far_scan`] found: pages per second, best pass of each side.
#[derive(Debug, Clone, PartialEq)]
pub struct FarScanReport {
    /// Pages per pass.
    pub pages: usize,
    /// Readahead window (pages) of the batched side.
    pub readahead: u32,
    /// With readahead (one `MGET` per window) and fault-around.
    pub batched_pages_per_s: f64,
    /// One `GET` per fault.
    pub single_pages_per_s: f64,
    /// `batched / single`.
    pub ratio: f64,
}

/// One scan side: a pager with `readahead` and `fault_around`, a fresh
/// region per pass, one byte read per page.
fn scan_side(
    store: &Arc<dyn Store>,
    pages: usize,
    passes: usize,
    readahead: u32,
    fault_around: usize,
    io_spin: Duration,
) -> Result<Vec<f64>> {
    let pager = Pager::builder()
        .io_spin(io_spin)
        .delivery(Delivery::InThread)
        .keep_unmapped(0)
        .readahead(readahead, 2)
        .fault_around(fault_around)
        .build()?;
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: false,
        ..MapOptions::default()
    };
    let mut rates = Vec::new();
    for _ in 0..passes + 1 {
        // SAFETY: the workload's stores and files are its own, and it changes them only through
        // its regions (the store contract).
        let region = unsafe { pager.map_store(store.clone(), pages * PAGE_SIZE, &opts) }?;
        let t = touch(region.as_ptr() as usize, pages, PAGE_SIZE)?;
        region.unmap()?;
        rates.push(pages as f64 / t.as_secs_f64());
    }
    rates.remove(0); // the warm-up
    Ok(rates)
}

/// Sequential scan with `MGET` readahead against one `GET` per fault; see
/// the module docs.
pub fn far_scan(
    far: &Far,
    pages: usize,
    passes: usize,
    readahead: u32,
    io_spin: Duration,
) -> Result<FarScanReport> {
    if pages == 0 || passes == 0 || readahead == 0 {
        return Err(Error::Config(
            "far-scan needs pages, passes and a readahead window".into(),
        ));
    }
    let store: Arc<dyn Store> = Arc::new(far.filled("scan", pages, |o| pattern(o / PAGE_SIZE))?);
    let batched = scan_side(&store, pages, passes, readahead, 64, io_spin)?;
    let single = scan_side(&store, pages, passes, 0, 0, io_spin)?;
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (b, s) = (best(&batched), best(&single));
    Ok(FarScanReport {
        pages,
        readahead,
        batched_pages_per_s: b,
        single_pages_per_s: s,
        ratio: b / s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A server that answers any request with `reply`, once.
    fn answering(reply: &'static [u8]) -> crate::far::StoreUrl {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut req = [0u8; 256];
            let _ = c.read(&mut req);
            c.write_all(reply).unwrap();
            std::thread::sleep(Duration::from_secs(30));
        });
        crate::far::StoreUrl(format!("redis://127.0.0.1:{port}"))
    }

    /// A nil or an error is an error at once: the client waited for a
    /// page's bytes for ever (found by review).
    #[test]
    fn a_reply_that_is_not_a_page_is_an_error() {
        for reply in [&b"$-1\r\n"[..], b"-BUSY the server is busy\r\n"] {
            let url = answering(reply);
            let mut c = SpinningClient::connect(&url, Duration::from_micros(50)).unwrap();
            let t = Instant::now();
            let r = c.get("k").map(|_| ());
            assert!(r.is_err(), "{:?}", String::from_utf8_lossy(reply));
            assert!(t.elapsed() < Duration::from_secs(5));
        }
    }
}
