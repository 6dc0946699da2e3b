//! Links the shim with `-z nodelete`: its destructor registers the exit
//! write-back as an exit handler (see `unload` in `src/lib.rs`), whose
//! code must still be mapped when the handler runs. An `LD_PRELOAD`
//! library is never unloaded; one a program `dlopen`ed and `dlclose`d
//! would be, and the handler would then call into unmapped memory.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
