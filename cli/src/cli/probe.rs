//! `uffd-pager probe`: what this kernel and process allow.

use super::json::Json;
use super::{CliError, CliResult};
use clap::Args;
use uffd_pager::PAGE_SIZE;
use uffd_pager_cli::far::{Far, StoreUrl};
use uffd_pager_cli::os::mem::{self, Memfd};
use uffd_pager_cli::os::uffd::{
    feature, feature_names, ioctl, ioctl_names, probe, Grants, RegisterMode, Uffd,
};

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Check a far-memory store instead (`redis://HOST:PORT[/DB]` or
    /// `redis-cluster://HOST:PORT,...`): connect, describe the server, and
    /// write one page through the store and read it back through the store
    /// and through a plain client, in a namespace deleted afterwards.
    /// Exit 1 if any of it fails.
    #[arg(long, value_name = "URL")]
    store: Option<StoreUrl>,
}

/// Features asked for on the descriptor that registers the sample ranges:
/// those that widen what a range offers, none that change how faults are
/// reported (SIGBUS, WP_ASYNC, events).
const RANGE_FEATURES: u64 = feature::PAGEFAULT_FLAG_WP
    | feature::MISSING_SHMEM
    | feature::MINOR_SHMEM
    | feature::WP_HUGETLBFS_SHMEM
    | feature::WP_UNPOPULATED
    | feature::POISON
    | feature::MOVE;
const RANGE_PAGES: usize = 16;

/// A sample range: what it was registered with and what it offers.
struct RangeProbe {
    what: &'static str,
    mode: &'static str,
    ioctls: Result<u64, String>,
}

struct Report {
    kernel: String,
    euid: u32,
    /// `vm.unprivileged_userfaultfd`, if readable.
    sysctl: Option<String>,
    umo: Result<Grants, i32>,
    full: Result<Grants, i32>,
    dev_present: bool,
    dev_open: Result<(), String>,
    /// Features of the range descriptor, and whether it is user-mode-only.
    range_fd: Result<(u64, bool), String>,
    ranges: Vec<RangeProbe>,
    /// 2 MiB huge pages: (reserved, free, reserved for mappings), if the
    /// kernel has hugetlb.
    huge_2m: Option<(u64, u64, u64)>,
}

/// The hugetlb pool of 2 MiB pages: (nr, free, resv).
fn huge_pages_2m() -> Option<(u64, u64, u64)> {
    uffd_pager::HugePagePool::read().map(|p| (p.total, p.free, p.reserved))
}

impl Report {
    fn non_umo(&self) -> bool {
        self.full.is_ok() || (self.dev_present && self.dev_open.is_ok())
    }
    fn granted(&self) -> u64 {
        let f = |r: &Result<Grants, i32>| r.as_ref().map_or(0, |g| g.features);
        f(&self.full) | f(&self.umo)
    }
    fn in_thread(&self) -> bool {
        self.granted() & feature::SIGBUS != 0
    }
    fn threads(&self) -> bool {
        self.umo.is_ok() || self.non_umo()
    }
}

fn errno_str(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

fn kernel_release() -> String {
    // SAFETY: a zeroed utsname is valid for uname to fill; on success its
    // `release` field is a NUL-terminated string inside the struct.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".into();
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

fn register_sample(uffd: &Uffd, shared: bool) -> RangeProbe {
    let len = RANGE_PAGES * PAGE_SIZE;
    let (what, mode_name, m) = if shared {
        (
            "memfd shared",
            "MINOR|MISSING",
            RegisterMode::MINOR | RegisterMode::MISSING,
        )
    } else {
        (
            "anonymous",
            "MISSING|WP",
            RegisterMode::MISSING | RegisterMode::WRITE_PROTECT,
        )
    };
    let ioctls = (|| {
        let memfd = if shared {
            Some(Memfd::new(c"uffd-pager-probe", len).map_err(|e| format!("memfd: {e}"))?)
        } else {
            None
        };
        let map = match &memfd {
            Some(fd) => fd.map_shared(len),
            None => mem::anonymous(len),
        }
        .map_err(|e| format!("mmap: {e}"))?;
        let addr = map.as_ptr() as usize;
        let r = uffd
            .register(addr, len, m)
            .map_err(|e| format!("UFFDIO_REGISTER: {}", errno_str(e)));
        let _ = uffd.unregister(addr, len);
        r
    })();
    RangeProbe {
        what,
        mode: mode_name,
        ioctls,
    }
}

fn gather() -> Report {
    let umo = probe(true);
    let full = probe(false);
    let dev = std::path::Path::new("/dev/userfaultfd");
    let dev_present = dev.exists();
    let dev_open = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .map(drop)
        .map_err(|e| e.to_string());
    let mut r = Report {
        kernel: kernel_release(),
        // SAFETY: geteuid has no preconditions and cannot fail.
        euid: unsafe { libc::geteuid() },
        sysctl: std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
            .ok()
            .map(|s| s.trim().to_string()),
        umo,
        full,
        dev_present,
        dev_open,
        range_fd: Err(String::new()),
        ranges: Vec::new(),
        huge_2m: huge_pages_2m(),
    };
    let want = RANGE_FEATURES & r.granted();
    let umo_only = !r.non_umo();
    r.range_fd = match Uffd::open(want, umo_only, false) {
        Ok(uffd) => {
            r.ranges = vec![register_sample(&uffd, false), register_sample(&uffd, true)];
            Ok((want, umo_only))
        }
        Err(e) => Err(e),
    };
    r
}

/// Runs the probe and prints its report.
pub fn run(a: &ProbeArgs) -> CliResult {
    if let Some(url) = &a.store {
        return probe_store(url, a.json);
    }
    let r = gather();
    if a.json {
        super::emit(&format!("{}\n", to_json(&r)))
    } else {
        super::emit(&print_human(&r))
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn range_has(r: &Report, bit: u64) -> Vec<&'static str> {
    r.ranges
        .iter()
        .filter(|p| p.ioctls.as_ref().is_ok_and(|b| b & bit != 0))
        .map(|p| p.what)
        .collect()
}

fn print_human(r: &Report) -> String {
    let mut o = String::new();
    let api = |g: &Result<Grants, i32>| match g {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("refused: {}", errno_str(*e)),
    };
    outln!(o, "kernel                       {}", r.kernel);
    outln!(o, "effective uid                {}", r.euid);
    if let Some(s) = &r.sysctl {
        let meaning = if s == "0" {
            "unprivileged processes: user-mode-only descriptors only"
        } else {
            "unprivileged processes: all faults"
        };
        outln!(o, "vm.unprivileged_userfaultfd  {s} ({meaning})");
    }
    outln!(o, "userfaultfd(2)");
    outln!(o, "  user-mode-only             {}", api(&r.umo));
    outln!(o, "  all faults (no UMO flag)   {}", api(&r.full));
    let dev = match (&r.dev_present, &r.dev_open) {
        (false, _) => "absent".to_string(),
        (true, Ok(())) => "present, opens".to_string(),
        (true, Err(e)) => format!("present, refused: {e}"),
    };
    outln!(o, "/dev/userfaultfd             {dev}");
    outln!(o, "unprivileged (UMO) works     {}", yes(r.umo.is_ok()));
    outln!(o, "non-UMO works (root/dev)     {}", yes(r.non_umo()));
    let feats = |g: &Result<Grants, i32>| g.as_ref().map_or(0, |g| g.features);
    outln!(
        o,
        "\nfeatures                     user-mode-only  all faults"
    );
    for (bit, name) in feature::all() {
        let (u, f) = (feats(&r.umo) & bit != 0, feats(&r.full) & bit != 0);
        outln!(o, "  {name:<26} {:<15} {}", yes(u), yes(f));
    }
    let ioctls = r
        .full
        .as_ref()
        .or(r.umo.as_ref())
        .map_or(0, |g: &Grants| g.ioctls);
    outln!(
        o,
        "descriptor ioctls            {}",
        ioctl_names(ioctls).join(" ")
    );
    match r.huge_2m {
        Some((nr, free, resv)) => outln!(o,
            "huge pages (2 MiB)           {nr} reserved, {free} free, {resv} promised to mappings{}",
            if nr == 0 {
                " (reserve some as root: echo N > /proc/sys/vm/nr_hugepages)"
            } else {
                ""
            }
        ),
        None => outln!(o, "huge pages (2 MiB)           none (no hugetlb in this kernel)"),
    }
    outln!(o, "\ndelivery modes");
    let in_thread = if r.in_thread() {
        "usable"
    } else {
        "not usable (no SIGBUS feature)"
    };
    outln!(o, "  in-thread (SIGBUS)         {in_thread}");
    let threads = if r.threads() {
        "usable"
    } else {
        "not usable (userfaultfd refused)"
    };
    outln!(o, "  handler threads            {threads}");
    let kernel_mode = if r.non_umo() {
        "served (handler threads without user-mode-only)"
    } else {
        "not served (user-mode-only only: syscalls get EFAULT)"
    };
    outln!(o, "  faults inside syscalls     {kernel_mode}");
    match &r.range_fd {
        Err(e) => outln!(o, "\nranges: could not open a descriptor: {e}"),
        Ok((f, umo)) => {
            outln!(
                o,
                "\nranges (descriptor: user-mode-only {}, features {})",
                yes(*umo),
                feature_names(*f).join("|")
            );
            for p in &r.ranges {
                let what = format!("{} {}", p.what, p.mode);
                match &p.ioctls {
                    Ok(b) => outln!(o, "  {what:<26} {}", ioctl_names(*b).join(" ")),
                    Err(e) => outln!(o, "  {what:<26} refused: {e}"),
                }
            }
            for (n, name) in [
                (ioctl::MOVE, "MOVE"),
                (ioctl::POISON, "POISON"),
                (ioctl::CONTINUE, "CONTINUE"),
                (ioctl::WRITEPROTECT, "WRITEPROTECT"),
            ] {
                let on = range_has(r, n);
                let s = if on.is_empty() {
                    "no".to_string()
                } else {
                    format!("yes ({})", on.join(", "))
                };
                outln!(o, "  {name:<26} {s}");
            }
        }
    }
    o
}

fn to_json(r: &Report) -> Json {
    let api = |g: &Result<Grants, i32>| match g {
        Ok(g) => Json::obj([
            ("ok", Json::Bool(true)),
            ("features", Json::strs(feature_names(g.features))),
            ("ioctls", Json::strs(ioctl_names(g.ioctls))),
        ]),
        Err(e) => Json::obj([
            ("ok", Json::Bool(false)),
            ("error", Json::str(errno_str(*e))),
        ]),
    };
    let ranges = match &r.range_fd {
        Err(e) => Json::obj([("error", Json::str(e.clone()))]),
        Ok((f, umo)) => Json::obj([
            ("user_mode_only", Json::Bool(*umo)),
            ("features", Json::strs(feature_names(*f))),
            (
                "ranges",
                Json::Arr(
                    r.ranges
                        .iter()
                        .map(|p| {
                            let res = match &p.ioctls {
                                Ok(b) => ("ioctls", Json::strs(ioctl_names(*b))),
                                Err(e) => ("error", Json::str(e.clone())),
                            };
                            Json::obj([
                                ("kind", Json::str(p.what)),
                                ("mode", Json::str(p.mode)),
                                res,
                            ])
                        })
                        .collect(),
                ),
            ),
        ]),
    };
    Json::obj([
        ("kernel", Json::str(r.kernel.clone())),
        ("euid", Json::Int(r.euid as i64)),
        (
            "unprivileged_userfaultfd_sysctl",
            r.sysctl.clone().map_or(Json::Null, Json::Str),
        ),
        ("user_mode_only", api(&r.umo)),
        ("all_faults", api(&r.full)),
        (
            "dev_userfaultfd",
            Json::obj([
                ("present", Json::Bool(r.dev_present)),
                ("opens", Json::Bool(r.dev_present && r.dev_open.is_ok())),
            ]),
        ),
        (
            "unprivileged_user_mode_only_works",
            Json::Bool(r.umo.is_ok()),
        ),
        ("non_user_mode_only_works", Json::Bool(r.non_umo())),
        (
            "delivery",
            Json::obj([
                ("in_thread", Json::Bool(r.in_thread())),
                ("threads", Json::Bool(r.threads())),
                ("kernel_mode_faults", Json::Bool(r.non_umo())),
            ]),
        ),
        ("sample_ranges", ranges),
        (
            "huge_pages_2m",
            r.huge_2m.map_or(Json::Null, |(nr, free, resv)| {
                Json::obj([
                    ("reserved", Json::Int(nr as i64)),
                    ("free", Json::Int(free as i64)),
                    ("promised", Json::Int(resv as i64)),
                ])
            }),
        ),
    ])
}

/// `probe --store URL`: see [`ProbeArgs::store`].
fn probe_store(url: &StoreUrl, json: bool) -> CliResult {
    use uffd_pager::store::{RedisOptions, RedisStore, Store};
    let fail = |m: String| CliError::Runtime(format!("probe --store {url}: {m}"));
    let about =
        RedisStore::ping(&url.0, &RedisOptions::default()).map_err(|e| fail(e.to_string()))?;
    let far = Far::open(url, "probe").map_err(|e| fail(e.to_string()))?;
    let store = far.store("page", 1).map_err(|e| fail(e.to_string()))?;
    let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8 + 1).collect();
    let t = std::time::Instant::now();
    store
        .write(0, &page)
        .map_err(|e| fail(format!("writing a page: {e}")))?;
    let written = t.elapsed();
    let mut back = vec![0u8; PAGE_SIZE];
    let t = std::time::Instant::now();
    store
        .read(0, &mut back)
        .map_err(|e| fail(format!("reading the page: {e}")))?;
    let read = t.elapsed();
    if back != page {
        return Err(fail(
            "the page read back differs from the page written".into(),
        ));
    }
    let plain = far.read_back(&store).map_err(|e| fail(e.to_string()))?;
    if plain != page {
        return Err(fail(
            "a plain client reads another page than the store wrote".into(),
        ));
    }
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    let mut o = String::new();
    if json {
        let j = Json::obj([
            ("store", Json::str(url.0.clone())),
            ("server", Json::str(about)),
            ("write_us", Json::Num(us(written))),
            ("read_us", Json::Num(us(read))),
            ("round_trip_ok", Json::Bool(true)),
        ]);
        outln!(o, "{j}");
    } else {
        outln!(o, "store {url}: {about}");
        outln!(o,
            "  one page written ({:.0} us) and read back ({:.0} us) through the store, and read back by a plain client: ok",
            us(written),
            us(read)
        );
    }
    super::emit(&o)
}
