//! Unmodified programs under the shim, each compared with its own output
//! without it: a C program doing what seed 000's reproducer does, sqlite3
//! on a database 4x the budget with `PRAGMA mmap_size`, and Python's mmap
//! module (a hash of a file, and write(2) coherence).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "../../tests/cdylib/build_lib.rs"]
mod cdylib;
use cdylib::build_lib;

fn shim() -> PathBuf {
    let so = build_lib("uffd-pager-preload").join("libuffd_pager_preload.so");
    assert!(so.exists(), "{} is not built", so.display());
    so
}

fn scratch() -> PathBuf {
    // A disk file system, not tmpfs: the pager's file store reads it with
    // pread, as it would a user's data.
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("preload-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// `cmd` run under the shim with `env`, its counters read back.
fn under_shim(cmd: &mut Command, env: &[(&str, &str)], stats: &Path) -> (Output, String) {
    let _ = std::fs::remove_file(stats);
    cmd.env("LD_PRELOAD", shim()).env("UFFD_PAGER_STATS", stats);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = std::fs::read_to_string(stats).unwrap_or_default();
    (out, text)
}

/// Builds `tests/c/NAME.c` into `dir`; returns the executable.
fn build_c(dir: &Path, name: &str) -> PathBuf {
    build_c_with(dir, name, &[])
}

/// [`build_c`] with more compiler flags (after the source, so libraries
/// to link with may be among them). The program is built under a
/// name of this thread's and renamed into place: two tests that build the
/// same program at once never run it while the other's compiler has it
/// open for writing (`ETXTBSY`).
fn build_c_with(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let tmp = dir.join(format!("{name}.{:?}.tmp", std::thread::current().id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let st = Command::new("cc")
        .args(["-O2", "-pthread"])
        .arg(&src)
        .args(flags)
        .arg("-o")
        .arg(&tmp)
        .status()
        .unwrap();
    assert!(st.success(), "cc {}", src.display());
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}

/// Runs `exe FILE` twice: on `d/<name>-plain.dat` without the shim, then
/// on `d/<name>.dat` under it with that file paged (and `env` set), each
/// required to succeed; returns the plain run's output, the paged run's
/// and the paged run's counters.
fn plain_and_paged(
    d: &Path,
    exe: &Path,
    name: &str,
    env: &[(&str, &str)],
) -> (String, String, String) {
    let plain = ok(&Command::new(exe)
        .arg(d.join(format!("{name}-plain.dat")))
        .output()
        .unwrap());
    let file = d.join(format!("{name}.dat"));
    let pattern = file.display().to_string();
    let mut all = vec![("UFFD_PAGER_FILES", pattern.as_str())];
    all.extend_from_slice(env);
    let (o, st) = under_shim(
        Command::new(exe).arg(&file),
        &all,
        &d.join(format!("{name}.stats")),
    );
    (plain, ok(&o), st)
}

fn counter(stats: &str, name: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {stats}"))
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn python_mmap_hash_is_the_same_under_a_quarter_size_budget() {
    let d = scratch();
    let file = d.join("hash.dat");
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&file, data).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hash.py");
    let plain = ok(&Command::new(python())
        .arg(&script)
        .arg(&file)
        .output()
        .unwrap());
    let pattern = format!("{}/*.dat", d.display());
    // Through timeout(1), which loads the shim too but pages nothing: its
    // exit, after Python's, must not overwrite Python's counters.
    let (o, st) = under_shim(
        Command::new("timeout")
            .arg("120")
            .arg(python())
            .arg(&script)
            .arg(&file),
        &[("UFFD_PAGER_FILES", &pattern), ("UFFD_PAGER_BUDGET", "2M")],
        &d.join("hash.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    // Every page came through the pager (faults, readahead, fault-around),
    // and most had to be evicted again.
    assert!(
        counter(&st, "pginstall") >= 2048 && counter(&st, "pgread") >= 2048,
        "{st}"
    );
    assert!(counter(&st, "pgsteal") >= 1024, "{st}");
    assert!(counter(&st, "peak_resident_pages") <= 512 + 64, "{st}");
}

/// `tests/coherence.py` under the shim, its file `NAME.dat` paged with a
/// 1 MiB budget and `env` set; the run must print `coherence ok`.
fn coherence(name: &str, env: &[(&str, &str)]) -> (Output, String) {
    let d = scratch();
    let file = d.join(format!("{name}.dat"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/coherence.py");
    let pattern = file.display().to_string();
    let mut all = vec![
        ("UFFD_PAGER_FILES", pattern.as_str()),
        ("UFFD_PAGER_BUDGET", "1M"),
    ];
    all.extend_from_slice(env);
    let (o, st) = under_shim(
        Command::new(python()).arg(&script).arg(&file),
        &all,
        &d.join(format!("{name}.stats")),
    );
    assert!(ok(&o).contains("coherence ok"));
    (o, st)
}

#[test]
fn writes_with_write_2_are_seen_through_the_mapping() {
    let (o, st) = coherence("coherent", &[]);
    // Both mappings were the pager's, and the writes refreshed them.
    assert_eq!(counter(&st, "preload_paged"), 2, "{st}");
    assert_eq!(counter(&st, "preload_refused"), 1, "{st}");
    assert!(counter(&st, "preload_refreshed") >= 3, "{st}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("refusing a second mapping"));
}

/// The same with `UFFD_PAGER_KIND=anonymous`, where the read-only mapping
/// is a private copy (the anonymous install kind), which the engine cannot
/// refresh: the write was said on stderr and the mapping showed the older
/// bytes until they were evicted (found by review). Its pages are dropped
/// now, and read again from the file.
#[test]
fn writes_with_write_2_are_seen_through_an_anonymous_kind_mapping() {
    let (_, st) = coherence("coherent-anon", &[("UFFD_PAGER_KIND", "anonymous")]);
    assert_eq!(counter(&st, "preload_paged"), 2, "{st}");
    assert!(counter(&st, "preload_refreshed") >= 3, "{st}");
}

#[test]
fn sqlite3_reads_a_database_four_times_the_budget() {
    let d = scratch();
    let db = d.join("big.db");
    let _ = std::fs::remove_file(&db);
    // About 16 MiB of rows.
    let make = "PRAGMA page_size=4096; CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT); \
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 60000) \
                INSERT INTO t SELECT i, printf('%0200d', i * 7919) FROM n; \
                CREATE INDEX tv ON t(v);";
    ok(&Command::new("sqlite3").arg(&db).arg(make).output().unwrap());
    let size = std::fs::metadata(&db).unwrap().len();
    assert!(size >= 16 << 20, "{size}");
    let queries = "PRAGMA mmap_size=268435456; \
                   SELECT count(*), sum(k), sum(length(v)) FROM t; \
                   SELECT v FROM t WHERE k IN (1, 777, 31337, 59999); \
                   SELECT count(*) FROM t WHERE v > printf('%0200d', 200000000); \
                   SELECT k FROM t ORDER BY v DESC LIMIT 3;";
    let plain = ok(&Command::new("sqlite3")
        .arg(&db)
        .arg(queries)
        .output()
        .unwrap());
    let pattern = format!("{}/*.db", d.display());
    let budget = format!("{}", size / 4);
    for policy in ["vanilla", "retry-once"] {
        let (o, st) = under_shim(
            Command::new("sqlite3").arg(&db).arg(queries),
            &[
                ("UFFD_PAGER_FILES", &pattern),
                ("UFFD_PAGER_BUDGET", &budget),
                ("UFFD_PAGER_POLICY", policy),
            ],
            &d.join("sqlite.stats"),
        );
        assert_eq!(ok(&o), plain, "{policy}");
        assert!(counter(&st, "preload_paged") >= 1, "{st}");
        // More was read than fits: the budget held, pages were evicted.
        assert!(counter(&st, "pgread") > size / 4096 / 4, "{st}");
        assert!(counter(&st, "pgsteal") > 0, "{st}");
        assert!(
            counter(&st, "peak_resident_pages") <= size / 4096 / 4 + 64,
            "{st}"
        );
        assert!(st.contains(&format!("policy {policy}")), "{st}");
    }
}

#[test]
fn the_seed_reproducer_runs_unchanged_under_both_policies() {
    let d = scratch();
    let exe = build_c(&d, "mmap_thrash");
    let plain = ok(&Command::new(&exe)
        .arg(&d)
        .args(["2", "1"])
        .output()
        .unwrap());
    assert!(plain.contains("data ok"));
    let pattern = format!("{}/test_file_*", d.display());
    for policy in ["vanilla", "retry-once"] {
        let (o, st) = under_shim(
            Command::new(&exe).arg(&d).args(["4", "2"]),
            &[
                ("UFFD_PAGER_FILES", &pattern),
                ("UFFD_PAGER_BUDGET", "16M"),
                ("UFFD_PAGER_POLICY", policy),
                ("UFFD_PAGER_LATENCY", "fixed:20us"),
            ],
            &d.join("thrash.stats"),
        );
        let out = ok(&o);
        assert!(out.contains("data ok"), "{out}");
        let rounds: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("Total rounds : "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rounds >= 1, "{out}");
        // Every round was a pager mapping of its own.
        assert!(counter(&st, "preload_paged") >= rounds, "{st}");
        assert!(counter(&st, "retry_mmap_drop") > 0, "{st}");
        assert_eq!(counter(&st, "preload_passed"), 0, "{st}");
    }
}

#[test]
fn a_bad_setting_is_a_message_and_exit_code_2() {
    for (k, v) in [
        ("UFFD_PAGER_BUDGET", "lots"),
        ("UFFD_PAGER_POLICY", "fastest"),
    ] {
        let o = Command::new("/bin/true")
            .env("LD_PRELOAD", shim())
            .env(k, v)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{k}={v}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("uffd-pager-preload") && err.contains(k),
            "{err}"
        );
    }
}

#[test]
fn anonymous_mappings_over_the_threshold_are_paged() {
    let d = scratch();
    let script = "import mmap\n\
                  m = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE)\n\
                  for i in range(0, len(m), 4096): m[i] = (i >> 12) % 251\n\
                  print(all(m[i] == (i >> 12) % 251 for i in range(0, len(m), 4096)))\n\
                  s = mmap.mmap(-1, 1 << 20)\n\
                  s[0] = 1\n\
                  print(s[0])\n";
    let plain = ok(&Command::new(python())
        .args(["-c", script])
        .output()
        .unwrap());
    let (o, st) = under_shim(
        Command::new(python()).args(["-c", script]),
        &[("UFFD_PAGER_ANON_MIN", "16M"), ("UFFD_PAGER_BUDGET", "4M")],
        &d.join("anon.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(plain, "True\n1\n");
    // The 32 MiB private mapping was the pager's, the 1 MiB one the kernel's.
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    assert!(counter(&st, "pgsteal") > 0, "{st}");
}

/// `MADV_FREE` on a paged anonymous mapping, then every page written
/// again (an allocator that frees and reuses its heap): the kernel kept
/// the freed pages mapped and the engine took them for dropped, so the
/// pages written again were resident outside the budget (found by
/// review). The mapping's resident size stays near the budget now.
#[test]
fn madv_free_on_a_paged_mapping_keeps_it_in_its_budget() {
    let d = scratch();
    let script = "import ctypes, mmap\n\
                  m = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE)\n\
                  for i in range(0, len(m), 4096): m[i] = 1\n\
                  m.madvise(mmap.MADV_FREE)\n\
                  for i in range(0, len(m), 4096): m[i] = 2\n\
                  print(all(m[i] == 2 for i in range(0, len(m), 4096)))\n\
                  a = ctypes.addressof(ctypes.c_char.from_buffer(m))\n\
                  rss, mine = 0, False\n\
                  for l in open('/proc/self/smaps'):\n\
                  \x20   f = l.split()\n\
                  \x20   if '-' in f[0] and len(f) > 4:\n\
                  \x20       lo, hi = (int(x, 16) for x in f[0].split('-'))\n\
                  \x20       mine = lo <= a < hi\n\
                  \x20   elif mine and f[0] == 'Rss:': rss = int(f[1])\n\
                  print(rss)\n";
    let (o, st) = under_shim(
        Command::new(python()).args(["-c", script]),
        &[("UFFD_PAGER_ANON_MIN", "16M"), ("UFFD_PAGER_BUDGET", "4M")],
        &d.join("free.stats"),
    );
    let out = ok(&o);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("True"), "{out}");
    let rss_kib: u64 = lines.next().unwrap().parse().unwrap();
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    assert!(
        rss_kib <= 6 << 10,
        "the 32 MiB mapping holds {rss_kib} KiB, past its 4 MiB budget: {st}"
    );
}

/// Python's `mmap.madvise(MADV_RANDOM)` reaches the engine: the same pass
/// over a file in order reads ahead without the advice and not with it.
#[test]
fn madvise_random_from_python_turns_the_pagers_readahead_off() {
    let d = scratch();
    let file = d.join("advised.dat");
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i >> 12) as u8).collect();
    std::fs::write(&file, data).unwrap();
    const SCRIPT: &str = "import mmap, sys\n\
        f = open(sys.argv[1], 'rb')\n\
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n\
        if sys.argv[2] != 'none': m.madvise(getattr(mmap, 'MADV_' + sys.argv[2]))\n\
        print(sum(m[i] for i in range(7, len(m), 4096)))\n";
    let pattern = format!("{}/*.dat", d.display());
    let mut read_ahead = Vec::new();
    for advice in ["none", "RANDOM"] {
        let (o, st) = under_shim(
            Command::new(python())
                .args(["-c", SCRIPT])
                .arg(&file)
                .arg(advice),
            &[("UFFD_PAGER_FILES", &pattern), ("UFFD_PAGER_BUDGET", "1M")],
            &d.join(format!("advised-{advice}.stats")),
        );
        // Pages 0..1024, each holding its number (mod 256) everywhere.
        let want: u64 = (0..1024u64).map(|p| p % 256).sum();
        assert_eq!(ok(&o).trim(), want.to_string(), "{advice}");
        assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
        read_ahead.push(counter(&st, "readahead_pages"));
    }
    assert!(read_ahead[0] > 64, "without advice: {read_ahead:?}");
    assert_eq!(read_ahead[1], 0, "advised random: {read_ahead:?}");
}

/// A read-only anonymous mapping stays read-only: the engine's anonymous
/// regions are writable, so the shim leaves it to the kernel, and pages the
/// writable one beside it. It used to page both, and the program's
/// read-only mapping came back `rw-p`.
#[test]
fn a_read_only_anonymous_mapping_stays_read_only() {
    let d = scratch();
    // The permissions of every 32 MiB mapping in /proc/self/maps.
    let script = "import mmap\n\
                  m = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)\n\
                  w = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE)\n\
                  w[4096] = 3\n\
                  assert m[4096] == 0 and w[4096] == 3\n\
                  perms = []\n\
                  for l in open('/proc/self/maps'):\n\
                  \x20   a, b = (int(x, 16) for x in l.split()[0].split('-'))\n\
                  \x20   if b - a == 32 << 20: perms.append(l.split()[1])\n\
                  print(sorted(perms))\n";
    let plain = ok(&Command::new(python())
        .args(["-c", script])
        .output()
        .unwrap());
    assert_eq!(plain, "['r--p', 'rw-p']\n");
    let (o, st) = under_shim(
        Command::new(python()).args(["-c", script]),
        &[("UFFD_PAGER_ANON_MIN", "16M"), ("UFFD_PAGER_BUDGET", "4M")],
        &d.join("anon-ro.stats"),
    );
    assert_eq!(ok(&o), plain);
    // The writable one only.
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A message the shim prints to a stderr that fails (a pipe whose reader
/// is gone, with SIGPIPE ignored, as Python ignores it) is dropped: the
/// shim used `eprintln!`, whose panic aborted the program.
#[test]
fn a_message_to_a_broken_stderr_does_not_abort_the_program() {
    let d = scratch();
    let file = d.join("copy.dat");
    std::fs::write(&file, vec![7u8; 1 << 20]).unwrap();
    let pattern = format!("{}/copy.dat", d.display());
    // A writable private mapping of a matching file: the shim says it
    // leaves it to the kernel. Stderr's reader is gone by then.
    let script = "import mmap, sys, time\n\
                  time.sleep(0.3)\n\
                  f = open(sys.argv[1], 'r+b')\n\
                  m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)\n\
                  m[0] = 1\n\
                  print(m[0], m[1])\n";
    let out = cdylib::stdout_with_stderr_gone(
        Command::new(python())
            .args(["-c", script])
            .arg(&file)
            .env("LD_PRELOAD", shim())
            .env("UFFD_PAGER_FILES", &pattern),
    );
    assert_eq!(out, "1 7\n");
}

/// A `fork()`ed child runs with the shim passing every call to the kernel:
/// the parent's regions are not mapped there and the engine refuses to work
/// in a child, and the shim's lock may have been held by another thread of
/// the parent at the fork (a write-back in `msync`), never to be released
/// in the child. A child's `write(2)` to a file used to wait for that lock
/// for ever.
#[test]
fn a_child_forked_during_a_write_back_does_not_hang() {
    let d = scratch();
    let exe = build_c(&d, "fork_during_msync");
    let data = d.join("forked.dat");
    std::fs::write(&data, vec![1u8; 4 << 20]).unwrap();
    let pattern = format!("{}/forked.dat", d.display());
    let (o, st) = under_shim(
        Command::new(&exe)
            .arg(&data)
            .arg(d.join("forked.out"))
            .arg("5"),
        &[("UFFD_PAGER_FILES", &pattern), ("UFFD_PAGER_BUDGET", "8M")],
        &d.join("forked.stats"),
    );
    assert_eq!(ok(&o), "children 5 hung 0\n");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// What a program maps over, moves or cuts out of pager mappings with
/// calls the shim passes to the kernel is the program's afterwards, as
/// without the shim: `tests/c/map_over.c` prints the same lines either
/// way. The shim kept its own record of each mapping's range, which those
/// calls left stale: `mprotect` and `munmap` of an anonymous mapping placed
/// with `MAP_FIXED` over a whole pager mapping returned 0 without reaching
/// the kernel, a munmap left the program's mapping in the middle of a
/// pager mapping in place, a second mapping of the file was refused
/// (ENODEV), and `MADV_DONTNEED` across a hole the program's `munmap` left
/// was EINVAL and dropped nothing. `mremap(MREMAP_FIXED)` without
/// `MREMAP_MAYMOVE` is the kernel's EINVAL.
#[test]
fn what_a_program_maps_over_a_pager_mapping_is_its_own() {
    let d = scratch();
    let exe = build_c(&d, "map_over");
    let data = d.join("over.dat");
    let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let plain = ok(&Command::new(&exe).arg(&data).output().unwrap());
    std::fs::write(&data, &bytes).unwrap();
    let pattern = format!("{}/over.dat", d.display());
    let (o, st) = under_shim(
        Command::new(&exe).arg(&data),
        &[
            ("UFFD_PAGER_FILES", &pattern),
            ("UFFD_PAGER_ANON_MIN", "16M"),
            ("UFFD_PAGER_BUDGET", "8M"),
        ],
        &d.join("over.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert!(
        plain.contains("perms r--p") && plain.contains("middle free"),
        "{plain}"
    );
    // Every file mapping and the anonymous one were the pager's.
    assert_eq!(counter(&st, "preload_paged"), 5, "{st}");
}

/// `pwrite` on a descriptor opened with `O_APPEND` appends (Linux ignores
/// the offset). The shim refreshed the pages at the offset it was given,
/// so a mapping of the file showed zeros where the appended bytes landed
/// in its last page: `tests/c/append_pwrite.c` printed
/// `past-the-old-end 0000` under the shim and `tail` without it.
#[test]
fn a_pwrite_that_appends_is_seen_through_the_mapping() {
    let d = scratch();
    let exe = build_c(&d, "append_pwrite");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("append-plain.dat"))
        .output()
        .unwrap());
    assert!(plain.contains("past-the-old-end tail"), "{plain}");
    let data = d.join("append.dat");
    let pattern = format!("{}/append.dat", d.display());
    let (o, st) = under_shim(
        Command::new(&exe).arg(&data),
        &[("UFFD_PAGER_FILES", &pattern), ("UFFD_PAGER_BUDGET", "1M")],
        &d.join("append.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A writable shared mapping of a descriptor with `O_APPEND` (opened so,
/// or set later with `fcntl`): the kernel writes what is stored through
/// the mapping at its page. The pager's store wrote back through a `dup`
/// of the program's descriptor, which shares its `O_APPEND`, and Linux
/// appends every `pwrite` there: the stores landed past the end of the
/// file (size 20480 then 24576, not 16384) and the pages kept `aaaaaa`.
#[test]
fn stores_through_a_mapping_of_an_append_descriptor_land_at_their_page() {
    let d = scratch();
    let exe = build_c(&d, "append_mapped");
    let (plain, paged, st) =
        plain_and_paged(&d, &exe, "append-mapped", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(
        plain,
        "opened O_APPEND: size 16384, at the pages storedagain!\n\
         O_APPEND set later: size 16384, at the pages storedagain!\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 2, "{st}");
}

/// A file grown with `pwrite(2)` while mapped writable and shared: what is
/// stored through the mapping between the end the file had at `mmap` and
/// its new end reaches the file, as through the kernel's mapping. The
/// store wrote no byte past the length at open, so those stores were lost
/// (`msync` said 0, the file kept zeros there).
#[test]
fn stores_past_the_old_end_of_a_grown_file_reach_it() {
    let d = scratch();
    let exe = build_c(&d, "grown_then_stored");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "grown", &[]);
    assert_eq!(
        plain,
        "size 4096, at 10: b, at 2000: 'stored', mapping at 4095: z\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A program built with `_FORTIFY_SOURCE` reads a file it stored to
/// through its writable shared mapping into buffers of a known size:
/// `__read_chk` and `__pread_chk`, which glibc serves without its `read`
/// and `pread` symbols, so the shim's write-back before a read never ran
/// and both reads gave the file's older bytes. A length past the buffer
/// still ends the program, as glibc's checks do.
#[test]
fn a_fortified_program_reads_what_it_stored() {
    let d = scratch();
    let exe = build_c_with(&d, "fortified_read", &["-D_FORTIFY_SOURCE=2"]);
    let plain = ok(&Command::new(&exe)
        .arg(d.join("fortified-plain.dat"))
        .arg("6")
        .output()
        .unwrap());
    assert_eq!(plain, "pread: stored, read: again!\n");
    let pattern = format!("{}/fortified.dat", d.display());
    let (o, st) = under_shim(
        Command::new(&exe).arg(d.join("fortified.dat")).arg("6"),
        &[("UFFD_PAGER_FILES", &pattern)],
        &d.join("fortified.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    let (o, _) = under_shim(
        Command::new(&exe).arg(d.join("fortified.dat")).arg("20"),
        &[("UFFD_PAGER_FILES", &pattern)],
        &d.join("fortified.stats"),
    );
    assert_eq!(o.status.signal(), Some(libc::SIGABRT), "{o:?}");
}

/// `preadv2` and `pwritev2` go through the same coherence as their older
/// siblings: a read sees the mapping's stores, and a write over a page the
/// mapping dirtied shows in it and is not undone by its write-back. They
/// were not interposed: the reads gave the file's older bytes, and the
/// write-back at `munmap` put the mapping's older copy over the write.
#[test]
fn preadv2_and_pwritev2_are_coherent_with_the_mapping() {
    let d = scratch();
    let exe = build_c(&d, "vectored_v2");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "v2", &[]);
    assert_eq!(
        plain,
        "preadv2: stored, at the position: again!\nmapping after pwritev2: pwv2!!\nfile after munmap: pwv2!!\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// mremap of a whole pager mapping with a flag mremap does not know is
/// `EINVAL`, as the kernel answers, and the mapping stays as it was. The
/// engine made the move as if the flag were not there: the mapping shrank,
/// and the program's read of what it had left was SIGSEGV.
#[test]
fn mremap_with_an_unknown_flag_is_einval() {
    let d = scratch();
    let exe = build_c(&d, "mremap_flags");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "flags", &[]);
    assert_eq!(
        plain,
        "flag 0x8: Invalid argument\n\
         flag 0x10: Invalid argument\n\
         flag 0x40000000: Invalid argument\n\
         it reads a a\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A `pwritev2` with `RWF_NOAPPEND` on a descriptor opened `O_APPEND`
/// writes at its offset (or the descriptor's position), and the file's
/// writable shared pager mapping shows it and keeps it. The shim took it
/// for a write at the end of the file, as every other write there: the
/// mapping showed the older bytes, and its write-back of the pages it had
/// dirtied undid the write in the file.
#[test]
fn pwritev2_with_rwf_noappend_on_an_append_descriptor_is_coherent() {
    let d = scratch();
    let exe = build_c(&d, "noappend_v2");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "noappend", &[]);
    assert_eq!(
        plain,
        "RWF_NOAPPEND at an offset: written\n\
         RWF_NOAPPEND at the position: written\n\
         mapping: stored noapp2 again! noapp1\n\
         file at 10: stored\n\
         file at 200: noapp2\n\
         file at PAGE + 10: again!\n\
         file at PAGE + 100: noapp1\n\
         length: 16384\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A file stored to through its writable shared pager mapping, then mapped
/// `PROT_EXEC` (the kernel's mapping under the shim too): the new mapping
/// shows the stores. The write-back before a mapping the kernel makes came
/// after the shim had already passed on mappings with `PROT_EXEC` (or
/// without `PROT_READ`), so they showed the file's older bytes.
#[test]
fn an_exec_mapping_shows_what_the_pagers_mapping_stored() {
    let d = scratch();
    let exe = build_c(&d, "exec_after_stores");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "exec-after", &[]);
    assert_eq!(
        plain,
        "PROT_EXEC private: stored\nPROT_EXEC shared: again!\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A writable shared mapping of a file the pager maps, made by the kernel
/// (`PROT_EXEC`, `PROT_WRITE` alone, past the end of the file, `MAP_FIXED`
/// over part of the pager's mapping, `mprotect(PROT_WRITE)` of a read-only
/// one), is refused, as a second pager mapping of such a file is: the
/// kernel's page cache and the pager's are two copies of the file. So is a
/// pager mapping of a file the kernel maps writable and shared (seen by
/// `/proc/self/maps`, so one made writable by a raw system call too), and
/// its `mprotect(PROT_WRITE)`; once the kernel's mapping is gone the file
/// is the pager's again. The kernel mapped every one: the pager's
/// write-back of a page it had dirtied put `aaaaaa` over what was stored
/// through the kernel's mapping (`viaexe`, under the kernel alone).
#[test]
fn a_writable_kernel_mapping_beside_a_pager_mapping_is_refused() {
    let d = scratch();
    let exe = build_c(&d, "writable_beside");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("beside-plain.dat"))
        .output()
        .unwrap());
    assert_eq!(
        plain,
        "rwx beside: mapped\n\
         write-only beside: mapped\n\
         past the end beside: mapped\n\
         read-only exec beside: mapped\n\
         its mprotect rwx: done\n\
         MAP_FIXED over half of it: mapped\n\
         file where both stored: viaexe\n\
         served rw after it: mapped\n\
         served read-only after it: mapped\n\
         it reads kernel\n\
         served rw once it is gone: mapped\n\
         it reads kernel\n\
         served read-only: mapped\n\
         rwx beside it: mapped\n\
         its mprotect rwx: done\n\
         its raw mprotect rwx: done\n\
         the served one's mprotect rw: done\n"
    );
    beside_under_shim(&exe, &d.join("beside.dat"));
}

/// Runs `writable_beside` under the shim on `file` and checks what each
/// call answered.
fn beside_under_shim(exe: &Path, file: &Path) {
    let pattern = file.display().to_string();
    let stats = file.with_extension("stats");
    let (o, st) = under_shim(
        Command::new(exe).arg(file),
        &[("UFFD_PAGER_FILES", &pattern)],
        &stats,
    );
    assert_eq!(
        ok(&o),
        "rwx beside: No such device\n\
         write-only beside: No such device\n\
         past the end beside: No such device\n\
         read-only exec beside: mapped\n\
         its mprotect rwx: Permission denied\n\
         MAP_FIXED over half of it: No such device\n\
         file where both stored: aaaaaa\n\
         served rw after it: mapped\n\
         served read-only after it: mapped\n\
         it reads kernel\n\
         served rw once it is gone: mapped\n\
         it reads kernel\n\
         served read-only: mapped\n\
         rwx beside it: No such device\n\
         its mprotect rwx: Permission denied\n\
         its raw mprotect rwx: done\n\
         the served one's mprotect rw: Permission denied\n"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("refusing a second mapping") && err.contains("UFFD_PAGER_FILES"),
        "{err}"
    );
    // The first writable one, the one after the kernel's, the read-only
    // one; the two made while the kernel's writable mapping was there are
    // the kernel's too.
    assert_eq!(counter(&st, "preload_paged"), 3, "{st}");
    assert_eq!(counter(&st, "preload_refused"), 8, "{st}");
}

/// The same on an overlay whose layers are on other file systems (a
/// container's root, say): `/proc/self/maps` gives a mapped file the
/// overlay's device where `fstat` gives the layer's, so the shim never
/// saw the kernel's writable mapping beside its own, and the pager's
/// write-back put its older bytes over what was stored through the
/// kernel's (its `mprotect(PROT_WRITE)` was `done`). Needs root (a
/// mount); without it the test says so and checks nothing.
#[test]
fn a_writable_kernel_mapping_is_seen_on_an_overlay_too() {
    let d = scratch();
    let exe = build_c(&d, "writable_beside");
    let lower = Path::new("/dev/shm").join(format!("uffd-ovl-{}", std::process::id()));
    let (upper, work, merged) = (d.join("ovl-upper"), d.join("ovl-work"), d.join("ovl"));
    for dir in [&lower, &upper, &work, &merged] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let mounted = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(&merged)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("skipped: no overlay mount here (needs root)");
        let _ = std::fs::remove_dir_all(&lower);
        return;
    }
    let r = std::panic::catch_unwind(|| beside_under_shim(&exe, &merged.join("beside.dat")));
    let _ = Command::new("umount").arg(&merged).status();
    let _ = std::fs::remove_dir_all(&lower);
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

/// A successful mmap the kernel makes after the shim's work leaves the
/// program's errno as it was: a file mapped with `MAP_FIXED` over the
/// program's own memory (the engine refused the range, the kernel mapped
/// it) left the engine's `EEXIST` behind.
#[test]
fn an_mmap_the_kernel_makes_keeps_errno() {
    let d = scratch();
    let exe = build_c(&d, "mmap_errno");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "mmap-errno", &[]);
    assert_eq!(
        plain,
        "MAP_FIXED over own memory: mapped, errno 1234\n\
         PROT_EXEC beside stores: mapped, errno 1234\n\
         msync: 0, errno 1234\n\
         mprotect: 0, errno 1234\n\
         mremap: shrunk, errno 1234\n\
         munmap: 0, errno 1234\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A writable shared mapping of a file whose mode no longer lets the
/// program open it for writing (its store cannot open it again), and
/// `O_APPEND` set on the descriptor after the `mmap`: the stores land at
/// their page and the file keeps its length. The store wrote through a
/// `dup` of the descriptor there, which took the `O_APPEND` set later:
/// every write-back was appended past the end of the file.
#[test]
fn stores_land_at_their_page_when_o_append_is_set_after_the_mmap() {
    let d = scratch();
    let exe = build_c(&d, "append_set_later");
    let (plain, paged, _) = plain_and_paged(&d, &exe, "append-later", &[]);
    assert_eq!(plain, "size 16384, at the page: stored\n");
    assert_eq!(paged, plain);
}

/// A memfd sealed against writes: a writable shared mapping is the
/// kernel's `EPERM`, and a read-only one cannot be made writable
/// (`EACCES`). The shim made a pager mapping of the first (its store, an
/// open file of its own, took the stores; each write-back failed with
/// `EPERM` at `msync`, `read` and exit), and let `mprotect` make the
/// second writable.
#[test]
fn a_memfd_sealed_against_writes_is_not_mapped_writable() {
    let d = scratch();
    let exe = build_c(&d, "sealed_memfd");
    let plain = ok(&Command::new(&exe).output().unwrap());
    assert_eq!(
        plain,
        "writable shared: Operation not permitted\n\
         read-only shared: reads a\n\
         mprotect(PROT_WRITE): Permission denied\n"
    );
    let (o, st) = under_shim(
        &mut Command::new(&exe),
        &[("UFFD_PAGER_FILES", "/memfd:*")],
        &d.join("sealed.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// `msync(MS_SYNC)` of a shared file mapping leaves no dirty page of the
/// file behind (`cachestat`), as the kernel's, which syncs the file's
/// range: also what `pwrite(2)` put there. The shim's write-back synced
/// only when it wrote something itself, so the program's own writes to
/// the mapped range stayed dirty, not durable. A range that runs past
/// the mapping into a hole is `ENOMEM`, after the kernel has synced the
/// mapping before the hole; the shim returned the `ENOMEM` without syncing.
#[test]
fn msync_ms_sync_makes_what_write_put_in_the_range_durable() {
    let d = scratch();
    let exe = build_c(&d, "msync_durable");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "msync-durable", &[]);
    assert_eq!(
        plain,
        "stores, then msync: 0 dirty pages\npwrite, then msync: 0 dirty pages\n\
         stores, then msync past the end (ENOMEM): 0 dirty pages\n\
         pwrite, then msync past the end (ENOMEM): 0 dirty pages\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 4, "{st}");
}

/// A file mapped with `MAP_FIXED` into a range the program had just
/// freed is paged. The engine's own mappings, made as it opened the store
/// and started, went into that range first; the engine's map then failed
/// with an overlap, and the kernel's `MAP_FIXED` that followed replaced
/// the engine's memory with the program's file (`MAP_FIXED_NOREPLACE`
/// failed with `EEXIST`, where the kernel alone maps).
#[test]
fn a_fixed_map_into_a_range_just_freed_is_paged() {
    let d = scratch();
    let exe = build_c(&d, "fixed_into_freed");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "fixed-freed", &[]);
    assert_eq!(
        plain,
        "MAP_FIXED: read back, stored 'b'\nMAP_FIXED_NOREPLACE: read back, stored 'b'\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 2, "{st}");
    assert_eq!(counter(&st, "preload_passed"), 0, "{st}");
}

/// `munmap` of a range that runs past the top of the address space is the
/// kernel's `EINVAL`, with nothing unmapped. The shim unmapped the pager
/// mappings in the range and had the kernel unmap the gaps between them
/// (the program's own memory there: here a page of its own) before the
/// kernel's `EINVAL` for the whole.
#[test]
fn munmap_past_the_top_of_the_address_space_unmaps_nothing() {
    let d = scratch();
    let exe = build_c(&d, "munmap_past_the_top");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "past-top", &[]);
    assert_eq!(
        plain,
        "munmap: -1 (EINVAL), mapping reads 'a', memory reads 'q'\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// `mprotect(PROT_WRITE)` over a pager mapping and a hole after it is the
/// kernel's `ENOMEM`, after the kernel made the mapping writable: the
/// shim returned before it marked the mapping writable, so `fsync`
/// skipped it and the store never reached the file.
#[test]
fn a_store_after_mprotect_over_a_hole_reaches_the_file() {
    let d = scratch();
    let exe = build_c(&d, "mprotect_hole");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "mprotect-hole", &[]);
    assert_eq!(plain, "mprotect: -1 (ENOMEM), the file reads 's'\n");
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A private anonymous pager mapping made `PROT_NONE` (the kernel's
/// call), then `PROT_READ` (the engine's: its pages write-protected, the
/// mapping left as it was) reads back what was written. The mapping stayed
/// `PROT_NONE`, so the read was SIGSEGV.
#[test]
fn an_anonymous_mapping_made_none_then_read_only_reads() {
    let d = scratch();
    let exe = build_c(&d, "mprotect_none_then_read");
    let plain = ok(&Command::new(&exe).output().unwrap());
    assert_eq!(plain, "read 'w', write refused\n");
    let (o, st) = under_shim(
        &mut Command::new(&exe),
        &[("UFFD_PAGER_ANON_MIN", "16M"), ("UFFD_PAGER_BUDGET", "4M")],
        &d.join("none-then-read.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A private anonymous pager mapping made `PROT_READ` (the engine's call:
/// its pages write-protected, the mapping left writable in the kernel),
/// then part of it writable again (the kernel's call): stores inside that
/// part succeed, and one outside it is still refused. The kernel's
/// `mprotect` had changed nothing, so the first store inside the part made
/// the whole mapping read-only for real, and it was SIGSEGV.
#[test]
fn an_anonymous_mapping_made_read_only_then_writable_in_part_takes_stores_there() {
    let d = scratch();
    let exe = build_c(&d, "mprotect_part_writable");
    let plain = ok(&Command::new(&exe).output().unwrap());
    assert_eq!(
        plain,
        "read 'w', inside: stored 'x', stored 'y'; outside: refused\n"
    );
    let (o, st) = under_shim(
        &mut Command::new(&exe),
        &[("UFFD_PAGER_ANON_MIN", "16M"), ("UFFD_PAGER_BUDGET", "4M")],
        &d.join("part-writable.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// `mremap` of part of a pager mapping is refused (EINVAL), the mapping
/// left as it was. The kernel moved the part with its userfaultfd
/// registration, where the engine has no region, and the first touch of
/// it was SIGSEGV.
#[test]
fn mremap_of_part_of_a_pager_mapping_is_refused_not_a_crash() {
    let d = scratch();
    let exe = build_c(&d, "mremap_part");
    let plain = ok(&Command::new(&exe).output().unwrap());
    assert_eq!(
        plain,
        "mremap of part: moved, reads ad0, the rest reads eh\n"
    );
    let (o, st) = under_shim(
        &mut Command::new(&exe),
        &[("UFFD_PAGER_ANON_MIN", "16M"), ("UFFD_PAGER_BUDGET", "4M")],
        &d.join("mremap-part.stats"),
    );
    assert_eq!(ok(&o), "mremap of part: EINVAL, the mapping reads ah\n");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    assert_eq!(counter(&st, "preload_refused"), 1, "{st}");
}

/// `mremap(MREMAP_FIXED)` of a pager mapping to a target over itself is
/// the kernel's `EINVAL`; the engine's answer was `EEXIST`, an errno
/// mremap never gives.
#[test]
fn mremap_onto_the_mapping_itself_is_einval() {
    let d = scratch();
    let exe = build_c(&d, "mremap_onto_itself");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "onto-itself", &[]);
    assert_eq!(
        plain,
        "two pages on: Invalid argument\n\
         its own address: Invalid argument\n\
         still reads a\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// `mmap` of a descriptor opened `O_WRONLY` is the kernel's `EACCES`,
/// whatever the mapping: the shim made a pager mapping of it. Its store
/// wrote through a `dup` of the descriptor and could not read the file:
/// the first touch was SIGBUS (and, the first being writable and shared,
/// the file was refused to every later mapping, `ENODEV`); with the file
/// opened again for the store, the mapping read what the descriptor
/// gives no right to read.
#[test]
fn a_write_only_descriptor_is_not_mapped() {
    let d = scratch();
    let exe = build_c(&d, "write_only");
    let (plain, paged, st) =
        plain_and_paged(&d, &exe, "write-only", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(
        plain,
        "read-only shared: Permission denied\n\
         writable shared: Permission denied\n\
         read-only private: Permission denied\n\
         O_RDWR: reads w\n"
    );
    assert_eq!(paged, plain);
    // The O_RDWR one only.
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A writable shared mapping of a descriptor opened `O_RDONLY` is the
/// kernel's `EACCES`: the store opened the file again through
/// `/proc/self/fd` for reading and writing (allowed by the file's mode, and
/// always for root), so the shim made it a pager mapping and a store
/// through it reached the file the descriptor gives no right to write.
#[test]
fn a_read_only_descriptor_is_not_mapped_writable_and_shared() {
    let d = scratch();
    let exe = build_c(&d, "read_only_shared_write");
    let (plain, paged, _) = plain_and_paged(&d, &exe, "ro-shared", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(
        plain,
        "writable shared of O_RDONLY: Permission denied\n\
         the file starts with '.'\n"
    );
    assert_eq!(paged, plain);
}

/// A file stored to through its writable shared pager mapping, then
/// mapped writable and `MAP_PRIVATE` (a mapping the kernel makes, under the
/// shim too): with `MAP_FIXED` over the pager's mapping or beside it, the
/// private mapping shows the stores, as it does without the shim. The
/// kernel's mapping read the file before the stores were written back
/// (the write-back before a `MAP_FIXED` over pager memory came after the
/// shim had handed a writable private mapping to the kernel): beside it,
/// every page was stale; over it, in some runs.
#[test]
fn a_private_mapping_shows_what_the_pagers_mapping_stored() {
    let d = scratch();
    let exe = build_c(&d, "private_after_stores");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("private-after-plain.dat"))
        .output()
        .unwrap());
    assert_eq!(
        plain,
        "MAP_FIXED over it: 10 rounds, 0 failed, 0 stale pages\n\
         beside it: 10 rounds, 0 failed, 0 stale pages\n"
    );
    let pattern = format!("{}/private-after.dat", d.display());
    let (o, st) = under_shim(
        Command::new(&exe).arg(d.join("private-after.dat")),
        // (No budget: the MAP_FIXED case showed stale pages in most runs
        // so, in none with a budget of 1 MiB.)
        &[("UFFD_PAGER_FILES", &pattern)],
        &d.join("private-after.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 20, "{st}");
}

/// `mremap(MREMAP_FIXED)` that the shim refuses (growing a file mapping
/// past the end the file had at `mmap`: `EINVAL`, where the kernel grows
/// it) leaves the range the program reserved as it was. The shim unmapped
/// the program's memory there before the engine's checks, so a refused
/// move left a hole where the program's data had been (SIGSEGV), which
/// any later mapping could take.
#[test]
fn a_refused_mremap_keeps_the_reserved_range() {
    let d = scratch();
    let exe = build_c(&d, "mremap_refused");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("mremap-refused-plain.dat"))
        .output()
        .unwrap());
    assert_eq!(plain, "moved: 'f'\n");
    let pattern = format!("{}/mremap-refused.dat", d.display());
    let (o, st) = under_shim(
        Command::new(&exe).arg(d.join("mremap-refused.dat")),
        &[("UFFD_PAGER_FILES", &pattern)],
        &d.join("mremap-refused.stats"),
    );
    assert_eq!(
        ok(&o),
        "mremap: Invalid argument\nthe reserved range: 'r', the mapping: 'f'\n"
    );
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// Forty 4 KiB windows of a sparse 4 TiB file take 160 KiB of address
/// space under the kernel, and as little under the shim. For a few hours
/// on 2026-12-05 each window's store reached to the end of the file (so
/// that `mremap` could grow it), and its object's memfd alias and state
/// words were sized to that: about 4 TiB of address space per window,
/// 124 TiB for the 31 the engine could make before the aliases no longer
/// fitted, a 16 TiB reservation the program made next failed with
/// `ENOMEM`, and every write-back scanned the state word of every page of
/// the file (6 minutes at this test's exit in a debug build).
#[test]
fn small_windows_of_a_large_file_take_little_address_space() {
    let d = scratch();
    let exe = build_c(&d, "file_windows");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("windows-plain.dat"))
        .args(["4096", "40"])
        .output()
        .unwrap());
    assert_eq!(plain, "40 windows, 0 failed; 16 TiB reserved: ok\n");
    let pattern = format!("{}/windows.dat", d.display());
    let (o, _) = under_shim(
        Command::new(&exe)
            .arg(d.join("windows.dat"))
            .args(["4096", "40"]),
        &[("UFFD_PAGER_FILES", &pattern)],
        &d.join("windows.stats"),
    );
    assert_eq!(ok(&o), plain);
}

/// A file mapped again with `MAP_FIXED` over its own writable shared pager
/// mapping: the kernel maps it (the engine maps only into a free range),
/// and the new mapping shows what was stored through the old one. The
/// shim refused it as a second mapping of the file (`ENODEV`); let
/// through, the write-back that follows the engine's unmap event came
/// after the new mapping read the file now and then (about one run in
/// 25 showed the old bytes), so it is written back first.
#[test]
fn a_file_mapped_again_over_its_own_mapping_shows_the_stores() {
    let d = scratch();
    let exe = build_c(&d, "map_fixed_again");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "again", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(plain, "20 rounds, 0 failed, 0 stale pages\n");
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 20, "{st}");
}

/// `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` of a pager mapping into a range
/// the program reserved for it: the kernel's move replaces what is at the
/// target, and so does the shim's now. The engine moves only into a free
/// range, so the call failed with `EEXIST` (an errno mremap never gives).
#[test]
fn mremap_moves_a_mapping_into_a_reserved_range() {
    let d = scratch();
    let exe = build_c(&d, "mremap_into");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "into", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(plain, "moved to the target: P f\nfile: PQ\n");
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` of a pager mapping onto
/// another pager mapping: as the kernel's, the move replaces what is at
/// the target, all of a mapping or a part, whose stores (in the part that
/// goes, and in the part that stays) reach its file. The engine moves only
/// into a free range, so the move failed with `EEXIST`, which mremap never
/// gives. A growing move of a file mapping is the shim's `EINVAL` (see
/// `mremap_refused.c`), and leaves the target as it was.
#[test]
fn mremap_onto_another_pager_mapping_replaces_it() {
    let d = scratch();
    let exe = build_c(&d, "mremap_over_mapping");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("over-mapping-plain-1.dat"))
        .arg(d.join("over-mapping-plain-2.dat"))
        .output()
        .unwrap());
    let same = "onto all of another mapping of the file: moved\n\
                it reads a d\n\
                onto half of a writable mapping: moved\n\
                it reads P c, the other half a S\n\
                file 1 page 0: P\n\
                file 1 page 1: Q\n\
                file 2 page 0: R\n\
                file 2 page 1: S\n\
                file 2 page 2: T\n";
    assert_eq!(
        plain,
        format!("{same}growing onto another mapping: moved\nit reads P h\n")
    );
    let pattern = format!("{}/over-mapping-?.dat", d.display());
    let (o, st) = under_shim(
        Command::new(&exe)
            .arg(d.join("over-mapping-1.dat"))
            .arg(d.join("over-mapping-2.dat")),
        &[("UFFD_PAGER_FILES", &pattern), ("UFFD_PAGER_BUDGET", "1M")],
        &d.join("over-mapping.stats"),
    );
    assert_eq!(
        ok(&o),
        format!("{same}growing onto another mapping: Invalid argument\nboth still read P i\n")
    );
    assert_eq!(counter(&st, "preload_paged"), 6, "{st}");
}

/// A `pwrite` to a file with a writable shared pager mapping writes back
/// only the mapping's dirty pages that the write will change (against a
/// write-back of an older copy landing between the write and its
/// refresh), not the whole mapping: the program keeps storing to all 16
/// pages and writes one with `pwrite` after each of 20 rounds. The file
/// ends as under the kernel. The whole mapping was written back before
/// every `pwrite`: 320 pages written back (20 × 16), now 35 (20 × 1,
/// and the 15 pages left dirty at the end).
#[test]
fn a_pwrite_writes_back_only_the_pages_it_changes() {
    let d = scratch();
    let exe = build_c(&d, "write_while_dirty");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "dirty", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert!(plain.contains("page 15: t X19"), "{plain}");
    assert!(plain.contains("page 0: t only"), "{plain}");
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    let written = counter(&st, "writeback");
    assert!(
        (35..=40).contains(&written),
        "{written} pages written back for 20 one-page writes and 16 dirty pages at the end\n{st}"
    );
}

/// A `pwrite` to a page the program's `mremap` cut off its mapping: the
/// engine still holds the page (dirty here) in the mapping's object, as
/// the kernel's page cache does, but the shim looked only at the mapped
/// length for what a write overlaps: nothing was written back before the
/// write, nothing refreshed after, and the mapping grown back showed `DD.`
/// where the kernel's shows `WD.`, and the file got `DD.` back at the
/// unmap (found by review).
#[test]
fn a_pwrite_past_a_shrunk_mapping_reaches_the_pages_it_still_holds() {
    let d = scratch();
    let exe = build_c(&d, "mremap_shrink_write");
    let (plain, paged, _) = plain_and_paged(&d, &exe, "shrunk", &[]);
    assert_eq!(plain, "mapping: WD.\nfile: WD.\n");
    assert_eq!(paged, plain);
}

/// `fsync` after a store through a writable shared mapping: the kernel's
/// covers what was stored through the mapping, so the bytes are in the
/// file when it returns. The shim passed `fsync` to the kernel, which
/// knew nothing of the pager's dirty pages: `tests/c/fsync_mapped.c` read
/// `aaaaaa` back with a raw `pread` under the shim, `synced` without it.
#[test]
fn fsync_writes_back_what_was_stored_through_the_mapping() {
    let d = scratch();
    let exe = build_c(&d, "fsync_mapped");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "fsync", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(plain, "after-fsync synced\n");
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A panic in the shim's work for a call (a bug in the shim or the engine,
/// forced here with the test builds' `UFFD_PAGER_PRELOAD_PANIC`). Where that
/// work goes into the engine, whose locks an unwinding panic may leave
/// held (a program that went on could hang), the program stops with
/// SIGABRT after a line naming the call; where it does not (finding out
/// whether a `write` lands in a mapped file), the call fails with `EIO`
/// and the program goes on. The panic unwound into the program's C frames
/// before, and Rust aborted the program with no word of which call it was.
#[test]
fn a_panic_in_the_shim_names_the_call_and_fails_safe() {
    let d = scratch();
    let exe = build_c(&d, "shim_calls");
    let file = d.join("calls.dat");
    let pattern = format!("{}", file.display());
    let run = |site: &str| {
        let env = [
            ("UFFD_PAGER_FILES", pattern.as_str()),
            ("UFFD_PAGER_BUDGET", "1M"),
            ("UFFD_PAGER_PRELOAD_PANIC", site),
        ];
        let stats = d.join(format!("calls-{site}.stats"));
        let (o, st) = under_shim(Command::new(&exe).arg(&file), &env, &stats);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (o, err, st)
    };
    // No panic: every call succeeds, through the pager.
    let (o, _, st) = run("none");
    let out = ok(&o);
    let calls = [
        "mmap", "msync", "write", "read", "fsync", "mprotect", "munmap",
    ];
    for c in calls {
        assert!(out.contains(&format!("{c} 0 0\n")), "{out}");
    }
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    // Work in the engine: stopped, and said.
    for site in [
        "mmap", "msync", "refresh", "read", "fsync", "mprotect", "munmap",
    ] {
        let (o, err, _) = run(site);
        assert_eq!(o.status.signal(), Some(libc::SIGABRT), "{site}: {err}");
        assert!(
            err.contains(&format!("internal error in {site} (a panic")),
            "{site}: {err}"
        );
        assert!(err.contains("the program stops here"), "{site}: {err}");
    }
    // Work outside it: the call fails, the program goes on.
    let (o, err, _) = run("write");
    let out = ok(&o);
    assert!(
        out.contains(&format!("write -1 {}\n", libc::EIO)),
        "{out}\n{err}"
    );
    for c in calls.iter().filter(|c| **c != "write") {
        assert!(out.contains(&format!("{c} 0 0\n")), "{out}");
    }
    assert!(out.ends_with("done\n"), "{out}");
}

/// `mprotect(PROT_WRITE)` on read-only shared file mappings, answered as
/// the kernel answers it: a descriptor opened for writing lets the mapping
/// become writable, whole or in part (or with `pkey_mprotect`), and what
/// is stored through it reaches the file, dirty pages evicted under the
/// budget included; made read-only again, or after a failed `mprotect`,
/// the file can be mapped again (a failed call, or one back to read-only,
/// kept it from a second mapping, `ENODEV`, in a first version); one
/// opened read-only gets `EACCES`. Before, the shim answered `EACCES` to
/// the first (the read-only mapping's store took no writes), and let the
/// kernel make part of the second writable (its memfd is writable) to no
/// avail.
#[test]
fn mprotect_write_on_a_read_only_shared_mapping_is_the_kernels_answer() {
    let d = scratch().join("mprotect");
    std::fs::create_dir_all(&d).unwrap();
    let exe = build_c(&d, "mprotect_write");
    let plain_dir = d.join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let plain = ok(&Command::new(&exe).arg(&plain_dir).output().unwrap());
    assert!(plain.contains("whole: fsync 0 ok, 1024 of 1024"), "{plain}");
    assert!(plain.contains("read-only: part -1"), "{plain}");
    let pattern = format!("{}/*.dat", d.display());
    let env = [
        ("UFFD_PAGER_FILES", pattern.as_str()),
        ("UFFD_PAGER_BUDGET", "1M"),
    ];
    let (o, st) = under_shim(Command::new(&exe).arg(&d), &env, &d.join("mprotect.stats"));
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 5, "{st}");
    // Dirty pages left under the budget: written back by reclaim.
    assert!(counter(&st, "pgsteal") >= 1024, "{st}");
    assert!(counter(&st, "writeback") >= 1024 + 256, "{st}");

    // Two pager mappings of one file: the pager keeps a cache per mapping,
    // so one may not become writable (the kernel's one page cache lets it).
    let (o, _) = under_shim(
        Command::new(&exe).arg(&d).arg("twice"),
        &env,
        &d.join("twice.stats"),
    );
    let out = ok(&o);
    assert!(
        out.contains("twice: mprotect -1 Permission denied"),
        "{out}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("has another pager mapping"), "{err}");

    // Made writable by a raw system call, which the shim does not see, and
    // left mapped at exit: the exit writes it back all the same (it wrote
    // back only mappings made writable through the shim before: the file
    // kept its old bytes, with exit status 0).
    let tagged = |f: &Path| {
        let b = std::fs::read(f).unwrap();
        (0..1024).filter(|p| b[p * 4096 + 7] == b'r').count()
    };
    ok(&Command::new(&exe)
        .arg(&plain_dir)
        .arg("raw")
        .output()
        .unwrap());
    assert_eq!(tagged(&plain_dir.join("raw.dat")), 342);
    let (o, _) = under_shim(
        Command::new(&exe).arg(&d).arg("raw"),
        &env,
        &d.join("raw.stats"),
    );
    ok(&o);
    assert_eq!(tagged(&d.join("raw.dat")), 342);

    // Made writable by the kernel (`PROT_WRITE` alone is not the engine's
    // to serve), then moved: the engine's move would map it read-only
    // again and the next store would be SIGSEGV, losing the stores before
    // it, so the move is refused; the stores reach the file.
    let (o, _) = under_shim(
        Command::new(&exe).arg(&d).arg("move"),
        &env,
        &d.join("move.stats"),
    );
    let out = ok(&o);
    assert!(out.contains("move: mremap -1 Invalid argument"), "{out}");
    assert!(out.contains("move: 2 of 2 pages in the file"), "{out}");
}

/// Lengths that round past the address space get the kernel's answers, on
/// pager memory as on the kernel's (the shim's rounding overflowed: a
/// panic, which stops the program, in the builds the tests use), and a
/// successful pager `mmap` leaves errno as the program set it (it left the
/// engine's EINVAL).
#[test]
fn lengths_past_the_address_space_get_the_kernels_answers() {
    let d = scratch();
    let exe = build_c(&d, "huge_lengths");
    let file = d.join("huge-lengths.dat");
    let plain = ok(&Command::new(&exe).arg(&file).output().unwrap());
    assert!(plain.ends_with("done\n"), "{plain}");
    let pattern = format!("{}", file.display());
    let (o, st) = under_shim(
        Command::new(&exe).arg(&file),
        &[("UFFD_PAGER_FILES", pattern.as_str())],
        &d.join("huge-lengths.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// Calls the kernel refuses or treats specially, which the shim answered
/// otherwise (found by review; `tests/c/mapping_flags.c` says what each
/// did): `MAP_SHARED_VALIDATE | MAP_SYNC` was mapped (libpmem then stops
/// calling `msync`), a map type of 0 too, `MAP_32BIT` was ignored, an
/// offset and length that overflow aborted the debug shim, a wrapping
/// `madvise(MADV_DONTNEED)` zeroed a pager mapping before the kernel's
/// `EINVAL`, and `mprotect(PROT_WRITE)` of length 0 or past the top
/// marked a read-only mapping writable, so a second mapping of its file
/// was refused.
#[test]
fn mapping_flags_the_kernel_refuses_are_refused() {
    let d = scratch();
    let exe = build_c(&d, "mapping_flags");
    let env = [("UFFD_PAGER_ANON_MIN", "1M")];
    let (plain, paged, st) = plain_and_paged(&d, &exe, "mapping-flags", &env);
    assert_eq!(paged, plain, "{st}");
    assert!(plain.contains("MAP_SYNC: failed (EOPNOTSUPP)"), "{plain}");
    assert!(plain.contains("below 4 GiB: yes"), "{plain}");
    assert!(
        plain.contains("memory reads 'x'\nmadvise unaligned"),
        "{plain}"
    );
    // The large anonymous mapping and the read-only file mappings were
    // the pager's.
    assert!(counter(&st, "preload_paged") >= 2, "{st}");
}

/// Stores through a writable shared mapping, then an exec with neither
/// `msync` nor `munmap`: the new image reads them from the file, as under
/// the kernel. The shim wrote mappings back at exit only, which an exec
/// never reaches, so the new image read the older bytes (found by
/// review). Each exec call the shim interposes (glibc's own `execl`
/// family reaches the kernel through internal calls: the README says so).
#[test]
fn an_exec_after_stores_through_a_mapping_sees_them() {
    let d = scratch();
    let exe = build_c(&d, "exec_with_stores");
    for how in [
        "execve", "execv", "execvp", "execvpe", "fexecve", "execveat",
    ] {
        let file = d.join(format!("exec-{how}.dat"));
        let plain = ok(&Command::new(&exe).arg(&file).arg(how).output().unwrap());
        assert_eq!(plain, format!("after {how}: stored\n"));
        let pattern = file.display().to_string();
        let (o, st) = under_shim(
            Command::new(&exe).arg(&file).arg(how),
            &[("UFFD_PAGER_FILES", &pattern)],
            &d.join(format!("exec-{how}.stats")),
        );
        assert_eq!(ok(&o), plain, "{how}");
        // The first image's counters, written before its exec.
        assert_eq!(counter(&st, "preload_paged"), 1, "{how}: {st}");
    }
}

/// `MADV_REMOVE` on a writable shared file mapping: the kernel punches the
/// file; the shim punched its own memfd instead (a clean page came back
/// with the file's bytes, and the file kept them: "madvise 0; ... clean
/// page: mapped a, file a"), and refuses it now with `EOPNOTSUPP`, the
/// kernel's answer where a file system cannot punch.
#[test]
fn madv_remove_on_a_shared_file_mapping_is_refused_not_lost() {
    let d = scratch();
    let exe = build_c(&d, "madv_remove");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "madv-remove", &[]);
    assert_eq!(
        plain,
        "madvise 0; stored page: mapped zero, file zero; clean page: mapped zero, file zero\n"
    );
    assert_eq!(
        paged,
        "madvise EOPNOTSUPP; stored page: mapped b, file b; clean page: mapped a, file a\n"
    );
    assert_eq!(counter(&st, "preload_refused"), 1, "{st}");
}

/// A library initialised before the shim registers a fork child handler
/// that maps and uses 32 MiB of anonymous memory (over the threshold) and
/// `pwrite`s a byte to a file the parent pages. Child handlers run in the
/// order they were registered, so it ran before the shim's and the
/// engine's marked the child: its mapping went to the pager as if in the
/// parent (the engine's ioctls act on the parent's address space: the
/// child hung in it, or the parent's memory changed). The engine marks a
/// fork under way first now
/// and refuses the child's calls, and the shim passes them to the kernel.
#[test]
fn a_libraries_fork_child_handler_gets_the_kernels_memory() {
    let d = scratch();
    let exe = with_atfork_lib(&d, "atfork_first");
    let env = [("UFFD_PAGER_ANON_MIN", "16M"), ("UFFD_PAGER_BUDGET", "4M")];
    let (plain, paged, st) = plain_and_paged(&d, &exe, "atfork-first", &env);
    let want = "child handler: its memory held what it stored; its write made\n\
                child exited 0; parent's memory intact; the file's first byte Z\n";
    assert_eq!(plain, want);
    assert_eq!(paged, want, "{st}");
    // The parent's file and 32 MiB mappings were the pager's; the child's
    // the kernel's.
    assert_eq!(counter(&st, "preload_paged"), 2, "{st}");
}

/// Builds `tests/c/NAME.c` linked with `tests/c/atfork_lib.c` (a library
/// whose constructor registers a fork child handler, so before the shim's
/// constructor does) into `dir`; returns the executable.
fn with_atfork_lib(d: &Path, name: &str) -> PathBuf {
    with_lib(d, name, "atfork_lib")
}

/// Builds `tests/c/LIB.c` into `dir/libLIB.so` and `tests/c/NAME.c`
/// linked with it into `dir/NAME-LIB`; returns the executable.
fn with_lib(d: &Path, name: &str, lib: &str) -> PathBuf {
    let so = d.join(format!("lib{lib}.so"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{lib}.c"));
    let tmp = d.join(format!("{lib}.{:?}.tmp", std::thread::current().id()));
    let st = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-pthread"])
        .arg(&src)
        .arg("-o")
        .arg(&tmp)
        .status()
        .unwrap();
    assert!(st.success(), "cc {}", src.display());
    std::fs::rename(&tmp, &so).unwrap();
    let dir = d.display().to_string();
    let flags = [
        &format!("-L{dir}"),
        &format!("-Wl,-rpath,{dir}"),
        "-Wl,--no-as-needed",
        &format!("-l{lib}"),
    ];
    let exe = build_c_with(d, name, &flags);
    let linked = d.join(format!("{name}-{lib}"));
    std::fs::rename(&exe, &linked).unwrap();
    linked
}

/// A store a shared library's destructor makes to a writable shared
/// mapping after `main` returns reaches the file. The library is
/// finalised after the shim (an `LD_PRELOAD` library's destructor runs
/// first), whose exit write-back ran in its own destructor: the store was
/// never written back (found by review).
#[test]
fn a_store_from_a_library_destructor_reaches_the_file() {
    let d = scratch();
    let exe = with_lib(&d, "dtor_store", "dtor_lib");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "dtor-store", &[]);
    assert_eq!(plain, "stored\n");
    assert_eq!(paged, plain, "{st}");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    for name in ["dtor-store-plain.dat", "dtor-store.dat"] {
        let f = std::fs::read(d.join(name)).unwrap();
        assert_eq!(&f[..4], b"main", "{name}");
        assert_eq!(&f[8 * 4096..8 * 4096 + 4], b"late", "{name}: {st}");
    }
}

/// `MADV_WILLNEED` over a paged mapping with a hole the program's own
/// `munmap` left answers `ENOMEM`, as the kernel's does (the mapped pages
/// are still read in). The shim answered 0 for any range with pager memory
/// in it (found by review).
#[test]
fn madv_willneed_over_a_hole_is_enomem() {
    let d = scratch();
    let exe = build_c(&d, "willneed_hole");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "willneed-hole", &[]);
    assert_eq!(plain, "madvise -1 ENOMEM; pages w w\n");
    assert_eq!(paged, plain, "{st}");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// `MADV_DOFORK` on a paged mapping would undo the engine's
/// `MADV_DONTFORK`: a child forked after it got the engine's memfd mapping
/// with no pager behind it, and the pages the pager had dropped read as
/// zeros there ("madvise 0; child: wrong pages"). The shim refuses it
/// with `EINVAL`, the kernel's answer for a mapping it will not copy.
#[test]
fn madv_dofork_on_a_paged_mapping_is_refused() {
    let d = scratch();
    let exe = build_c(&d, "madv_dofork");
    let (plain, paged, st) =
        plain_and_paged(&d, &exe, "madv-dofork", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(plain, "madvise 0; child: every page right\n");
    assert_eq!(paged, "madvise EINVAL\n", "{st}");
    assert_eq!(counter(&st, "preload_refused"), 1, "{st}");
}

/// Stores through a mapping, then a child process started with `fork`,
/// `posix_spawn`, `posix_spawnp`, `system` or `popen` (no exec of the
/// program's own, no msync): the child reads the stores from the file.
/// It read the older bytes: nothing wrote back before it started.
#[test]
fn a_child_process_started_after_stores_through_a_mapping_sees_them() {
    let d = scratch();
    let exe = build_c(&d, "spawn_with_stores");
    for how in ["fork", "posix_spawn", "posix_spawnp", "system", "popen"] {
        let file = d.join(format!("spawn-{how}.dat"));
        let plain = ok(&Command::new(&exe).arg(&file).arg(how).output().unwrap());
        assert!(
            plain.starts_with(&format!("after {how}: stored\nerrno ")),
            "{plain}"
        );
        let pattern = file.display().to_string();
        let (o, st) = under_shim(
            Command::new(&exe).arg(&file).arg(how),
            &[("UFFD_PAGER_FILES", &pattern)],
            &d.join(format!("spawn-{how}.stats")),
        );
        assert_eq!(ok(&o), plain, "{how}");
        assert_eq!(counter(&st, "preload_paged"), 1, "{how}: {st}");
    }
}

/// A program whose own allocator maps and unmaps memory under its lock,
/// beside a thread whose calls the shim serves on a paged file (found by
/// review): the shim took its table's lock for every anonymous `mmap` and
/// every `munmap`, and allocates under it, so the two threads waited for
/// each other for ever (the program's alarm killed it). Such calls are
/// decided without the lock now (`maps/spans.rs`).
#[test]
fn an_allocator_that_maps_under_its_own_lock_does_not_hang() {
    let d = scratch();
    // (Without builtins: the compiler turns calloc's malloc and memset
    // into a call to calloc.)
    let exe = build_c_with(&d, "own_allocator", &["-fno-builtin"]);
    let (plain, paged, st) = plain_and_paged(&d, &exe, "own-allocator", &[]);
    assert_eq!(plain, "done\n");
    assert_eq!(paged, plain);
    assert!(counter(&st, "preload_paged") >= 1000, "{st}");
}

/// `sync`, `syncfs` and `sync_file_range` after stores through a writable
/// shared mapping: the kernel's write what was stored, as its page cache
/// holds it. The shim did not interpose them, so the file kept the older
/// bytes (found by review); they write the mappings back first now.
#[test]
fn sync_and_syncfs_and_sync_file_range_write_the_stores() {
    let d = scratch();
    let exe = build_c(&d, "sync_calls");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "sync-calls", &[]);
    assert_eq!(
        plain,
        "after sync: sync!!\nafter syncfs: syncfs\nafter sync_file_range: range!\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A `pwrite` over a range that spans a hole the program unmapped in a
/// read-only mapping of the anonymous kind: the shim dropped the written
/// pages with one call over the whole range, which the engine refused
/// (not inside one piece), so both sides showed the older bytes (found by
/// review). They are dropped piece by piece now.
#[test]
fn a_write_over_a_hole_is_seen_on_both_sides_of_it() {
    let d = scratch();
    let exe = build_c(&d, "write_over_a_hole");
    let env = [("UFFD_PAGER_KIND", "anonymous")];
    let (plain, paged, st) = plain_and_paged(&d, &exe, "write-over-a-hole", &env);
    assert_eq!(plain, "before: a a\nafter: w w\n");
    assert_eq!(paged, plain, "{st}");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A thread with a descriptor table of its own maps a file at a number the
/// process's first table holds for another file: the pages are written
/// back to the file mapped. The shim opened the file again through
/// `/proc/self/fd` (the first thread's table), so it paged the other
/// file's name and wrote the stores there.
#[test]
fn a_thread_with_its_own_descriptor_table_maps_its_own_file() {
    let d = scratch();
    let exe = build_c(&d, "own_table");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("own-table-plain.dat"))
        .output()
        .unwrap());
    assert_eq!(plain, "at the page: stored, the other file there: bbbbbb\n");
    let pattern = format!("{}/own-table.dat*", d.display());
    let (o, st) = under_shim(
        Command::new(&exe).arg(d.join("own-table.dat")),
        &[("UFFD_PAGER_FILES", &pattern)],
        &d.join("own-table.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// read(2) into, and write(2) from, pages of a paged anonymous mapping
/// that are not in yet, where the pager cannot serve a fault inside a
/// system call (in-thread delivery: a user-mode-only descriptor): the
/// kernel answered each with `EFAULT` ("Bad address" from Python), where
/// without the shim they succeed (found by review). The shim keeps the
/// buffer's pages resident for the call now.
#[test]
fn read_and_write_on_absent_paged_memory_succeed_in_thread() {
    let d = scratch();
    let data = d.join("syscall-buffers.data");
    let out = d.join("syscall-buffers.out");
    let bytes: Vec<u8> = (0..(2usize << 20))
        .map(|i| (i / 4096 % 251) as u8)
        .collect();
    std::fs::write(&data, &bytes).unwrap();
    let script = format!(
        "import mmap, os\n\
         m = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE)\n\
         v = memoryview(m)\n\
         with open('{data}', 'rb', buffering=0) as f:\n    \
             n = f.readinto(v[8 << 20:10 << 20])\n\
         fd = os.open('{out}', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n\
         w = os.write(fd, v[8 << 20:10 << 20])\n\
         z = os.write(fd, v[20 << 20:(20 << 20) + 4096])\n\
         os.close(fd)\n\
         print(n, w, z)\n",
        data = data.display(),
        out = out.display()
    );
    let (o, st) = under_shim(
        Command::new(python()).args(["-c", &script]),
        &[
            ("UFFD_PAGER_ANON_MIN", "16M"),
            ("UFFD_PAGER_BUDGET", "8M"),
            ("UFFD_PAGER_DELIVERY", "in-thread"),
        ],
        &d.join("syscall-buffers.stats"),
    );
    assert_eq!(ok(&o), "2097152 2097152 4096\n");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    let mut want = bytes;
    want.extend([0u8; 4096]);
    assert!(std::fs::read(&out).unwrap() == want, "the bytes written");
}

/// The same for `write(2)` from a writable shared file mapping: the guard
/// faulted the buffer's pages in for a write, which made them dirty, and
/// every one was written back at exit though nothing changed it (found by
/// review). A `write`'s buffer is faulted in for a read now.
#[test]
fn a_write_from_a_writable_file_mapping_leaves_its_pages_clean() {
    let d = scratch();
    let data = d.join("write-from-mapping.data");
    let out = d.join("write-from-mapping.out");
    let bytes: Vec<u8> = (0..(2usize << 20))
        .map(|i| (i / 4096 % 249) as u8)
        .collect();
    std::fs::write(&data, &bytes).unwrap();
    let script = format!(
        "import mmap, os\n\
         f = open('{data}', 'r+b')\n\
         m = mmap.mmap(f.fileno(), 2 << 20)\n\
         fd = os.open('{out}', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n\
         print(os.write(fd, memoryview(m)[:1 << 20]))\n\
         os.close(fd)\n",
        data = data.display(),
        out = out.display()
    );
    let (o, st) = under_shim(
        Command::new(python()).args(["-c", &script]),
        &[
            ("UFFD_PAGER_FILES", &data.display().to_string()),
            ("UFFD_PAGER_DELIVERY", "in-thread"),
        ],
        &d.join("write-from-mapping.stats"),
    );
    assert_eq!(ok(&o), "1048576\n");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    assert_eq!(counter(&st, "writeback"), 0, "{st}");
    assert!(
        std::fs::read(&out).unwrap() == bytes[..1 << 20],
        "the bytes written"
    );
    assert!(std::fs::read(&data).unwrap() == bytes, "the file");
}

/// POSIX makes `read`, `write`, `readv` and `writev` cancellation points.
/// The shim passed them on as raw system calls, which are not: a thread
/// blocked in one on a pipe never took a `pthread_cancel`. They go through
/// libc's own definitions now.
#[test]
fn a_thread_blocked_in_read_or_write_takes_a_cancel() {
    let d = scratch();
    let exe = build_c(&d, "cancel_blocked_io");
    let plain = ok(&Command::new(&exe).output().unwrap());
    let (o, _) = under_shim(&mut Command::new(&exe), &[], &d.join("cancel.stats"));
    let out = ok(&o);
    assert_eq!(out, plain);
    for c in ["read", "readv", "write", "writev"] {
        assert!(out.contains(&format!("{c} cancelled\n")), "{out}");
    }
    // The read's buffer in a paged mapping, served in-thread (which cannot
    // serve a fault inside a system call): the shim keeps it resident for
    // the call, and the cancelled call's residency guard is given back, so
    // the munmap after it leaves nothing resident. Called through
    // `extern "C"` pointers, a release build of the shim skipped the
    // guard's drop (1 page left resident at exit); a debug build, which
    // keeps the landing pads, ran it either way.
    // With a cancel already pending when a page is faulted in (a load,
    // and a read(2) into a guarded buffer): the engine's own reads of the
    // file are not cancellation points (they were for a moment, and the
    // forced unwind from inside the engine would abort the process).
    let file = d.join("cancel.dat");
    let plain = ok(&Command::new(&exe)
        .arg(d.join("cancel-plain.dat"))
        .output()
        .unwrap());
    assert!(plain.contains("pending read cancelled\n"), "{plain}");
    let pattern = file.display().to_string();
    let (o, st) = under_shim(
        Command::new("timeout").arg("20").arg(&exe).arg(&file),
        &[
            ("UFFD_PAGER_FILES", pattern.as_str()),
            ("UFFD_PAGER_DELIVERY", "in-thread"),
        ],
        &d.join("cancel-paged.stats"),
    );
    assert_eq!(ok(&o), plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    assert!(
        counter(&st, "pgfault") >= 1,
        "the guard faulted the page in\n{st}"
    );
    assert_eq!(counter(&st, "resident_pages"), 0, "{st}");
}

/// A signal handler's `write(2)` to a log file, every 100 µs, while the
/// program maps, stores to, `pwrite`s, `msync`s and unmaps a paged
/// mapping in a loop: the handler's write goes through the shim too,
/// which looks its file up in the table that the interrupted call may be
/// holding the lock of. A handler on a thread that is inside the shim's
/// own work passes its call straight on (the work is marked as the
/// shim's), so it neither waits for that lock (a hang) nor fails. A
/// guard: it passes without any change of this stop.
#[test]
fn a_signal_handlers_write_during_the_shims_own_work_goes_through() {
    let d = scratch();
    let exe = build_c(&d, "signal_write");
    let expect = "failed writes 0; log holds every write: yes; many writes: yes\n";
    let plain = ok(&Command::new(&exe)
        .arg(d.join("signal-plain.dat"))
        .output()
        .unwrap());
    assert_eq!(plain, expect);
    let file = d.join("signal.dat");
    let pattern = file.display().to_string();
    let (o, st) = under_shim(
        Command::new("timeout").arg("60").arg(&exe).arg(&file),
        &[
            ("UFFD_PAGER_FILES", pattern.as_str()),
            ("UFFD_PAGER_BUDGET", "1M"),
        ],
        &d.join("signal.stats"),
    );
    assert_eq!(ok(&o), expect);
    assert!(counter(&st, "preload_paged") >= 1, "{st}");
}

/// The program's POSIX record lock on a file outlives a mapping of the
/// file and its `munmap`, as under the kernel alone: the shim's store
/// closed its own descriptor of the file at the `munmap`, and that close
/// dropped the lock (sqlite remaps its database so while it holds its
/// locks). Its descriptor now waits for the locks to go: the program's
/// own close drops them, under the kernel too.
#[test]
fn a_record_lock_outlives_a_mapping_of_its_file() {
    let d = scratch();
    let exe = build_c(&d, "record_locks");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "record-locks", &[]);
    assert_eq!(
        plain,
        "map 1 read 'a'; after its munmap the lock is held\n\
         map 2 read 'a'; after its munmap the lock is held\n\
         after the program's close the lock is gone\n"
    );
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 2, "{st}");
}

/// A cancel pending while the shim maps and unmaps a paged file: the
/// thread is cancelled at its own next cancellation point, as under the
/// kernel alone. The shim's own `open`s and `close`s there are glibc
/// cancellation points, and the cancel acting in one aborted the process
/// (its unwind met the shim's panic guard as a foreign exception).
#[test]
fn a_cancel_pending_while_the_shim_works_waits_for_the_programs_own_point() {
    let d = scratch();
    let exe = build_c(&d, "cancel_in_shim");
    let (plain, paged, st) = plain_and_paged(&d, &exe, "cancel-in-shim", &[]);
    assert_eq!(plain, "cancelled at its own cancellation point\n");
    assert_eq!(paged, plain);
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// `MADV_WILLNEED` is a hint: over a file 16 times the budget the shim
/// reads in at most a quarter of the budget (2 MiB at most), and past the
/// end of the file it answers 0, as the kernel does. It read all 4,096
/// pages in (`pgread` 4,105 for a budget of 256 pages), and answered `EIO`
/// past the end (found by review).
#[test]
fn madv_willneed_reads_a_bounded_part_and_never_fails_on_reads() {
    let d = scratch();
    let exe = build_c(&d, "willneed_large");
    let (plain, paged, st) =
        plain_and_paged(&d, &exe, "willneed-large", &[("UFFD_PAGER_BUDGET", "1M")]);
    assert_eq!(
        plain,
        "whole: madvise 0 ; first l\npast the end: madvise 0 ; first l\n"
    );
    assert_eq!(paged, plain, "{st}");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    // A quarter of the budget (64 pages) per call, and what fault-around
    // and readahead add to the program's own read of the first page.
    assert!(counter(&st, "pgread") < 256, "{st}");
}

/// `mprotect` with a protection the kernel refuses before it changes
/// anything (an unknown bit, `PROT_GROWSDOWN` on a mapping that does not
/// grow down) gets the kernel's `EINVAL` over a pager mapping too. The
/// shim took either as a plain `PROT_READ` and answered 0 (found by
/// review).
#[test]
fn mprotect_with_bits_the_kernel_refuses_is_einval() {
    let d = scratch();
    let exe = build_c(&d, "mprotect_bad_prot");
    let (plain, paged, st) = plain_and_paged(
        &d,
        &exe,
        "mprotect-bad-prot",
        &[("UFFD_PAGER_BUDGET", "1M")],
    );
    assert_eq!(
        plain,
        "unknown bit: mprotect -1 EINVAL\ngrowsdown: mprotect -1 EINVAL\n\
         plain: mprotect 0 \nfirst b\n"
    );
    assert_eq!(paged, plain, "{st}");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
}

/// A read of bytes stored through a shared mapping whose page the pager
/// cannot write back first (the file size limit is below it: `EFBIG`)
/// fails with that errno; a read of another page still reads. The shim's
/// read went on after the failed write-back and returned the file's older
/// bytes with no error (found by review).
#[test]
fn a_read_whose_write_back_fails_fails_instead_of_returning_older_bytes() {
    let d = scratch();
    let exe = build_c(&d, "read_after_failed_writeback");
    let (plain, paged, st) = plain_and_paged(
        &d,
        &exe,
        "read-after-failed-writeback",
        &[("UFFD_PAGER_BUDGET", "1M")],
    );
    assert_eq!(plain, "other page: read\npread: the store\n");
    assert_eq!(paged, "other page: read\npread -1 EFBIG\n", "{st}");
    assert_eq!(counter(&st, "preload_paged"), 1, "{st}");
    // The exit's write-back, with the limit lifted, lands.
    let bytes = std::fs::read(d.join("read-after-failed-writeback.dat")).unwrap();
    assert_eq!(bytes[6 * 4096], b'n');
}
