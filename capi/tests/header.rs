//! The checked-in C header is what cbindgen makes of the crate now.
//! `UPDATE_HEADER=1 cargo test -p uffd-pager-capi --test header` rewrites it.

#[test]
fn checked_in_header_matches_the_sources() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).unwrap();
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen");
    let mut made = Vec::new();
    bindings.write(&mut made);
    let path = format!("{dir}/include/uffd_pager.h");
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let have = std::fs::read(&path).unwrap_or_default();
    assert!(
        have == made,
        "{path} is out of date with capi/src: run \
         `UPDATE_HEADER=1 cargo test -p uffd-pager-capi --test header` and commit it"
    );
}
