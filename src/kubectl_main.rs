use std::process::ExitCode;

fn main() -> ExitCode {
    vramguard::cli::kubectl::main()
}
