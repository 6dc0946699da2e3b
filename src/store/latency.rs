//! Latency models for the simulated store: what a simulated I/O takes,
//! parsed from and printed as `none`, `fixed:50us`, `uniform:10us-100us`
//! or `exp:50us`.

use std::fmt;
use std::str::FromStr;

/// How long each simulated I/O takes.
///
/// Parsed from `none`, `fixed:50us`, `exp:50us` and the like; see
/// [`SimulatedStore`](super::SimulatedStore) for an example.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatencyModel {
    /// No added latency.
    None,
    /// Every I/O takes exactly `ns`.
    Fixed {
        /// The latency.
        ns: u64,
    },
    /// Uniformly distributed in `[min_ns, max_ns]`.
    Uniform {
        /// Smallest latency.
        min_ns: u64,
        /// Largest latency (inclusive).
        max_ns: u64,
    },
    /// Exponentially distributed with mean `mean_ns`.
    Exponential {
        /// Mean latency.
        mean_ns: u64,
    },
}

impl LatencyModel {
    /// The model's mean latency.
    ///
    /// Example: [`LatencyModel`](crate::store::LatencyModel).
    pub fn mean_ns(&self) -> u64 {
        match *self {
            LatencyModel::None => 0,
            LatencyModel::Fixed { ns } => ns,
            LatencyModel::Uniform { min_ns, max_ns } => {
                min_ns / 2 + max_ns / 2 + (min_ns & max_ns & 1)
            }
            LatencyModel::Exponential { mean_ns } => mean_ns,
        }
    }

    /// The longest latency the model can draw: an exponential one's
    /// draws reach `ln(2^53)`, about 36.7, times its mean (they are made
    /// from 53 random bits), not its mean.
    ///
    /// ```
    /// use uffd_pager::store::LatencyModel;
    /// let m = LatencyModel::Exponential { mean_ns: 1_000 };
    /// assert_eq!(m.max_ns(), 36_736);
    /// ```
    pub fn max_ns(&self) -> u64 {
        match *self {
            LatencyModel::None => 0,
            LatencyModel::Fixed { ns } => ns,
            LatencyModel::Uniform { min_ns, max_ns } => min_ns.max(max_ns),
            LatencyModel::Exponential { .. } => self.sample(0),
        }
    }

    /// Draws one latency, given 64 uniformly random bits. Pure arithmetic,
    /// async-signal-safe.
    pub(crate) fn sample(&self, r: u64) -> u64 {
        match *self {
            LatencyModel::None => 0,
            LatencyModel::Fixed { ns } => ns,
            LatencyModel::Uniform { min_ns, max_ns } => {
                // A hand-built model may have the bounds swapped.
                let (lo, hi) = (min_ns.min(max_ns), min_ns.max(max_ns));
                let span = (hi - lo) as u128 + 1;
                // Multiply-shift maps r onto [0, span) without division.
                lo + ((r as u128 * span) >> 64) as u64
            }
            LatencyModel::Exponential { mean_ns } => {
                // u in (0, 1], from the top 53 bits.
                let u = ((r >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
                let x = -(mean_ns as f64) * u.ln();
                if x >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    x as u64
                }
            }
        }
    }
}

/// Parses a duration such as `50us`, `1.5ms`, `200ns`, `2s` (or `0`).
fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration {t:?} needs a unit (ns, us, ms or s)"))?;
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        u => {
            return Err(format!(
                "unknown unit {u:?} in duration {t:?} (use ns, us, ms or s)"
            ))
        }
    };
    if num.is_empty() {
        return Err(format!("duration {t:?} has no number"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(scale)
            .ok_or_else(|| format!("duration {t:?} is too large"));
    }
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad number {num:?} in duration {t:?}"))?;
    let ns = (v * scale as f64).round();
    if !ns.is_finite() || ns < 0.0 || ns >= u64::MAX as f64 {
        return Err(format!("duration {t:?} is out of range"));
    }
    Ok(ns as u64)
}

/// Formats nanoseconds with the largest unit that represents them exactly.
fn fmt_duration(ns: u64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for (scale, unit) in [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns != 0 && ns.is_multiple_of(scale) {
            return write!(f, "{}{unit}", ns / scale);
        }
    }
    write!(f, "{ns}ns")
}

impl FromStr for LatencyModel {
    type Err = String;

    /// Parses `none`, `fixed:50us`, `uniform:10us-100us`, `exp:50us`
    /// (also `exponential:50us`). Units: ns, us, ms, s.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("none") {
            return Ok(LatencyModel::None);
        }
        let (kind, arg) = t.split_once(':').ok_or_else(|| {
            format!(
                "bad latency model {t:?}: expected none, fixed:<dur>, \
                 uniform:<dur>-<dur> or exp:<dur>"
            )
        })?;
        let ctx = |e: String| format!("bad latency model {t:?}: {e}");
        match kind.trim().to_ascii_lowercase().as_str() {
            "fixed" => Ok(LatencyModel::Fixed {
                ns: parse_duration(arg).map_err(ctx)?,
            }),
            "uniform" => {
                let (lo, hi) = arg.split_once('-').ok_or_else(|| {
                    ctx(format!("uniform needs a range <min>-<max>, got {arg:?}"))
                })?;
                let min_ns = parse_duration(lo).map_err(ctx)?;
                let max_ns = parse_duration(hi).map_err(ctx)?;
                if min_ns > max_ns {
                    return Err(ctx(format!("uniform minimum exceeds maximum in {arg:?}")));
                }
                Ok(LatencyModel::Uniform { min_ns, max_ns })
            }
            "exp" | "exponential" => Ok(LatencyModel::Exponential {
                mean_ns: parse_duration(arg).map_err(ctx)?,
            }),
            k => Err(format!(
                "bad latency model {t:?}: unknown kind {k:?} (expected none, fixed, uniform or exp)"
            )),
        }
    }
}

impl fmt::Display for LatencyModel {
    /// The form [`FromStr`] accepts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LatencyModel::None => write!(f, "none"),
            LatencyModel::Fixed { ns } => {
                write!(f, "fixed:")?;
                fmt_duration(ns, f)
            }
            LatencyModel::Uniform { min_ns, max_ns } => {
                write!(f, "uniform:")?;
                fmt_duration(min_ns, f)?;
                write!(f, "-")?;
                fmt_duration(max_ns, f)
            }
            LatencyModel::Exponential { mean_ns } => {
                write!(f, "exp:")?;
                fmt_duration(mean_ns, f)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_models() {
        assert_eq!("none".parse::<LatencyModel>(), Ok(LatencyModel::None));
        assert_eq!(" NONE ".parse::<LatencyModel>(), Ok(LatencyModel::None));
        assert_eq!(
            "fixed:50us".parse::<LatencyModel>(),
            Ok(LatencyModel::Fixed { ns: 50_000 })
        );
        assert_eq!(
            "fixed:1.5ms".parse::<LatencyModel>(),
            Ok(LatencyModel::Fixed { ns: 1_500_000 })
        );
        assert_eq!(
            "fixed:0".parse::<LatencyModel>(),
            Ok(LatencyModel::Fixed { ns: 0 })
        );
        assert_eq!(
            "uniform:10us-100us".parse::<LatencyModel>(),
            Ok(LatencyModel::Uniform {
                min_ns: 10_000,
                max_ns: 100_000
            })
        );
        assert_eq!(
            "uniform:500ns-2ms".parse::<LatencyModel>(),
            Ok(LatencyModel::Uniform {
                min_ns: 500,
                max_ns: 2_000_000
            })
        );
        assert_eq!(
            "exp:50us".parse::<LatencyModel>(),
            Ok(LatencyModel::Exponential { mean_ns: 50_000 })
        );
        assert_eq!(
            "exponential:1s".parse::<LatencyModel>(),
            Ok(LatencyModel::Exponential {
                mean_ns: 1_000_000_000
            })
        );
    }

    #[test]
    fn rejects_bad_models() {
        for bad in [
            "",
            "fast",
            "fixed",
            "fixed:",
            "fixed:50",
            "fixed:50xs",
            "fixed:us",
            "fixed:-5us",
            "fixed:1.2.3ms",
            "fixed:99999999999999999999s",
            "uniform:10us",
            "uniform:100us-10us",
            "uniform:10us-",
            "exp:abc",
            "gauss:10us",
        ] {
            let e = bad.parse::<LatencyModel>().unwrap_err();
            assert!(!e.is_empty(), "{bad:?}");
            assert!(e.contains("latency model"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn display_round_trips() {
        for m in [
            LatencyModel::None,
            LatencyModel::Fixed { ns: 50_000 },
            LatencyModel::Fixed { ns: 1_234 },
            LatencyModel::Fixed { ns: 0 },
            LatencyModel::Uniform {
                min_ns: 10_000,
                max_ns: 2_000_000_000,
            },
            LatencyModel::Exponential { mean_ns: 3_000_000 },
        ] {
            let s = m.to_string();
            assert_eq!(s.parse::<LatencyModel>(), Ok(m), "{s}");
        }
        assert_eq!(LatencyModel::Fixed { ns: 50_000 }.to_string(), "fixed:50us");
    }
}
