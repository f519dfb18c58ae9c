//! How fast a spec is validated and estimated: the webhook does this on every
//! admission, once per candidate GPU product.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use vramguard::api::parse::{documents, training_job};
use vramguard::api::{TrainingJobSpec, validate};
use vramguard::estimate::{self, GpuProduct, gpus};

const LORA_8B: &str = "\
apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata:
  name: llama-8b-lora
spec:
  model:
    preset: llama-3.1-8b
  training:
    mode: lora
    lora: {rank: 16, targetModules: [q_proj, k_proj, v_proj, o_proj]}
    microBatchSize: 4
    sequenceLength: 4096
    precision: bf16-mixed
    gradientCheckpointing: full
    attention: flash
";

const LLAMA_405B_3D: &str = "\
apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata:
  name: llama-405b-3d
spec:
  model:
    preset: llama-3.1-405b
  training:
    mode: full
    microBatchSize: 1
    globalBatchSize: 512
    sequenceLength: 8192
    precision: bf16-mixed
    gradientCheckpointing: selective
    attention: flash
  parallelism:
    gpus: 512
    gpusPerNode: 8
    strategy: megatron
    zeroStage: 1
    tensorParallel: 8
    sequenceParallel: true
    pipelineParallel: 8
    pipelineSchedule: interleaved-1f1b
    virtualStages: 2
";

const HF_CONFIG_QWEN: &str = r#"
apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata:
  name: qwen-hf
spec:
  model:
    hfConfig: {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
      "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
      "vocab_size": 152064, "tie_word_embeddings": false}
  training:
    mode: full
    microBatchSize: 2
    sequenceLength: 4096
    precision: bf16
    gradientCheckpointing: full
  parallelism:
    gpus: 8
    strategy: fsdp
    zeroStage: 3
"#;

const RESNET_50: &str = "\
apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata:
  name: resnet-50
spec:
  model:
    preset: resnet-50
  training:
    mode: full
    microBatchSize: 256
    precision: bf16-mixed
    optimizer: sgd-momentum
";

fn spec(text: &str) -> TrainingJobSpec {
    let doc = documents(text)
        .expect("the bench spec is YAML")
        .into_iter()
        .next()
        .expect("one document");
    training_job(doc).expect("the bench spec parses").spec
}

fn validate_and_estimate(spec: &TrainingJobSpec, gpu: &'static GpuProduct) -> u64 {
    let job = validate(spec).expect("the bench spec validates");
    estimate::estimate(&job, gpu)
        .expect("the bench spec is estimated")
        .status
        .per_gpu_bytes
}

fn bench(c: &mut Criterion) {
    let h100 = gpus::find("h100-80gb").expect("h100-80gb is in the catalog");
    let mut group = c.benchmark_group("validate+estimate");
    group.throughput(Throughput::Elements(1));
    for (name, text) in [
        ("llama-3.1-8b lora", LORA_8B),
        ("llama-3.1-405b 512 GPUs tp8 pp8 dp8", LLAMA_405B_3D),
    ] {
        let spec = spec(text);
        group.bench_function(name, |b| {
            b.iter(|| validate_and_estimate(black_box(&spec), black_box(h100)))
        });
    }
    group.finish();

    // The estimate alone on a validated job (what the planner repeats per candidate).
    let mut group = c.benchmark_group("estimate");
    group.throughput(Throughput::Elements(1));
    for (name, text) in [
        ("hfConfig qwen2 7B fsdp 8 GPUs", HF_CONFIG_QWEN),
        ("resnet-50 layers", RESNET_50),
        ("llama-3.1-405b 512 GPUs tp8 pp8 dp8", LLAMA_405B_3D),
    ] {
        let job = validate(&spec(text)).expect("the bench spec validates");
        group.bench_function(name, |b| {
            b.iter(|| {
                estimate::estimate(black_box(&job), black_box(h100))
                    .expect("estimated")
                    .status
                    .per_gpu_bytes
            })
        });
    }
    group.finish();

    let text = LORA_8B;
    let mut group = c.benchmark_group("parse+validate+estimate");
    group.throughput(Throughput::Elements(1));
    group.bench_function("llama-3.1-8b lora from YAML", |b| {
        b.iter(|| validate_and_estimate(&spec(black_box(text)), h100))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
