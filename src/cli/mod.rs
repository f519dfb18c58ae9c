//! The `vramguard` command line: `estimate`, `crds`, `serve`, `agent`, `simulate`. The only module that
//! uses `anyhow`; everything it decides comes from `api`, `estimate`, `plan`.

pub mod agent;
pub mod crds;
pub mod estimate;
pub mod kubectl;
pub mod max;
pub mod paint;
mod plot;
pub mod problems;
mod render;
mod report;
pub mod serve;
#[cfg(feature = "simulate")]
pub mod simulate;
pub mod spec_flags;

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
    /// How `serve` and `agent` write their log to stderr: text (coloured only
    /// on a terminal) or one JSON object per line. The level comes from RUST_LOG
    /// (default info: a summary of admission reviews a minute; debug: every review).
    #[arg(
        long,
        global = true,
        env = "VRAMGUARD_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

/// The log's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Estimate per-GPU memory of TrainingJobs and check them against GPUs.
    Estimate(EstimateArgs),
    /// The largest micro-batch and longest sequence a job fits with on a GPU, as written and
    /// after each change its fit policy lists.
    Max(max::MaxArgs),
    /// Print the CustomResourceDefinitions (YAML) to apply to a cluster, or with
    /// --reference every TrainingJob field as Markdown.
    Crds(crds::CrdsArgs),
    /// Serve the admission webhook (TLS) for TrainingJobs.
    Serve(serve::ServeArgs),
    /// Probe this node's GPUs: print one probe (--once), or publish a GpuNode and serve /check.
    Agent(agent::AgentArgs),
    /// Run a scenario: webhook, operator and agents on simulated GPUs and trainers, with faults,
    /// side by side with vramguard off.
    #[cfg(feature = "simulate")]
    Simulate(simulate::SimulateArgs),
}

/// Parse arguments, run, and map the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Estimate(mut args) => {
            args.color = args.color.for_stdout();
            let stdout = std::io::stdout();
            let stderr = std::io::stderr();
            run_estimate(
                &args,
                &mut std::io::stdin().lock(),
                &mut stdout.lock(),
                &mut stderr.lock(),
            )
        }
        Command::Max(mut args) => {
            args.color = args.color.for_stdout();
            let stdout = std::io::stdout();
            let stderr = std::io::stderr();
            max::run(
                &args,
                &mut std::io::stdin().lock(),
                &mut stdout.lock(),
                &mut stderr.lock(),
            )
        }
        Command::Crds(args) => crds::run(&args, &mut std::io::stdout().lock()),
        Command::Serve(args) => run_async(cli.log_format, serve::run(args)),
        Command::Agent(args) => run_async(cli.log_format, agent::run(args)),
        #[cfg(feature = "simulate")]
        Command::Simulate(args) => {
            // The simulated operator and agents log like real ones: warnings only.
            init_tracing_at(cli.log_format, "warn");
            let stdout = std::io::stdout();
            // Not locked: the progress line is written from another thread.
            simulate::run(
                &args,
                &mut std::io::stdin().lock(),
                &mut stdout.lock(),
                &mut std::io::stderr(),
            )
        }
    };
    ExitCode::from(code)
}

/// Resolves on SIGTERM or Ctrl-C; logs `what` then.
pub(crate) async fn shutdown_signal(what: &'static str) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("{what}");
}

fn init_tracing(format: LogFormat) {
    init_tracing_at(format, "info");
}

/// Logs to standard error at `default` unless RUST_LOG says otherwise.
fn init_tracing_at(format: LogFormat, default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        // Escape codes only for a person at a terminal, never into a file or a pipe.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
}

fn run_async(
    log_format: LogFormat,
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> u8 {
    init_tracing(log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    match runtime.block_on(fut) {
        Ok(()) => EXIT_FITS,
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_BAD_INPUT
        }
    }
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
