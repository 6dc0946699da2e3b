//! `RedisStore`'s connections: the standalone or cluster client, the pool
//! of idle connections (one per concurrent caller, so one per I/O worker),
//! the retry loop with its time budget, and the cluster's hash slots.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use ::redis::cluster::{ClusterClient, ClusterConnection};
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Cmd, ConnectionInfo, RedisError, RedisResult, RetryMethod, Value};

/// The first pause between two tries of a call; it doubles after each.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// Idle connections kept beyond this many are closed (more callers than
/// that at once are not expected: the engine has a handful of workers).
const MAX_IDLE: usize = 64;

/// The servers a store talks to.
pub(super) enum Backend {
    /// One server.
    Standalone(::redis::Client),
    /// A cluster, reached through any of these nodes.
    Cluster(Vec<ConnectionInfo>),
}

/// One connection: to the server, or to the cluster (a connection per
/// node, made as slots are reached, and the slot map).
pub(super) enum Conn {
    /// To a standalone server.
    Single(::redis::Connection),
    /// To a cluster.
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    /// The reply to one command (routed by its key in a cluster).
    pub(super) fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(c.as_mut()),
        }
    }

    /// The reply to one command of several sent one after another within
    /// one try, by `deadline`: the sockets wait only what is left of it.
    /// (Not a pipeline: a pipeline's replies are read one by one, each
    /// waiting the full socket timeout after the first timed out, so a
    /// pipeline of N commands to a stalled server waited N timeouts.)
    pub(super) fn query_by(&mut self, cmd: &Cmd, deadline: Instant) -> RedisResult<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into());
        }
        self.set_timeouts(left.max(Duration::from_millis(1)))?;
        self.query(cmd)
    }

    /// The reply of any one node to a command without a key (`INFO`).
    pub(super) fn query_any_node(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query(c),
            Conn::Cluster(c) => {
                c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
            }
        }
    }

    /// Sets the read and write timeouts of every socket.
    fn set_timeouts(&self, t: Duration) -> RedisResult<()> {
        match self {
            Conn::Single(c) => {
                c.set_read_timeout(Some(t))?;
                c.set_write_timeout(Some(t))
            }
            Conn::Cluster(c) => {
                c.set_read_timeout(Some(t))?;
                c.set_write_timeout(Some(t))
            }
        }
    }
}

/// Why one try of a call failed.
pub(super) enum CallError {
    /// The client or the server failed: retried unless the crate calls it
    /// permanent.
    Redis(RedisError),
    /// The server answered with something that is not a page (a value of
    /// the wrong length, a reply of the wrong shape): never retried, never
    /// taken for a page.
    Bad(String),
}

impl From<RedisError> for CallError {
    fn from(e: RedisError) -> Self {
        CallError::Redis(e)
    }
}

/// Why a call failed after its last try.
#[derive(Debug)]
pub(super) struct Failure {
    /// What the engine gets: `ETIMEDOUT` for a timeout, `EIO` otherwise.
    pub(super) errno: i32,
    /// What went wrong, for logs and typed errors.
    pub(super) message: String,
}

/// What every store opened from one URL shares (clones made by
/// `with_prefix` included): the client and the idle connections.
pub(super) struct Shared {
    pub(super) backend: Backend,
    /// The URL, for logs.
    pub(super) url: String,
    /// The server, spelled one way (`RedisUrl::server_key`).
    pub(super) server: String,
    pub(super) timeout: Duration,
    pub(super) attempts: u32,
    idle: Mutex<Vec<Conn>>,
}

impl Shared {
    /// A client for `backend` with no connection yet.
    pub(super) fn new(
        backend: Backend,
        url: String,
        server: String,
        timeout: Duration,
        attempts: u32,
    ) -> Self {
        Shared {
            backend,
            url,
            server,
            timeout,
            attempts,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A new connection whose connect and commands each wait at most `t`.
    pub(super) fn connect(&self, t: Duration) -> RedisResult<Conn> {
        let conn = match &self.backend {
            Backend::Standalone(client) => Conn::Single(client.get_connection_with_timeout(t)?),
            Backend::Cluster(nodes) => {
                // One retry inside the crate lets it follow a MOVED or ASK
                // redirect (a slot migrating) on its own; everything else
                // is retried by `call`, on a fresh connection. Its pause
                // before a retry of `TRYAGAIN` is kept short (the crate's
                // own is at least 1.28 s, past a whole try's timeout): a
                // multi-key command that gets it is sent again a key at a
                // time instead (`redis_pages.rs`).
                let client = ClusterClient::builder(nodes.iter().cloned())
                    .connection_timeout(t)
                    .response_timeout(t)
                    .retries(1)
                    .min_retry_wait(5)
                    .max_retry_wait(50)
                    .build()?;
                Conn::Cluster(Box::new(client.get_connection()?))
            }
        };
        conn.set_timeouts(t)?;
        Ok(conn)
    }

    /// Returns a connection that just worked to the pool.
    pub(super) fn put_back(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// Runs `op` on a connection, trying up to `attempts` times within
    /// about `timeout × attempts` in all. `op` gets the try's deadline,
    /// for a try of several commands ([`Conn::query_by`]); a try of one
    /// command needs none (the sockets' timeouts are the try's).
    ///
    /// The first try takes an idle connection if there is one; every retry
    /// makes a fresh one (after an I/O error the idle ones are likely dead
    /// too, so they are closed as well), after a pause of 10 ms doubling.
    /// Later tries get only what is left of the budget as their timeouts.
    /// A connection that failed is never reused: a reply still on its way
    /// would be read as the answer to the next command.
    ///
    /// Hazard (not handled): within one try, the cluster client sends a
    /// command again on the same node socket after an I/O timeout (the one
    /// retry it is given, to follow redirects). After a timed-out *reply*
    /// that is sound (it skips the late reply; `redis_cluster_tests`'s
    /// stalled-node test). A *send* cut by the timeout, a batch larger
    /// than the sockets' buffers to a node that stalls, would be sent again
    /// whole after the part already sent, and the node would read the
    /// start of the second copy as the rest of the first. On loopback a
    /// slot's largest batch (64 pages) fits the buffers.
    pub(super) fn call<T>(
        &self,
        what: &str,
        mut op: impl FnMut(&mut Conn, Instant) -> Result<T, CallError>,
    ) -> Result<T, Failure> {
        let start = Instant::now();
        let budget = self.timeout.saturating_mul(self.attempts);
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            let left = budget.saturating_sub(start.elapsed());
            let result = self.try_once(attempt, left, &mut op);
            let err = match result {
                Ok(v) => return Ok(v),
                Err(CallError::Bad(message)) => {
                    tracing::error!(url = %self.url, what, %message, "redis store: bad reply");
                    return Err(Failure {
                        errno: libc::EIO,
                        message,
                    });
                }
                Err(CallError::Redis(e)) => e,
            };
            if err.is_io_error() {
                self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
            let permanent = matches!(err.retry_method(), RetryMethod::NoRetry);
            let out_of_time = start.elapsed() + backoff >= budget;
            if permanent || attempt >= self.attempts || out_of_time {
                let errno = if err.is_timeout() {
                    libc::ETIMEDOUT
                } else {
                    libc::EIO
                };
                tracing::warn!(url = %self.url, what, attempt, error = %err, "redis store: call failed");
                return Err(Failure {
                    errno,
                    message: err.to_string(),
                });
            }
            tracing::warn!(
                url = %self.url, what, attempt, error = %err, ?backoff,
                "redis store: retrying on a new connection"
            );
            thread::sleep(backoff);
            backoff = (backoff * 2).min(self.timeout);
            attempt += 1;
        }
    }

    /// One try of `call`: `left` is what remains of its time budget.
    fn try_once<T>(
        &self,
        attempt: u32,
        left: Duration,
        op: &mut impl FnMut(&mut Conn, Instant) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        let pooled = if attempt == 1 {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
        } else {
            None
        };
        // A timeout of zero means "none" to the sockets: keep a floor.
        let t = self.timeout.min(left).max(Duration::from_millis(1));
        let shortened = t < self.timeout;
        let start = Instant::now();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect(t)?,
        };
        let v = op(&mut conn, start + t)?;
        // Put back only connections that wait the full timeout: not one
        // made on a shortened try (a cluster connection keeps the connect
        // timeout it was made with for the nodes it reaches later), and
        // not one whose timeouts `query_by` shortened and that cannot be
        // set back.
        if !shortened && conn.set_timeouts(self.timeout).is_ok() {
            self.put_back(conn);
        }
        Ok(v)
    }

    /// How many idle connections the pool holds.
    #[cfg(test)]
    pub(super) fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0, no reflection), the
/// checksum Redis Cluster hashes keys with.
pub(super) fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster hash slot of `key`: the CRC16 of its hash tag (the bytes
/// between the first `{` and the first `}` after it, if there are any)
/// or of the whole key, modulo 16384.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) & 0x3FFF
}
