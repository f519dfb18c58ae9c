//! `vramguard agent`: the node agent. With `--once`, one probe printed to
//! stdout (the first thing to run on a new node; `--simulate FILE` without a
//! GPU). Otherwise it publishes this node's `GpuNode` every interval and
//! serves `/check` and `/healthz` until SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::estimate::OutputFormat;
use crate::agent::bytes::human;
use crate::agent::nvidia::Nvidia;
use crate::agent::publish::{self, PublishConfig};
use crate::agent::simulated::Simulated;
use crate::agent::{Agent, Gpu, ProbeOptions, pod_resources, server};
use crate::api::GpuNodeStatus;

/// Arguments of `vramguard agent`.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Probe once, print the result and exit (no cluster needed).
    #[arg(long, env = "VRAMGUARD_AGENT_ONCE", default_value_t = false)]
    pub once: bool,
    /// Output format of --once.
    #[arg(short = 'o', long, env = "VRAMGUARD_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Simulated GPUs from a YAML file (see examples/gpus.yaml) instead of the real ones.
    #[arg(long, env = "VRAMGUARD_SIMULATE", value_name = "FILE")]
    pub simulate: Option<PathBuf>,
    /// Path of libnvidia-ml (default: libnvidia-ml.so.1 from the library search path).
    #[arg(
        long,
        env = "VRAMGUARD_NVML_LIBRARY",
        value_name = "PATH",
        conflicts_with = "simulate"
    )]
    pub nvml_library: Option<PathBuf>,
    /// Do not load libcuda: NVML data only, no allocating measurements.
    #[arg(long, env = "VRAMGUARD_NO_CUDA", default_value_t = false)]
    pub no_cuda: bool,
    /// Do not measure the CUDA context overhead.
    #[arg(long, env = "VRAMGUARD_NO_CONTEXT_PROBE", default_value_t = false)]
    pub no_context_probe: bool,
    /// Do not search for the largest allocatable block.
    #[arg(long, env = "VRAMGUARD_NO_BLOCK_PROBE", default_value_t = false)]
    pub no_block_probe: bool,
    /// Also measure GPUs where other processes run (the probe briefly takes their free memory);
    /// always on with --simulate, where there is no job to race.
    #[arg(long, env = "VRAMGUARD_PROBE_BUSY_GPUS", default_value_t = false)]
    pub probe_busy_gpus: bool,
    /// Time budget of one GPU's largest-block search, in milliseconds.
    #[arg(long, env = "VRAMGUARD_BLOCK_PROBE_MS", default_value_t = 1000)]
    pub block_probe_ms: u64,
    /// MiB each idle GPU gets written and read back per probe (0: no memory check).
    #[arg(long, env = "VRAMGUARD_VERIFY_MIB", default_value_t = 0)]
    pub verify_mib: u64,
    /// The Kubernetes node this agent runs on (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Seconds between published probes.
    #[arg(long, env = "VRAMGUARD_INTERVAL_SECS", default_value_t = 30)]
    pub interval_secs: u64,
    /// Seconds after a probe at which consumers treat the GpuNode as stale.
    #[arg(long, env = "VRAMGUARD_TTL_SECS", default_value_t = 120)]
    pub ttl_secs: u64,
    /// A probe that measured the same as the last one published is published again (its
    /// probeTime refreshed) once that one is this many seconds old; a change is published at
    /// once. Default: half the TTL.
    #[arg(long, env = "VRAMGUARD_HEARTBEAT_SECS")]
    pub heartbeat_secs: Option<u64>,
    /// Do not copy the Node's taints into the GpuNode.
    #[arg(long, env = "VRAMGUARD_NO_TAINTS", default_value_t = false)]
    pub no_taints: bool,
    /// Address of the /check and /healthz endpoint (plain HTTP).
    #[arg(long, env = "VRAMGUARD_AGENT_LISTEN", default_value = "0.0.0.0:9470")]
    pub listen: SocketAddr,
    /// The kubelet's pod-resources socket; GPU assignments are read where it is mounted.
    #[arg(
        long,
        env = "VRAMGUARD_POD_RESOURCES_SOCKET",
        default_value = pod_resources::DEFAULT_SOCKET
    )]
    pub pod_resources_socket: PathBuf,
}

/// One probe as a table.
pub fn render_table(status: &GpuNodeStatus) -> String {
    let mut out = String::new();
    let opt = |b: Option<u64>| b.map(human).unwrap_or_else(|| "-".to_string());
    out.push_str(&format!(
        "{:<4} {:<28} {:>11} {:>11} {:>13} {:>11} {:<8} {}\n",
        "GPU", "PRODUCT", "TOTAL", "FREE", "LARGEST BLOCK", "CONTEXT", "HEALTHY", "NOTES"
    ));
    for g in &status.gpus {
        let mut notes = Vec::new();
        if let Some(m) = &g.health_message {
            notes.push(m.clone());
        }
        if let Some(p) = &g.assigned_pod {
            notes.push(format!("pod {p}"));
        }
        if !g.processes.is_empty() {
            notes.push(format!("{} other process(es)", g.processes.len()));
        }
        for m in &g.mig_devices {
            notes.push(format!(
                "MIG {} {}: {} free",
                m.index,
                m.profile,
                human(m.free_bytes)
            ));
        }
        out.push_str(&format!(
            "{:<4} {:<28} {:>11} {:>11} {:>13} {:>11} {:<8} {}\n",
            g.index,
            g.product,
            human(g.total_bytes),
            human(g.free_bytes),
            opt(g.largest_free_block_bytes),
            opt(g.context_overhead_bytes),
            if g.healthy { "yes" } else { "NO" },
            notes.join("; ")
        ));
    }
    out.push_str(&format!(
        "driver {}, CUDA {}, agent {}\n",
        status.driver_version.as_deref().unwrap_or("?"),
        status.cuda_version.as_deref().unwrap_or("?"),
        status.agent_version.as_deref().unwrap_or("?"),
    ));
    out
}

fn render(status: &GpuNodeStatus, output: OutputFormat) -> anyhow::Result<String> {
    Ok(match output {
        OutputFormat::Json => {
            let mut s =
                serde_json::to_string_pretty(status).context("encoding the probe as JSON")?;
            s.push('\n');
            s
        }
        OutputFormat::Yaml => {
            serde_saphyr::to_string(status).context("encoding the probe as YAML")?
        }
        OutputFormat::Table => render_table(status),
        OutputFormat::Svg => anyhow::bail!("-o svg is for estimate; use table, json or yaml"),
    })
}

/// Run the agent.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let AgentArgs {
        once,
        output,
        simulate,
        nvml_library,
        no_cuda,
        no_context_probe,
        no_block_probe,
        probe_busy_gpus,
        block_probe_ms,
        verify_mib,
        node_name,
        interval_secs,
        ttl_secs,
        heartbeat_secs,
        no_taints,
        listen,
        pod_resources_socket,
    } = args;

    let gpu: Arc<dyn Gpu> = match &simulate {
        Some(path) => Arc::new(
            Simulated::from_path(path).with_context(|| format!("--simulate {}", path.display()))?,
        ),
        None => {
            let gpu = tokio::task::spawn_blocking(move || {
                Nvidia::load(nvml_library.as_deref(), !no_cuda)
            })
            .await
            .context("loading the NVIDIA libraries")??;
            Arc::new(gpu)
        }
    };
    tracing::info!(backend = gpu.backend(), "GPU backend ready");
    let options = ProbeOptions {
        context_overhead: !no_context_probe,
        largest_block: !no_block_probe,
        probe_busy_gpus: probe_busy_gpus || simulate.is_some(),
        block_budget: Duration::from_millis(block_probe_ms),
        verify_bytes: verify_mib
            .checked_mul(1 << 20)
            .with_context(|| format!("--verify-mib {verify_mib}: too large"))?,
    };
    // A simulated node has no kubelet of its own to ask.
    let socket = simulate.is_none().then_some(pod_resources_socket);
    let agent = Arc::new(Agent::new(gpu, options, socket));

    if once {
        let status = agent.probe().await?;
        print!("{}", render(&status, output)?);
        return Ok(());
    }

    let node_name = match node_name.filter(|n| !n.trim().is_empty()) {
        Some(n) => n,
        None => bail!(
            "give --node-name or set NODE_NAME (in a DaemonSet: the downward API's spec.nodeName); \
             or use --once to print one probe"
        ),
    };
    if interval_secs == 0 {
        bail!("--interval-secs 0 is not allowed; minimum is 1");
    }
    if ttl_secs <= interval_secs {
        tracing::warn!(
            ttl_secs,
            interval_secs,
            "the TTL is not longer than the interval: the GpuNode will look stale between probes"
        );
    }
    let heartbeat = heartbeat_secs
        .map(Duration::from_secs)
        .unwrap_or_else(|| publish::default_heartbeat(ttl_secs));
    // An unchanged probe is written at the first interval at or after the heartbeat.
    let oldest = heartbeat.as_secs().div_ceil(interval_secs).max(1) * interval_secs;
    if oldest >= ttl_secs {
        tracing::warn!(
            ttl_secs,
            interval_secs,
            heartbeat_secs = heartbeat.as_secs(),
            "the heartbeat, rounded up to intervals, is not shorter than the TTL: \
             an idle GpuNode will look stale between heartbeats"
        );
    }
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (use --once to probe without one)")?;
    let config = PublishConfig {
        node_name,
        interval: Duration::from_secs(interval_secs),
        ttl_seconds: ttl_secs,
        copy_taints: !no_taints,
        heartbeat,
    };
    tracing::info!(%listen, node = %config.node_name, "publishing GpuNode and serving /check");
    let server = server::serve(
        listen,
        server::router(Arc::clone(&agent)),
        super::shutdown_signal("shutting down"),
        None,
    );
    let publisher = publish::run(&agent, client, config);
    tokio::select! {
        r = server => r.context("the check endpoint stopped")?,
        () = publisher => bail!("the publishing loop ended"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuStatus;

    #[test]
    fn table_lists_every_gpu() {
        let status = GpuNodeStatus {
            gpus: vec![GpuStatus {
                index: 0,
                product: "NVIDIA L4".into(),
                total_bytes: 23_034 << 20,
                free_bytes: 22 << 30,
                healthy: false,
                health_message: Some("XID 79".into()),
                ..Default::default()
            }],
            gpu_count: 1,
            ..Default::default()
        };
        let t = render_table(&status);
        assert!(
            t.contains("NVIDIA L4") && t.contains("XID 79") && t.contains("NO"),
            "{t}"
        );
    }
}
