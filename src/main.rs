use std::process::ExitCode;

fn main() -> ExitCode {
    vramguard::cli::main()
}
