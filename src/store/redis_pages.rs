//! `RedisStore`'s page I/O: the commands and batches that `read`,
//! `read_many`, `write` and `write_many` send, and the checks of what comes
//! back.

use ::redis::{Cmd, Value};

use super::conn::{self, Backend, CallError, Failure};
use super::{page_key, RedisStore, RedisStoreError};
use crate::store::zero::in_bounds;
use crate::store::StoreError;
use crate::sys::PAGE_SIZE;

impl RedisStore {
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

    /// Fills `buf` (whole pages from `first`) with a `GET`, or `MGET`s.
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
                .call("GET", |c, _| fill_page(&keys[0], c.query(&get)?, buf));
            return r.map_err(|f| StoreError(f.errno));
        }
        let groups = self.groups(&(first..first + n as u64).collect::<Vec<_>>());
        self.shared
            .call("MGET", |c, deadline| {
                for g in &groups {
                    let mut mget = ::redis::cmd("MGET");
                    for &i in g {
                        mget.arg(&keys[i]);
                    }
                    let items = match c.query_by(&mget, deadline) {
                        Ok(Value::Array(items)) if items.len() == g.len() => items,
                        Ok(other) => return Err(CallError::Bad(format!("MGET replied {other:?}"))),
                        Err(e) if split_slot(&e) => {
                            // The slot's keys are on two nodes while it
                            // migrates: a GET each, which follows its key.
                            for &i in g {
                                let mut get = ::redis::cmd("GET");
                                get.arg(&keys[i]);
                                let page = &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                                fill_page(&keys[i], c.query_by(&get, deadline)?, page)?;
                            }
                            continue;
                        }
                        Err(e) => return Err(e.into()),
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

    /// The most keys one multi-key command names on one server: a 2 MiB
    /// page's 512, so such a page is one round trip, as a plain `MGET` of
    /// its keys (2 MiB in one reply; it was 256, and a 2 MiB page two).
    pub(super) const KEYS_PER_COMMAND: usize = 512;

    /// Indices into `pages` (page numbers) grouped into one multi-key
    /// command each: by hash slot in a cluster (where a command's keys
    /// must share one), in runs of at most [`Self::KEYS_PER_COMMAND`] on
    /// one server.
    pub(super) fn groups(&self, pages: &[u64]) -> Vec<Vec<usize>> {
        let Backend::Cluster(_) = self.shared.backend else {
            return (0..pages.len())
                .collect::<Vec<_>>()
                .chunks(Self::KEYS_PER_COMMAND)
                .map(<[usize]>::to_vec)
                .collect();
        };
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        let mut last: Option<(u64, u16)> = None; // (tag, slot)
        for (i, &p) in pages.iter().enumerate() {
            let tag = p / Self::PAGES_PER_TAG;
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

    /// Writes each `(page index, bytes)`: one `SET` or `DEL`, or per group
    /// of [`groups`](Self::groups) an `MSET` of its non-zero pages and a
    /// `DEL` of its zero ones.
    pub(super) fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let keys: Vec<String> = pages
            .iter()
            .map(|&(p, _)| page_key(&self.prefix, p))
            .collect();
        if let [(_, bytes)] = pages {
            let one = Self::page_cmd(&keys[0], bytes);
            return self
                .shared
                .call("SET", |c, _| c.query(&one).map(drop).map_err(Into::into))
                .map_err(|f| StoreError(f.errno));
        }
        let numbers: Vec<u64> = pages.iter().map(|&(p, _)| p).collect();
        let mut cmds: Vec<(Cmd, Vec<usize>)> = Vec::new();
        for g in self.groups(&numbers) {
            let (zero, data): (Vec<usize>, Vec<usize>) = g
                .into_iter()
                .partition(|&i| pages[i].1.iter().all(|&b| b == 0));
            if !data.is_empty() {
                let mut mset = ::redis::cmd("MSET");
                for &i in &data {
                    mset.arg(&keys[i]).arg(pages[i].1);
                }
                cmds.push((mset, data));
            }
            if !zero.is_empty() {
                let mut del = ::redis::cmd("DEL");
                for &i in &zero {
                    del.arg(&keys[i]);
                }
                cmds.push((del, zero));
            }
        }
        self.shared
            .call("MSET", |c, deadline| {
                for (cmd, members) in &cmds {
                    match c.query_by(cmd, deadline) {
                        Ok(_) => {}
                        Err(e) if split_slot(&e) => {
                            // As in `read_pages`: a command per page.
                            for &i in members {
                                c.query_by(&Self::page_cmd(&keys[i], pages[i].1), deadline)?;
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            })
            .map_err(|f| StoreError(f.errno))
    }
}

/// Whether a multi-key command failed because its slot is migrating and
/// its keys are on two nodes (`TRYAGAIN`; `ASK` where the crate could not
/// follow it): each key alone can still be reached.
pub(super) fn split_slot(e: &::redis::RedisError) -> bool {
    use ::redis::{ErrorKind, ServerErrorKind};
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::Ask)
    )
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
