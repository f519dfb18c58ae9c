//! Writing `MemoryProfile` objects: the operator adds an observation with
//! the resourceVersion it read (retried on conflict), so concurrent
//! observations are never lost. They are read through the inventory's
//! reflector (`Snapshot::learnt_scale`), by the operator and the webhook.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::fingerprint;
use crate::api::{
    MAX_OBSERVATIONS, MemoryProfile, MemoryProfileSpec, MemoryProfileStatus, Observation,
    TrainingJob,
};

/// Add one observation to `profile` (the status after it).
pub fn with_observation(
    status: Option<MemoryProfileStatus>,
    obs: Observation,
) -> MemoryProfileStatus {
    let mut s = status.unwrap_or_default();
    if obs.estimated_bytes > 0 {
        let ratio = obs.observed_bytes as f64 / obs.estimated_bytes as f64;
        if ratio.is_finite() && ratio > s.ratio {
            s.ratio = ratio;
        }
    }
    s.observation_count = s.observation_count.saturating_add(1);
    s.observations.push(obs);
    let excess = s.observations.len().saturating_sub(MAX_OBSERVATIONS);
    s.observations.drain(..excess);
    s
}

/// Record `obs` in the profile `name` (created when missing).
pub async fn observe(
    client: &Client,
    name: &str,
    fingerprint: &str,
    tj: &TrainingJob,
    obs: Observation,
) -> Result<(), kube::Error> {
    let api: Api<MemoryProfile> = Api::all(client.clone());
    let mut tries = 0;
    loop {
        tries += 1;
        let current = match api.get_opt(name).await? {
            Some(p) => p,
            None => {
                let p = MemoryProfile {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: MemoryProfileSpec {
                        fingerprint: fingerprint.to_string(),
                        model: tj
                            .status
                            .as_ref()
                            .and_then(|s| s.model.clone())
                            .unwrap_or_else(|| "unknown".into()),
                        recipe: fingerprint::recipe_words(&tj.spec),
                    },
                    status: None,
                };
                match api.create(&PostParams::default(), &p).await {
                    Ok(p) => p,
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(e),
                }
            }
        };
        let mut next = current.clone();
        next.status = Some(with_observation(current.status.clone(), obs.clone()));
        match api
            .replace_status(&current.name_any(), &PostParams::default(), &next)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && tries < 8 => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(est: u64, seen: u64) -> Observation {
        Observation {
            job: "ml/a".into(),
            attempt: 0,
            gpu: None,
            estimated_bytes: est,
            observed_bytes: seen,
            kind: "GpuOutOfMemory".into(),
            time: None,
        }
    }

    #[test]
    fn the_ratio_is_the_largest_proven_and_history_is_bounded() {
        let mut s = with_observation(None, obs(100, 120));
        assert!((s.ratio - 1.2).abs() < 1e-9);
        s = with_observation(Some(s), obs(100, 110));
        assert!(
            (s.ratio - 1.2).abs() < 1e-9,
            "a smaller ratio does not lower it"
        );
        for _ in 0..40 {
            s = with_observation(Some(s), obs(100, 130));
        }
        assert!((s.ratio - 1.3).abs() < 1e-9);
        assert_eq!(s.observation_count, 42);
        assert_eq!(s.observations.len(), MAX_OBSERVATIONS);
        let zero = with_observation(None, obs(0, 10));
        assert_eq!(zero.ratio, 0.0);
    }
}
