//! `uffd-pager`: the command-line front end (see `uffd-pager --help`).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
