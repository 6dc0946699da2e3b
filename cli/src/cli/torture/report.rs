//! The torture's report: the text one and the JSON one (`--json`), with
//! the run's counts given in the pages its arguments counted.

use super::super::json::Json;
use uffd_pager::{Counter, PAGE_SIZE};
use uffd_pager_cli::workload::torture::{TortureConfig, TortureKind, TortureReport};

fn kind_name(k: &TortureKind) -> &'static str {
    match k {
        TortureKind::File { .. } => "file",
        TortureKind::Anonymous => "anonymous",
        TortureKind::Swapfile { .. } => "swapfile",
        TortureKind::Far { .. } => "file (redis)",
        TortureKind::FarSwap { .. } => "anonymous (swap to redis)",
    }
}

fn ops_per_s(r: &TortureReport) -> f64 {
    let s = r.elapsed.as_secs_f64();
    if s > 0.0 {
        r.ops as f64 / s
    } else {
        0.0
    }
}

/// `units` 4 KiB units (what the torture counts) as pages of the run's
/// size, as its arguments gave them: "32 2 MiB" for 16384 units of a
/// 2 MiB run, the plain count for 4 KiB pages.
fn in_pages(units: u64, page_size: usize) -> String {
    let per = (page_size / PAGE_SIZE).max(1) as u64;
    if per == 1 {
        units.to_string()
    } else {
        format!("{} {} MiB", units / per, page_size >> 20)
    }
}

pub(super) fn report_text(cfg: &TortureConfig, r: &TortureReport) -> String {
    use std::fmt::Write as _;
    let st = &r.stats;
    let mut s = String::new();
    let install = match cfg.kind {
        TortureKind::File { .. } | TortureKind::Far { .. } => format!(", install {}", cfg.install),
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "torture: kind {}{install}, {} threads, {} pages ({} MiB) over a budget of {} pages, \
         {}% writes, delivery {}, policy {}, seed {}",
        kind_name(&cfg.kind),
        cfg.threads,
        in_pages(cfg.pages as u64, cfg.page_size),
        (cfg.pages * PAGE_SIZE) >> 20,
        in_pages(cfg.budget_pages, cfg.page_size),
        cfg.write_pct,
        cfg.delivery,
        cfg.policy,
        cfg.seed
    );
    let _ = writeln!(
        s,
        "  ops             {} (reads {}, writes {})",
        r.ops, r.reads, r.writes
    );
    let _ = writeln!(s, "  mismatches      {}", r.mismatches);
    let _ = writeln!(s, "  words verified  {}", r.words_verified);
    let _ = writeln!(
        s,
        "  elapsed         {:.3} s ({:.0} ops/s)",
        r.elapsed.as_secs_f64(),
        ops_per_s(r)
    );
    let _ = writeln!(
        s,
        "  reclaim         pgsteal {} pgscan {} writeback {} direct_reclaim {} kswapd_wake {}",
        st.get(Counter::PGSTEAL),
        st.get(Counter::PGSCAN),
        st.get(Counter::WRITEBACK),
        st.get(Counter::DIRECT_RECLAIM),
        st.get(Counter::KSWAPD_WAKE)
    );
    let _ = writeln!(
        s,
        "  faults          pgfault {} pgmajfault {} wp_fault {} retry_mmap_drop {} retry_io_miss {}",
        st.get(Counter::PGFAULT),
        st.get(Counter::PGMAJFAULT),
        st.get(Counter::WP_FAULT),
        st.get(Counter::RETRY_MMAP_DROP),
        st.get(Counter::RETRY_IO_MISS)
    );
    let _ = writeln!(
        s,
        "  background      flushes {} reclaimed {} pages",
        r.background_flushes, r.background_reclaimed
    );
    if cfg.churn {
        let _ = writeln!(
            s,
            "  churn           {} address-space operations on side regions, {} bytes wrong",
            r.churn_ops, r.churn_mismatches
        );
        if let Some(m) = &r.churn_first {
            let _ = writeln!(s, "    first: {m}");
        }
    }
    // (In the arguments' pages, as the header: the engine counts 4 KiB
    // units, which this line printed unlabelled for a 2 MiB run.)
    let over = if st.peak_resident_pages > st.budget_pages {
        format!(
            " (over by {} in flight)",
            in_pages(st.peak_resident_pages - st.budget_pages, cfg.page_size)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  peak resident   {} / budget {} pages{over}",
        in_pages(st.peak_resident_pages, cfg.page_size),
        in_pages(st.budget_pages, cfg.page_size)
    );
    if !r.first_mismatches.is_empty() {
        let _ = writeln!(s, "  first mismatches:");
        for m in &r.first_mismatches {
            let _ = writeln!(s, "    {m}");
        }
    }
    let _ = writeln!(
        s,
        "{}",
        if r.is_clean() {
            "PASS: every read and every final word matched the model"
        } else {
            "FAIL: data did not match the model"
        }
    );
    s
}

pub(super) fn report_json(cfg: &TortureConfig, r: &TortureReport) -> Json {
    let st = &r.stats;
    let counters = Json::Obj(
        Counter::ALL
            .iter()
            .map(|&c| (c.name().to_string(), Json::Int(st.get(c) as i64)))
            .collect(),
    );
    let mismatches = Json::Arr(
        r.first_mismatches
            .iter()
            .map(|m| Json::str(m.to_string()))
            .collect(),
    );
    Json::obj([
        ("workload", Json::str("torture")),
        ("kind", Json::str(kind_name(&cfg.kind))),
        (
            "install",
            // As the text report: the install kind of the kinds that map
            // a file or object (the far one too).
            match cfg.kind {
                TortureKind::File { .. } | TortureKind::Far { .. } => {
                    Json::str(cfg.install.to_string())
                }
                _ => Json::Null,
            },
        ),
        ("threads", Json::Int(cfg.threads as i64)),
        // In 4 KiB units whatever the page size (page_size_bytes says it).
        ("pages", Json::Int(cfg.pages as i64)),
        ("budget_pages", Json::Int(cfg.budget_pages as i64)),
        ("page_size_bytes", Json::Int(cfg.page_size as i64)),
        ("write_pct", Json::Int(i64::from(cfg.write_pct))),
        ("delivery", Json::str(cfg.delivery.to_string())),
        ("policy", Json::str(cfg.policy.to_string())),
        ("seed", Json::UInt(cfg.seed)),
        ("ops", Json::Int(r.ops as i64)),
        ("reads", Json::Int(r.reads as i64)),
        ("writes", Json::Int(r.writes as i64)),
        ("mismatches", Json::Int(r.mismatches as i64)),
        ("first_mismatches", mismatches),
        ("churn_ops", Json::Int(r.churn_ops as i64)),
        ("churn_mismatches", Json::Int(r.churn_mismatches as i64)),
        (
            "churn_first_mismatch",
            r.churn_first
                .as_ref()
                .map_or(Json::Null, |m| Json::str(m.clone())),
        ),
        ("words_verified", Json::Int(r.words_verified as i64)),
        ("elapsed_s", Json::Num(r.elapsed.as_secs_f64())),
        ("ops_per_s", Json::Num(ops_per_s(r))),
        ("background_flushes", Json::Int(r.background_flushes as i64)),
        (
            "background_reclaimed",
            Json::Int(r.background_reclaimed as i64),
        ),
        (
            "peak_resident_pages",
            Json::Int(st.peak_resident_pages as i64),
        ),
        ("counters", counters),
        ("clean", Json::Bool(r.is_clean())),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use uffd_pager::InstallKind;
    use uffd_pager_cli::far::StoreUrl;

    /// A report of nothing done, for the report's formatting.
    fn empty_report() -> TortureReport {
        let pager = uffd_pager::Pager::builder().build().unwrap();
        TortureReport {
            ops: 0,
            reads: 0,
            writes: 0,
            mismatches: 0,
            first_mismatches: Vec::new(),
            words_verified: 0,
            background_flushes: 0,
            background_reclaimed: 0,
            churn_ops: 0,
            churn_mismatches: 0,
            churn_first: None,
            elapsed: std::time::Duration::ZERO,
            stats: pager.stats(),
        }
    }

    /// The JSON report names the install kind wherever the text one does:
    /// a file in Redis too.
    #[test]
    fn json_names_the_install_kind_of_a_far_object() {
        let r = empty_report();
        for (kind, want) in [
            (
                TortureKind::Far {
                    url: StoreUrl("redis://127.0.0.1:6379".into()),
                },
                "\"install\":\"anonymous\"",
            ),
            (
                TortureKind::File {
                    path: "/nonexistent".into(),
                },
                "\"install\":\"anonymous\"",
            ),
            (TortureKind::Anonymous, "\"install\":null"),
        ] {
            let cfg = TortureConfig {
                kind,
                install: InstallKind::Anonymous,
                ..TortureConfig::default()
            };
            let text = report_text(&cfg, &r);
            let json = report_json(&cfg, &r).to_string();
            assert!(json.contains(want), "{json}");
            assert_eq!(
                text.contains("install anonymous"),
                want.contains("anonymous"),
                "{text}"
            );
        }
    }

    /// With 2 MiB pages the report counts pages as the arguments did (it
    /// gave 4 KiB units: "16384 pages" for `--pages 32`), and the JSON
    /// says the unit of its counts.
    #[test]
    fn a_2_mib_run_reports_pages_as_its_arguments_count_them() {
        let mut r = empty_report();
        r.stats.budget_pages = 8 * 512;
        r.stats.peak_resident_pages = 8 * 512;
        let cfg = TortureConfig {
            pages: 32 * 512,
            budget_pages: 8 * 512,
            page_size: uffd_pager::HUGE_PAGE_SIZE,
            ..TortureConfig::default()
        };
        let text = report_text(&cfg, &r);
        assert!(
            text.contains("32 2 MiB pages (64 MiB) over a budget of 8 2 MiB pages"),
            "{text}"
        );
        // (The peak line gave 4 KiB units, unlabelled.)
        assert!(
            text.contains("peak resident   8 2 MiB / budget 8 2 MiB pages"),
            "{text}"
        );
        let json = report_json(&cfg, &r).to_string();
        assert!(json.contains("\"page_size_bytes\":2097152"), "{json}");
    }
}
