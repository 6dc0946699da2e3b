//! `RedisStore`'s URLs, options checks, typed errors and first connection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, IntoConnectionInfo};

use super::conn::{Backend, Conn, Shared};
use super::RedisOptions;
use crate::sys::PAGE_SIZE;

/// Why a [`RedisStore`](super::RedisStore) could not be opened, or one of
/// its own operations ([`clear`](super::RedisStore::clear),
/// [`ping`](super::RedisStore::ping)) failed. Page reads and writes fail
/// with a plain [`StoreError`](crate::store::StoreError) instead.
///
/// ```
/// use uffd_pager::store::{RedisOptions, RedisStore, RedisStoreError};
///
/// // Checked before connecting: no server needed.
/// let err = RedisStore::open("redis://127.0.0.1:6390", 100, &RedisOptions::default());
/// assert!(matches!(err, Err(RedisStoreError::BadLength(100))));
/// let err = RedisStore::open("http://127.0.0.1", 4096, &RedisOptions::default());
/// assert!(matches!(err, Err(RedisStoreError::BadUrl { .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The URL does not parse (see [`RedisUrl`]).
    #[error("bad Redis URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key prefix is empty, or holds a brace or a control character.
    #[error("bad key prefix {prefix:?}: {reason}")]
    BadPrefix {
        /// The prefix as given.
        prefix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The store length is zero or not a multiple of the page size.
    #[error("bad store length {0}: must be a positive multiple of 4096")]
    BadLength(u64),
    /// A zero timeout or zero attempts.
    #[error("bad Redis options: {0}")]
    BadOptions(&'static str),
    /// The first connection failed.
    #[error("cannot connect to {url}: {message}")]
    Connect {
        /// The server or cluster.
        url: String,
        /// The client's error.
        message: String,
    },
    /// A command failed after every attempt.
    #[error("Redis command failed on {url}: {message}")]
    Command {
        /// The server or cluster.
        url: String,
        /// The client's or the server's error.
        message: String,
    },
    /// The cluster answered, but its state is not `ok`.
    #[error("cluster {url} is in state {state:?}, not ok")]
    ClusterNotOk {
        /// The cluster.
        url: String,
        /// Its `cluster_state` (`fail`, ...).
        state: String,
    },
}

/// A parsed store URL (see [`RedisStore`](super::RedisStore) for the forms).
///
/// ```
/// use uffd_pager::store::RedisUrl;
///
/// let u = RedisUrl::parse("redis://127.0.0.1:6390/2")?;
/// assert_eq!(u, RedisUrl::Standalone { host: "127.0.0.1".into(), port: 6390, db: 2 });
/// let c = RedisUrl::parse("redis-cluster://10.0.0.1:7000,10.0.0.2")?;
/// assert_eq!(c.to_string(), "redis-cluster://10.0.0.1:7000,10.0.0.2:6379");
/// assert!(RedisUrl::parse("redis://host:99999").is_err());
/// # Ok::<(), uffd_pager::store::RedisStoreError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisUrl {
    /// `redis://HOST[:PORT][/DB]`.
    Standalone {
        /// Host name or address (IPv6 without its brackets).
        host: String,
        /// TCP port; 6379 when not given.
        port: u16,
        /// Database number; 0 when not given.
        db: u32,
    },
    /// `redis-cluster://HOST[:PORT],...`: the nodes to start from.
    Cluster {
        /// `(host, port)` of each node listed; never empty.
        nodes: Vec<(String, u16)>,
    },
}

/// Redis's own default port.
const DEFAULT_PORT: u16 = 6379;

impl RedisUrl {
    /// Parses `url`; a typed error says what is wrong, it never panics.
    ///
    /// Example: [`RedisUrl`].
    pub fn parse(url: &str) -> Result<Self, RedisStoreError> {
        let bad = |reason: &str| RedisStoreError::BadUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = url.strip_prefix("redis://") {
            let (hostport, db) = match rest.split_once('/') {
                Some((hp, db)) => (hp, db),
                None => (rest, ""),
            };
            if hostport.contains(',') {
                return Err(bad(
                    "redis:// names one server: a cluster's nodes go in redis-cluster://HOST:PORT,...",
                ));
            }
            let (host, port) = host_port(hostport).map_err(bad)?;
            let db = match db {
                "" => 0,
                d if d.bytes().all(|b| b.is_ascii_digit()) => d
                    .parse()
                    .map_err(|_| bad("the database number is too large"))?,
                _ => return Err(bad("the path must be a database number")),
            };
            Ok(RedisUrl::Standalone { host, port, db })
        } else if let Some(rest) = url.strip_prefix("redis-cluster://") {
            let rest = rest.strip_suffix('/').unwrap_or(rest);
            if rest.contains('/') {
                return Err(bad("a cluster has only database 0: no /DB"));
            }
            let nodes = rest
                .split(',')
                .map(host_port)
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad)?;
            Ok(RedisUrl::Cluster { nodes })
        } else {
            Err(bad("the scheme must be redis:// or redis-cluster://"))
        }
    }

    /// The `redis` crate's URL of each server: one for a standalone
    /// server (with its database), one per seed node of a cluster; an IPv6
    /// host in brackets, as the crate needs it.
    ///
    /// ```
    /// use uffd_pager::store::RedisUrl;
    ///
    /// let u = RedisUrl::parse("redis://[::1]:6390").unwrap();
    /// assert_eq!(u.client_urls(), ["redis://[::1]:6390/0"]);
    /// ```
    pub fn client_urls(&self) -> Vec<String> {
        let n = match self {
            RedisUrl::Standalone { .. } => 1,
            RedisUrl::Cluster { nodes } => nodes.len(),
        };
        (0..n).map(|i| self.client_url(i)).collect()
    }

    /// The crate's URL for node `i` (the server itself if standalone).
    pub(super) fn client_url(&self, i: usize) -> String {
        match self {
            RedisUrl::Standalone { host, port, db } => {
                format!("redis://{}:{port}/{db}", bracketed(host))
            }
            RedisUrl::Cluster { nodes } => {
                let (host, port) = &nodes[i];
                format!("redis://{}:{port}", bracketed(host))
            }
        }
    }
}

impl fmt::Display for RedisUrl {
    /// The URL in full: port and database spelled out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisUrl::Standalone { host, port, db } => {
                write!(f, "redis://{}:{port}/{db}", bracketed(host))
            }
            RedisUrl::Cluster { nodes } => {
                f.write_str("redis-cluster://")?;
                for (i, (host, port)) in nodes.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    write!(f, "{sep}{}:{port}", bracketed(host))?;
                }
                Ok(())
            }
        }
    }
}

impl RedisUrl {
    /// The server this URL reaches, spelled one way however the URL
    /// spells it: each host resolved (its lowest address; as written if
    /// it does not resolve), a cluster's seed nodes sorted, a standalone
    /// server's database. For [`super::RedisStore`]'s identity. Resolves
    /// names, so it is asked once, when a store is opened.
    ///
    /// Hazard: two different seed lists of one cluster, or two addresses
    /// of one server (a proxy, a NAT), still spell two servers.
    pub(super) fn server_key(&self) -> String {
        use std::net::ToSocketAddrs;
        let node = |host: &str, port: u16| match (host, port).to_socket_addrs() {
            Ok(addrs) => addrs
                .min()
                .map_or_else(|| format!("{}:{port}", bracketed(host)), |a| a.to_string()),
            Err(_) => format!("{}:{port}", bracketed(host)),
        };
        match self {
            RedisUrl::Standalone { host, port, db } => {
                format!("redis://{}/{db}", node(host, *port))
            }
            RedisUrl::Cluster { nodes } => {
                let mut v: Vec<String> = nodes.iter().map(|(h, p)| node(h, *p)).collect();
                v.sort();
                v.dedup();
                format!("redis-cluster://{}", v.join(","))
            }
        }
    }
}

/// `host` as written in a URL: IPv6 addresses in brackets.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Parses `HOST[:PORT]` or `[IPV6][:PORT]`.
fn host_port(s: &str) -> Result<(String, u16), &'static str> {
    if s.contains('@') {
        return Err("user names and passwords are not supported");
    }
    if s.contains(['?', '#']) {
        return Err("query strings and fragments are not supported");
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address lacks its ']'")?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("a bad IPv6 address");
        }
        match after {
            "" => (host, None),
            a => (
                host,
                Some(a.strip_prefix(':').ok_or("junk after an IPv6 address")?),
            ),
        }
    } else {
        let (host, port) = match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        if port.is_some_and(|p| p.contains(':')) {
            return Err("IPv6 addresses go in brackets: [::1]:6379");
        }
        let ok = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_';
        if !host.bytes().all(ok) {
            return Err("a host name holds letters, digits, '.', '-' and '_' only");
        }
        // Each dot-separated label has a letter or digit at both ends; one
        // of digits and dots only is an IPv4 address.
        let label = |l: &str| {
            l.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && l.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        };
        // (A fully qualified name may end in a dot.)
        let name = host.strip_suffix('.').unwrap_or(host);
        if !host.is_empty() && !name.split('.').all(label) {
            return Err("a bad host name");
        }
        if host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && host.parse::<std::net::Ipv4Addr>().is_err()
        {
            return Err("a bad IPv4 address");
        }
        (host, port)
    };
    if host.is_empty() {
        return Err("a host is missing");
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err("the port must be a number from 1 to 65535"),
        },
    };
    Ok((host.to_string(), port))
}

/// A key prefix must be non-empty, brace-free (the braces are the hash
/// tag's) and free of control characters.
pub(super) fn check_prefix(prefix: &str) -> Result<(), RedisStoreError> {
    let bad = |reason| RedisStoreError::BadPrefix {
        prefix: prefix.to_string(),
        reason,
    };
    if prefix.is_empty() {
        return Err(bad("it is empty"));
    }
    if prefix.contains(['{', '}']) {
        return Err(bad("it holds '{' or '}', which delimit the hash tag"));
    }
    if prefix.chars().any(char::is_control) {
        return Err(bad("it holds a control character"));
    }
    Ok(())
}

/// The longest [`RedisOptions::timeout`]: a day. (A try's deadline is the
/// clock plus the timeout, which overflows, and panicked, near
/// `Duration::MAX`.)
pub(super) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The prefix, a timeout above zero and at most [`MAX_TIMEOUT`], and at
/// least one attempt.
pub(super) fn check_options(opts: &RedisOptions) -> Result<(), RedisStoreError> {
    check_prefix(&opts.prefix)?;
    if opts.timeout.is_zero() {
        return Err(RedisStoreError::BadOptions("the timeout must not be zero"));
    }
    if opts.timeout > MAX_TIMEOUT {
        return Err(RedisStoreError::BadOptions(
            "the timeout must be at most a day (86,400 s)",
        ));
    }
    if opts.attempts == 0 {
        return Err(RedisStoreError::BadOptions("attempts must be at least 1"));
    }
    Ok(())
}

/// Validates `url` and `opts`, and makes the first connection.
pub(super) fn connect(
    url: &str,
    opts: &RedisOptions,
) -> Result<(Arc<Shared>, Conn), RedisStoreError> {
    let parsed = RedisUrl::parse(url)?;
    check_options(opts)?;
    let bad = |e: ::redis::RedisError| RedisStoreError::BadUrl {
        url: url.to_string(),
        reason: e.to_string(),
    };
    let backend = match &parsed {
        RedisUrl::Standalone { .. } => {
            Backend::Standalone(::redis::Client::open(parsed.client_url(0)).map_err(bad)?)
        }
        RedisUrl::Cluster { nodes } => Backend::Cluster(
            (0..nodes.len())
                .map(|i| parsed.client_url(i).into_connection_info())
                .collect::<Result<_, _>>()
                .map_err(bad)?,
        ),
    };
    let shared = Shared::new(
        backend,
        parsed.to_string(),
        parsed.server_key(),
        opts.timeout,
        opts.attempts,
    );
    let first = shared
        .connect(opts.timeout)
        .map_err(|e| RedisStoreError::Connect {
            url: parsed.to_string(),
            message: e.to_string(),
        })?;
    Ok((Arc::new(shared), first))
}

/// `len` must be a positive multiple of the page size.
pub(super) fn check_len(len: u64) -> Result<(), RedisStoreError> {
    if len == 0 || !len.is_multiple_of(PAGE_SIZE as u64) {
        return Err(RedisStoreError::BadLength(len));
    }
    Ok(())
}

/// The `name:value` lines of an `INFO`-style reply.
pub(super) fn info_fields(conn: &mut Conn, cmd: &Cmd) -> ::redis::RedisResult<String> {
    Ok(::redis::from_redis_value(conn.query_any_node(cmd)?)?)
}

/// The value of `name` in `INFO`-style text, or `?`.
pub(super) fn field<'a>(info: &'a str, name: &str) -> &'a str {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map_or("?", str::trim)
}
