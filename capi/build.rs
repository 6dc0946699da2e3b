//! The shared library's SONAME carries the ABI version
//! (`UFFD_PAGER_ABI_VERSION` in `src/lib.rs`): a program links against
//! `libuffd_pager.so.1`, and a library with another ABI is not loaded in
//! its place.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libuffd_pager.so.1");
}
