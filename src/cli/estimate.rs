//! `vramguard estimate`: read TrainingJobs, estimate each on the GPUs asked
//! about, find the cheapest allowed plan where one does not fit, place each on
//! a simulated cluster (`--cluster`), print a table, JSON or YAML, and exit 0
//! (fits as written), 1 (does not fit as written) or 2 (bad input).

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::paint::{ColorChoice, Paint};
use super::problems::{ErrorFormat, Problems};
pub use super::report::{
    ChosenPlan, Contributor, Explanation, GpuVerdict, JobReport, PhaseReport, ReadFrom,
};
use super::spec_flags::SpecFlags;
use super::{EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_FITS, render};
use crate::api::{self, GpuNode, ValidatedJob, parse};
use crate::decide::{self, Choice};
use crate::estimate::{self, Estimate, GpuProduct, gpus};
use crate::kinds;
use crate::plan::{self, Binding, GpuView, PlaceOutcome, Verdict};

/// Output formats of `estimate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
    Yaml,
    /// `estimate` only: the step as a picture (one job).
    Svg,
}

/// Arguments of `vramguard estimate`.
#[derive(Debug, Clone, Args)]
pub struct EstimateArgs {
    /// TrainingJob YAML, or a batch/v1 Job, JobSet, TrainJob or PyTorchJob (one or several
    /// documents); `-` reads standard input. Without it, the job is given by flags (`--model`,
    /// `--hf-config`, ...).
    #[arg(
        short = 'f',
        long = "file",
        env = "VRAMGUARD_FILE",
        value_name = "FILE"
    )]
    pub file: Option<PathBuf>,
    /// GPU product to check against (see the README for the catalog).
    #[arg(
        long,
        env = "VRAMGUARD_GPU",
        default_value = "h100-80gb",
        conflicts_with = "gpus"
    )]
    pub gpu: String,
    /// Several GPU products, comma-separated; the job fits when it fits one of them.
    #[arg(
        long,
        env = "VRAMGUARD_GPUS",
        value_delimiter = ',',
        value_name = "GPU,GPU,..."
    )]
    pub gpus: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, env = "VRAMGUARD_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// A simulated cluster: GpuNode YAML (one or several documents, as the agent publishes
    /// them); prints where each job would be placed. Staleness is judged at the newest
    /// probeTime in the file.
    #[arg(long, env = "VRAMGUARD_CLUSTER", value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// Taint keys the jobs tolerate when placed on `--cluster`, comma-separated (default: none).
    #[arg(
        long,
        env = "VRAMGUARD_TOLERATE",
        value_delimiter = ',',
        value_name = "KEY,KEY,..."
    )]
    pub tolerate: Vec<String>,
    /// Print the TrainingJob (YAML, ready for `kubectl apply -f -`) that the flags and `-f`
    /// make, once it is valid, instead of estimating it.
    #[arg(long)]
    pub print_spec: bool,
    /// Also write the picture of the step (what `-o svg` prints) to FILE (one job).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
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

/// Resolve the GPU names the user gave.
pub fn resolve_gpus(args: &EstimateArgs) -> Result<Vec<&'static GpuProduct>, String> {
    let names: Vec<&str> = if args.gpus.is_empty() {
        vec![args.gpu.as_str()]
    } else {
        args.gpus
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect()
    };
    if names.is_empty() {
        return Err("--gpus: no GPU named".to_string());
    }
    names
        .iter()
        .map(|n| {
            gpus::find(n).ok_or_else(|| match gpus::candidates(n).as_slice() {
                [] => format!(
                    "--gpu: unknown GPU {n:?}; known: {}",
                    gpus::names().collect::<Vec<_>>().join(", ")
                ),
                many => format!(
                    "--gpu: {n:?} names more than one GPU, with different memory: {}; say which",
                    many.join(", ")
                ),
            })
        })
        .collect()
}

fn verdict_message(v: &Verdict) -> String {
    let gib = |b: u64| b as f64 / estimate::GIB;
    match &v.allocator_limit {
        _ if v.binding == Binding::Unsupported => {
            format!(
                "cannot run: {}",
                v.unsupported.as_deref().unwrap_or_default()
            )
        }
        _ if v.fits => format!("fits with {:.1} GiB headroom", gib(v.headroom_bytes)),
        Some(c) if v.binding == Binding::AllocatorLimit => c.explain(v.short_by_bytes),
        _ if v.short_by_bytes > 0 => format!("short by {:.1} GiB", gib(v.short_by_bytes)),
        _ => format!(
            "largest tensor {:.1} GiB exceeds the largest free block {:.1} GiB",
            gib(v.largest_tensor_bytes),
            gib(v.largest_block_bytes)
        ),
    }
}

/// Estimate one validated job on every GPU.
pub fn report(
    job: &ValidatedJob,
    name: Option<String>,
    targets: &[&'static GpuProduct],
) -> Result<JobReport, String> {
    let mut first: Option<Estimate> = None;
    let mut verdicts = Vec::new();
    for gpu in targets {
        let est = estimate::estimate(job, gpu).map_err(|e| e.to_string())?;
        let shrink = plan::shrink(job, gpu, GpuView::empty(gpu.usable_bytes()))
            .map_err(|e| e.to_string())?;
        let v = shrink.as_written;
        verdicts.push(GpuVerdict {
            gpu: gpu.name.to_string(),
            product: gpu.product.to_string(),
            usable_bytes: gpu.usable_bytes(),
            per_gpu_bytes: est.status.per_gpu_bytes,
            message: verdict_message(&v),
            plan: shrink.plan.filter(|_| !v.fits),
            advice: shrink.advice,
            verdict: v,
        });
        if first.is_none() {
            first = Some(est);
        }
    }
    let est = first.ok_or("no GPU to estimate on")?;
    let top: Vec<Contributor> = est
        .top_contributors(3)
        .into_iter()
        .map(|(c, b)| Contributor {
            component: c.to_string(),
            bytes: b,
        })
        .collect();
    let summary = format!(
        "peak at {}: {}",
        est.peak_phase.name(),
        top.iter()
            .map(|c| format!("{} {:.2} GiB", c.component, c.bytes as f64 / estimate::GIB))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let interval = est.status.upper.map(|u| {
        let lower = est.status.lower.map_or(est.status.per_gpu_bytes, |l| l.per_gpu_bytes);
        let widest = est.status.spread.first().map(|w| {
            let narrowed = crate::estimate::bounds::Mechanism::ALL
                .iter()
                .find(|m| m.name() == w.mechanism)
                .map(|m| m.narrowed_by())
                .unwrap_or(match job.spec().training.stack {
                    None => "training.stack, globalBatchSize, optimizerImplementation, parallelism.fsdpVersion",
                    Some(_) => "globalBatchSize, optimizerImplementation, parallelism.fsdpVersion",
                });
            format!(
                "; widest: {} (-{:.2} / +{:.2} GiB; narrowed by {narrowed})",
                w.mechanism,
                w.below_bytes as f64 / estimate::GIB,
                w.above_bytes as f64 / estimate::GIB
            )
        });
        format!(
            "range {:.2} – {:.2} GiB per GPU{}; fit, shrinking and placement use the high end",
            lower as f64 / estimate::GIB,
            u.per_gpu_bytes.max(est.status.per_gpu_bytes) as f64 / estimate::GIB,
            widest.unwrap_or_default()
        )
    });
    let plan = chosen_plan(job, targets, &verdicts);
    Ok(JobReport {
        name,
        model: job.model_name.clone(),
        phases: est
            .phases
            .iter()
            .map(|p| PhaseReport {
                phase: p.phase.name().to_string(),
                allocated_bytes: p.allocated().ceil() as u64,
            })
            .collect(),
        explanation: Explanation {
            peak_phase: est.peak_phase.name().to_string(),
            top_contributors: top,
            summary,
            interval,
        },
        fits: verdicts.iter().any(|v| v.verdict.fits),
        plan,
        placement: None,
        placed_with: None,
        verdicts,
        estimate: est.status,
        read_from: None,
        job: Some(job.clone()),
    })
}

/// The job as written on the first GPU it fits, else the cheapest plan (first on ties).
fn chosen_plan(
    job: &ValidatedJob,
    targets: &[&'static GpuProduct],
    verdicts: &[GpuVerdict],
) -> Option<ChosenPlan> {
    if let Some(i) = verdicts.iter().position(|v| v.verdict.fits) {
        let gpu = targets.get(i)?;
        let plan = plan::shrink(job, gpu, GpuView::empty(gpu.usable_bytes()))
            .ok()?
            .plan?;
        return Some(ChosenPlan {
            gpu: gpu.name.to_string(),
            plan,
        });
    }
    let (v, p) = verdicts
        .iter()
        .filter_map(|v| v.plan.as_ref().map(|p| (v, p)))
        .reduce(|best, cur| {
            if cur.1.slowdown < best.1.slowdown {
                cur
            } else {
                best
            }
        })?;
    Some(ChosenPlan {
        gpu: v.gpu.clone(),
        plan: p.clone(),
    })
}

/// Read `--cluster`: every document a GpuNode.
fn read_cluster(path: &std::path::Path) -> Result<Vec<GpuNode>, String> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("--cluster {source}: {e}"))?;
    let docs = parse::documents(&text).map_err(|e| format!("--cluster {source}: {e}"))?;
    let mut nodes = Vec::new();
    let mut problems = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        match parse::gpu_node(doc) {
            Ok(n) => nodes.push(n),
            Err(e) => {
                for line in e.to_string().lines() {
                    problems.push(format!("--cluster {source}: document {}: {line}", i + 1));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(nodes)
    } else {
        Err(problems.join("\n"))
    }
}

/// Place every job on the cluster, judging staleness at the newest probe in the file.
fn place_all(
    reports: &mut [JobReport],
    nodes: &[GpuNode],
    tolerate: &[String],
) -> Result<(), String> {
    let now = nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.probe_time.as_ref().map(|t| t.0))
        .max()
        .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    let snapshot =
        crate::inventory::Snapshot::new(nodes.to_vec(), None, true, Some(now.as_second()));
    let none = plan::ReservationIndex::new();
    for r in reports {
        if let Some(job) = &r.job {
            // The rule the webhook and the operator decide by, with what the
            // agents published and no other admitted job's reservation.
            let view = decide::ClusterView {
                snapshot: &snapshot,
                reservations: &none,
                tolerations: tolerate,
                now,
                scale: 1.0,
            };
            let (outcome, with) = match decide::choose(job, &view).map_err(|e| e.to_string())? {
                Choice::Run {
                    plan, assignment, ..
                } => (PlaceOutcome::Placed(assignment), plan.map(|p| *p)),
                Choice::Wait { reason } => (PlaceOutcome::Wait { reason }, None),
                Choice::Reject { reason, .. } => (PlaceOutcome::Reject { reason }, None),
            };
            r.placement = Some(outcome);
            r.placed_with = with;
        }
    }
    Ok(())
}

/// A document's problems, already formatted with where they are.
pub struct DocumentError {
    pub location: String,
    pub message: String,
}

/// Parse, validate and estimate every document of `text`.
pub fn reports_from_text(
    text: &str,
    targets: &[&'static GpuProduct],
) -> Result<Vec<Result<JobReport, DocumentError>>, String> {
    let docs = parse::documents(text).map_err(|e| e.to_string())?;
    Ok(reports_from_documents(docs, targets, &SpecFlags::default()))
}

/// Where a document is, for messages.
fn location(i: usize, many: bool, name: &Option<String>) -> String {
    match (name, many) {
        (Some(n), true) => format!("document {} ({n})", i + 1),
        (None, true) => format!("document {}", i + 1),
        (Some(n), false) => n.clone(),
        (None, false) => "document".to_string(),
    }
}

/// Parse and validate every document, as the webhook would; the errors name the field (and
/// the flag that set it).
pub fn validate_documents(
    docs: Vec<serde_json::Value>,
    flags: &SpecFlags,
) -> Vec<Result<(Option<String>, ValidatedJob), DocumentError>> {
    let many = docs.len() > 1;
    docs.into_iter()
        .enumerate()
        .map(|(i, doc)| validate_document(i, many, doc, flags))
        .collect()
}

/// One document of `validate_documents`.
fn validate_document(
    i: usize,
    many: bool,
    doc: serde_json::Value,
    flags: &SpecFlags,
) -> Result<(Option<String>, ValidatedJob), DocumentError> {
    let name = parse::document_name(&doc);
    parse::training_job(doc)
        .map_err(|e| e.to_string())
        .and_then(|tj| api::validate_job(&tj).map_err(|e| e.to_string()))
        .map(|job| (name.clone(), job))
        .map_err(|message| DocumentError {
            location: location(i, many, &name),
            message: flags.annotate(&message),
        })
}

/// Parse, validate and estimate every document: TrainingJobs, and Jobs, JobSets,
/// TrainJobs and PyTorchJobs read by `kinds`.
pub fn reports_from_documents(
    docs: Vec<serde_json::Value>,
    targets: &[&'static GpuProduct],
    flags: &SpecFlags,
) -> Vec<Result<JobReport, DocumentError>> {
    let many = docs.len() > 1;
    docs.into_iter()
        .enumerate()
        .map(|(i, doc)| {
            if let Some(kind) = kinds::Kind::of_document(&doc) {
                let name = parse::document_name(&doc);
                return other_kind(kind, &doc, name.clone(), targets).map_err(|message| {
                    DocumentError {
                        location: location(i, many, &name),
                        message,
                    }
                });
            }
            validate_document(i, many, doc, flags).and_then(|(name, job)| {
                report(&job, name.clone(), targets).map_err(|message| DocumentError {
                    location: name.unwrap_or_else(|| "document".to_string()),
                    message,
                })
            })
        })
        .collect()
}

/// Read a Job, JobSet, TrainJob or PyTorchJob (`kinds`) and estimate it.
fn other_kind(
    kind: kinds::Kind,
    doc: &serde_json::Value,
    name: Option<String>,
    targets: &[&'static GpuProduct],
) -> Result<JobReport, String> {
    match kinds::read(kind, doc) {
        kinds::Reading::Judge(j) => {
            let mut r = report(&j.validated, name, targets)?;
            r.read_from = Some(ReadFrom {
                kind: kind.name().to_string(),
                origin: j.origin.describe(),
                sources: j.sources.clone(),
                products: j.products.clone(),
            });
            Ok(r)
        }
        kinds::Reading::NotJudged(why) => Err(format!("{} not judged: {why}", kind.name())),
        kinds::Reading::Invalid(errs) => Err(api::validate::errors_to_string(&errs)),
    }
}

/// The documents `-f` and the flags give, and what to call their source in messages.
pub fn job_documents(
    file: Option<&std::path::Path>,
    flags: &SpecFlags,
    stdin: &mut dyn Read,
) -> Result<(String, Vec<serde_json::Value>), String> {
    let Some(file) = file else {
        return Ok(("flags".to_string(), vec![flags.document()?]));
    };
    let source = file.display().to_string();
    let text = read_input(file, stdin)?;
    let mut docs = parse::documents(&text).map_err(|e| format!("{source}: {e}"))?;
    for doc in &mut docs {
        if kinds::Kind::of_document(doc).is_some() {
            if !flags.is_empty() {
                return Err(format!(
                    "{source}: the spec flags set TrainingJob fields; a {} is read from its own fields, its vramguard.io/training annotation or its command line",
                    doc.get("kind").and_then(|k| k.as_str()).unwrap_or("job")
                ));
            }
            continue;
        }
        flags.apply(doc)?;
    }
    Ok((source, docs))
}

fn read_input(file: &std::path::Path, stdin: &mut dyn Read) -> Result<String, String> {
    let mut bytes = Vec::new();
    let source = file.display().to_string();
    if source == "-" {
        stdin
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading standard input: {e}"))?;
    } else {
        bytes = std::fs::read(file).map_err(|e| format!("{source}: {e}"))?;
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{source}: not UTF-8 text (invalid byte at offset {}); expected TrainingJob YAML",
            e.utf8_error().valid_up_to()
        )
    })
}

/// `--print-spec`: every document as YAML once all are valid; exit 0, or 2 with every problem.
fn print_spec(
    source: &str,
    docs: Vec<serde_json::Value>,
    flags: &SpecFlags,
    out: &mut dyn Write,
    err: &mut Problems,
) -> u8 {
    for r in validate_documents(docs.clone(), flags) {
        if let Err(e) = r {
            err.add(Some(source), Some(&e.location), &e.message);
        }
    }
    if err.any() {
        return EXIT_BAD_INPUT;
    }
    for (i, doc) in docs.iter().enumerate() {
        let text = match serde_saphyr::to_string(doc) {
            Ok(t) => t,
            Err(e) => {
                err.add(None, None, &format!("writing the spec: {e}"));
                return EXIT_BAD_INPUT;
            }
        };
        let sep = if i > 0 { "---\n" } else { "" };
        if write!(out, "{sep}{text}").is_err() {
            return EXIT_BAD_INPUT;
        }
    }
    EXIT_FITS
}

/// Run `estimate`; returns the exit code.
pub fn run_estimate(
    args: &EstimateArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let mut problems = Problems::new(args.error_format);
    let code = estimate_to(args, stdin, out, &mut problems);
    problems.write(err);
    code
}

fn estimate_to(
    args: &EstimateArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut Problems,
) -> u8 {
    let cluster = match args.cluster.as_deref().map(read_cluster).transpose() {
        Ok(c) => c,
        Err(e) => {
            err.add(None, None, &e);
            return EXIT_BAD_INPUT;
        }
    };
    let targets = match resolve_gpus(args) {
        Ok(t) => t,
        Err(e) => {
            err.add(None, None, &e);
            return EXIT_BAD_INPUT;
        }
    };
    let (source, docs) = match job_documents(args.file.as_deref(), &args.spec, stdin) {
        Ok(d) => d,
        Err(e) => {
            err.add(None, None, &e);
            return EXIT_BAD_INPUT;
        }
    };
    if args.print_spec {
        return print_spec(&source, docs, &args.spec, out, err);
    }
    let results = reports_from_documents(docs, &targets, &args.spec);
    let mut bad = false;
    let mut reports = Vec::new();
    for r in results {
        match r {
            Ok(rep) => reports.push(rep),
            Err(e) => {
                bad = true;
                err.add(Some(&source), Some(&e.location), &e.message);
            }
        }
    }
    if let Some(nodes) = &cluster
        && let Err(e) = place_all(&mut reports, nodes, &args.tolerate)
    {
        err.add(Some(&source), None, &e);
        return EXIT_BAD_INPUT;
    }
    let picture = args.output == OutputFormat::Svg || args.plot.is_some();
    let svg = match (picture, reports.as_slice()) {
        (false, _) => None,
        (true, [one]) if !bad => match &one.job {
            Some(job) => {
                let name = one.name.as_deref().unwrap_or("job");
                match super::plot::step_svg(job, name, targets[0]) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        err.add(None, None, &format!("drawing the step: {e}"));
                        return EXIT_BAD_INPUT;
                    }
                }
            }
            None => None,
        },
        (true, _) if bad => return EXIT_BAD_INPUT,
        (true, many) => {
            err.add(
                None,
                None,
                &format!(
                    "-o svg and --plot draw one job; {source} holds {}",
                    many.len()
                ),
            );
            return EXIT_BAD_INPUT;
        }
    };
    if let (Some(path), Some(svg)) = (&args.plot, &svg)
        && let Err(e) = std::fs::write(path, svg)
    {
        err.add(None, None, &format!("--plot {}: {e}", path.display()));
        return EXIT_BAD_INPUT;
    }
    let written = match args.output {
        OutputFormat::Svg => out.write_all(svg.unwrap_or_default().as_bytes()),
        OutputFormat::Table => render::table(&reports, Paint::new(args.color), out),
        OutputFormat::Json | OutputFormat::Yaml => structured(&reports, bad, args.output, out),
    };
    finish(written, bad, reports.iter().all(|r| r.fits), err)
}

/// `reports` as JSON or YAML: one object when there is one report and no
/// document failed, else the list.
pub(crate) fn structured<T: serde::Serialize>(
    reports: &[T],
    bad: bool,
    format: OutputFormat,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let one = reports.len() == 1 && !bad;
    if format == OutputFormat::Yaml {
        let text = if one {
            serde_saphyr::to_string(&reports[0])
        } else {
            serde_saphyr::to_string(&reports)
        };
        return write!(out, "{}", text.map_err(std::io::Error::other)?);
    }
    let text = if one {
        serde_json::to_string_pretty(&reports[0])
    } else {
        serde_json::to_string_pretty(&reports)
    };
    writeln!(out, "{}", text.map_err(std::io::Error::other)?)
}

/// The exit code once the output is written: bad input, does not fit, fits.
pub(crate) fn finish(
    written: std::io::Result<()>,
    bad: bool,
    all_fit: bool,
    err: &mut Problems,
) -> u8 {
    if let Err(e) = written {
        err.add(None, None, &format!("writing output: {e}"));
        return EXIT_BAD_INPUT;
    }
    if bad {
        EXIT_BAD_INPUT
    } else if all_fit {
        EXIT_FITS
    } else {
        EXIT_DOES_NOT_FIT
    }
}
