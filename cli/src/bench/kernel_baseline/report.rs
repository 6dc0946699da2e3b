//! The kernel baseline's report: the engine's rate against the best
//! kernel side's, and the table, footprint and verdict lines it prints.

use super::*;
use crate::bench::verdict::{judged, Goal};

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

impl Report {
    /// The engine's rate over the best kernel side's; NaN where any side
    /// was killed: a killed kernel side might have been the best (found
    /// by review: the verdict was taken against the slower survivor, the
    /// default readahead's when `MADV_RANDOM`'s was killed).
    /// Likewise where any side read a word that differs from the file (its
    /// rate is not of the work asked for: the verdict read `met` above the
    /// error the run then ended with; found by review).
    pub fn ratio(&self) -> f64 {
        if self.no_ratio().is_some() {
            return f64::NAN;
        }
        let best = self.sides[1..].iter().map(Side::rate).fold(0.0, f64::max);
        match self.sides[0].rate() {
            e if best > 0.0 => e / best,
            _ => f64::NAN,
        }
    }

    /// Why there is no ratio, if there is none.
    fn no_ratio(&self) -> Option<&'static str> {
        if self.sides.iter().any(|s| s.killed.is_some()) {
            Some("a side was killed; see its row")
        } else if self.sides.iter().any(|s| s.mismatches > 0) {
            Some("a side read words that differ from the file; see its row")
        } else if self.sides.iter().any(|s| s.rate() <= 0.0) {
            Some("a side did no work in its time")
        } else {
            None
        }
    }

    /// The goal the ratio is held to (issue 14): at least 2× for a scan
    /// with 2 MiB pages (against the kernel's 4 KiB mapping), 1× for the
    /// rest. (Every run was held to 1×, and a 2 MiB scan between 1× and 2×
    /// read `met`; found by review.)
    pub fn goal(&self, k: &Knobs) -> Goal {
        match self.workload {
            Workload::Scan if k.page_size > PAGE_SIZE => Goal::AtLeast(2.0),
            _ => Goal::AtLeast(1.0),
        }
    }

    /// The Markdown table, a heading line before it and the ratio after.
    pub fn table(&self, k: &Knobs, dir: &Path) -> String {
        let mut t = String::new();
        let mib = |pages: u64| (pages * PAGE_SIZE as u64) >> 20;
        let _ = writeln!(
            t,
            "{}, kernel baseline: {} file(s) of {} pages ({} MiB) on {}, budget {} pages, cgroup {} limit {:.1} MiB (budget + {:.1} MiB: footprint and fixed overhead), {} thread(s), {:.1} s per side",
            self.workload.name(),
            self.files,
            self.file_pages,
            mib(self.file_pages as u64),
            dir.display(),
            self.budget_pages,
            self.cgroup,
            self.limit as f64 / (1 << 20) as f64,
            (self.limit - self.budget_pages * PAGE_SIZE as u64) as f64 / (1 << 20) as f64,
            if self.workload == Workload::Scan { 1 } else { k.threads.max(1) },
            k.duration.as_secs_f64(),
        );
        let _ = writeln!(t, "| side | {}/s | engine ÷ side | p50 µs | p99 µs | p99.9 µs | max µs | faults (pager / cgroup) | major (pager / cgroup) | reclaimed (pager / cgroup) | cgroup peak MiB | mismatches |", self.workload.unit());
        let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        let engine = self.sides[0].rate();
        for s in &self.sides {
            let c = &s.cgroup;
            if let Some(why) = &s.killed {
                let _ = writeln!(
                    t,
                    "| {} | {why} | | | | | | – / {} | – / {} | – / {} | {} | |",
                    s.name,
                    c.pgfault,
                    c.pgmajfault,
                    c.reclaimed,
                    c.peak_bytes >> 20
                );
                continue;
            }
            let l = &s.latency;
            let lat = if l.count == 0 {
                "– | – | – | –".to_string()
            } else {
                format!(
                    "{} | {} | {} | {}",
                    us(l.p50_ns),
                    us(l.p99_ns),
                    us(l.p999_ns),
                    us(l.max_ns)
                )
            };
            let ratio = if s.rate() > 0.0 && engine > 0.0 && self.sides[0].killed.is_none() {
                format!("{:.2}×", engine / s.rate())
            } else {
                "–".to_string()
            };
            let _ = writeln!(
                t,
                "| {} | {:.0} | {ratio} | {lat} | {} / {} | {} / {} | {} / {} | {:.1} | {} |",
                s.name,
                s.rate(),
                s.pager[0],
                c.pgfault,
                s.pager[1],
                c.pgmajfault,
                s.pager[2],
                c.reclaimed,
                c.peak_bytes as f64 / (1 << 20) as f64,
                s.mismatches,
            );
        }
        if !self.sides[0].footprint.is_empty() {
            let _ = writeln!(t, "engine {} at the end", self.sides[0].footprint);
        }
        // (A v1 group counts no reclaim: the column showed its every
        // uncharge as reclaim, the exit's too; found by review.)
        if self.cgroup.starts_with("v1") {
            let _ = writeln!(
                t,
                "cgroup v1 counts no reclaim: its \"reclaimed\" is pgpgout, every page \
                 uncharged (the process's exit included)"
            );
        }
        match self.no_ratio() {
            Some(why) => {
                let _ = writeln!(t, "engine ÷ best kernel side: – ({why})");
            }
            None => {
                let _ = writeln!(
                    t,
                    "engine ÷ best kernel side: {}",
                    judged(self.ratio(), "×", self.goal(k))
                );
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(name: &str, ops: u64, killed: bool) -> Side {
        Side {
            name: name.into(),
            ops,
            secs: 1.0,
            mismatches: 0,
            pager: [0; 3],
            latency: Default::default(),
            footprint: String::new(),
            cgroup: Default::default(),
            killed: killed.then(|| "killed by signal 9".to_string()),
        }
    }

    fn report(sides: Vec<Side>) -> Report {
        Report {
            workload: Workload::Random,
            sides,
            cgroup: "v2 memory.max",
            limit: 1 << 30,
            file_pages: 1024,
            files: 1,
            budget_pages: 256,
        }
    }

    #[test]
    fn the_ratio_is_against_the_best_kernel_side() {
        let r = report(vec![
            side("engine", 100, false),
            side("kernel mmap", 10, false),
            side("kernel mmap + MADV_RANDOM", 50, false),
        ]);
        assert_eq!(r.ratio(), 2.0);
    }

    #[test]
    fn a_side_that_read_wrong_words_leaves_no_ratio() {
        let mut wrong = side("engine", 100, false);
        wrong.mismatches = 3;
        let r = report(vec![
            wrong,
            side("kernel mmap", 10, false),
            side("kernel mmap + MADV_RANDOM", 50, false),
        ]);
        assert!(r.ratio().is_nan(), "{}", r.ratio());
        let t = r.table(&Knobs::default(), Path::new("/tmp"));
        assert!(!t.contains("met"), "{t}");
        assert!(t.contains("– (a side read words that differ"), "{t}");
    }

    #[test]
    fn a_scan_with_2m_pages_is_held_to_twice_the_kernel() {
        let mut r = report(vec![
            side("engine", 150, false),
            side("kernel mmap", 100, false),
        ]);
        r.workload = Workload::Scan;
        let huge = Knobs {
            page_size: 2 << 20,
            ..Knobs::default()
        };
        let t = r.table(&huge, Path::new("/tmp"));
        assert!(t.contains("1.50× (goal ≥ 2×: missed)"), "{t}");
        let t = r.table(&Knobs::default(), Path::new("/tmp"));
        assert!(t.contains("1.50× (goal ≥ 1×: met)"), "{t}");
    }

    #[test]
    fn a_side_with_no_work_says_so() {
        let r = report(vec![
            side("engine", 100, false),
            side("kernel mmap", 0, false),
        ]);
        let t = r.table(&Knobs::default(), Path::new("/tmp"));
        assert!(t.contains("– (a side did no work in its time)"), "{t}");
    }

    #[test]
    fn a_killed_kernel_side_leaves_no_ratio() {
        let r = report(vec![
            side("engine", 100, false),
            side("kernel mmap", 10, false),
            side("kernel mmap + MADV_RANDOM", 0, true),
        ]);
        assert!(r.ratio().is_nan(), "{}", r.ratio());
        let t = r.table(&Knobs::default(), Path::new("/tmp"));
        assert!(
            t.contains("engine ÷ best kernel side: – (a side was killed"),
            "{t}"
        );
    }
}
