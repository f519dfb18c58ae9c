//! `vramguard serve`: the admission webhook over TLS, with the GPU inventory
//! from the cluster (GpuNode objects and GFD node labels) or from a file;
//! with a cluster, also the operator (one leader among the replicas).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use crate::api::parse;
use crate::inventory::{self, Source};
use crate::operator;
use crate::webhook::{self, AppState, tls};

/// Seconds between the info lines that sum up the admission reviews answered.
const SUMMARY_SECS: u64 = 60;

/// Arguments of `vramguard serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the webhook listens on.
    #[arg(long, env = "VRAMGUARD_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain (the mounted Secret's tls.crt); reloaded when it changes.
    #[arg(
        long,
        env = "VRAMGUARD_TLS_CERT",
        requires = "tls_key",
        conflicts_with = "self_signed"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (tls.key).
    #[arg(long, env = "VRAMGUARD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Generate a CA and a server certificate for local use.
    #[arg(long, env = "VRAMGUARD_SELF_SIGNED", default_value_t = false)]
    pub self_signed: bool,
    /// With --self-signed: write the CA certificate here (for clients' --cacert).
    #[arg(long, env = "VRAMGUARD_CA_OUT", requires = "self_signed")]
    pub ca_out: Option<PathBuf>,
    /// With --self-signed: the names the certificate is valid for.
    #[arg(
        long,
        env = "VRAMGUARD_TLS_HOSTS",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1"
    )]
    pub tls_hosts: Vec<String>,
    /// A static inventory (GpuNode objects) instead of watching the cluster.
    #[arg(long, env = "VRAMGUARD_CLUSTER")]
    pub cluster: Option<PathBuf>,
    /// Seconds between checks of the certificate files for changes.
    #[arg(long, env = "VRAMGUARD_TLS_RELOAD_SECS", default_value_t = 10)]
    pub tls_reload_secs: u64,
    /// Seconds in-flight reviews get to finish after SIGTERM.
    #[arg(long, env = "VRAMGUARD_DRAIN_SECS", default_value_t = 30)]
    pub drain_secs: u64,
    /// Seconds a connection is kept open with no request in flight (1-3600).
    #[arg(long, env = "VRAMGUARD_IDLE_TIMEOUT_SECS", default_value_t = webhook::server::IDLE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub idle_timeout_secs: u64,
    /// Connections open at once (1-65536); past it new connections are closed at once.
    #[arg(long, env = "VRAMGUARD_MAX_CONNECTIONS", default_value_t = webhook::server::MAX_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections: u64,
    /// What `/validate` does with a Job, JobSet, TrainJob or PyTorchJob that
    /// does not fit: Deny, Warn (allow with the verdict as warnings) or Audit
    /// (allow silently, count the verdict). `/validate/deny`, `/validate/warn`
    /// and `/validate/audit` say it per namespace.
    #[arg(long, env = "VRAMGUARD_ENFORCEMENT", default_value = "Deny",
          value_parser = |s: &str| s.parse::<webhook::Enforcement>())]
    pub enforcement: webhook::Enforcement,
    /// Serve admission reviews only: do not run the operator (which runs
    /// whenever the inventory comes from the cluster).
    #[arg(long, env = "VRAMGUARD_NO_OPERATOR", default_value_t = false)]
    pub no_operator: bool,
    /// Namespace of the operator's leader-election Lease (the pod's own).
    #[arg(long, env = "VRAMGUARD_LEASE_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "VRAMGUARD_LEASE_NAME",
        default_value = "vramguard-operator"
    )]
    pub lease_name: String,
    /// This replica's identity in the Lease and in Events (the pod name).
    #[arg(long, env = "VRAMGUARD_IDENTITY")]
    pub identity: Option<String>,
    /// Run the Kueue AdmissionCheck controller (`controllerName:
    /// vramguard.io/vram-fit`): Workloads with quota reserved are judged on
    /// their flavors' GPU product and set Ready, Retry or Rejected. One
    /// replica leads it, by the Lease `<lease-name>-kueue`.
    #[arg(long, env = "VRAMGUARD_KUEUE_ADMISSION_CHECK", default_value_t = false)]
    pub kueue_admission_check: bool,
    /// Seconds Kueue waits before it queues a workload set to Retry again (0-3600).
    #[arg(long, env = "VRAMGUARD_KUEUE_RETRY_AFTER_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub kueue_retry_after_secs: u32,
}

/// This replica's name: the flag, else the host name (a pod's name).
fn identity(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| format!("vramguard-{}", std::process::id()))
}

/// Read a cluster file of GpuNode documents.
pub fn read_cluster(path: &PathBuf) -> anyhow::Result<Vec<crate::api::GpuNode>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let docs = parse::documents(&text).with_context(|| path.display().to_string())?;
    let mut nodes = Vec::new();
    for (i, d) in docs.into_iter().enumerate() {
        nodes.push(
            parse::gpu_node(d)
                .with_context(|| format!("{}: document {}", path.display(), i + 1))?,
        );
    }
    Ok(nodes)
}

/// Run the webhook until SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        listen,
        tls_cert,
        tls_key,
        self_signed,
        ca_out,
        tls_hosts,
        cluster,
        tls_reload_secs,
        drain_secs,
        idle_timeout_secs,
        max_connections,
        enforcement,
        no_operator,
        lease_namespace,
        lease_name,
        identity: identity_flag,
        kueue_admission_check,
        kueue_retry_after_secs,
    } = args;
    if kueue_admission_check && cluster.is_some() {
        bail!(
            "--kueue-admission-check judges Kueue's Workloads in a cluster; it cannot run with --cluster FILE"
        );
    }

    // TLS is checked before anything binds.
    let (rustls, watched) = server_tls(tls_cert, tls_key, self_signed, ca_out, &tls_hosts)?;

    let (source, driver, client) = inventory_source(cluster).await?;
    // One registry for /metrics: the webhook's families, the operator's, the build.
    let mut state = AppState::new(source.clone());
    state.enforcement = enforcement;
    crate::metrics::register_build_info(&mut state.registry);
    let operator_metrics = operator::OperatorMetrics::register(&mut state.registry);
    // Audit verdicts as Events on the objects, published off the reviews' path.
    if let Some(client) = &client {
        let (events, queue) =
            webhook::audit::AuditEvents::new(&mut state.registry, webhook::audit::QUEUE);
        state.audit_events = Some(events);
        let reporter = kube::runtime::events::Reporter {
            controller: "vramguard-webhook".to_string(),
            instance: Some(identity(identity_flag.clone())),
        };
        tokio::spawn(webhook::audit::run(client.clone(), reporter, queue));
    }
    let kueue = kueue_controller(
        client.as_ref().filter(|_| kueue_admission_check),
        &source,
        identity_flag.clone(),
        &lease_namespace,
        &lease_name,
        kueue_retry_after_secs,
    );
    // The operator runs with a live inventory; a static file has no cluster to act on.
    let operator = operator_loop(
        client.filter(|_| !no_operator),
        &source,
        identity_flag,
        operator_metrics,
        &lease_namespace,
        &lease_name,
    );
    let state = Arc::new(state);
    tokio::spawn(webhook::log_summaries(
        state.clone(),
        Duration::from_secs(SUMMARY_SECS),
    ));
    let limits = webhook::Limits {
        idle_timeout: Duration::from_secs(idle_timeout_secs),
        max_connections: usize::try_from(max_connections)
            .unwrap_or(webhook::server::MAX_CONNECTIONS),
        ..webhook::Limits::default()
    };
    let connections = webhook::Connections::of(&state, limits);
    let router = webhook::router_with(state, limits);
    tracing::info!(%listen, "serving admission reviews");
    let reload_config = rustls.clone();
    let reload = async move {
        match watched {
            Some((cert, key)) => {
                let every = Duration::from_secs(tls_reload_secs.max(1));
                tls::watch(cert, key, reload_config, every).await
            }
            None => std::future::pending().await,
        }
    };
    let server = webhook::serve(
        listen,
        router,
        connections,
        rustls,
        super::shutdown_signal("shutting down: finishing in-flight reviews"),
        Duration::from_secs(drain_secs),
        None,
    );
    let mut operator = operator;
    tokio::select! {
        r = server => r.context("the webhook server stopped")?,
        _ = driver => bail!("the inventory watch ended"),
        _ = reload => bail!("the certificate watch ended"),
        r = &mut operator => {
            r.context("the operator stopped")?;
            bail!("the operator stopped")
        }
        r = kueue => {
            r.context("the Kueue admission check controller stopped")?;
            bail!("the Kueue admission check controller stopped")
        }
    }
    // The server drained; let the operator give up its Lease.
    let _ = tokio::time::timeout(Duration::from_secs(5), operator).await;
    Ok(())
}

/// The server's TLS config: the files given (and the pair to watch for changes), or a
/// self-signed pair whose CA is written to `ca_out` or printed.
fn server_tls(
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    self_signed: bool,
    ca_out: Option<PathBuf>,
    tls_hosts: &[String],
) -> anyhow::Result<(
    axum_server::tls_rustls::RustlsConfig,
    Option<(PathBuf, PathBuf)>,
)> {
    let (config, watched) = match (tls_cert, tls_key, self_signed) {
        (Some(cert), Some(key), false) => (tls::load(&cert, &key)?, Some((cert, key))),
        (None, None, true) => {
            let pair = tls::self_signed(tls_hosts)?;
            if let Some(path) = &ca_out {
                std::fs::write(path, &pair.ca_pem).with_context(|| path.display().to_string())?;
            } else {
                println!("{}", pair.ca_pem);
            }
            let config = tls::server_config_from_pem(
                pair.cert_pem.as_bytes(),
                pair.key_pem.as_bytes(),
                std::path::Path::new("(generated)"),
                std::path::Path::new("(generated)"),
            )?;
            (config, None)
        }
        _ => bail!("give --tls-cert and --tls-key, or --self-signed"),
    };
    Ok((
        axum_server::tls_rustls::RustlsConfig::from_config(config),
        watched,
    ))
}

/// The Kueue AdmissionCheck controller when asked for (and a cluster is there), else a
/// future that never ends.
fn kueue_controller(
    client: Option<&kube::Client>,
    source: &Arc<dyn Source>,
    identity_flag: Option<String>,
    lease_namespace: &str,
    lease_name: &str,
    retry_after: u32,
) -> futures::future::BoxFuture<'static, anyhow::Result<()>> {
    let Some(client) = client else {
        return Box::pin(std::future::pending());
    };
    let identity = identity(identity_flag);
    let lease =
        operator::LeaseConfig::new(lease_namespace, &format!("{lease_name}-kueue"), &identity);
    let config = crate::kueue::controller::Config {
        retry_after,
        instance: Some(identity.clone()),
        ..crate::kueue::controller::Config::default()
    };
    tracing::info!(
        controller = crate::kueue::CONTROLLER_NAME,
        "kueue: admission check controller standing for leader"
    );
    let (client, source) = (client.clone(), source.clone());
    Box::pin(async move {
        crate::kueue::controller::run(
            client,
            source,
            config,
            lease,
            super::shutdown_signal("kueue: stepping down"),
        )
        .await
        .map_err(anyhow::Error::from)
    })
}

/// The operator, standing for leader, when a cluster is there and it is not turned off;
/// else a future that never ends.
fn operator_loop(
    client: Option<kube::Client>,
    source: &Arc<dyn Source>,
    identity_flag: Option<String>,
    metrics: operator::OperatorMetrics,
    lease_namespace: &str,
    lease_name: &str,
) -> futures::future::BoxFuture<'static, anyhow::Result<()>> {
    let Some(client) = client else {
        return Box::pin(std::future::pending());
    };
    let identity = identity(identity_flag);
    let config = operator::Config {
        instance: Some(identity.clone()),
        metrics,
        ..operator::Config::default()
    };
    let lease = operator::LeaseConfig::new(lease_namespace, lease_name, &identity);
    tracing::info!(%identity, lease = %lease_name, namespace = %lease_namespace, "operator: standing for leader");
    let source = source.clone();
    Box::pin(async move {
        operator::run(
            client,
            source,
            config,
            lease,
            super::shutdown_signal("operator: stepping down"),
        )
        .await
        .map_err(anyhow::Error::from)
    })
}

/// Where the GPUs are read from: a static cluster file, or the cluster's GpuNodes through
/// reflectors (with their driver, and the client).
async fn inventory_source(
    cluster: Option<PathBuf>,
) -> anyhow::Result<(
    Arc<dyn Source>,
    futures::future::BoxFuture<'static, ()>,
    Option<kube::Client>,
)> {
    Ok(match cluster {
        Some(path) => {
            let nodes = read_cluster(&path)?;
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            (
                Arc::new(inventory::Static::new(nodes, now)),
                Box::pin(std::future::pending()),
                None,
            )
        }
        None => {
            let c = kube::Client::try_default().await.context(
                "connecting to the Kubernetes API (give --cluster FILE to run without one)",
            )?;
            let (source, driver) = inventory::reflect::start(c.clone());
            (Arc::new(source), Box::pin(driver), Some(c))
        }
    })
}
