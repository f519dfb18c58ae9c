//! `vramguard max`: the largest micro-batch and the longest sequence a job fits with on one
//! GPU, as written and after each change its fit policy lists (`src/plan/max.rs`). Exit 0
//! when the job fits as written, 1 when it does not, 2 on bad input.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::EXIT_BAD_INPUT;
use super::estimate::{OutputFormat, finish, job_documents, structured, validate_documents};
use super::paint::{ColorChoice, Paint};
use super::problems::{ErrorFormat, Problems};
use super::spec_flags::SpecFlags;
use crate::api::ValidatedJob;
use crate::estimate::{GIB, GpuProduct, gpus};
use crate::plan::Allowance;
use crate::plan::max::{Largest, Row, table};

/// Arguments of `vramguard max`.
#[derive(Debug, Clone, Args)]
pub struct MaxArgs {
    /// TrainingJob YAML (one or several documents); `-` reads standard input. Without it,
    /// the job is given by flags.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The GPU product.
    #[arg(long, env = "VRAMGUARD_GPU", default_value = "h100-80gb")]
    pub gpu: String,
    /// Every change the planner knows, not only those `fitPolicy.allow` lists.
    #[arg(long)]
    pub all_changes: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// How bad input is reported on standard error: `error:` lines, or one JSON object
    /// `{"errors": [{"path", "reason", ...}]}` for programs.
    #[arg(long, env = "VRAMGUARD_ERROR_FORMAT", value_enum, default_value_t = ErrorFormat::Text)]
    pub error_format: ErrorFormat,
    /// Colour in the table: on a terminal (auto, unless NO_COLOR is set), always or never.
    #[arg(long, env = "VRAMGUARD_COLOR", value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    #[command(flatten)]
    pub spec: SpecFlags,
}

/// What `max` says about one job (the `-o json` object).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MaxReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub model: String,
    pub gpu: String,
    pub usable_bytes: u64,
    pub safety_margin: f64,
    /// The micro-batch and sequence as written.
    pub micro_batch_size: u64,
    pub sequence_length: u64,
    /// True when the job fits as written.
    pub fits: bool,
    pub rows: Vec<Row>,
}

fn allowance(job: &ValidatedJob, all: bool) -> Allowance {
    if all {
        return Allowance::all();
    }
    // What the job says may change, whether the webhook may change it (Adjust) or not.
    job.spec()
        .fit_policy
        .allow
        .iter()
        .fold(Allowance::none(), |a, f| a.with(*f))
}

/// The report for one job.
pub fn report(
    job: &ValidatedJob,
    name: Option<String>,
    gpu: &'static GpuProduct,
    all_changes: bool,
) -> Result<MaxReport, String> {
    let rows = table(job, gpu, allowance(job, all_changes)).map_err(|e| e.to_string())?;
    let t = &job.spec().training;
    let fits = rows
        .first()
        .and_then(|r| r.micro_batch_size.value)
        .is_some_and(|m| m >= t.micro_batch_size)
        && rows
            .first()
            .and_then(|r| r.sequence_length)
            .is_none_or(|s| s.value.is_some_and(|v| v >= t.seq_len()));
    Ok(MaxReport {
        name,
        model: job.model_name.clone(),
        gpu: gpu.name.to_string(),
        usable_bytes: gpu.usable_bytes(),
        safety_margin: job.spec().fit_policy.safety_margin,
        micro_batch_size: t.micro_batch_size,
        sequence_length: t.seq_len(),
        fits,
        rows,
    })
}

fn cell(l: &Largest) -> String {
    match (l.value, l.capped) {
        (None, _) => "none".to_string(),
        (Some(v), true) => format!("≥{v}"),
        (Some(v), false) => v.to_string(),
    }
}

fn write_table(reports: &[MaxReport], paint: Paint, out: &mut dyn Write) -> std::io::Result<()> {
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        writeln!(
            out,
            "{}: {} on {} ({:.1} GiB usable, {:.0} % margin); written: micro-batch {} × {} tokens, {}",
            paint.bold(r.name.as_deref().unwrap_or("job")),
            r.model,
            r.gpu,
            r.usable_bytes as f64 / GIB,
            r.safety_margin * 100.0,
            r.micro_batch_size,
            r.sequence_length,
            if r.fits {
                paint.good("fits")
            } else {
                paint.bad("does not fit")
            }
        )?;
        let width = r
            .rows
            .iter()
            .map(|row| row.change.chars().count())
            .max()
            .unwrap_or(0)
            .max(10);
        writeln!(
            out,
            "  {:<width$}  {:>12}  {:>14}",
            "change", "micro-batch", "sequence"
        )?;
        for row in &r.rows {
            // Widths count characters (the arrows are one each).
            writeln!(
                out,
                "  {:<width$}  {:>12}  {:>14}",
                row.change,
                cell(&row.micro_batch_size),
                row.sequence_length.as_ref().map_or("-".to_string(), cell),
            )?;
        }
    }
    writeln!(
        out,
        "  micro-batch at the written sequence and accumulation; sequence at the written micro-batch"
    )
}

/// Run `max`; returns the exit code.
pub fn run(args: &MaxArgs, stdin: &mut dyn Read, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let mut problems = Problems::new(args.error_format);
    let code = max_to(args, stdin, out, &mut problems);
    problems.write(err);
    code
}

fn max_to(args: &MaxArgs, stdin: &mut dyn Read, out: &mut dyn Write, err: &mut Problems) -> u8 {
    let Some(gpu) = gpus::find(&args.gpu) else {
        err.add(
            None,
            None,
            &format!(
                "--gpu: unknown GPU {:?}; known: {}",
                args.gpu,
                gpus::names().collect::<Vec<_>>().join(", ")
            ),
        );
        return EXIT_BAD_INPUT;
    };
    let (source, docs) = match job_documents(args.file.as_deref(), &args.spec, stdin) {
        Ok(d) => d,
        Err(e) => {
            err.add(None, None, &e);
            return EXIT_BAD_INPUT;
        }
    };
    let mut bad = false;
    let mut reports = Vec::new();
    for r in validate_documents(docs, &args.spec) {
        let r = r.and_then(|(name, job)| {
            report(&job, name.clone(), gpu, args.all_changes).map_err(|message| {
                super::estimate::DocumentError {
                    location: name.unwrap_or_else(|| "document".to_string()),
                    message,
                }
            })
        });
        match r {
            Ok(rep) => reports.push(rep),
            Err(e) => {
                bad = true;
                err.add(Some(&source), Some(&e.location), &e.message);
            }
        }
    }
    let written = match args.output {
        OutputFormat::Svg => {
            err.add(
                None,
                None,
                "-o svg is for estimate; use table, json or yaml",
            );
            return EXIT_BAD_INPUT;
        }
        OutputFormat::Table => write_table(&reports, Paint::new(args.color), out),
        OutputFormat::Json | OutputFormat::Yaml => structured(&reports, bad, args.output, out),
    };
    finish(written, bad, reports.iter().all(|r| r.fits), err)
}
