//! The `vramguard` command line: `estimate` and `crds`. The only module that
//! uses `anyhow`; everything it decides comes from `api`, `estimate`, `plan`.

pub mod crds;
pub mod estimate;
mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use estimate::{EstimateArgs, JobReport, OutputFormat, run_estimate};

/// Exit code: every job fits.
pub const EXIT_FITS: u8 = 0;
/// Exit code: some job does not fit on any GPU asked about.
pub const EXIT_DOES_NOT_FIT: u8 = 1;
/// Exit code: bad input (unreadable file, invalid YAML, invalid spec).
pub const EXIT_BAD_INPUT: u8 = 2;

/// Estimate, fit and place GPU training jobs before they run.
#[derive(Debug, Parser)]
#[command(name = "vramguard", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Estimate per-GPU memory of TrainingJobs and check them against GPUs.
    Estimate(EstimateArgs),
    /// Print the CustomResourceDefinitions (YAML) to apply to a cluster.
    Crds,
}

/// Parse arguments, run, and map the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Estimate(args) => {
            let stdout = std::io::stdout();
            let stderr = std::io::stderr();
            run_estimate(
                &args,
                &mut std::io::stdin().lock(),
                &mut stdout.lock(),
                &mut stderr.lock(),
            )
        }
        Command::Crds => crds::run(&mut std::io::stdout().lock()),
    };
    ExitCode::from(code)
}

/// The command definition, for tests and documentation.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_definition_is_consistent() {
        super::command().debug_assert();
    }
}
