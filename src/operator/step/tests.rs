//! Every phase transition of a TrainingJob, as a table of steps: the job as
//! read and what was observed in, the status and effects out. No client: a
//! job is walked through its life as the controller would walk it, each
//! step's status written back onto the object the next step reads.

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::api::{
    GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus, TrainingJobSpec, TrainingJobStatus,
};
use crate::operator::conditions as cond;
use crate::operator::oom;
use crate::plan::ReservationIndex;

const GIB: u64 = 1 << 30;

/// A LoRA fine-tune of `model` (an 8B one: 49 GiB per GPU on an H100 with
/// full checkpointing); `policy` its fit policy.
fn spec(model: &str, policy: &str) -> TrainingJobSpec {
    serde_saphyr::from_str(&format!(
        "model: {{preset: {model}}}
training: {{mode: lora, lora: {{rank: 16}}, microBatchSize: 1, globalBatchSize: 32, sequenceLength: 2048,
           precision: bf16-mixed, optimizer: adamw, attention: flash, gradientCheckpointing: full}}
fitPolicy: {policy}
template:
  spec:
    containers:
      - name: trainer
        image: ghcr.io/example/trainer:1.0
"
    ))
    .expect("test spec")
}

fn tj_with(model: &str, policy: &str) -> TrainingJob {
    let mut tj = TrainingJob::new("train", spec(model, policy));
    tj.metadata.namespace = Some("ml".into());
    tj.metadata.uid = Some("uid-1".into());
    tj.metadata.generation = Some(1);
    tj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    tj
}

/// A new job with its finalizer, pending, no retries, no changes allowed.
fn tj() -> TrainingJob {
    tj_with("llama-3.1-8b", "{maxOomRetries: 2}")
}

fn node(free_gib: u64) -> GpuNode {
    let mut g = GpuNode::new(
        "gpu-a",
        GpuNodeSpec {
            node_name: "gpu-a".into(),
            ttl_seconds: 3600,
            taints: Vec::new(),
        },
    );
    g.status = Some(GpuNodeStatus {
        gpus: vec![GpuStatus {
            index: 0,
            product: "NVIDIA H100 80GB HBM3".into(),
            total_bytes: 80 * GIB,
            free_bytes: free_gib * GIB,
            used_bytes: (80 - free_gib) * GIB,
            healthy: true,
            ..Default::default()
        }],
        gpu_count: 1,
        product: Some("NVIDIA H100 80GB HBM3".into()),
        probe_time: Some(now()),
        ..Default::default()
    });
    g
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn snapshot(free_gib: u64) -> inventory::Snapshot {
    inventory::Snapshot::new(vec![node(free_gib)], Some(now().0.as_second()), true, None)
}

/// A step of a pending job on one H100 with `free_gib` free.
fn pending_on(tj: &TrainingJob, free_gib: u64) -> Step {
    let snapshot = snapshot(free_gib);
    let reservations = ReservationIndex::default();
    let seen = Observed {
        cluster: Some(Cluster {
            snapshot: &snapshot,
            reservations: &reservations,
        }),
        ..Observed::at(now())
    };
    step(tj, &seen).expect("step")
}

/// `tj` with `step`'s status written.
fn written(tj: &TrainingJob, step: &Step) -> TrainingJob {
    let mut next = tj.clone();
    next.status = Some(step.status.clone().expect("a status to write"));
    next
}

fn status(step: &Step) -> &TrainingJobStatus {
    step.status.as_ref().expect("a status")
}

fn condition<'a>(s: &'a TrainingJobStatus, type_: &str) -> (&'a str, &'a str) {
    let c = cond::get(&s.conditions, type_).unwrap_or_else(|| panic!("no {type_} condition"));
    (c.status.as_str(), c.reason.as_str())
}

fn reasons(effects: &[Effect]) -> Vec<&'static str> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

/// The job placed on an empty H100: Admitted.
fn admitted() -> TrainingJob {
    let tj = tj();
    written(&tj, &pending_on(&tj, 80))
}

/// The attempt's Job as the step renders it, with `status`.
fn job_of(tj: &TrainingJob, status: JobStatus) -> Job {
    let s = step(tj, &Observed::at(now())).expect("step");
    let Some(Effect::CreateJob { job, .. }) = s.before.last() else {
        panic!("no Job made: {s:?}");
    };
    let mut job = (**job).clone();
    job.status = Some(status);
    job
}

fn job_condition(type_: &str, message: &str) -> JobStatus {
    JobStatus {
        conditions: Some(vec![JobCondition {
            type_: type_.into(),
            status: "True".into(),
            message: Some(message.into()),
            ..JobCondition::default()
        }]),
        ..JobStatus::default()
    }
}

/// A step of an admitted or running job whose Job is `job`.
fn following(tj: &TrainingJob, job: &Job, failure: Option<&Found>, profile_scale: f64) -> Step {
    let seen = Observed {
        job: Some(job),
        failure,
        profile_scale,
        ..Observed::at(now())
    };
    step(tj, &seen).expect("step")
}

/// `tj` running: its Job has an active pod.
fn running() -> (TrainingJob, Job) {
    let tj = admitted();
    let active = JobStatus {
        active: Some(1),
        ..JobStatus::default()
    };
    let job = job_of(&tj, active);
    let s = following(&tj, &job, None, 1.0);
    (written(&tj, &s), job)
}

/// An OOM that proves 57 GiB needed where 49 were estimated: the retry
/// still fits an H100.
const GPU_OOM: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 55.00 GiB memory in use. Of the allocated memory 52.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.";

fn found(reason: Option<&str>, exit: i32, message: &str) -> Found {
    Found {
        pod: "train-0-x7k2p".into(),
        container: "trainer".into(),
        failure: oom::classify(reason, Some(exit), message),
    }
}

/// `tj` running, then its Job failed with `failure` found in its pods.
fn failed_with(tj: &TrainingJob, job: &Job, failure: Option<&Found>) -> Step {
    let mut job = job.clone();
    job.status = Some(JobStatus {
        failed: Some(1),
        ..job_condition("Failed", "BackoffLimitExceeded")
    });
    following(tj, &job, failure, 1.0)
}

#[test]
fn a_new_job_gets_the_finalizer_first_and_nothing_else() {
    let mut tj = tj();
    tj.metadata.finalizers = None;
    assert_eq!(reads(&tj), Reads::Nothing);
    let s = step(&tj, &Observed::at(now())).unwrap();
    assert_eq!(s.before, vec![Effect::AddFinalizer]);
    assert_eq!((s.status, s.reserve, s.next), (None, None, Next::Again));
}

#[test]
fn pending_to_admitted_records_the_decision_and_takes_the_hold() {
    let tj = tj();
    assert_eq!(reads(&tj), Reads::Cluster);
    let s = pending_on(&tj, 80);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Admitted));
    assert_eq!(st.job_name.as_deref(), Some("train-0"));
    assert_eq!(condition(st, cond::VALIDATED), ("True", "Valid"));
    assert_eq!(condition(st, cond::PLACED), ("True", "Placed"));
    let placement = st.placement.as_ref().expect("a placement");
    assert_eq!(placement.node, "gpu-a");
    assert!(placement.reserved_bytes_per_gpu > 40 * GIB, "{placement:?}");
    let hold = s.reserve.as_ref().expect("a hold");
    assert_eq!((hold.uid.as_str(), hold.attempt), ("uid-1", 0));
    assert_eq!(hold.job, "ml/train-0");
    assert_eq!(hold.reservations[0].bytes, placement.reserved_bytes_per_gpu);
    assert!(
        s.before.is_empty(),
        "nothing before the status: {:?}",
        s.before
    );
    assert_eq!(
        s.after[..3],
        [
            Effect::Count(Count::Placed { adjusted: false }),
            Effect::Waiting(false),
            Effect::NotStarted(true)
        ]
    );
    assert_eq!(reasons(&s.after), ["Placed"]);
    assert_eq!(s.next, Next::Again, "the Job is made at once");
}

#[test]
fn a_pending_job_the_ledger_holds_already_is_older_than_its_admission() {
    let seen = Observed {
        held: true,
        ..Observed::at(now())
    };
    let s = step(&tj(), &seen).unwrap();
    assert_eq!(s, Step::new(Next::AwaitChange));
}

#[test]
fn pending_waits_for_capacity_and_says_so_once() {
    let tj = tj();
    let s = pending_on(&tj, 20);
    assert_eq!(s.before, vec![Effect::Waiting(true)]);
    assert_eq!(s.reserve, None);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Pending));
    assert_eq!(condition(st, cond::PLACED), ("False", "WaitingForCapacity"));
    assert_eq!(reasons(&s.after), ["WaitingForCapacity"]);
    assert_eq!(s.next, Next::Wait);
    // Nothing changed: no write, no second event, still waiting.
    let again = pending_on(&written(&tj, &s), 20);
    assert_eq!(again.before, vec![Effect::Waiting(true)]);
    assert_eq!((again.status, again.after), (None, vec![]));
}

#[test]
fn pending_is_rejected_when_nothing_fits_and_failed_after_a_retry() {
    // A 70B model's bf16 weights alone are more than one 80 GB GPU holds,
    // and the fit policy allows no changes.
    let mut tj = tj_with("llama-3.1-70b", "{maxOomRetries: 2}");
    let s = pending_on(&tj, 80);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Rejected));
    assert_eq!(condition(st, cond::PLACED), ("False", "DoesNotFit"));
    assert_eq!(
        s.after[..2],
        [Effect::Waiting(false), Effect::Release],
        "a rejected job holds nothing"
    );
    assert_eq!(reasons(&s.after), ["DoesNotFit"]);
    // The same after an out-of-memory retry: the retry failed.
    tj.status = Some(TrainingJobStatus {
        oom_retries: 1,
        ..TrainingJobStatus::default()
    });
    let s = pending_on(&tj, 80);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Failed));
    assert_eq!(condition(st, cond::FAILED), ("True", "NoSmallerPlan"));
    assert!(
        st.message
            .as_deref()
            .unwrap()
            .starts_with("after 1 out-of-memory retry,")
    );
}

#[test]
fn an_invalid_spec_is_rejected_before_the_cluster_is_looked_at() {
    let mut tj = tj();
    tj.spec.training.micro_batch_size = 0;
    let s = step(&tj, &Observed::at(now())).expect("no cluster needed");
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Rejected));
    assert_eq!(condition(st, cond::VALIDATED), ("False", "InvalidSpec"));
    assert!(
        st.message.as_deref().unwrap().contains("microBatchSize"),
        "{st:?}"
    );
}

#[test]
fn admitted_without_its_job_makes_it() {
    let tj = admitted();
    assert_eq!(reads(&tj), Reads::Job("train-0".into()));
    let s = step(&tj, &Observed::at(now())).unwrap();
    let [Effect::CreateJob { job, note }] = &s.before[..] else {
        panic!("one Job made: {s:?}");
    };
    assert_eq!(job.metadata.name.as_deref(), Some("train-0"));
    assert_eq!(note, "created Job train-0 (attempt 0)");
    assert_eq!((&s.status, &s.after, s.next), (&None, &vec![], Next::Again));
}

#[test]
fn admitted_and_queued_then_running() {
    let tj = admitted();
    let mut suspended = job_of(&tj, JobStatus::default());
    suspended.spec.as_mut().unwrap().suspend = Some(true);
    assert_eq!(
        wants(&tj, &suspended),
        Wants {
            failure: false,
            profile: true
        }
    );
    let s = following(&tj, &suspended, None, 1.0);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Admitted));
    assert_eq!(condition(st, cond::QUEUED), ("True", "Suspended"));
    assert_eq!((s.before.clone(), s.after.clone()), (vec![], vec![]));
    let queued = written(&tj, &s);
    // Nothing new while it stays suspended.
    assert_eq!(following(&queued, &suspended, None, 1.0).status, None);
    // The queue lets it go and a pod runs.
    let active = job_of(
        &queued,
        JobStatus {
            active: Some(1),
            ..JobStatus::default()
        },
    );
    assert_eq!(wants(&queued, &active), Wants::default());
    let s = following(&queued, &active, None, 1.0);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Running));
    assert_eq!(condition(st, cond::QUEUED), ("False", "Admitted"));
    assert_eq!(condition(st, cond::RUNNING), ("True", "PodsActive"));
    assert_eq!(s.before, vec![Effect::NotStarted(false)]);
    assert_eq!(reasons(&s.after), ["Running"]);
    assert!(
        !s.after.contains(&Effect::Release),
        "a running job holds its memory"
    );
}

#[test]
fn running_to_succeeded_releases_the_hold() {
    let (tj, job) = running();
    assert_eq!(tj.status.as_ref().unwrap().phase, Some(Phase::Running));
    let mut done = job.clone();
    done.status = Some(job_condition("Complete", ""));
    let s = following(&tj, &done, None, 1.0);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Succeeded));
    assert_eq!(condition(st, cond::COMPLETE), ("True", "Completed"));
    assert_eq!(condition(st, cond::RUNNING), ("False", "Completed"));
    assert_eq!(s.after[0], Effect::Release);
    assert_eq!(reasons(&s.after), ["Succeeded"]);
    // Terminal: every later step only makes sure nothing is held.
    let end = written(&tj, &s);
    assert_eq!(reads(&end), Reads::Nothing);
    let s = step(&end, &Observed::at(now())).unwrap();
    assert_eq!(s.before, vec![Effect::Waiting(false), Effect::Release]);
    assert_eq!((s.status, s.next), (None, Next::AwaitChange));
}

#[test]
fn a_gpu_oom_is_learnt_and_retried_smaller() {
    let (tj, job) = running();
    let oom = found(Some("Error"), 1, GPU_OOM);
    let mut failed_job = job.clone();
    failed_job.status = Some(JobStatus {
        failed: Some(1),
        ..JobStatus::default()
    });
    assert!(wants(&tj, &failed_job).failure);
    let s = failed_with(&tj, &job, Some(&oom));
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Pending), "placed again");
    assert_eq!(st.oom_retries, 1);
    assert_eq!((st.placement.clone(), st.job_name.clone()), (None, None));
    let learned = st.learned.as_ref().expect("a lesson");
    assert!(learned.scale > 1.0, "{learned:?}");
    assert_eq!(
        condition(st, cond::OUT_OF_MEMORY),
        ("True", "GpuOutOfMemory")
    );
    assert_eq!(st.last_oom.as_ref().unwrap().pod, "train-0-x7k2p");
    let [Effect::Learn { observation, .. }] = &s.before[..] else {
        panic!("the MemoryProfile learns first: {:?}", s.before);
    };
    assert_eq!(
        (observation.job.as_str(), observation.attempt),
        ("ml/train", 0)
    );
    assert!(observation.observed_bytes > observation.estimated_bytes);
    assert!(matches!(
        s.after[0],
        Effect::Count(Count::GpuOom {
            observed: Some(_),
            ..
        })
    ));
    assert_eq!(s.after[1], Effect::Count(Count::OomRetry));
    assert_eq!(
        s.after[2..4],
        [
            Effect::DeleteJob {
                name: "train-0".into()
            },
            Effect::Release
        ]
    );
    assert_eq!(reasons(&s.after), ["GpuOutOfMemory"]);
    assert_eq!(s.next, Next::Soon);
    // The retry is placed with the lesson, as attempt 1.
    let retry = written(&tj, &s);
    let placed = pending_on(&retry, 80);
    let st = status(&placed);
    assert_eq!(st.phase, Some(Phase::Admitted));
    assert_eq!(st.job_name.as_deref(), Some("train-1"));
    assert_eq!(placed.reserve.as_ref().unwrap().attempt, 1);
}

#[test]
fn a_gpu_oom_with_every_retry_used_fails_the_job() {
    let mut tj = tj_with("llama-3.1-8b", "{maxOomRetries: 0}");
    tj = written(&tj, &pending_on(&tj, 80));
    let job = job_of(&tj, JobStatus::default());
    let oom = found(Some("Error"), 1, GPU_OOM);
    let s = failed_with(&tj, &job, Some(&oom));
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Failed));
    assert_eq!(
        condition(st, cond::FAILED),
        ("True", "OutOfMemoryRetriesExhausted")
    );
    assert_eq!(
        condition(st, cond::OUT_OF_MEMORY),
        ("True", "GpuOutOfMemory")
    );
    assert!(matches!(s.before[..], [Effect::Learn { .. }]));
    assert!(matches!(s.after[0], Effect::Count(Count::GpuOom { .. })));
    assert!(!s.after.contains(&Effect::Count(Count::OomRetry)));
    assert!(s.after.contains(&Effect::Release));
    assert!(
        !s.after
            .iter()
            .any(|e| matches!(e, Effect::DeleteJob { .. })),
        "the failed Job stays to be read"
    );
    assert_eq!(s.next, Next::AwaitChange);
}

#[test]
fn a_host_oom_or_another_failure_fails_the_job() {
    let (tj, job) = running();
    let host = found(Some("OOMKilled"), 137, "");
    let s = failed_with(&tj, &job, Some(&host));
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Failed));
    assert_eq!(condition(st, cond::FAILED), ("True", "HostOutOfMemory"));
    assert_eq!(st.last_oom.as_ref().unwrap().kind, "HostOutOfMemory");
    assert_eq!(s.after[0], Effect::Count(Count::HostOom));
    assert!(
        s.before.is_empty(),
        "a host OOM teaches the MemoryProfile nothing"
    );

    let other = found(Some("Error"), 2, "ValueError: bad batch");
    let s = failed_with(&tj, &job, Some(&other));
    let st = status(&s);
    assert_eq!(condition(st, cond::FAILED), ("True", "JobFailed"));
    assert_eq!(
        st.message.as_deref(),
        Some(
            "Job train-0 failed: pod train-0-x7k2p container trainer: the container failed (Error, exit code 2)"
        )
    );
    assert_eq!(st.last_oom, None);

    // No pod tells why: the Job's own reason.
    let s = failed_with(&tj, &job, None);
    let st = status(&s);
    assert_eq!(
        st.message.as_deref(),
        Some("Job train-0 failed: BackoffLimitExceeded")
    );
    assert_eq!(
        s.after,
        [
            Effect::Waiting(false),
            Effect::Release,
            Effect::Event {
                kind: Kind::Warning,
                reason: "JobFailed",
                note: "Job train-0 failed: BackoffLimitExceeded".into()
            }
        ]
    );
}

#[test]
fn a_job_of_the_same_name_not_ours_fails_the_job() {
    let tj = admitted();
    let mut foreign = job_of(&tj, JobStatus::default());
    foreign.metadata.owner_references = None;
    assert_eq!(
        wants(&tj, &foreign),
        Wants::default(),
        "its pods are not read"
    );
    let s = following(&tj, &foreign, None, 1.0);
    assert_eq!(
        condition(status(&s), cond::FAILED),
        ("True", "JobNameTaken")
    );
}

#[test]
fn admitted_not_started_is_placed_again_when_its_profile_learnt_past_the_hold() {
    let tj = admitted();
    let job = job_of(&tj, JobStatus::default());
    // Within the hold (its margin): nothing changes.
    let s = following(&tj, &job, None, 1.01);
    assert_eq!(s.status, None);
    let s = following(&tj, &job, None, 1.6);
    let st = status(&s);
    assert_eq!(st.phase, Some(Phase::Pending));
    assert_eq!((st.placement.clone(), st.job_name.clone()), (None, None));
    assert_eq!(condition(st, cond::PLACED), ("False", "LearntBeforeStart"));
    assert_eq!(st.learned.as_ref().unwrap().scale, 1.6);
    assert_eq!(
        s.after[..3],
        [
            Effect::DeleteJob {
                name: "train-0".into()
            },
            Effect::NotStarted(false),
            Effect::Release
        ]
    );
    assert_eq!(s.next, Next::Soon);
    // Once a pod started, a lesson waits for the next attempt.
    let started = job_of(
        &tj,
        JobStatus {
            active: Some(1),
            ..JobStatus::default()
        },
    );
    assert!(!wants(&tj, &started).profile);
}

#[test]
fn admitted_by_hand_without_a_decision_goes_back_to_pending() {
    let mut tj = tj();
    tj.status = Some(TrainingJobStatus {
        phase: Some(Phase::Admitted),
        ..TrainingJobStatus::default()
    });
    assert_eq!(reads(&tj), Reads::Nothing);
    let s = step(&tj, &Observed::at(now())).unwrap();
    assert_eq!(status(&s).phase, Some(Phase::Pending));
    assert_eq!(
        (s.before.clone(), s.after.clone(), s.next),
        (vec![], vec![], Next::AwaitChange)
    );
}

#[test]
fn deleted_releases_the_hold_then_lets_go() {
    let (mut tj, _) = running();
    tj.metadata.deletion_timestamp = Some(now());
    assert_eq!(reads(&tj), Reads::Nothing);
    let s = step(&tj, &Observed::at(now())).unwrap();
    assert_eq!(
        s.before,
        [
            Effect::Waiting(false),
            Effect::Release,
            Effect::RemoveFinalizer
        ]
    );
    assert_eq!(
        (s.status, s.after, s.next),
        (None, vec![], Next::AwaitChange)
    );
    // Without our finalizer there is nothing to remove; the hold still goes.
    tj.metadata.finalizers = Some(vec!["other/finalizer".into()]);
    let s = step(&tj, &Observed::at(now())).unwrap();
    assert_eq!(s.before, [Effect::Waiting(false), Effect::Release]);
}

#[test]
fn a_pending_step_without_the_cluster_is_an_error_not_a_guess() {
    assert!(matches!(
        step(&tj(), &Observed::at(now())),
        Err(Error::NotObserved(_))
    ));
}
