//! The controller's own part: what it does around a step's writes, against the
//! in-memory API server over HTTP with kube's client.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::{GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus, TrainingJobSpec};
use crate::apiserver::ApiServer;
use crate::inventory::Static;

const GIB: u64 = 1 << 30;
const NS: &str = "ml";

/// A pending LoRA fine-tune of an 8B model with its finalizer: 49 GiB on an H100.
fn training_job(name: &str) -> TrainingJob {
    let spec: TrainingJobSpec = serde_saphyr::from_str(
        "model: {preset: llama-3.1-8b}
training: {mode: lora, lora: {rank: 16}, microBatchSize: 1, globalBatchSize: 32, sequenceLength: 2048,
           precision: bf16-mixed, optimizer: adamw, attention: flash, gradientCheckpointing: full}
template:
  spec:
    containers:
      - name: trainer
        image: ghcr.io/example/trainer:1.0
",
    )
    .expect("test spec");
    let mut tj = TrainingJob::new(name, spec);
    tj.metadata.namespace = Some(NS.into());
    tj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    tj
}

/// One empty H100, probed now.
fn node() -> GpuNode {
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
            free_bytes: 79 * GIB,
            used_bytes: GIB,
            healthy: true,
            ..Default::default()
        }],
        gpu_count: 1,
        product: Some("NVIDIA H100 80GB HBM3".into()),
        probe_time: Some(Time(Timestamp::now())),
        ..Default::default()
    });
    g
}

fn context(
    client: Client,
) -> (
    Arc<Context>,
    mpsc::UnboundedReceiver<ObjectRef<TrainingJob>>,
) {
    let (kick, kicks) = mpsc::unbounded();
    let inventory = Static::new(vec![node()], Timestamp::now().as_second());
    let config = Config::default();
    let ctx = Context {
        client,
        inventory: Arc::new(inventory),
        ledger: Mutex::new(Ledger::default()),
        waiting: StdMutex::new(HashSet::new()),
        admitted: StdMutex::new(HashSet::new()),
        kick,
        reporter: events::Reporter {
            controller: config.reporter.clone(),
            instance: config.reporter.clone(),
        },
        config,
        reconciles: AtomicU64::new(0),
    };
    (Arc::new(ctx), kicks)
}

#[tokio::test]
async fn a_failed_status_write_gives_the_hold_back() {
    let server = ApiServer::start().await;
    let (ctx, mut kicks) = context(server.client());
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), NS);
    // The copy the controller read, then changed by someone else: its status write
    // carries a resourceVersion that is no longer the stored one.
    let read = Arc::new(server.put(&training_job("train")));
    let mut edited = (*read).clone();
    edited
        .metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "b".into());
    server.put(&edited);
    // Another job waits for the capacity the hold takes.
    let other = ObjectRef::<TrainingJob>::new("other").within(NS);
    ctx.set_waiting(other.clone(), true);

    let key = ledger::key(&read);
    let step = read_and_step(&read, &ctx, NS, None).await.expect("steps");
    assert!(step.reserve.is_some() && step.status.is_some(), "{step:?}");
    assert!(
        ctx.ledger.lock().await.get(&key).is_some(),
        "the decision takes its hold under the lock"
    );

    let err = match apply(&api, &read, &ctx, step).await {
        Ok(_) => panic!("a status write over a stale resourceVersion succeeded"),
        Err(e) => e,
    };
    assert!(
        matches!(&err, Error::Kube(kube::Error::Api(s)) if s.code == 409),
        "{err}"
    );
    assert!(
        ctx.ledger.lock().await.get(&key).is_none(),
        "the hold of a decision that was not recorded is given back"
    );
    assert_eq!(
        kicks.try_recv().ok(),
        Some(other),
        "the waiting job is tried again on the freed capacity"
    );
    // Nothing was made for a decision that was not recorded.
    assert!(server.objects::<Job>().is_empty());
}
