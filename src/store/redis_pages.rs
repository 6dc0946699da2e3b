//! `RedisStore`'s page I/O: the commands and batches that `read`,
//! `read_many`, `write` and `write_many` send, and the checks of what comes
//! back.

use ::redis::{cluster, Cmd, Value};

use super::conn::{self, Backend, Batch, CallError, Failure};
use super::{page_key, RedisStore, RedisStoreError};
use crate::store::zero::in_bounds;
use crate::store::StoreError;
use crate::sys::PAGE_SIZE;

impl RedisStore {
    /// An empty pipeline for this store's backend.
    pub(super) fn batch(&self) -> Batch {
        match self.shared.backend {
            Backend::Standalone(_) => Batch::Single(::redis::pipe()),
            Backend::Cluster(_) => Batch::Cluster(cluster::cluster_pipe()),
        }
    }

    /// A failed call of `clear` as a typed error.
    pub(super) fn command_error(&self, f: Failure) -> RedisStoreError {
        RedisStoreError::Command {
            url: self.shared.url.clone(),
            message: f.message,
        }
    }

    /// The first page of `[offset, offset + n)`, if that is whole pages
    /// within the store; `EINVAL` otherwise.
    pub(super) fn first_page(&self, offset: u64, n: usize) -> Result<u64, StoreError> {
        let page = PAGE_SIZE as u64;
        if !offset.is_multiple_of(page)
            || !n.is_multiple_of(PAGE_SIZE)
            || !in_bounds(offset, n, self.len)
        {
            return Err(StoreError(libc::EINVAL));
        }
        Ok(offset / page)
    }

    /// Fills `buf` (whole pages from `first`) with `GET` or `MGET`s.
    pub(super) fn read_pages(&self, first: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = buf.len() / PAGE_SIZE;
        if n == 0 {
            return Ok(());
        }
        let keys: Vec<String> = (0..n as u64)
            .map(|k| page_key(&self.prefix, first + k))
            .collect();
        if n == 1 {
            let mut get = ::redis::cmd("GET");
            get.arg(&keys[0]);
            let r = self
                .shared
                .call("GET", |c| fill_page(&keys[0], c.query(&get)?, buf));
            return r.map_err(|f| StoreError(f.errno));
        }
        let groups = self.mget_groups(first, n);
        if groups.len() > 1 && matches!(self.shared.backend, Backend::Cluster(_)) {
            // The cluster pipeline refuses MGET: a GET per page instead,
            // still one round trip (per node).
            return self.get_pipeline(&keys, buf);
        }
        // One MGET per group: all of them in one pipeline if there are
        // several (more than 256 pages).
        let cmds: Vec<Cmd> = groups
            .iter()
            .map(|g| {
                let mut mget = ::redis::cmd("MGET");
                for &i in g {
                    mget.arg(&keys[i]);
                }
                mget
            })
            .collect();
        let mut batch = self.batch();
        if cmds.len() > 1 {
            cmds.iter().for_each(|c| batch.add(c.clone()));
        }
        self.shared
            .call("MGET", |c| {
                let replies = match cmds.len() {
                    1 => vec![c.query(&cmds[0])?],
                    _ => batch.run(c)?,
                };
                if replies.len() != groups.len() {
                    return Err(CallError::Bad("MGET: replies missing".to_string()));
                }
                for (g, reply) in groups.iter().zip(replies) {
                    let items = match reply {
                        Value::Array(items) if items.len() == g.len() => items,
                        other => return Err(CallError::Bad(format!("MGET replied {other:?}"))),
                    };
                    for (&i, item) in g.iter().zip(items) {
                        let page = &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                        fill_page(&keys[i], item, page)?;
                    }
                }
                Ok(())
            })
            .map_err(|f| StoreError(f.errno))
    }

    /// Fills `buf` with the pages at `keys` through one pipeline of `GET`s.
    fn get_pipeline(&self, keys: &[String], buf: &mut [u8]) -> Result<(), StoreError> {
        let mut batch = self.batch();
        for key in keys {
            let mut get = ::redis::cmd("GET");
            get.arg(key);
            batch.add(get);
        }
        self.shared
            .call("GET pipeline", |c| {
                let replies = batch.run(c)?;
                if replies.len() != keys.len() {
                    return Err(CallError::Bad("GET pipeline: replies missing".to_string()));
                }
                for (i, reply) in replies.into_iter().enumerate() {
                    fill_page(
                        &keys[i],
                        reply,
                        &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
                    )?;
                }
                Ok(())
            })
            .map_err(|f| StoreError(f.errno))
    }

    /// Indices `0..n` of pages from `first`, grouped into one `MGET` each:
    /// by hash slot in a cluster, in runs of at most 256 on one server.
    pub(super) fn mget_groups(&self, first: u64, n: usize) -> Vec<Vec<usize>> {
        let Backend::Cluster(_) = self.shared.backend else {
            return (0..n)
                .collect::<Vec<_>>()
                .chunks(256)
                .map(<[usize]>::to_vec)
                .collect();
        };
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        let mut last: Option<(u64, u16)> = None; // (tag, slot)
        for i in 0..n {
            let tag = (first + i as u64) / Self::PAGES_PER_TAG;
            let slot = match last {
                Some((t, s)) if t == tag => s,
                _ => conn::key_slot(format!("{}:{tag}", self.prefix).as_bytes()),
            };
            last = Some((tag, slot));
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }

    /// The command that stores `page` at `key`: `DEL` for zeros, else
    /// `SET`.
    pub(super) fn page_cmd(key: &str, page: &[u8]) -> Cmd {
        if page.iter().all(|&b| b == 0) {
            let mut del = ::redis::cmd("DEL");
            del.arg(key);
            del
        } else {
            let mut set = ::redis::cmd("SET");
            set.arg(key).arg(page);
            set
        }
    }

    /// Writes each `(page index, bytes)`: one command, or one pipeline.
    pub(super) fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let cmds: Vec<Cmd> = pages
            .iter()
            .map(|&(p, bytes)| Self::page_cmd(&page_key(&self.prefix, p), bytes))
            .collect();
        let r = match cmds.as_slice() {
            [] => return Ok(()),
            [one] => self
                .shared
                .call("SET", |c| c.query(one).map(drop).map_err(Into::into)),
            _ => {
                let mut batch = self.batch();
                cmds.into_iter().for_each(|c| batch.add(c));
                self.shared
                    .call("SET pipeline", |c| Ok(batch.run(c).map(drop)?))
            }
        };
        r.map_err(|f| StoreError(f.errno))
    }
}

/// Copies a `GET`/`MGET` reply for `key` into `page`: nil is a zero page,
/// a 4096-byte string is the page, anything else an error.
fn fill_page(key: &str, reply: Value, page: &mut [u8]) -> Result<(), CallError> {
    match reply {
        Value::Nil => page.fill(0),
        Value::BulkString(v) if v.len() == page.len() => page.copy_from_slice(&v),
        Value::BulkString(v) => {
            return Err(CallError::Bad(format!(
                "{key} holds {} bytes, not a {}-byte page",
                v.len(),
                page.len()
            )))
        }
        other => return Err(CallError::Bad(format!("{key}: unexpected reply {other:?}"))),
    }
    Ok(())
}
