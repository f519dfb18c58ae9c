//! Leader election on a `coordination.k8s.io/v1` Lease, so several replicas
//! can run and one decides. The holder renews the Lease every `renew_every`;
//! another replica takes it over only once `renewTime + leaseDuration` has
//! passed. Every write carries the resourceVersion it read, so of two
//! replicas racing for an expired Lease exactly one wins. A leader that
//! cannot renew within `renew_deadline` (shorter than the lease) steps down
//! before anyone else may step up.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::{Client, Error};
use tokio::sync::watch;
use tokio::time::Instant;

/// Which Lease, who we are, and the timings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica (its pod name).
    pub identity: String,
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down.
    pub renew_deadline: Duration,
    /// How often the leader renews.
    pub renew_every: Duration,
    /// How often a follower tries.
    pub retry_every: Duration,
}

impl LeaseConfig {
    /// The usual timings (15 s lease, 10 s deadline, renew every 2 s).
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            retry_every: Duration::from_secs(2),
        }
    }
}

fn conflict_or_exists(e: &Error) -> bool {
    matches!(e, Error::Api(s) if s.code == 409)
}

fn lease_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// True when `lease` is held by someone other than `me` whose hold has not
/// expired at `now`.
fn held_by_other(lease: &Lease, me: &str, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    let Some(holder) = spec.holder_identity.as_deref().filter(|h| !h.is_empty()) else {
        return false;
    };
    if holder == me {
        return false;
    }
    let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match renewed {
        Some(t) => t
            .checked_add(SignedDuration::from_secs(seconds))
            .is_ok_and(|until| until > now),
        None => false,
    }
}

/// One attempt to take or keep the Lease: true when we hold it afterwards.
pub async fn try_acquire(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool, Error> {
    let now = Timestamp::now();
    let existing = api.get_opt(&cfg.name).await?;
    let Some(mut lease) = existing else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(lease_seconds(cfg.lease_duration)),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(e) if conflict_or_exists(&e) => Ok(false),
            Err(e) => Err(e),
        };
    };
    if held_by_other(&lease, &cfg.identity, now) {
        return Ok(false);
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(lease_seconds(cfg.lease_duration));
    // The resourceVersion read above is the precondition of this write.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(e) if conflict_or_exists(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Give the Lease up (on shutdown) so another replica need not wait it out.
pub async fn release(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<(), Error> {
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(e) if conflict_or_exists(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Keep trying to lead; `leading` says whether we do. Runs until dropped.
pub async fn elect(client: Client, cfg: LeaseConfig, leading: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_renewed: Option<Instant> = None;
    loop {
        let outcome = try_acquire(&api, &cfg).await;
        let now = Instant::now();
        let is_leader = match outcome {
            Ok(true) => {
                last_renewed = Some(now);
                true
            }
            Ok(false) => {
                last_renewed = None;
                false
            }
            Err(error) => {
                tracing::warn!(%error, lease = %cfg.name, "leader election");
                // Keep leading through a blip, never past the deadline.
                last_renewed.is_some_and(|t| now.duration_since(t) < cfg.renew_deadline)
            }
        };
        let changed = leading.send_if_modified(|v| {
            let changed = *v != is_leader;
            *v = is_leader;
            changed
        });
        if changed {
            tracing::info!(identity = %cfg.identity, leader = is_leader, "leadership changed");
        }
        let wait = if is_leader {
            cfg.renew_every
        } else {
            cfg.retry_every
        };
        tokio::time::sleep(wait).await;
    }
}

/// A task that ends when its handle is dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Run `work` only while this replica holds `lease`, until `shutdown`
/// resolves (then the Lease is released if held). `work` gets a future that
/// resolves when leadership is lost or shutdown begins, and must return soon
/// after; an error from it is logged under `what` and `work` runs again once
/// this replica leads.
pub async fn lead<W, Fut, E>(
    client: Client,
    lease: LeaseConfig,
    what: &'static str,
    shutdown: impl std::future::Future<Output = ()> + Send,
    mut work: W,
) where
    W: FnMut(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>>) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let (tx, mut rx) = watch::channel(false);
    // Dropped with this future (a crash, an abort): the renewals stop too.
    let elector = AbortOnDrop(tokio::spawn(elect(client.clone(), lease.clone(), tx)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Follow until we lead.
        tokio::select! {
            _ = &mut shutdown => break,
            r = rx.wait_for(|leading| *leading) => if r.is_err() { break },
        }
        let mut lost = rx.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stop = Box::pin(async move {
            tokio::select! {
                _ = lost.wait_for(|leading| !*leading) => {},
                _ = stop_rx => {},
            }
        });
        let run = work(stop);
        tokio::pin!(run);
        tokio::select! {
            r = &mut run => {
                if let Err(error) = r {
                    tracing::warn!(%error, what, "controller stopped; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            _ = &mut shutdown => {
                let _ = stop_tx.send(());
                let _ = run.await;
                break;
            }
        }
    }
    drop(elector);
    let leases = Api::namespaced(client, &lease.namespace);
    if let Err(error) = release(&leases, &lease).await {
        tracing::warn!(%error, what, "releasing the Lease");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: i64, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(seconds),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_held_until_it_expires() {
        let now = Timestamp::from_second(1_000).unwrap();
        assert!(held_by_other(&lease(Some("b"), 990, 15), "a", now));
        assert!(!held_by_other(&lease(Some("b"), 980, 15), "a", now));
        assert!(!held_by_other(&lease(Some("a"), 999, 15), "a", now));
        assert!(!held_by_other(&lease(None, 999, 15), "a", now));
        assert!(!held_by_other(&lease(Some(""), 999, 15), "a", now));
    }
}
