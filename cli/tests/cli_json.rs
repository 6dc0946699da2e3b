//! The `--json` output of the bench subcommands: parsed with a strict
//! recursive-descent JSON parser (the crate has no JSON dependency) and
//! checked against the documented schema.

use std::collections::BTreeMap;
use std::process::Command;

/// A parsed JSON value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Value>),
    Obj(BTreeMap<String, Value>),
}

/// A strict JSON parser (RFC 8259): one value, surrounded only by
/// whitespace; no trailing commas, no duplicate keys, no NaN.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn parse(text: &'a str) -> Result<Value, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(v)
    }

    fn err(&self, what: &str) -> String {
        let from = self.i.saturating_sub(20);
        let to = (self.i + 20).min(self.s.len());
        format!(
            "{what} at byte {}: …{}…",
            self.i,
            String::from_utf8_lossy(&self.s[from..to])
        )
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected {:?}", c as char)))
        }
    }

    fn lit(&mut self, word: &str, v: Value) -> Result<Value, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.err("bad literal"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > 64 {
            return Err(self.err("nested too deep"));
        }
        self.ws();
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') => self.lit("true", Value::Bool(true)),
            Some(b'f') => self.lit("false", Value::Bool(false)),
            Some(b'n') => self.lit("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.err("expected a value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, String> {
        self.eat(b'{')?;
        let mut m = BTreeMap::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Value::Obj(m));
        }
        loop {
            self.ws();
            let k = self.string()?;
            self.ws();
            self.eat(b':')?;
            let v = self.value(depth + 1)?;
            if m.insert(k.clone(), v).is_some() {
                return Err(self.err(&format!("duplicate key {k:?}")));
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Value::Obj(m));
                }
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, String> {
        self.eat(b'[')?;
        let mut v = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(Value::Arr(v));
        }
        loop {
            v.push(self.value(depth + 1)?);
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Value::Arr(v));
                }
                _ => return Err(self.err("expected ',' or ']'")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.err("bad \\u escape"))?;
        self.i += 4;
        Ok(h)
    }

    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let c = self.peek().ok_or_else(|| self.err("unterminated string"))?;
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = self.peek().ok_or_else(|| self.err("bad escape"))?;
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let mut u = self.hex4()?;
                            if (0xD800..0xDC00).contains(&u) {
                                self.eat(b'\\')?;
                                self.eat(b'u')?;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.err("bad surrogate pair"));
                                }
                                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                            }
                            char::from_u32(u).ok_or_else(|| self.err("bad code point"))?
                        }
                        _ => return Err(self.err("bad escape")),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                c if c < 0x20 => return Err(self.err("control character in string")),
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| self.err("invalid UTF-8"))
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let s = p.i;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.i += 1;
            }
            p.i - s
        };
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        if self.peek() == Some(b'0') {
            self.i += 1;
        } else if digits(self) == 0 {
            return Err(self.err("bad number"));
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if digits(self) == 0 {
                return Err(self.err("bad fraction"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return Err(self.err("bad exponent"));
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| self.err("utf8"))?;
        let x: f64 = text.parse().map_err(|_| self.err("bad number"))?;
        if !x.is_finite() {
            return Err(self.err("number out of range"));
        }
        Ok(Value::Num(x))
    }
}

impl Value {
    fn get(&self, k: &str) -> &Value {
        match self {
            Value::Obj(m) => m
                .get(k)
                .unwrap_or_else(|| panic!("missing key {k:?} in {self:?}")),
            _ => panic!("not an object looking up {k:?}: {self:?}"),
        }
    }
    fn num(&self, what: &str) -> f64 {
        match self {
            Value::Num(x) if x.is_finite() => *x,
            _ => panic!("{what}: want a finite number, got {self:?}"),
        }
    }
    fn str(&self, what: &str) -> &str {
        match self {
            Value::Str(s) => s,
            _ => panic!("{what}: want a string, got {self:?}"),
        }
    }
    fn arr(&self, what: &str) -> &[Value] {
        match self {
            Value::Arr(v) => v,
            _ => panic!("{what}: want an array, got {self:?}"),
        }
    }
    fn obj(&self, what: &str) -> &BTreeMap<String, Value> {
        match self {
            Value::Obj(m) => m,
            _ => panic!("{what}: want an object, got {self:?}"),
        }
    }
}

/// Runs the binary and parses its stdout as one JSON value.
fn json_of(args: &[&str]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running uffd-pager");
    let out = String::from_utf8(o.stdout).expect("stdout is UTF-8");
    assert!(
        o.status.success(),
        "{args:?}: {:?}\nstdout: {out}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    Parser::parse(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}\n{out}"))
}

/// A non-negative whole number.
fn count(v: &Value, what: &str) -> f64 {
    let x = v.num(what);
    assert!(x >= 0.0 && x.fract() == 0.0, "{what}: not a count: {x}");
    x
}

/// Checks `{"workload","knob","runs":[…]}` as documented in the README.
fn check_sweep(v: &Value, workload: &str, knob: &str) {
    assert_eq!(v.get("workload").str("workload"), workload);
    assert_eq!(v.get("knob").str("knob"), knob);
    let runs = v.get("runs").arr("runs");
    assert!(!runs.is_empty(), "{workload}: no runs");
    for r in runs {
        let w = |k: &str| format!("{workload} run.{k}");
        assert_eq!(r.get("knob").str(&w("knob")), knob);
        count(r.get("value"), &w("value"));
        assert!(!r.get("label").str(&w("label")).is_empty());
        count(r.get("ops"), &w("ops"));
        assert!(!r.get("unit").str(&w("unit")).is_empty());
        let elapsed = r.get("elapsed_s").num(&w("elapsed_s"));
        assert!(elapsed > 0.0, "{}: {elapsed}", w("elapsed_s"));
        assert!(r.get("cpu_s").num(&w("cpu_s")) >= 0.0);
        assert!(r.get("throughput").num(&w("throughput")) >= 0.0);
        let counters = r.get("counters").obj(&w("counters"));
        for k in [
            "vma_lock_success",
            "retry_mmap_drop",
            "retry_io_miss",
            "pgfault",
            "pgmajfault",
        ] {
            assert!(counters.contains_key(k), "{}: no {k}", w("counters"));
        }
        for (k, c) in counters {
            count(c, &w(&format!("counters.{k}")));
        }
        let pct = r.get("miss_drop_pct").num(&w("miss_drop_pct"));
        assert!((0.0..=100.0).contains(&pct), "miss_drop_pct {pct}");
        let g = r.get("global_lock");
        g.obj(&w("global_lock"));
        for k in [
            "read_acquisitions",
            "read_contended",
            "read_wait_ns",
            "write_acquisitions",
            "write_contended",
            "write_wait_ns",
        ] {
            count(g.get(k), &w(&format!("global_lock.{k}")));
        }
        let l = r.get("fault_latency_ns");
        l.obj(&w("fault_latency_ns"));
        for k in ["count", "p50", "p90", "p99", "max"] {
            count(l.get(k), &w(&format!("fault_latency_ns.{k}")));
        }
        assert!(l.get("mean").num(&w("fault_latency_ns.mean")) >= 0.0);
        let (p50, p99) = (l.get("p50").num("p50"), l.get("p99").num("p99"));
        assert!(
            p50 <= p99,
            "percentiles out of order: p50 {p50} > p99 {p99}"
        );
        count(r.get("peak_resident_pages"), &w("peak_resident_pages"));
        count(r.get("budget_pages"), &w("budget_pages"));
        for (k, x) in r.get("extra").obj(&w("extra")) {
            x.num(&w(&format!("extra.{k}")));
        }
    }
}

#[test]
fn parser_is_strict() {
    let ok = Parser::parse(r#" {"a":[1,-2.5e3,true,false,null,"x\"\u00e9\ud83d\ude00"],"b":{}} "#)
        .unwrap();
    assert_eq!(ok.get("a").arr("a")[1], Value::Num(-2500.0));
    assert_eq!(ok.get("a").arr("a")[5], Value::Str("x\"é😀".into()));
    for bad in [
        "",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\":1,\"a\":2}",
        "01",
        "1.",
        "NaN",
        "{} {}",
        "\"\n\"",
        "{a:1}",
        "1e999",
    ] {
        assert!(Parser::parse(bad).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn filemap_json() {
    let v = json_of(&[
        "bench",
        "filemap",
        "--threads",
        "2",
        "--duration",
        "0.3",
        "--pages",
        "32",
        "--budget",
        "16",
        "--json",
    ]);
    check_sweep(&v, "filemap", "threads");
    for r in v.get("runs").arr("runs") {
        assert_eq!(r.get("value").num("value"), 2.0);
        assert_eq!(r.get("budget_pages").num("budget_pages"), 16.0);
    }
}

#[test]
fn populate_churn_json() {
    let v = json_of(&["bench", "populate-churn", "--duration", "0.2", "--json"]);
    check_sweep(&v, "populate-churn", "threads");
}

#[test]
fn swap_json() {
    let v = json_of(&[
        "bench",
        "swap",
        "--duration",
        "0.3",
        "--pages",
        "512",
        "--budget",
        "256",
        "--threads",
        "2",
        "--json",
    ]);
    check_sweep(&v, "swap", "writers");
}

/// An array of objects, each with a finite, positive "ratio".
fn check_ratio_rows(v: &Value, workload: &str) {
    let rows = v.arr(workload);
    assert!(!rows.is_empty(), "{workload}: no rows");
    for r in rows {
        r.obj(workload);
        assert_eq!(r.get("workload").str("workload"), workload);
        let ratio = r.get("ratio").num("ratio");
        assert!(ratio > 0.0, "{workload}: ratio {ratio}");
        assert_eq!(r.get("pages").num("pages"), 64.0);
    }
}

#[test]
fn fault_cost_json() {
    let v = json_of(&[
        "bench",
        "fault-cost",
        "--pages",
        "64",
        "--passes",
        "1",
        "--json",
    ]);
    check_ratio_rows(&v, "fault-cost");
}

#[test]
fn evict_json() {
    let v = json_of(&["bench", "evict", "--pages", "64", "--passes", "1", "--json"]);
    check_ratio_rows(&v, "evict");
}

#[test]
fn torture_json() {
    let v = json_of(&[
        "torture",
        "--ops",
        "20000",
        "--pages",
        "256",
        "--budget",
        "64",
        "--kind",
        "anonymous",
        "--json",
    ]);
    assert_eq!(v.get("workload").str("workload"), "torture");
    assert_eq!(v.get("mismatches").num("mismatches"), 0.0);
    assert!(v.get("ops").num("ops") >= 20000.0);
    assert_eq!(v.get("clean"), &Value::Bool(true));
    count(v.get("counters").get("pgsteal"), "pgsteal");
}

/// A seed past `i64::MAX` is written as given (it came out as -1 for
/// `u64::MAX`, so a run replayed from the JSON used another seed; found by
/// review).
#[test]
fn torture_json_keeps_a_large_seed() {
    let o = Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
        .args([
            "torture", "--ops", "1000", "--pages", "256", "--budget", "64",
        ])
        .args([
            "--kind",
            "anonymous",
            "--json",
            "--seed",
            "18446744073709551615",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("running uffd-pager");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("\"seed\":18446744073709551615"), "{out}");
    Parser::parse(&out).unwrap_or_else(|e| panic!("not JSON: {e}\n{out}"));
}

/// A scratch directory, removed with its contents when dropped (also when
/// the test fails).
struct ScratchDir(std::path::PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn torture_file_removes_its_file() {
    let scratch = ScratchDir(
        std::env::temp_dir().join(format!("uffd-pager-cli-json-{}", std::process::id())),
    );
    let dir = &scratch.0;
    std::fs::create_dir_all(dir).unwrap();
    let v = json_of(&[
        "torture",
        "--ops",
        "20000",
        "--pages",
        "256",
        "--budget",
        "64",
        "--kind",
        "file",
        "--dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(v.get("mismatches").num("mismatches"), 0.0);
    assert!(v.get("words_verified").num("words_verified") > 0.0);
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert!(left.is_empty(), "torture left files behind: {left:?}");
}

#[test]
fn metadata_json() {
    let v = json_of(&[
        "bench", "metadata", "--pages", "262144", "--budget", "4096", "--touch", "4096", "--json",
    ]);
    assert_eq!(v.get("workload").str("workload"), "metadata");
    assert_eq!(
        v.get("state_word_bytes_per_page")
            .num("state_word_bytes_per_page"),
        4.0
    );
    let computed = v.get("computed_bytes_per_page").num("computed");
    assert!(computed > 4.0 && computed <= 16.0, "computed {computed}");
    count(v.get("ring_bytes"), "ring_bytes");
    v.get("measured_bytes_per_page").num("measured");
}
