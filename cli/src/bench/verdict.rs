//! Verdict lines: a figure against the goal it is held to, `met` or
//! `missed`, so that a reader does not compare numbers by eye (the demo's
//! lines and the kernel baseline's).

/// A goal a figure is checked against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// The figure must be at least this.
    AtLeast(f64),
    /// The figure must be at most this.
    AtMost(f64),
}

impl Goal {
    /// Whether `v` meets the goal (a NaN never does).
    pub fn met(self, v: f64) -> bool {
        match self {
            Goal::AtLeast(g) => v >= g,
            Goal::AtMost(g) => v <= g,
        }
    }
}

/// `value{unit} (goal ≥ g{unit}: met)`, or `missed`; a NaN figure reads
/// `– (goal …: missed)`. The figure has two decimals, or four where two
/// would round it onto the other side of the goal (1.2996 against ≥ 1.3
/// read `1.30× (goal ≥ 1.3×: missed)`; found by review).
pub fn judged(v: f64, unit: &str, g: Goal) -> String {
    let (op, x) = match g {
        Goal::AtLeast(x) => ("≥", x),
        Goal::AtMost(x) => ("≤", x),
    };
    let met = g.met(v);
    let word = if met { "met" } else { "missed" };
    let shown = if v.is_nan() {
        "–".to_string()
    } else {
        let two = format!("{v:.2}");
        match two.parse::<f64>() {
            Ok(r) if g.met(r) != met => format!("{v:.4}"),
            _ => two,
        }
    };
    format!("{shown}{unit} (goal {op} {x}{unit}: {word})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_says_met_or_missed() {
        assert_eq!(
            judged(1.42, "×", Goal::AtLeast(1.3)),
            "1.42× (goal ≥ 1.3×: met)"
        );
        assert_eq!(
            judged(-49.0, "%", Goal::AtMost(-95.0)),
            "-49.00% (goal ≤ -95%: missed)"
        );
        assert_eq!(
            judged(2.0, "%", Goal::AtMost(2.0)),
            "2.00% (goal ≤ 2%: met)"
        );
        assert!(!Goal::AtLeast(30.0).met(29.99));
    }

    #[test]
    fn a_figure_rounded_onto_the_goal_shows_enough_digits() {
        assert_eq!(
            judged(1.2996, "×", Goal::AtLeast(1.3)),
            "1.2996× (goal ≥ 1.3×: missed)"
        );
        assert_eq!(
            judged(2.004, "%", Goal::AtMost(2.0)),
            "2.0040% (goal ≤ 2%: missed)"
        );
        assert_eq!(
            judged(f64::NAN, "×", Goal::AtLeast(1.0)),
            "–× (goal ≥ 1×: missed)"
        );
    }
}
