//! At exit or exec: the shim's shared mappings written back, and its
//! counters and the pager's written out (`UFFD_PAGER_STATS`).

use super::{here, state, PAGED, PASSED, REFRESHED, REFUSED};
use std::sync::atomic::Ordering::Relaxed;

/// At exit: write shared mappings back, and the counters out.
pub fn unload() {
    finish("exit");
}

/// At exit or exec (`when`): write shared mappings back, and the counters
/// out.
pub fn finish(when: &str) {
    // A fork()ed child's copy of the table serves nothing and reports
    // nothing, and its lock may be held for good (see `FORKED`).
    if !here() {
        return;
    }
    let mut guard = state();
    let Some(st) = guard.as_mut() else { return };
    // Only the process that made a pager reports: every process started
    // under LD_PRELOAD loads the shim (a shell, `timeout`, the program's
    // own children), and one that paged nothing must not overwrite the
    // program's counters. A fork()ed child's copy of the pager serves
    // nothing and reports nothing.
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if st.pager.is_none() || st.owner_pid != pid {
        return;
    }
    let mut failed = Vec::new();
    // Every mapping whose store takes writes, not only those made writable
    // through the shim: a raw `mprotect` system call passes it by (a flush
    // with nothing dirty writes and syncs nothing).
    for e in st.maps.iter().filter(|e| e.file.is_some() && e.may_write) {
        if let Err(err) = e.region.flush() {
            failed.push(format!("{}: write-back at {when} failed: {err}", e.path));
        }
    }
    // Pages of mappings unmapped while their file refused them: the pager
    // is never dropped (it lives in a static), so this is their last try.
    if let Some(Err(err)) = st.pager.as_ref().map(|p| p.flush_unmapped()) {
        let lost = st.pager.as_ref().map_or(0, |p| p.unwritten_bytes());
        failed.push(format!(
            "{lost} bytes stored through mappings already unmapped are lost: {err}"
        ));
    }
    for m in failed {
        st.say(m);
    }
    let Some(path) = st
        .cfg
        .stats
        .as_ref()
        .map(|p| p.replace("%p", &pid.to_string()))
    else {
        return;
    };
    let pager = st.pager.as_ref().expect("checked above");
    let mut text = format!("{}\npolicy {}", pager.stats(), pager.policy());
    for (k, v) in [
        ("preload_paged", &PAGED),
        ("preload_passed", &PASSED),
        ("preload_refused", &REFUSED),
        ("preload_refreshed", &REFRESHED),
    ] {
        text.push_str(&format!("\n{k} {}", v.load(Relaxed)));
    }
    text.push('\n');
    if path.ends_with(".json") {
        let fields: Vec<String> = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| match v.parse::<u64>() {
                Ok(n) => format!("\"{k}\": {n}"),
                Err(_) => format!("\"{k}\": \"{v}\""),
            })
            .collect();
        text = format!("{{{}}}\n", fields.join(", "));
    }
    if let Err(e) = std::fs::write(&path, text) {
        st.say(format!("writing the counters to {path}: {e}"));
    }
}
