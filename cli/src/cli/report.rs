//! Rendering a sweep of workload runs: the seed-style comparison table, the
//! counters under it, JSON, CSV and an SVG plot.

use super::json::Json;
use std::fmt::Write as _;
use uffd_pager::Counter;
use uffd_pager_cli::workload::RunResult;

/// Runs of one workload over a swept knob and several labels (policies).
#[derive(Debug, Default)]
pub struct Sweep {
    /// Workload name.
    pub workload: &'static str,
    /// The swept knob's name ("threads", "writers", …).
    pub knob: &'static str,
    /// Its values, in order.
    pub values: Vec<usize>,
    /// Column labels (policies or drain/shard variants), in order.
    pub labels: Vec<String>,
    /// `(value index, label index, result)`.
    pub runs: Vec<(usize, usize, RunResult)>,
}

impl Sweep {
    /// The run at (value, label).
    pub fn get(&self, v: usize, l: usize) -> Option<&RunResult> {
        self.runs
            .iter()
            .find(|r| r.0 == v && r.1 == l)
            .map(|r| &r.2)
    }

    /// The comparison table: one row per knob value, one column per label,
    /// each with its % change against the first label.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let unit = self.runs.first().map_or("ops", |r| r.2.unit);
        let _ = writeln!(
            s,
            "{} throughput ({unit}/s, higher is better)",
            self.workload
        );
        let _ = write!(s, "| {:>8} |", self.knob);
        for l in &self.labels {
            let _ = write!(s, " {:>26} |", l);
        }
        s.push('\n');
        let _ = write!(s, "|{:-<10}|", "");
        for _ in &self.labels {
            let _ = write!(s, "{:-<28}|", "");
        }
        s.push('\n');
        for (vi, v) in self.values.iter().enumerate() {
            let _ = write!(s, "| {v:>8} |");
            let base = self.get(vi, 0).map(|r| r.throughput());
            for li in 0..self.labels.len() {
                let cell = match (self.get(vi, li), base) {
                    (Some(r), Some(b)) if li > 0 && b > 0.0 => format!(
                        "{:.2} ({:+.1}%)",
                        r.throughput(),
                        100.0 * (r.throughput() / b - 1.0)
                    ),
                    (Some(r), _) => format!("{:.2}", r.throughput()),
                    (None, _) => "-".into(),
                };
                let _ = write!(s, " {cell:>26} |");
            }
            s.push('\n');
        }
        s
    }

    /// The counters of every run, one block per run.
    pub fn counters(&self) -> String {
        let mut s = String::new();
        for (vi, li, r) in &self.runs {
            let st = &r.stats;
            let c = |k| st.get(k);
            let _ = writeln!(
                s,
                "[{}={} {}{}] {} {} in {:.2}s ({:.0}/CPU-s)",
                self.knob,
                self.values[*vi],
                self.labels[*li],
                r.install.map_or(String::new(), |k| format!(", {k} kind")),
                r.ops,
                r.unit,
                r.elapsed.as_secs_f64(),
                r.ops_per_cpu_second()
            );
            let _ = writeln!(
                s,
                "  vma_lock success {} abort {} retry {} miss {} | retry_mmap_drop {} retry_io_miss {} \
                 miss/drop {:.2}% | pgfault {} pgmajfault {}",
                c(Counter::VMA_LOCK_SUCCESS),
                c(Counter::VMA_LOCK_ABORT),
                c(Counter::VMA_LOCK_RETRY),
                c(Counter::VMA_LOCK_MISS),
                c(Counter::RETRY_MMAP_DROP),
                c(Counter::RETRY_IO_MISS),
                st.miss_drop_pct(),
                c(Counter::PGFAULT),
                c(Counter::PGMAJFAULT),
            );
            let g = &st.global;
            let ops = r.ops.max(1) as f64;
            let _ = writeln!(
                s,
                "  global lock contended {} (read {} wait {:.3}s, write {} wait {:.3}s) | lru lock {:.3}/op \
                 (contended {:.3}/op) | pgscan {} pgsteal {} writeback {}",
                st.global_contended(),
                g.read_contended,
                g.read_wait_ns as f64 / 1e9,
                g.write_contended,
                g.write_wait_ns as f64 / 1e9,
                c(Counter::LRU_LOCK) as f64 / ops,
                c(Counter::LRU_LOCK_CONTENDED) as f64 / ops,
                c(Counter::PGSCAN),
                c(Counter::PGSTEAL),
                c(Counter::WRITEBACK),
            );
            let l = &st.fault_latency;
            let _ = write!(
                s,
                "  fault latency p50 {:.1}µs p90 {:.1}µs p99 {:.1}µs max {:.1}µs | peak resident {} / budget {} pages",
                l.p50_ns as f64 / 1e3,
                l.p90_ns as f64 / 1e3,
                l.p99_ns as f64 / 1e3,
                l.max_ns as f64 / 1e3,
                st.peak_resident_pages,
                st.budget_pages
            );
            if !r.extra.is_empty() {
                let _ = write!(s, "\n ");
                for (k, v) in &r.extra {
                    let _ = write!(s, " {k} {v:.3}");
                }
            }
            if let Some(lat) = &r.latency {
                let _ = write!(
                    s,
                    " | store latency {} delivered mean {:.1}µs p99 {:.1}µs",
                    lat.model,
                    lat.delivered.mean_ns / 1e3,
                    lat.delivered.p99_ns as f64 / 1e3
                );
            }
            s.push('\n');
        }
        s
    }

    /// JSON: `{"workload", "knob", "runs": [...]}` (schema in the README).
    pub fn json(&self) -> Json {
        let runs = self
            .runs
            .iter()
            .map(|(vi, li, r)| run_json(self.knob, self.values[*vi], &self.labels[*li], r))
            .collect();
        Json::obj([
            ("workload", Json::str(self.workload)),
            ("knob", Json::str(self.knob)),
            ("runs", Json::Arr(runs)),
        ])
    }

    /// CSV, one row per run.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "workload,knob,value,label,ops,unit,elapsed_s,cpu_s,throughput,vma_lock_success,\
             vma_lock_abort,vma_lock_retry,vma_lock_miss,retry_mmap_drop,retry_io_miss,\
             miss_drop_pct,global_contended,global_read_wait_s,lru_lock_per_op,p50_us,p99_us,\
             peak_resident_pages,budget_pages\n",
        );
        for (vi, li, r) in &self.runs {
            let st = &r.stats;
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{:.4},{:.4},{:.3},{},{},{},{},{},{},{:.3},{},{:.4},{:.4},{:.2},{:.2},{},{}",
                self.workload,
                self.knob,
                self.values[*vi],
                self.labels[*li],
                r.ops,
                r.unit,
                r.elapsed.as_secs_f64(),
                r.cpu.as_secs_f64(),
                r.throughput(),
                st.get(Counter::VMA_LOCK_SUCCESS),
                st.get(Counter::VMA_LOCK_ABORT),
                st.get(Counter::VMA_LOCK_RETRY),
                st.get(Counter::VMA_LOCK_MISS),
                st.get(Counter::RETRY_MMAP_DROP),
                st.get(Counter::RETRY_IO_MISS),
                st.miss_drop_pct(),
                st.global_contended(),
                st.global.read_wait_ns as f64 / 1e9,
                st.get(Counter::LRU_LOCK) as f64 / r.ops.max(1) as f64,
                st.fault_latency.p50_ns as f64 / 1e3,
                st.fault_latency.p99_ns as f64 / 1e3,
                st.peak_resident_pages,
                st.budget_pages
            );
        }
        s
    }

    /// Writes an SVG line chart of throughput against the swept knob, one
    /// line per label.
    pub fn plot(&self, path: &std::path::Path, title: &str) -> Result<(), String> {
        self.plot_with_seed(path, title, &[])
    }

    /// [`Sweep::plot`], with a published series drawn dashed beside each
    /// of ours: `seed[i]` is `(label, y values)` for our label `i`, its
    /// n-th value at our n-th knob value, scaled so that the seed's first
    /// point of its first series lands on ours (the seeds' machines are not
    /// this one: the shape is what compares). Ticks on the knob axis are
    /// whole numbers.
    pub fn plot_with_seed(
        &self,
        path: &std::path::Path,
        title: &str,
        seed: &[(&str, &[f64])],
    ) -> Result<(), String> {
        use plotters::prelude::*;
        let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
        let scale = match (seed.first().and_then(|s| s.1.first()), self.get(0, 0)) {
            (Some(&s0), Some(r)) if s0 > 0.0 => r.throughput() / s0,
            _ => 0.0,
        };
        let seed_pts = |li: usize| -> Vec<(f64, f64)> {
            seed.get(li).map_or(Vec::new(), |(_, ys)| {
                self.values
                    .iter()
                    .zip(ys.iter())
                    .map(|(&x, &y)| (x as f64, y * scale))
                    .collect()
            })
        };
        let xmax = self.values.iter().copied().max().unwrap_or(1) as f64;
        let xmin = self.values.iter().copied().min().unwrap_or(0) as f64;
        let ours = self.runs.iter().map(|r| r.2.throughput());
        let theirs = (0..seed.len()).flat_map(|li| seed_pts(li).into_iter().map(|p| p.1));
        let ymax = ours.chain(theirs).fold(0.0, f64::max) * 1.1;
        let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let span = if xmax > xmin { xmax - xmin } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (xmin - 0.05 * span)..(xmax + 0.05 * span),
                0f64..ymax.max(1.0),
            )
            .map_err(|e| err(&e))?;
        let unit = self.runs.first().map_or("ops", |r| r.2.unit);
        let whole = |x: &f64| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{}", x.round() as i64)
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc(self.knob)
            .y_desc(format!("{unit}/s"))
            .x_labels(((xmax - xmin) as usize + 2).min(48))
            .x_label_formatter(&whole)
            .draw()
            .map_err(|e| err(&e))?;
        for (li, (label, _)) in seed.iter().enumerate() {
            let color = Palette99::pick(li).to_rgba();
            let dashed = DashedLineSeries::new(seed_pts(li), 6, 4, color.stroke_width(1));
            chart
                .draw_series(dashed)
                .map_err(|e| err(&e))?
                .label(label.to_string())
                .legend(move |(x, y)| {
                    plotters::element::DashedPathElement::new(
                        vec![(x, y), (x + 20, y)],
                        4,
                        3,
                        color,
                    )
                });
        }
        for (li, label) in self.labels.iter().enumerate() {
            let color = Palette99::pick(li).to_rgba();
            let pts: Vec<(f64, f64)> = (0..self.values.len())
                .filter_map(|vi| {
                    self.get(vi, li)
                        .map(|r| (self.values[vi] as f64, r.throughput()))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))
    }
}

fn run_json(knob: &str, value: usize, label: &str, r: &RunResult) -> Json {
    let st = &r.stats;
    let counters = Json::Obj(
        Counter::ALL
            .iter()
            .map(|&c| (c.name().to_string(), Json::Int(st.get(c) as i64)))
            .collect(),
    );
    let g = &st.global;
    let l = &st.fault_latency;
    Json::obj([
        ("knob", Json::str(knob)),
        ("value", Json::Int(value as i64)),
        ("label", Json::str(label)),
        (
            "kind",
            r.install.map_or(Json::Null, |k| Json::str(k.to_string())),
        ),
        ("ops", Json::Int(r.ops as i64)),
        ("unit", Json::str(r.unit)),
        ("elapsed_s", Json::Num(r.elapsed.as_secs_f64())),
        ("cpu_s", Json::Num(r.cpu.as_secs_f64())),
        ("throughput", Json::Num(r.throughput())),
        ("counters", counters),
        ("miss_drop_pct", Json::Num(st.miss_drop_pct())),
        (
            "global_lock",
            Json::obj([
                ("read_acquisitions", Json::Int(g.read_acquisitions as i64)),
                ("read_contended", Json::Int(g.read_contended as i64)),
                ("read_wait_ns", Json::Int(g.read_wait_ns as i64)),
                ("write_acquisitions", Json::Int(g.write_acquisitions as i64)),
                ("write_contended", Json::Int(g.write_contended as i64)),
                ("write_wait_ns", Json::Int(g.write_wait_ns as i64)),
            ]),
        ),
        (
            "fault_latency_ns",
            Json::obj([
                ("count", Json::Int(l.count as i64)),
                ("mean", Json::Num(l.mean_ns)),
                ("p50", Json::Int(l.p50_ns as i64)),
                ("p90", Json::Int(l.p90_ns as i64)),
                ("p99", Json::Int(l.p99_ns as i64)),
                ("max", Json::Int(l.max_ns as i64)),
            ]),
        ),
        (
            "peak_resident_pages",
            Json::Int(st.peak_resident_pages as i64),
        ),
        ("budget_pages", Json::Int(st.budget_pages as i64)),
        (
            "extra",
            Json::Obj(
                r.extra
                    .iter()
                    .map(|(k, v)| (k.to_string(), Json::Num(*v)))
                    .collect(),
            ),
        ),
    ])
}
