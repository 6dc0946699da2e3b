//! The shim's settings, read once from the environment when the library
//! loads. A bad value stops the program before `main` with a message on
//! stderr and exit code 2: a crash later, inside the program, would be
//! worse.

use engine::store::LatencyModel;
use engine::{Delivery, InstallKind, Policy};
use std::ffi::CString;

/// What the shim was told.
#[derive(Debug)]
pub struct Config {
    /// `UFFD_PAGER_FILES`: colon-separated fnmatch(3) patterns of resolved
    /// paths whose mappings the pager serves.
    pub files: Vec<CString>,
    /// `UFFD_PAGER_ANON_MIN`: private anonymous mappings at least this
    /// large are served (None: none are).
    pub anon_min: Option<usize>,
    /// `UFFD_PAGER_BUDGET`: bytes (0: unlimited).
    pub budget: u64,
    /// `UFFD_PAGER_POLICY`.
    pub policy: Policy,
    /// `UFFD_PAGER_DELIVERY` (default: handler threads, which also serve
    /// faults inside system calls where the process may open a full
    /// descriptor; elsewhere the read and write calls keep their buffers
    /// resident: `maps::resident_for_call`).
    pub delivery: Delivery,
    /// `UFFD_PAGER_READAHEAD`: pages (0: none; unset: the engine's 32).
    pub readahead: Option<u32>,
    /// `UFFD_PAGER_FAULT_AROUND`: pages (0: none; unset: the engine's 64).
    pub fault_around: Option<usize>,
    /// `UFFD_PAGER_LATENCY`: a latency model added to every file read
    /// (`fixed:50us`, `exp:100us`, ...).
    pub latency: Option<LatencyModel>,
    /// `UFFD_PAGER_KIND`: how a file's pages are installed (shared memfd,
    /// the default, or anonymous copies for read-only mappings).
    pub kind: InstallKind,
    /// `UFFD_PAGER_STATS`: where the counters go at exit (`.json`: JSON;
    /// `%p` is replaced by the process id), written by a process that made
    /// a pager.
    pub stats: Option<String>,
    /// `UFFD_PAGER_VERBOSE=1`: one stderr line per decision.
    pub verbose: bool,
}

/// A size: bytes, or with a K/M/G suffix (powers of 1024).
pub fn size(v: &str) -> Result<u64, String> {
    let v = v.trim();
    let (num, mul) = match v.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mul = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{v:?}: unknown suffix {c:?} (K, M, G, T)")),
            };
            (&v[..i], mul)
        }
        _ => (v, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{v:?} is not a size (bytes, or a number with K, M, G or T)"))
}

impl Config {
    /// Reads the environment through `get`.
    pub fn from(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let bad = |k: &str, e: String| format!("{k}: {e}");
        let files = match get("UFFD_PAGER_FILES") {
            Some(v) => v
                .split(':')
                .filter(|p| !p.is_empty())
                .map(|p| CString::new(p).map_err(|_| bad("UFFD_PAGER_FILES", "NUL byte".into())))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let num = |k: &str| -> Result<Option<u64>, String> {
            get(k).map(|v| size(&v).map_err(|e| bad(k, e))).transpose()
        };
        let anon_min = num("UFFD_PAGER_ANON_MIN")?.map(|n| n.max(1) as usize);
        let budget = num("UFFD_PAGER_BUDGET")?.unwrap_or(0);
        // (The engine's least budget, named here rather than as a failed
        // build at the first mapping.)
        let least = engine::limits::MIN_BUDGET_PAGES * engine::PAGE_SIZE as u64;
        if budget > 0
            && budget.div_ceil(engine::PAGE_SIZE as u64) < engine::limits::MIN_BUDGET_PAGES
        {
            return Err(bad(
                "UFFD_PAGER_BUDGET",
                format!("{budget} bytes is under the least budget, {least} (0 is none)"),
            ));
        }
        let policy = match get("UFFD_PAGER_POLICY") {
            Some(v) => v.parse().map_err(|e| bad("UFFD_PAGER_POLICY", e))?,
            None => Policy::default(),
        };
        let delivery = match get("UFFD_PAGER_DELIVERY") {
            Some(v) => v.parse().map_err(|e| bad("UFFD_PAGER_DELIVERY", e))?,
            None => Delivery::Threads {
                threads: Delivery::per_cpu_threads(),
                spin_us: 0,
            },
        };
        let pages = |k: &str| -> Result<Option<u64>, String> {
            get(k)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map(|n| n.min(1 << 16))
                        .map_err(|_| bad(k, format!("{v:?} is not a page count")))
                })
                .transpose()
        };
        let readahead = pages("UFFD_PAGER_READAHEAD")?.map(|n| n as u32);
        let fault_around = pages("UFFD_PAGER_FAULT_AROUND")?.map(|n| n as usize);
        let latency = match get("UFFD_PAGER_LATENCY") {
            Some(v) => Some(v.parse().map_err(|e| bad("UFFD_PAGER_LATENCY", e))?),
            None => None,
        };
        let kind = match get("UFFD_PAGER_KIND").as_deref() {
            None | Some("shared") => InstallKind::Shared,
            Some("anonymous") => InstallKind::Anonymous,
            Some(v) => {
                return Err(bad(
                    "UFFD_PAGER_KIND",
                    format!("{v:?} (shared or anonymous)"),
                ))
            }
        };
        let verbose = match get("UFFD_PAGER_VERBOSE").as_deref() {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(bad("UFFD_PAGER_VERBOSE", format!("{v:?} (0 or 1)"))),
        };
        Ok(Config {
            files,
            anon_min,
            budget,
            policy,
            delivery,
            readahead,
            fault_around,
            latency,
            kind,
            stats: get("UFFD_PAGER_STATS"),
            verbose,
        })
    }

    /// Whether `path` matches one of the file patterns.
    pub fn wants_path(&self, path: &std::ffi::CStr) -> bool {
        self.files.iter().any(|p| {
            // SAFETY: both are NUL-terminated strings.
            unsafe { libc::fnmatch(p.as_ptr(), path.as_ptr(), 0) == 0 }
        })
    }

    /// The pager these settings describe.
    pub fn builder(&self) -> engine::PagerBuilder {
        let mut b = engine::Pager::builder()
            .policy(self.policy)
            .delivery(self.delivery)
            .budget_pages(self.budget.div_ceil(engine::PAGE_SIZE as u64));
        if let Some(n) = self.readahead {
            b = b.readahead(n, 2);
        }
        if let Some(n) = self.fault_around {
            b = b.fault_around(n);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn sizes_and_settings_parse() {
        assert_eq!(size("1G"), Ok(1 << 30));
        assert_eq!(size("64m"), Ok(64 << 20));
        assert_eq!(size("4096"), Ok(4096));
        assert!(size("12Q").is_err() && size("x").is_err() && size("99999999999T").is_err());
        let c = Config::from(env(&[
            ("UFFD_PAGER_FILES", "/data/*.db:/tmp/x"),
            ("UFFD_PAGER_BUDGET", "16M"),
            ("UFFD_PAGER_POLICY", "vanilla"),
            ("UFFD_PAGER_LATENCY", "fixed:50us"),
        ]))
        .unwrap();
        assert_eq!(c.files.len(), 2);
        assert_eq!(c.budget, 16 << 20);
        assert!(c.wants_path(c"/data/a.db") && !c.wants_path(c"/data/a.txt"));
        assert!(c.latency.is_some() && c.anon_min.is_none());
    }

    #[test]
    fn every_bad_value_names_its_variable() {
        for (k, v) in [
            ("UFFD_PAGER_BUDGET", "lots"),
            ("UFFD_PAGER_BUDGET", "8K"),
            ("UFFD_PAGER_POLICY", "fast"),
            ("UFFD_PAGER_DELIVERY", "post"),
            ("UFFD_PAGER_LATENCY", "soon"),
            ("UFFD_PAGER_KIND", "odd"),
            ("UFFD_PAGER_ANON_MIN", "-1"),
            ("UFFD_PAGER_READAHEAD", "many"),
            ("UFFD_PAGER_VERBOSE", "yes"),
        ] {
            let e = Config::from(env(&[(k, v)])).unwrap_err();
            assert!(e.starts_with(k), "{e}");
        }
    }
}
