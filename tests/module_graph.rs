//! The module graph has no circles: no file of a crate reaches, through
//! the `crate::`, `super::` and `self::` paths it names, a file that
//! reaches it back. (`Mm` holds state; reclaim, readahead, delivery and
//! fault injection take an `&Mm`, and `pager/` wires them together.)
//!
//! A path counts for the deepest file it names: `crate::reclaim::staging::
//! Reclaim` is an edge to `reclaim/staging.rs`, `crate::reclaim::shrink` to
//! `reclaim/mod.rs`. Comments and `#[cfg(test)]` modules (from their line
//! to the end of the file) are left out; declaring a child module
//! (`mod x;`) is not an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn files(root: &Path, dir: &Path, out: &mut BTreeMap<Module, PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).unwrap().with_extension("");
            let mut m: Module = rel
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if m.last().is_some_and(|l| l == "mod") {
                m.pop();
            }
            if m == ["lib"] || m == ["main"] {
                m.clear();
            }
            out.insert(m, p);
        }
    }
}

/// The modules `text` (the file of module `m`) names paths into.
fn targets(m: &Module, text: &str) -> Vec<Module> {
    let mut code = String::new();
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with("#[cfg(test)]") {
            break;
        }
        if !l.starts_with("//") {
            code.push_str(line);
            code.push('\n');
        }
    }
    let mut out = Vec::new();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut i = 0;
    let b = code.as_bytes();
    while i < b.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        let starts_word = i == 0 || !word(b[i - 1] as char);
        let base = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|k| rest.starts_with(k));
        let (Some(base), true) = (base, starts_word) else {
            i += 1;
            continue;
        };
        let mut at: Module = match base {
            "crate::" => Vec::new(),
            "super::" => m[..m.len().saturating_sub(1)].to_vec(),
            _ => m.clone(),
        };
        let mut s = &rest[base.len()..];
        while let Some(r) = s.strip_prefix("super::") {
            at.pop();
            s = r;
        }
        // The path's segments, then any `{a, b::c}` group after it.
        let end = s.find(|c: char| !(word(c) || c == ':')).unwrap_or(s.len());
        let path: Vec<String> = s[..end]
            .split("::")
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect();
        let mut prefix = at.clone();
        prefix.extend(path);
        out.push(prefix.clone());
        if s[end..].starts_with('{') {
            let close = s[end..].find('}').map_or(s.len(), |c| end + c);
            for item in s[end + 1..close].split(',') {
                let item = item.split(" as ").next().unwrap().trim();
                let mut t = prefix.clone();
                t.extend(
                    item.split("::")
                        .filter(|x| !x.is_empty() && *x != "self")
                        .map(String::from),
                );
                out.push(t);
            }
        }
        i += base.len() + end;
    }
    out
}

fn cycles(root: &Path) -> Vec<Vec<Module>> {
    let mut fs = BTreeMap::new();
    files(root, root, &mut fs);
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, p) in &fs {
        if m.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(p).unwrap();
        for t in targets(m, &text) {
            let hit = (1..=t.len())
                .rev()
                .map(|k| t[..k].to_vec())
                .find(|k| fs.contains_key(k));
            if let Some(h) = hit {
                if &h != m {
                    edges.entry(m.clone()).or_default().insert(h);
                }
            }
        }
    }
    // A module is on a circle if it can reach itself.
    let reach = |from: &Module| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<Module> = edges.get(from).into_iter().flatten().cloned().collect();
        while let Some(x) = stack.pop() {
            if seen.insert(x.clone()) {
                stack.extend(edges.get(&x).into_iter().flatten().cloned());
            }
        }
        seen
    };
    let mut found: Vec<Vec<Module>> = Vec::new();
    for m in fs.keys() {
        let r = reach(m);
        if r.contains(m) && !found.iter().any(|c| c.contains(m)) {
            let on: Vec<Module> = r.iter().filter(|x| reach(x).contains(m)).cloned().collect();
            found.push(on);
        }
    }
    found
}

fn check(dir: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let c = cycles(&root);
    let show: Vec<String> = c
        .iter()
        .map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" "))
        .collect();
    assert!(c.is_empty(), "circles in {dir}: {show:#?}");
}

#[test]
fn the_library_has_no_circles() {
    check("src");
}

#[test]
fn the_command_line_has_no_circles() {
    check("cli/src");
}

#[test]
fn the_c_api_and_the_shim_have_no_circles() {
    check("capi/src");
    check("preload/src");
}

/// The checker finds a circle where there is one.
#[test]
fn a_circle_is_found() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "use crate::b::X;\nmod inner;\n").unwrap();
    std::fs::write(dir.join("a/inner.rs"), "use super::super::b;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::{a::inner::Y, c};\n").unwrap();
    let c = cycles(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(c.len(), 1, "{c:?}");
    let names: Vec<String> = c[0].iter().map(|m| m.join("::")).collect();
    assert_eq!(names, ["a::inner", "b"]);
}
