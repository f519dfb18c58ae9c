//! `vramguard simulate -f scenario.yaml`: the webhook, operator and agents on
//! simulated nodes and trainers, in one process on simulated time; prints the
//! timeline, the summary beside the baseline (vramguard off) and the
//! invariants. Exit codes: 0 every invariant holds, 1 one does not, 2 bad input.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;

use super::estimate::OutputFormat;
use super::{EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_FITS};
use crate::simulate;

/// Arguments of `vramguard simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The scenario (see examples/scenarios/), or - for standard input.
    #[arg(
        short = 'f',
        long = "file",
        env = "VRAMGUARD_SCENARIO",
        value_name = "FILE"
    )]
    pub file: PathBuf,
    /// Output format: table (timeline, side-by-side summary, invariants), json or yaml.
    #[arg(short = 'o', long, env = "VRAMGUARD_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Timeline lines shown in the table output.
    #[arg(long, env = "VRAMGUARD_TIMELINE_LINES", default_value_t = 40)]
    pub timeline_lines: usize,
}

/// Run `simulate`; returns the exit code.
pub fn run(
    args: &SimulateArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let SimulateArgs {
        file,
        output,
        timeline_lines,
    } = args;
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        match stdin.read_to_string(&mut s) {
            Ok(_) => s,
            Err(e) => {
                let _ = writeln!(err, "error: reading standard input: {e}");
                return EXIT_BAD_INPUT;
            }
        }
    } else {
        match std::fs::read_to_string(file) {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(err, "error: {}: {e}", file.display());
                return EXIT_BAD_INPUT;
            }
        }
    };
    let scenario = match simulate::scenario::parse_within(&text, memory_available()) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(err, "error: {}: {e}", file.display());
            return EXIT_BAD_INPUT;
        }
    };
    let report = match simulate::run(&scenario) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let written = match output {
        OutputFormat::Table => out.write_all(report.text(*timeline_lines).as_bytes()),
        OutputFormat::Json => serde_json::to_string_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|s| writeln!(out, "{s}")),
        OutputFormat::Yaml => serde_saphyr::to_string(&report)
            .map_err(std::io::Error::other)
            .and_then(|s| out.write_all(s.as_bytes())),
    };
    if let Err(e) = written {
        let _ = writeln!(err, "error: writing the report: {e}");
        return EXIT_BAD_INPUT;
    }
    if report.all_hold() {
        EXIT_FITS
    } else {
        EXIT_DOES_NOT_FIT
    }
}

/// Memory the system can give this process without swapping (Linux's
/// `MemAvailable`); `None` where it cannot be read.
fn memory_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}
