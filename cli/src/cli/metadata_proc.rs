//! Reading this process's memory figures for `bench metadata`: VmRSS and
//! friends from `/proc/self/status` and `smaps_rollup`, and its mappings
//! with their Rss from `/proc/self/smaps`.

use super::CliError;

/// Memory figures of this process, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Mem {
    /// VmRSS.
    pub(super) rss: u64,
    /// VmSize.
    pub(super) size: u64,
    /// VmPTE: the kernel's page tables (not part of VmRSS).
    pub(super) pte: u64,
    /// Rss from `/proc/self/smaps_rollup`: exact (a page-table walk), where
    /// VmRSS sums per-CPU counters that may lag by a few hundred KiB.
    pub(super) exact: u64,
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> CliError + '_ {
    move |e| CliError::Runtime(format!("{what}: {e}"))
}

/// `"  1234 kB"` in bytes.
fn kb_field(v: &str) -> u64 {
    v.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
        * 1024
}

/// Reads VmRSS, VmSize and VmPTE from `/proc/self/status` and Rss from
/// `/proc/self/smaps_rollup`.
pub(super) fn mem_now() -> Result<Mem, CliError> {
    let s = std::fs::read_to_string("/proc/self/status")
        .map_err(io_err("reading /proc/self/status"))?;
    let mut m = Mem::default();
    for line in s.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k {
            "VmRSS" => m.rss = kb_field(v),
            "VmSize" => m.size = kb_field(v),
            "VmPTE" => m.pte = kb_field(v),
            _ => {}
        }
    }
    let roll = std::fs::read_to_string("/proc/self/smaps_rollup")
        .map_err(io_err("reading /proc/self/smaps_rollup"))?;
    m.exact = roll
        .lines()
        .find_map(|l| l.strip_prefix("Rss:"))
        .map_or(0, kb_field);
    if m.rss == 0 || m.size == 0 {
        return Err(CliError::Runtime(
            "/proc/self/status has no VmRSS/VmSize".into(),
        ));
    }
    Ok(m)
}

/// One mapping of `/proc/self/smaps`: `[start, end)` and its Rss in bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Map {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) rss: u64,
}

impl Map {
    pub(super) fn len(&self) -> usize {
        self.end - self.start
    }
}

/// The mappings of this process with their Rss.
pub(super) fn mappings() -> Result<Vec<Map>, CliError> {
    let s =
        std::fs::read_to_string("/proc/self/smaps").map_err(io_err("reading /proc/self/smaps"))?;
    let mut v: Vec<Map> = Vec::new();
    for line in s.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if let Some(m) = v.last_mut() {
                m.rss = kb_field(rss);
            }
            continue;
        }
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                v.push(Map { start, end, rss: 0 });
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc() {
        let m = mem_now().unwrap();
        assert!(m.rss > 0 && m.size >= m.rss && m.exact > 0);
        assert!(mappings().unwrap().iter().any(|m| m.rss > 0));
    }
}
