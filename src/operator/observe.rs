//! The reads a step needs beyond the watch cache: a failed attempt's pods
//! (their termination messages and, when those do not show a GPU OOM, their
//! log tails) and the job's shape's MemoryProfile, from the API server.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};

use super::fingerprint;
use super::oom::{self, Failure};
use super::render::{self, ATTEMPT_LABEL, JOB_LABEL};
use super::step::{Found, rank, terminated};
use crate::api::{MemoryProfile, TrainingJob};
use crate::inventory;

/// How much of a failed container's log is read: lines and bytes.
#[derive(Clone, Copy, Debug)]
pub struct LogTail {
    pub lines: i64,
    pub bytes: i64,
}

/// The most telling failure of an attempt's pods (see [`Found`]); None when
/// none shows one or the pods cannot be listed (logged).
pub async fn failure(
    client: &Client,
    tail: LogTail,
    ns: &str,
    tj_name: &str,
    attempt: u32,
) -> Option<Found> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!(
        "{JOB_LABEL}={},{ATTEMPT_LABEL}={attempt}",
        render::label_value(tj_name)
    );
    let list = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l,
        Err(error) => {
            tracing::warn!(%error, job = tj_name, "listing the attempt's pods");
            return None;
        }
    };
    let mut best: Option<Found> = None;
    for pod in list.items {
        let pod_name = pod.name_any();
        let statuses = pod
            .status
            .as_ref()
            .map(|s| {
                s.init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for cs in statuses {
            let Some((reason, exit, message)) = terminated(&cs) else {
                continue;
            };
            let mut failure = oom::classify(reason.as_deref(), Some(exit), &message);
            if !matches!(failure, Failure::GpuOom(_)) && reason.as_deref() != Some("OOMKilled") {
                // The termination message keeps only the last 2 KB / 80
                // lines; a traceback can push the OOM line out of it.
                let lp = LogParams {
                    container: Some(cs.name.clone()),
                    tail_lines: Some(tail.lines),
                    limit_bytes: Some(tail.bytes),
                    ..LogParams::default()
                };
                match pods.logs(&pod_name, &lp).await {
                    Ok(log) => {
                        let from_log = oom::classify(reason.as_deref(), Some(exit), &log);
                        if rank(&from_log) > rank(&failure) {
                            failure = from_log;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, pod = %pod_name, "reading the log tail");
                    }
                }
            }
            if best
                .as_ref()
                .is_none_or(|b| rank(&failure) > rank(&b.failure))
            {
                best = Some(Found {
                    pod: pod_name.clone(),
                    container: cs.name.clone(),
                    failure,
                });
            }
        }
    }
    best
}

/// The scale the job's shape's MemoryProfile puts on estimates now, read
/// from the API server (not the reflector, which may not have the profile
/// yet when its own watch event triggered this reconcile); 1 without one.
pub async fn profile_scale(client: &Client, tj: &TrainingJob) -> f64 {
    let name = fingerprint::profile_name(&fingerprint::fingerprint(&tj.spec));
    let profiles: Api<MemoryProfile> = Api::all(client.clone());
    match profiles.get_opt(&name).await {
        Ok(Some(p)) => inventory::profile_ratios(std::iter::once(&p))
            .get(&name)
            .copied()
            .unwrap_or(1.0)
            .max(1.0),
        Ok(None) => 1.0,
        Err(error) => {
            tracing::debug!(%error, profile = %name, "reading a MemoryProfile");
            1.0
        }
    }
}
