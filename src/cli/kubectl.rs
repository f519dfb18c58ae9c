//! `kubectl vramguard` (the `kubectl-vramguard` binary, found by kubectl's plugin lookup on
//! the PATH): `estimate` and `max` offline, as `vramguard` has them, and three questions to
//! the cluster through kube's client (the kubeconfig kubectl uses, or `--kubeconfig`):
//! `explain trainingjob NAME` (the status's estimate as the CLI shows it, with the range,
//! the phase, the plan and the placement), `why NAME` (its conditions and its Events), and
//! `nodes` (per GPU: free memory and the largest free block, from the GpuNodes). Their
//! answers are coloured on a terminal as `vramguard estimate`'s are (`--color`,
//! `NO_COLOR`, `TERM=dumb`; never in a pipe).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::estimate::{EstimateArgs, run_estimate};
use super::max::{self, MaxArgs};
use super::paint::{ColorChoice, Paint};
use super::{EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_FITS, render};
use crate::api::{GpuNode, Phase, TrainingJob};
use crate::estimate::GIB;

/// How long one call to the API server may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Events shown by `why`, newest last.
const MAX_EVENTS: usize = 20;
/// Objects read per page of a list.
const PAGE: u32 = 500;
/// Pages read at most from one list (10 000 objects).
const MAX_PAGES: usize = 20;

/// vramguard's answers in kubectl: will it fit, why does it wait, where is room.
#[derive(Debug, Parser)]
#[command(name = "kubectl-vramguard", bin_name = "kubectl vramguard", version)]
pub struct KubectlCli {
    /// The kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's, else "default").
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    #[command(subcommand)]
    pub command: KubectlCommand,
}

#[derive(Debug, Subcommand)]
pub enum KubectlCommand {
    /// Estimate TrainingJobs offline (the same as `vramguard estimate`).
    Estimate(EstimateArgs),
    /// The largest micro-batch and sequence that fit (the same as `vramguard max`).
    Max(MaxArgs),
    /// A TrainingJob's estimate, range, phase, plan and placement, from its status.
    Explain {
        /// The kind: trainingjob (tj, trainingjobs).
        kind: String,
        name: String,
        #[command(flatten)]
        view: View,
    },
    /// Why a TrainingJob waits, was rejected or failed: its conditions and Events.
    Why {
        name: String,
        #[command(flatten)]
        view: View,
    },
    /// Per node and GPU: free memory, the largest free block and the probe's age.
    Nodes {
        #[command(flatten)]
        view: View,
    },
}

/// How the cluster answers are shown.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct View {
    /// Colour: auto (on a terminal, unless NO_COLOR is set or TERM is dumb), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

impl KubectlCommand {
    /// The colour of a cluster answer, decided for standard output.
    fn paint(&self) -> Paint {
        match self {
            Self::Explain { view, .. } | Self::Why { view, .. } | Self::Nodes { view } => {
                Paint::new(view.color.for_stdout())
            }
            Self::Estimate(_) | Self::Max(_) => Paint::new(ColorChoice::Never),
        }
    }
}

/// The plugin's entry point.
pub fn main() -> ExitCode {
    let cli = KubectlCli::parse();
    let code = match cli.command {
        KubectlCommand::Estimate(mut args) => {
            args.color = args.color.for_stdout();
            let stdout = std::io::stdout();
            run_estimate(
                &args,
                &mut std::io::stdin().lock(),
                &mut stdout.lock(),
                &mut std::io::stderr(),
            )
        }
        KubectlCommand::Max(mut args) => {
            args.color = args.color.for_stdout();
            let stdout = std::io::stdout();
            max::run(
                &args,
                &mut std::io::stdin().lock(),
                &mut stdout.lock(),
                &mut std::io::stderr(),
            )
        }
        ref online => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: starting the async runtime: {e}");
                    return ExitCode::from(EXIT_BAD_INPUT);
                }
            };
            let mut out = Vec::new();
            let result = runtime.block_on(async {
                let (client, ns) = connect(&cli).await?;
                tokio::time::timeout(REQUEST_TIMEOUT * 2, ask(online, &client, &ns, &mut out))
                    .await
                    .context("the API server did not answer in time")?
            });
            let _ = std::io::stdout().write_all(&out);
            match result {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    EXIT_BAD_INPUT
                }
            }
        }
    };
    ExitCode::from(code)
}

async fn connect(cli: &KubectlCli) -> anyhow::Result<(Client, String)> {
    let options = kube::config::KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let mut config = match &cli.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None if cli.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("reading the kubeconfig")?,
        None => kube::Config::infer().await.context(
            "no kubeconfig found (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a cluster",
        )?,
    };
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).context("building the client")?;
    Ok((client, ns))
}

async fn ask(
    command: &KubectlCommand,
    client: &Client,
    ns: &str,
    out: &mut Vec<u8>,
) -> anyhow::Result<u8> {
    let paint = command.paint();
    match command {
        KubectlCommand::Explain { kind, name, .. } => {
            if !matches!(
                kind.to_ascii_lowercase().as_str(),
                "trainingjob" | "trainingjobs" | "tj" | "trainingjob.vramguard.io"
            ) {
                bail!(
                    "explain: {kind:?} is not a kind vramguard explains; use: explain trainingjob NAME"
                );
            }
            let tj = get_job(client, ns, name).await?;
            explain(&tj, paint, out)?;
            Ok(EXIT_FITS)
        }
        KubectlCommand::Why { name, .. } => {
            let tj = get_job(client, ns, name).await?;
            let events = events_of(client, ns, name).await?;
            why(&tj, &events, paint, out)?;
            Ok(EXIT_FITS)
        }
        KubectlCommand::Nodes { .. } => {
            let api: Api<GpuNode> = Api::all(client.clone());
            let nodes = list_all(&api).await.context("listing GpuNodes")?;
            nodes_table(&nodes, paint, out)?;
            Ok(if nodes.is_empty() {
                EXIT_DOES_NOT_FIT
            } else {
                EXIT_FITS
            })
        }
        KubectlCommand::Estimate(_) | KubectlCommand::Max(_) => Ok(EXIT_BAD_INPUT),
    }
}

async fn get_job(client: &Client, ns: &str, name: &str) -> anyhow::Result<TrainingJob> {
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), ns);
    api.get_opt(name)
        .await
        .with_context(|| format!("reading TrainingJob {ns}/{name}"))?
        .with_context(|| format!("no TrainingJob {name:?} in namespace {ns:?}"))
}

/// Every object of a list, page by page, at most [`MAX_PAGES`] pages.
async fn list_all<K>(api: &Api<K>) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    for _ in 0..MAX_PAGES {
        let page = api.list(&params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(out),
        }
    }
    Ok(out)
}

/// The Events about TrainingJob `name`, oldest first, the last [`MAX_EVENTS`].
async fn events_of(client: &Client, ns: &str, name: &str) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let mut events: Vec<Event> = list_all(&api)
        .await
        .context("listing Events")?
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.name.as_deref() == Some(name) && r.kind.as_deref() == Some("TrainingJob")
            })
        })
        .collect();
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let skip = events.len().saturating_sub(MAX_EVENTS);
    Ok(events.split_off(skip))
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / GIB)
}

/// A phase's name, green when the job runs or ran, red when it will not, yellow while it
/// waits.
fn phase_text(phase: Option<Phase>, missing: &str, paint: Paint) -> String {
    match phase {
        None => paint.note(missing),
        Some(p) => {
            let name = format!("{p:?}");
            match p {
                Phase::Admitted | Phase::Running | Phase::Succeeded => paint.good(&name),
                Phase::Failed | Phase::Rejected => paint.bad(&name),
                Phase::Pending => paint.note(&name),
            }
        }
    }
}

/// `explain trainingjob NAME`.
pub fn explain(tj: &TrainingJob, paint: Paint, out: &mut dyn Write) -> std::io::Result<()> {
    let ns = tj.namespace().unwrap_or_default();
    let status = tj.status.clone().unwrap_or_default();
    let phase = phase_text(status.phase, "(no phase yet)", paint);
    writeln!(
        out,
        "{}: {} · phase {phase}",
        paint.bold(&format!("{ns}/{}", tj.name_any())),
        status
            .model
            .as_deref()
            .unwrap_or("(model not resolved yet)")
    )?;
    match &status.estimate {
        Some(e) => {
            if let Some(gpu) = &e.gpu {
                writeln!(out, "  estimated for {gpu}")?;
            }
            render::estimate_block(e, out)?;
            writeln!(out, "  peak at {}", e.peak_phase)?;
        }
        None => writeln!(out, "  no estimate in the status yet")?,
    }
    if let Some(p) = &status.plan {
        let changes = if p.changes.is_empty() {
            "as written".to_string()
        } else {
            p.changes.join(", ")
        };
        writeln!(
            out,
            "  plan: micro-batch {} × accumulation {}, ZeRO {}: {changes}",
            p.micro_batch_size, p.gradient_accumulation_steps, p.zero_stage
        )?;
    }
    if let Some(p) = &status.placement {
        let gpus: Vec<String> = p.gpus.iter().map(u32::to_string).collect();
        writeln!(
            out,
            "  placement: {} GPU {} ({} held per GPU)",
            p.node,
            gpus.join(","),
            gib(p.reserved_bytes_per_gpu)
        )?;
    }
    if let Some(m) = &status.message {
        writeln!(out, "  message: {m}")?;
    }
    if status.oom_retries > 0 {
        let retries = format!("GPU OOM retries: {}", status.oom_retries);
        writeln!(out, "  {}", paint.note(&retries))?;
    }
    Ok(())
}

/// `why NAME`.
pub fn why(
    tj: &TrainingJob,
    events: &[Event],
    paint: Paint,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let status = tj.status.clone().unwrap_or_default();
    let phase = phase_text(
        status.phase,
        "(no phase yet: the operator has not seen it)",
        paint,
    );
    let name = format!("{}/{}", tj.namespace().unwrap_or_default(), tj.name_any());
    writeln!(out, "{}: {phase}", paint.bold(&name))?;
    if let Some(m) = &status.message {
        writeln!(out, "  {m}")?;
    }
    if !status.conditions.is_empty() {
        writeln!(out, "{}", paint.bold("conditions:"))?;
        for c in &status.conditions {
            writeln!(
                out,
                "  {} = {} ({}) since {}: {}",
                c.type_, c.status, c.reason, c.last_transition_time.0, c.message
            )?;
        }
    }
    if events.is_empty() {
        writeln!(out, "events: none")?;
    } else {
        writeln!(out, "{}", paint.bold("events:"))?;
        for e in events {
            let at = e
                .event_time
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            let kind = e.type_.as_deref().unwrap_or("");
            let kind = if kind == "Warning" {
                paint.bad(kind)
            } else {
                kind.to_string()
            };
            writeln!(
                out,
                "  {at} {kind} {}: {}",
                e.reason.as_deref().unwrap_or(""),
                e.note.as_deref().unwrap_or("")
            )?;
        }
    }
    Ok(())
}

/// `nodes`.
pub fn nodes_table(nodes: &[GpuNode], paint: Paint, out: &mut dyn Write) -> std::io::Result<()> {
    if nodes.is_empty() {
        return writeln!(
            out,
            "no GpuNode: is the vramguard agent running on the GPU nodes?"
        );
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let header = format!(
        "{:<24} {:>4}  {:<16} {:>10} {:>10} {:>14}  {:>9}  health",
        "NODE", "GPU", "PRODUCT", "TOTAL GiB", "FREE GiB", "LARGEST GiB", "PROBE AGE"
    );
    writeln!(out, "{}", paint.bold(&header))?;
    let mut sorted: Vec<&GpuNode> = nodes.iter().collect();
    sorted.sort_by_key(|n| n.name_any());
    for n in sorted {
        let Some(s) = &n.status else {
            writeln!(out, "{:<24} (no probe yet)", n.name_any())?;
            continue;
        };
        // Padded before painting, so the escape codes do not count toward the width.
        let age = match s.probe_time.as_ref() {
            Some(t) => {
                let secs = (now.as_second() - t.0.as_second()).max(0);
                let text = format!("{:>9}", format!("{secs}s"));
                // Stale: the webhook and the operator no longer trust this node.
                if secs.unsigned_abs() > n.spec.ttl_seconds {
                    paint.note(&text)
                } else {
                    text
                }
            }
            None => format!("{:>9}", "-"),
        };
        for g in &s.gpus {
            let largest = g
                .largest_free_block_bytes
                .map(|b| format!("{:.1}", b as f64 / GIB))
                .unwrap_or_else(|| "-".to_string());
            let health = if g.healthy {
                paint.good("ok")
            } else {
                paint.bad(&format!(
                    "unhealthy: {}",
                    g.health_message.as_deref().unwrap_or("")
                ))
            };
            writeln!(
                out,
                "{:<24} {:>4}  {:<16} {:>10.1} {:>10.1} {:>14}  {}  {health}",
                n.name_any(),
                g.index,
                g.product,
                g.total_bytes as f64 / GIB,
                g.free_bytes as f64 / GIB,
                largest,
                age
            )?;
        }
    }
    Ok(())
}
