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
    /// A progress line on standard error: auto (only when it is a terminal), always, never.
    #[arg(long, env = "VRAMGUARD_PROGRESS", value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
}

/// When `simulate` shows its progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    Auto,
    Always,
    Never,
}

/// `1d 2h`, `3h 12m`, `45m 10s`, `30s`.
pub fn short_duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {sec}s")
    } else {
        format!("{sec}s")
    }
}

/// The progress line.
pub fn progress_line(p: &simulate::Progress, horizon: f64, jobs: usize, wall: f64) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    if p.live_done.load(Relaxed) {
        return format!("simulate: the same scenario with vramguard off · {wall:.1} s");
    }
    let at = p.simulated_ms.load(Relaxed) as f64 / 1000.0;
    format!(
        "simulate: {} of {} simulated · {} of {jobs} jobs submitted · {wall:.1} s",
        short_duration(at),
        short_duration(horizon),
        p.submitted.load(Relaxed),
    )
}

/// Rewrite the progress line on standard error every 200 ms until `done`, then clear it.
fn show_progress(
    p: &simulate::Progress,
    done: &std::sync::atomic::AtomicBool,
    horizon: f64,
    jobs: usize,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let started = std::time::Instant::now();
    let mut err = std::io::stderr();
    loop {
        let line = progress_line(p, horizon, jobs, started.elapsed().as_secs_f64());
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        for _ in 0..4 {
            if done.load(Relaxed) {
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
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
        progress,
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
    let show = match progress {
        ProgressMode::Always => true,
        ProgressMode::Never => false,
        // CI logs and pipes stay clean.
        ProgressMode::Auto => std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let state = simulate::Progress::default();
    let done = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        if show {
            s.spawn(|| show_progress(&state, &done, scenario.horizon, scenario.arrivals.len()));
        }
        let r = simulate::run_with_progress(&scenario, &state);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    });
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let written = match output {
        OutputFormat::Svg => {
            let _ = writeln!(
                err,
                "error: -o svg is for estimate; use table, json or yaml"
            );
            return EXIT_BAD_INPUT;
        }
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
