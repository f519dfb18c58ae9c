//! The pods an object asks for: its pod sets, each with its count, the GPUs or MIG
//! slices its containers ask, the products its node selector allows and the taints it
//! tolerates.

use super::*;

/// Why the pods of an object could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodSetError {
    /// A field is not what Kubernetes would accept: its path and what is wrong.
    #[error("{path}: {reason}")]
    Field { path: String, reason: String },
    /// Two containers of one pod ask for different MIG profiles.
    #[error("{path} asks {resource}, another container {other}; one MIG profile per pod is read")]
    MixedMig {
        path: String,
        resource: String,
        other: String,
    },
}

fn field(path: impl Into<String>, reason: impl Into<String>) -> PodSetError {
    PodSetError::Field {
        path: path.into(),
        reason: reason.into(),
    }
}

/// A count field: absent gives `default`; anything but a whole number ≥ 0 is an error.
fn count(v: &Value, key: &str, path: &str, default: u64) -> Result<u64, PodSetError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            field(
                format!("{path}.{key}"),
                format!("{n} is not a whole number"),
            )
        }),
        Some(Value::String(s)) => s.parse::<u64>().map_err(|_| {
            field(
                format!("{path}.{key}"),
                format!("{s:?} is not a whole number"),
            )
        }),
        Some(other) => Err(field(
            format!("{path}.{key}"),
            format!("{other} is not a whole number"),
        )),
    }
}

/// A resource quantity of whole devices (`8`, `"8"`).
fn devices(v: &Value, path: &str) -> Result<u64, PodSetError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| field(path, format!("{n} is not a whole number of devices"))),
        Value::String(s) => s
            .parse::<u64>()
            .map_err(|_| field(path, format!("{s:?} is not a whole number of devices"))),
        other => Err(field(path, format!("{other} is not a quantity"))),
    }
}

/// The resource prefix of a MIG slice (`nvidia.com/mig-3g.40gb`).
pub const MIG_PREFIX: &str = "nvidia.com/mig-";

/// The MIG profile a resource names (`nvidia.com/mig-3g.40gb` → `3g.40gb`):
/// `<compute>g.<memory>gb`, as the device plugin's mixed strategy names
/// them; `None` for anything else.
pub fn mig_profile(resource: &str) -> Option<&str> {
    let profile = resource.strip_prefix(MIG_PREFIX)?;
    let (g, mem) = profile.split_once("g.")?;
    let gb = mem.strip_suffix("gb")?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(g) && digits(gb)).then_some(profile)
}

/// GPUs and MIG slices one container's resources ask for (limits, else
/// requests): whole GPUs, and the MIG resource with its count.
fn container_gpus(
    resources: Option<&Value>,
    path: &str,
) -> Result<(u64, Option<(String, u64)>), PodSetError> {
    let Some(r) = resources else {
        return Ok((0, None));
    };
    let mut gpus = 0;
    let mut mig = None;
    for part in ["limits", "requests"] {
        let Some(map) = r.get(part).and_then(Value::as_object) else {
            continue;
        };
        if let Some(q) = map.get(GPU_RESOURCE) {
            gpus = devices(q, &format!("{path}.{part}[{GPU_RESOURCE}]"))?;
        }
        if let Some((k, q)) = map.iter().find(|(k, _)| k.starts_with(MIG_PREFIX)) {
            let n = devices(q, &format!("{path}.{part}[{k}]"))?;
            mig = Some((k.clone(), n));
        }
        if gpus > 0 || mig.is_some() {
            break;
        }
    }
    Ok((gpus, mig))
}

fn argv_of(c: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .filter_map(|k| c.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(|w| w.as_str().map(str::to_string))
        .collect()
}

/// GPU products a pod spec's node selector or required node affinity allows.
fn products_of(pod_spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = pod_spec
        .get("nodeSelector")
        .and_then(|s| s.get(PRODUCT_LABEL))
        .and_then(Value::as_str)
    {
        out.push(p.to_string());
    }
    let terms = pod_spec
        .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array);
    for term in terms.into_iter().flatten() {
        for e in term
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if str_at(e, "key") == Some(PRODUCT_LABEL) && str_at(e, "operator") == Some("In") {
                for v in e
                    .get("values")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(v) = v.as_str()
                        && !out.iter().any(|o| o == v)
                    {
                        out.push(v.to_string());
                    }
                }
            }
        }
    }
    out
}

fn tolerations_of(pod_spec: &Value) -> Vec<String> {
    pod_spec
        .get("tolerations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let key = str_at(t, "key").unwrap_or("");
            if key.is_empty() {
                (str_at(t, "operator") == Some("Exists")).then(|| "*".to_string())
            } else {
                Some(key.to_string())
            }
        })
        .collect()
}

/// A pod set from a pod spec at `path`.
fn pod_set(pod_spec: &Value, path: &str, pods: u64) -> Result<PodSet, PodSetError> {
    let mut containers = Vec::new();
    let mut mig: Option<String> = None;
    let mut mig_per_pod = 0u64;
    for (i, c) in pod_spec
        .get("containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let cpath = format!("{path}.containers[{i}]");
        let (gpus, m) = container_gpus(c.get("resources"), &format!("{cpath}.resources"))?;
        if let Some((resource, n)) = m {
            match &mig {
                Some(other) if *other != resource => {
                    return Err(PodSetError::MixedMig {
                        path: format!("{cpath}.resources"),
                        resource,
                        other: other.clone(),
                    });
                }
                _ => {
                    mig = Some(resource);
                    mig_per_pod = mig_per_pod.saturating_add(n);
                }
            }
        }
        containers.push(Container {
            path: cpath,
            argv: argv_of(c),
            gpus,
        });
    }
    Ok(PodSet {
        path: path.to_string(),
        pods,
        gpus_per_pod: containers.iter().map(|c| c.gpus).sum(),
        mig,
        mig_per_pod,
        products: products_of(pod_spec),
        tolerations: tolerations_of(pod_spec),
        containers,
    })
}

/// The pod sets of an object of `kind`.
pub fn pod_sets(kind: Kind, obj: &Value) -> Result<Vec<PodSet>, PodSetError> {
    let null = Value::Null;
    let spec = obj.get("spec").unwrap_or(&null);
    let mut out = Vec::new();
    match kind {
        Kind::Job => {
            let pods = count(spec, "parallelism", "spec", 1)?;
            let pod = spec.pointer("/template/spec").unwrap_or(&null);
            out.push(pod_set(pod, "spec.template.spec", pods)?);
        }
        Kind::JobSet => {
            for (i, rj) in spec
                .get("replicatedJobs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .take(MAX_POD_SETS)
            {
                let path = format!("spec.replicatedJobs[{i}]");
                let replicas = count(rj, "replicas", &path, 1)?;
                let job = rj.pointer("/template/spec").unwrap_or(&null);
                let parallelism = count(job, "parallelism", &format!("{path}.template.spec"), 1)?;
                let pod = job.pointer("/template/spec").unwrap_or(&null);
                out.push(pod_set(
                    pod,
                    &format!("{path}.template.spec.template.spec"),
                    replicas.saturating_mul(parallelism),
                )?);
            }
        }
        Kind::PyTorchJob => {
            let specs = spec.get("pytorchReplicaSpecs").and_then(Value::as_object);
            for (role, rs) in specs.into_iter().flatten().take(MAX_POD_SETS) {
                let path = format!("spec.pytorchReplicaSpecs.{role}");
                let replicas = count(rs, "replicas", &path, 1)?;
                let pod = rs.pointer("/template/spec").unwrap_or(&null);
                out.push(pod_set(pod, &format!("{path}.template.spec"), replicas)?);
            }
        }
        Kind::Workload => {
            for (i, ps) in spec
                .get("podSets")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .take(MAX_POD_SETS)
            {
                let path = format!("spec.podSets[{i}]");
                let pods = count(ps, "count", &path, 1)?;
                let pod = ps.pointer("/template/spec").unwrap_or(&null);
                out.push(pod_set(pod, &format!("{path}.template.spec"), pods)?);
            }
        }
        Kind::TrainJob => {
            let trainer = spec.get("trainer").unwrap_or(&null);
            let nodes = count(trainer, "numNodes", "spec.trainer", 1)?;
            let (gpus, mig) = container_gpus(
                trainer.get("resourcesPerNode"),
                "spec.trainer.resourcesPerNode",
            )?;
            // The node selector and tolerations of the pod overrides.
            let mut products = Vec::new();
            let mut tolerations = Vec::new();
            for o in spec
                .get("podSpecOverrides")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                products.extend(products_of(o));
                tolerations.extend(tolerations_of(o));
            }
            let (mig, mig_per_pod) = match mig {
                Some((r, n)) => (Some(r), n),
                None => (None, 0),
            };
            out.push(PodSet {
                path: "spec.trainer".to_string(),
                pods: nodes,
                gpus_per_pod: gpus,
                mig,
                mig_per_pod,
                products,
                tolerations,
                containers: vec![Container {
                    path: "spec.trainer".to_string(),
                    argv: argv_of(trainer),
                    gpus,
                }],
            });
        }
    }
    Ok(out)
}
