//! Properties of the estimator over generated specs: every spec the validator
//! accepts is estimated without panic or error, the three peak figures are
//! ordered (allocated ≤ reserved ≤ per GPU), and the allocated peak never
//! shrinks when the micro-batch or the sequence grows; a plan the shrink
//! search returns fits when estimated again, and the webhook's answer to any
//! spec stays within Kubernetes' size limits. Three `#[ignore]`d
//! tests at the end hold estimator bugs the properties found; they pass once
//! the bugs are fixed and then belong in the properties.

use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use vramguard::api::{
    self, AdjustableField, Attention, Checkpointing, CustomModel, FitMode, FitPolicy, Framework,
    LoraSpec, Loss, MlpKind, ModelSpec, NormKind, Offload, Optimizer, ParallelismSpec,
    PipelineSchedule, Precision, Quantization, TrainingJobSpec, TrainingMode, TrainingSpec,
    TransformerKind, TransformerSpec, validate,
};
use vramguard::estimate::presets::PRESETS;
use vramguard::estimate::{self, GpuProduct, gpus::GPUS};
use vramguard::inventory::{Snapshot, Source, Static};
use vramguard::operator::admit::Decision;
use vramguard::plan::{self, GpuView, effective_batch};
use vramguard::webhook::decide;
use vramguard::webhook::review::{Object, Review};

fn preset_model() -> impl Strategy<Value = ModelSpec> {
    (0..PRESETS.len()).prop_map(|i| ModelSpec {
        preset: Some(PRESETS[i].name.to_string()),
        ..ModelSpec::default()
    })
}

/// Transformer dimensions within the validator's limits and of a size real
/// models have (so the estimate stays far below the 1 EiB refusal).
fn transformer_model() -> impl Strategy<Value = ModelSpec> {
    let shape = (
        1u64..=96,                                               // layers
        1u64..=64,                                               // attention heads
        prop::sample::select(vec![16u64, 32, 64, 80, 128, 256]), // head width
        1u64..=8,                                                // kv-head grouping
        prop::option::of(1u64..=8),                              // intermediate, in hidden/2
        1u64..=262_144,                                          // vocabulary
    );
    let flavour = (
        prop::sample::select(vec![
            TransformerKind::Decoder,
            TransformerKind::Encoder,
            TransformerKind::EncoderDecoder,
        ]),
        prop::sample::select(vec![MlpKind::Gated, MlpKind::Standard]),
        any::<bool>(), // tied embeddings
        prop_oneof![
            Just((0u64, 0u64)),
            (2u64..=16).prop_flat_map(|e| (Just(e), 1..=e))
        ],
        prop::option::of(prop::sample::select(vec![
            NormKind::Layernorm,
            NormKind::Rmsnorm,
        ])),
        any::<bool>(), // bias
        prop_oneof![Just(0u64), 512u64..=8192],
        prop::option::of(1u64..=48), // decoder layers
    );
    // Parallel block, post norms, attention and logit soft-capping.
    let extras = prop::array::uniform4(prop::option::of(any::<bool>()));
    (shape, flavour, extras).prop_map(
        |(
            (layers, heads, width, group, inter, vocab),
            (kind, mlp, tied, (experts, per_token), norm, bias, positions, decoder),
            [parallel, post, attn_cap, logit_cap],
        )| {
            let hidden = heads * width;
            // The largest divisor of heads not above heads / group.
            let kv = (1..=heads / group.min(heads))
                .rev()
                .find(|k| heads % k == 0)
                .unwrap_or(1);
            ModelSpec {
                transformer: Some(TransformerSpec {
                    kind,
                    layers,
                    hidden_size: hidden,
                    attention_heads: heads,
                    kv_heads: Some(kv),
                    intermediate_size: inter.map(|m| (hidden * m / 2).max(1)),
                    vocab_size: vocab,
                    mlp,
                    tied_embeddings: tied,
                    experts,
                    experts_per_token: per_token,
                    decoder_layers: decoder.filter(|_| kind == TransformerKind::EncoderDecoder),
                    norm,
                    bias,
                    max_positions: positions,
                    parallel_block: parallel,
                    post_norms: post,
                    attention_softcap: attn_cap,
                    final_logit_softcap: logit_cap,
                    ..TransformerSpec::default()
                }),
                ..ModelSpec::default()
            }
        },
    )
}

fn custom_model() -> impl Strategy<Value = ModelSpec> {
    (1e6f64..1e12, 0f64..1e10).prop_map(|(parameters, activation)| ModelSpec {
        custom: Some(CustomModel {
            parameters: parameters.round(),
            activation_bytes_per_sample: activation.round(),
        }),
        ..ModelSpec::default()
    })
}

fn model() -> impl Strategy<Value = ModelSpec> {
    prop_oneof![3 => preset_model(), 3 => transformer_model(), 1 => custom_model()]
}

const LORA_TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
];

fn training() -> impl Strategy<Value = TrainingSpec> {
    let what = (
        prop::sample::select(vec![
            TrainingMode::Full,
            TrainingMode::Lora,
            TrainingMode::Qlora,
            TrainingMode::Adapter,
            TrainingMode::Inference,
        ]),
        1u64..=256, // LoRA rank
        prop::sample::subsequence(LORA_TARGETS.to_vec(), 1..=LORA_TARGETS.len()),
        prop::option::of(prop::sample::select(vec![
            Quantization::None,
            Quantization::Int8,
            Quantization::Nf4,
            Quantization::Nf4Double,
        ])),
        1u64..=64,     // micro-batch
        1u64..=32_768, // sequence
    );
    let how = (
        prop::sample::select(vec![
            Precision::Fp32,
            Precision::Tf32,
            Precision::Fp16Mixed,
            Precision::Bf16Mixed,
            Precision::Fp16,
            Precision::Bf16,
        ]),
        prop::sample::select(vec![
            Optimizer::Adamw,
            Optimizer::Adam,
            Optimizer::Sgd,
            Optimizer::SgdMomentum,
            Optimizer::Adafactor,
            Optimizer::Adamw8bit,
            Optimizer::PagedAdamw,
            Optimizer::PagedAdamw8bit,
        ]),
        prop::sample::select(vec![
            Checkpointing::None,
            Checkpointing::Selective,
            Checkpointing::Full,
        ]),
        prop::sample::select(vec![Attention::Eager, Attention::Sdpa, Attention::Flash]),
        prop::sample::select(vec![Loss::Standard, Loss::Chunked]),
        prop::sample::select(vec![
            Framework::Pytorch,
            Framework::Tensorflow,
            Framework::Jax,
        ]),
        any::<[bool; 4]>(), // optimizer in backward, offloading, compile, data on GPU
    );
    (what, how).prop_map(
        |(
            (mode, rank, targets, quantization, mb, seq),
            (precision, optimizer, checkpointing, attention, loss, framework, flags),
        )| {
            let lora = matches!(mode, TrainingMode::Lora | TrainingMode::Qlora).then(|| LoraSpec {
                rank,
                target_modules: targets.iter().map(|t| t.to_string()).collect(),
                ..LoraSpec::default()
            });
            let quantization = match mode {
                TrainingMode::Qlora => quantization.filter(|q| *q != Quantization::None),
                TrainingMode::Full => None,
                _ => quantization,
            };
            TrainingSpec {
                mode,
                lora,
                quantization,
                micro_batch_size: mb,
                sequence_length: Some(seq),
                precision,
                optimizer,
                optimizer_in_backward: flags[0],
                gradient_checkpointing: checkpointing,
                activation_offloading: flags[1],
                attention,
                loss,
                compile: flags[2],
                framework,
                data_on_gpu_bytes: if flags[3] { 1 << 28 } else { 0 },
                ..TrainingSpec::default()
            }
        },
    )
}

fn parallelism() -> impl Strategy<Value = ParallelismSpec> {
    (
        prop::sample::select(vec![1u64, 2, 4, 8]),     // tensor
        prop::sample::select(vec![1u64, 2, 4]),        // pipeline
        prop::sample::select(vec![1u64, 2]),           // context
        prop::sample::select(vec![1u64, 2, 4, 8, 16]), // data
        0u8..=3,
        prop::sample::select(vec![
            api::Strategy::Ddp,
            api::Strategy::Fsdp,
            api::Strategy::Deepspeed,
            api::Strategy::Megatron,
        ]),
        any::<bool>(), // sequence parallel (with tensor parallel)
        prop::sample::select(vec![
            PipelineSchedule::Gpipe,
            PipelineSchedule::OneFOneB,
            PipelineSchedule::Interleaved1f1b,
            PipelineSchedule::LoopedBfs,
            PipelineSchedule::InterleavedZeroBubble,
            PipelineSchedule::ZbvZeroBubble,
            PipelineSchedule::DualPipeV,
        ]),
        0usize..3, // offload, as far as the ZeRO stage allows
    )
        .prop_map(
            |(tp, pp, cp, dp, zero_stage, strategy, sp, schedule, offload)| {
                let offloads: &[Offload] = match zero_stage {
                    0 => &[Offload::None],
                    1 | 2 => &[Offload::None, Offload::Optimizer],
                    _ => &[
                        Offload::None,
                        Offload::Optimizer,
                        Offload::OptimizerAndParameters,
                    ],
                };
                ParallelismSpec {
                    gpus: tp * pp * cp * dp,
                    gpus_per_node: None,
                    zero_stage: Some(zero_stage),
                    strategy,
                    sharding: None,
                    tensor_parallel: tp,
                    sequence_parallel: sp && tp > 1,
                    pipeline_parallel: pp,
                    pipeline_schedule: schedule,
                    virtual_stages: if schedule.multi_stage() && pp > 1 {
                        2
                    } else {
                        1
                    },
                    context_parallel: cp,
                    offload: offloads[offload % offloads.len()],
                    offload_gradients: false,
                    fsdp_version: None,
                }
            },
        )
}

fn spec() -> impl Strategy<Value = TrainingJobSpec> {
    (model(), training(), parallelism()).prop_map(|(model, training, mut parallelism)| {
        if model.custom.is_some() {
            // A model known by size alone has no dimensions to split.
            let p = &mut parallelism;
            p.gpus /= p.tensor_parallel * p.pipeline_parallel * p.context_parallel;
            p.tensor_parallel = 1;
            p.pipeline_parallel = 1;
            p.context_parallel = 1;
            p.sequence_parallel = false;
            p.virtual_stages = 1;
        }
        TrainingJobSpec {
            model,
            training,
            parallelism,
            fit_policy: FitPolicy::default(),
            template: None,
        }
    })
}

/// Specs without pipeline stages. With stages the estimator reports the
/// stage its `peak_of` ranks first, and that ranking leaves out temporaries
/// and the allocator's share, so a bigger batch can switch the reported
/// stage to one that needs less (see `pipeline_stage_switch_*` below).
fn single_stage_spec() -> impl Strategy<Value = TrainingJobSpec> {
    spec().prop_map(|mut spec| {
        let p = &mut spec.parallelism;
        p.gpus /= p.pipeline_parallel;
        p.pipeline_parallel = 1;
        p.virtual_stages = 1;
        spec
    })
}

fn gpu() -> impl Strategy<Value = &'static GpuProduct> {
    (0..GPUS.len()).prop_map(|i| &GPUS[i])
}

/// The three peak figures of `spec` on `gpu`, checking they are ordered.
fn peaks(spec: &TrainingJobSpec, gpu: &'static GpuProduct) -> Result<[u64; 3], TestCaseError> {
    let job = validate(spec).map_err(|e| {
        TestCaseError::fail(format!("a variant of an accepted spec is rejected: {e}"))
    })?;
    let est = estimate::estimate(&job, gpu)
        .map_err(|e| TestCaseError::fail(format!("{e} for {spec:?}")))?;
    let s = &est.status;
    prop_assert!(s.peak_allocated_bytes > 0, "nothing allocated: {spec:?}");
    prop_assert!(
        s.peak_allocated_bytes <= s.peak_reserved_bytes,
        "allocated {} > reserved {}",
        s.peak_allocated_bytes,
        s.peak_reserved_bytes
    );
    prop_assert!(
        s.peak_reserved_bytes <= s.per_gpu_bytes,
        "reserved {} > per GPU {}",
        s.peak_reserved_bytes,
        s.per_gpu_bytes
    );
    Ok([
        s.peak_allocated_bytes,
        s.peak_reserved_bytes,
        s.per_gpu_bytes,
    ])
}

const FIGURES: [&str; 3] = ["peakAllocatedBytes", "peakReservedBytes", "perGpuBytes"];

/// The first `figures` of `large` are at least those of `small`.
///
/// The properties compare peakAllocatedBytes only. Reserved (and so per-GPU)
/// bytes are the allocator's overhead *at the allocation peak* added to it,
/// but that overhead follows the churned bytes of the peak phase: when a bigger
/// batch moves the peak from the optimizer step (temporaries) to the forward
/// pass (activations), reserved drops, e.g. 482.4 → 480.3 GB for a 23.7B
/// custom model at microBatchSize 4 → 5. The caching allocator never gives
/// memory back within a step, so that is an estimator bug; the ignored
/// `*_never_shrinks_*` tests below hold the cases until it is fixed.
fn non_decreasing(
    what: &str,
    small: [u64; 3],
    large: [u64; 3],
    figures: usize,
    spec: &TrainingJobSpec,
) -> Result<(), TestCaseError> {
    for i in 0..figures {
        prop_assert!(
            small[i] <= large[i],
            "{} shrinks when {what}: {} → {} for {spec:?}",
            FIGURES[i],
            small[i],
            large[i]
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_global_rejects: 4096,
        ..ProptestConfig::default()
    })]

    #[test]
    fn accepted_specs_are_estimated_in_order(spec in spec(), gpu in gpu()) {
        prop_assume!(validate(&spec).is_ok());
        peaks(&spec, gpu)?;
    }

    #[test]
    fn more_micro_batch_never_needs_less(spec in single_stage_spec(), gpu in gpu()) {
        prop_assume!(validate(&spec).is_ok());
        let small = peaks(&spec, gpu)?;
        let mut bigger = spec.clone();
        bigger.training.micro_batch_size += 1;
        let large = peaks(&bigger, gpu)?;
        non_decreasing("microBatchSize grows by 1", small, large, 1, &spec)?;
    }

    #[test]
    fn longer_sequences_never_need_less(spec in single_stage_spec(), gpu in gpu()) {
        prop_assume!(validate(&spec).is_ok());
        let small = peaks(&spec, gpu)?;
        let mut longer = spec.clone();
        longer.training.sequence_length = Some(longer.training.seq_len() * 2);
        // A learned position table (a preset's or a transformer's own) bounds
        // the length; a doubled length past it is refused by validation, which
        // the validation tests cover, so only accepted variants are compared.
        prop_assume!(validate(&longer).is_ok());
        let large = peaks(&longer, gpu)?;
        non_decreasing("sequenceLength doubles", small, large, 1, &spec)?;
    }

    /// Dimensions anywhere in the validator's range: no panic, and an
    /// accepted spec gets an estimate or a clear "too large" error.
    #[test]
    fn extreme_dimensions_never_panic(
        layers in 1u64..=(1 << 24),
        heads in 1u64..=(1 << 24),
        head_dim in 1u64..=(1 << 24),
        inter in 1u64..=(1 << 24),
        vocab in 1u64..=(1 << 24),
        mb in 1u64..=(1 << 24),
        seq in 1u64..=(1 << 26),
        training in training(),
        gpu in gpu(),
    ) {
        let spec = TrainingJobSpec {
            model: ModelSpec {
                transformer: Some(TransformerSpec {
                    layers,
                    hidden_size: heads,
                    attention_heads: heads,
                    head_dim: Some(head_dim),
                    intermediate_size: Some(inter),
                    vocab_size: vocab,
                    ..TransformerSpec::default()
                }),
                ..ModelSpec::default()
            },
            training: TrainingSpec { micro_batch_size: mb, sequence_length: Some(seq), ..training },
            ..TrainingJobSpec::default()
        };
        if let Ok(job) = validate(&spec)
            && let Ok(est) = estimate::estimate(&job, gpu) {
                let s = &est.status;
                prop_assert!(s.peak_allocated_bytes <= s.peak_reserved_bytes);
                prop_assert!(s.peak_reserved_bytes <= s.per_gpu_bytes);
            }
    }
}

/// The generator must produce accepted specs of every model source, or the
/// properties above would hold vacuously.
#[test]
fn the_generator_mostly_produces_accepted_specs() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = spec();
    let (mut accepted, mut presets, mut transformers, mut customs) = (0, 0, 0, 0);
    for _ in 0..400 {
        let spec = strategy
            .new_tree(&mut runner)
            .expect("the strategy generates")
            .current();
        if validate(&spec).is_ok() {
            accepted += 1;
            presets += usize::from(spec.model.preset.is_some());
            transformers += usize::from(spec.model.transformer.is_some());
            customs += usize::from(spec.model.custom.is_some());
        }
    }
    assert!(
        accepted >= 100,
        "only {accepted} of 400 generated specs validate"
    );
    assert!(
        presets > 0 && transformers > 0 && customs > 0,
        "{presets} {transformers} {customs}"
    );
}

/// Regression cases found by the properties with pipeline parallelism: the
/// reported stage changes with the batch and the estimate shrinks. Ignored
/// until the estimator picks the stage by its full per-GPU bytes.
fn pipeline_case(
    preset: &str,
    training: TrainingSpec,
    parallelism: ParallelismSpec,
) -> TrainingJobSpec {
    TrainingJobSpec {
        model: ModelSpec {
            preset: Some(preset.to_string()),
            ..ModelSpec::default()
        },
        training,
        parallelism,
        ..TrainingJobSpec::default()
    }
}

#[test]

fn pipeline_stage_switch_never_shrinks_the_estimate() {
    let h100 = vramguard::estimate::gpus::find("h100-80gb").expect("in the catalog");
    let lora = pipeline_case(
        "stablelm-3b",
        TrainingSpec {
            mode: TrainingMode::Lora,
            lora: Some(LoraSpec {
                rank: 1,
                target_modules: vec!["down_proj".to_string()],
                ..LoraSpec::default()
            }),
            quantization: Some(Quantization::Nf4Double),
            micro_batch_size: 40,
            sequence_length: Some(10),
            precision: Precision::Fp32,
            gradient_checkpointing: Checkpointing::Selective,
            activation_offloading: true,
            attention: Attention::Eager,
            loss: Loss::Chunked,
            ..TrainingSpec::default()
        },
        ParallelismSpec {
            gpus: 4,
            pipeline_parallel: 4,
            pipeline_schedule: PipelineSchedule::Interleaved1f1b,
            virtual_stages: 2,
            ..ParallelismSpec::default()
        },
    );
    let mut bigger = lora.clone();
    bigger.training.micro_batch_size += 1;
    let full = pipeline_case(
        "gemma-2b",
        TrainingSpec {
            sequence_length: Some(220),
            precision: Precision::Fp16Mixed,
            gradient_checkpointing: Checkpointing::Selective,
            activation_offloading: true,
            attention: Attention::Eager,
            ..TrainingSpec::default()
        },
        ParallelismSpec {
            gpus: 8,
            strategy: api::Strategy::Fsdp,
            pipeline_parallel: 4,
            pipeline_schedule: PipelineSchedule::Gpipe,
            ..ParallelismSpec::default()
        },
    );
    let mut longer = full.clone();
    longer.training.sequence_length = Some(longer.training.seq_len() * 2);
    for (small, large) in [(lora, bigger), (full, longer)] {
        let (a, b) = (peaks(&small, h100), peaks(&large, h100));
        let (Ok(a), Ok(b)) = (a, b) else {
            panic!("not estimated: {small:?}");
        };
        non_decreasing("the batch grows", a, b, 3, &small).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]

fn reserved_bytes_never_shrink_when_the_peak_phase_moves() {
    let h100 = vramguard::estimate::gpus::find("h100-80gb").expect("in the catalog");
    let spec = TrainingJobSpec {
        model: ModelSpec {
            custom: Some(CustomModel {
                parameters: 23_663_279_051.0,
                activation_bytes_per_sample: 9_789_878_143.0,
            }),
            ..ModelSpec::default()
        },
        training: TrainingSpec {
            micro_batch_size: 4,
            sequence_length: Some(1),
            precision: Precision::Fp16Mixed,
            ..TrainingSpec::default()
        },
        ..TrainingJobSpec::default()
    };
    let mut bigger = spec.clone();
    bigger.training.micro_batch_size += 1;
    let (Ok(a), Ok(b)) = (peaks(&spec, h100), peaks(&bigger, h100)) else {
        panic!("not estimated: {spec:?}");
    };
    non_decreasing("microBatchSize grows by 1", a, b, 3, &spec).unwrap_or_else(|e| panic!("{e}"));
}

#[test]

fn the_largest_tensor_is_part_of_the_allocated_bytes() {
    let h100 = vramguard::estimate::gpus::find("h100-80gb").expect("in the catalog");
    let spec = TrainingJobSpec {
        model: ModelSpec {
            preset: Some("gpt2".to_string()),
            ..ModelSpec::default()
        },
        training: TrainingSpec {
            mode: TrainingMode::Inference,
            sequence_length: Some(1),
            precision: Precision::Fp32,
            ..TrainingSpec::default()
        },
        parallelism: ParallelismSpec {
            zero_stage: Some(3),
            offload: Offload::OptimizerAndParameters,
            ..ParallelismSpec::default()
        },
        ..TrainingJobSpec::default()
    };
    let job = validate(&spec).expect("valid");
    let s = estimate::estimate(&job, h100).expect("estimated").status;
    // The 50257 × 768 fp32 embedding (154 MB) is gathered onto the GPU, yet
    // peakAllocatedBytes says 34 MB.
    assert!(
        s.largest_tensor_bytes <= s.peak_allocated_bytes,
        "largest tensor {} > allocated {}",
        s.largest_tensor_bytes,
        s.peak_allocated_bytes
    );
}

/// Any subset of the fields the planner may change, in Adjust mode, with a
/// margin anywhere in its range.
fn fit_policy() -> impl Strategy<Value = FitPolicy> {
    let fields = vec![
        AdjustableField::MicroBatchSize,
        AdjustableField::Precision,
        AdjustableField::GradientCheckpointing,
        AdjustableField::Optimizer,
        AdjustableField::ZeroStage,
        AdjustableField::Loss,
    ];
    (
        prop::sample::subsequence(fields.clone(), 0..=fields.len()),
        0.0f64..0.5,
    )
        .prop_map(|(allow, safety_margin)| FitPolicy {
            mode: FitMode::Adjust,
            allow,
            safety_margin,
            ..FitPolicy::default()
        })
}

/// A GPU of the catalog as a placement would see it: part of it taken, its
/// free memory in pieces.
fn gpu_view() -> impl Strategy<Value = (&'static GpuProduct, GpuView)> {
    (gpu(), 0.05f64..=1.0, 0.05f64..=1.0).prop_map(|(gpu, free, block)| {
        let total = gpu.usable_bytes();
        let free_bytes = (total as f64 * free) as u64;
        let view = GpuView {
            total_bytes: total,
            free_bytes,
            largest_block_bytes: (free_bytes as f64 * block) as u64,
        };
        (gpu, view)
    })
}

/// The example cluster as the webhook's static inventory sees it.
fn example_snapshot() -> (Snapshot, Timestamp) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/cluster.yaml"
    ))
    .expect("the example cluster reads");
    let nodes: Vec<_> = api::parse::documents(&text)
        .expect("YAML")
        .into_iter()
        .map(|d| api::parse::gpu_node(d).expect("a GpuNode"))
        .collect();
    let now = nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.probe_time.as_ref().map(|t| t.0))
        .max()
        .expect("the example cluster has probe times");
    (Static::new(nodes, now.as_second()).snapshot(), now)
}

/// The example cluster with each GPU's free memory cut to a share of its
/// total (`shares` taken in turn): a cluster partly busy.
fn busy_snapshot(shares: &[f64]) -> (Snapshot, Timestamp) {
    let (snapshot, now) = example_snapshot();
    let mut nodes = snapshot.nodes.to_vec();
    let mut turn = shares.iter().cycle();
    for n in &mut nodes {
        for g in n.status.iter_mut().flat_map(|s| s.gpus.iter_mut()) {
            let share = turn.next().copied().unwrap_or(1.0);
            let free = (g.total_bytes as f64 * share) as u64;
            g.free_bytes = free.min(g.free_bytes);
            g.used_bytes = g.total_bytes - g.free_bytes;
            g.largest_free_block_bytes = g.largest_free_block_bytes.map(|b| b.min(g.free_bytes));
        }
    }
    (Static::new(nodes, now.as_second()).snapshot(), now)
}

/// A CREATE review of a TrainingJob named `name` with `spec`, as the API
/// server sends it.
fn review_of(name: &str, spec: &TrainingJobSpec) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7b0ac6b0-0000-4000-8000-000000000000",
            "kind": {"group": "vramguard.io", "version": "v1alpha1", "kind": "TrainingJob"},
            "resource": {"group": "vramguard.io", "version": "v1alpha1", "resource": "trainingjobs"},
            "name": name,
            "namespace": "team-a",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "vramguard.io/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": spec,
            },
        },
    }))
    .expect("a review serialises")
}

/// Names and presets a user may write, long and not ASCII included.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{1,63}",
        "\\PC{0,400}",
        (1usize..5000).prop_map(|n| "é".repeat(n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        max_global_rejects: 4096,
        ..ProptestConfig::default()
    })]

    /// A plan the shrink search returns fits the GPU it was searched for when
    /// its settings are applied and the job is estimated again, and keeps the
    /// effective batch.
    #[test]
    fn a_plan_the_search_returns_fits_when_re_estimated(
        spec in spec(),
        policy in fit_policy(),
        (gpu, view) in gpu_view(),
    ) {
        let spec = TrainingJobSpec { fit_policy: policy, ..spec };
        let Ok(job) = validate(&spec) else { return Ok(()) };
        let Ok(shrink) = plan::shrink(&job, gpu, view) else { return Ok(()) };
        if let Some(p) = shrink.plan {
            let applied = p.apply(&job)
                .map_err(|e| TestCaseError::fail(format!("the job does not take its plan: {e}")))?;
            let est = estimate::estimate(&applied, gpu)
                .map_err(|e| TestCaseError::fail(format!("the plan cannot be estimated: {e}")))?;
            let verdict = plan::fit_estimate(&est, spec.fit_policy.safety_margin, view);
            prop_assert!(verdict.fits, "{:?} does not fit {view:?}: {verdict:?}", p.settings);
            prop_assert_eq!(est.status.per_gpu_bytes, p.estimate.per_gpu_bytes);
            prop_assert_eq!(effective_batch(&applied), effective_batch(&job));
            prop_assert!(p.settings.micro_batch_size >= spec.fit_policy.min_micro_batch_size);
        }
    }

    /// Whatever the spec, the name or the preset, the webhook's answer stays
    /// within what Kubernetes carries: a denial's message within 1024 bytes
    /// (what `kubectl` shows and an Event note holds), each warning within
    /// 120 characters and all of them within the API server's 4096.
    #[test]
    fn any_decision_stays_under_the_size_limits(
        spec in spec(),
        name in hostile_text(),
        preset in prop::option::of(hostile_text()),
        policy in fit_policy(),
    ) {
        let mut spec = TrainingJobSpec { fit_policy: policy, ..spec };
        if let Some(p) = preset {
            spec.model = ModelSpec { preset: Some(p), ..ModelSpec::default() };
        }
        let body = review_of(&name, &spec);
        let review: Review<'_, Object> = serde_json::from_slice(&body).expect("the review reads");
        let (snapshot, now) = example_snapshot();
        let request = review.request.expect("a request");
        let d = decide::review(request, &snapshot, now);
        prop_assert!(d.status.message.len() <= decide::MAX_MESSAGE, "{}", d.status.message.len());
        prop_assert!(d.allowed || !d.status.message.is_empty());
        let total: usize = d.warnings.iter().map(String::len).sum();
        prop_assert!(d.warnings.iter().all(|w| w.len() <= decide::MAX_WARNING));
        prop_assert!(total <= 4096, "{total} bytes of warnings");
    }

    /// One decision for both doors: on the same inventory (partly busy), what
    /// the webhook tells a user at `kubectl apply` is what the operator then
    /// does with no other job in the way: a job it runs as written gets no
    /// warning, one it runs shrunk gets "vramguard will run this on <the
    /// product it places on> with <the plan's changes>", one it keeps waiting
    /// gets "cluster busy now", and one it rejects is denied by the webhook
    /// (or admitted with "no node can take it now" when empty GPUs would
    /// take it).
    #[test]
    fn the_webhook_promises_what_the_operator_does(
        spec in spec(),
        policy in fit_policy(),
        shares in prop::collection::vec(prop::sample::select(vec![0.02, 0.1, 0.3, 0.6, 1.0]), 1..6),
    ) {
        let spec = TrainingJobSpec { fit_policy: policy, ..spec };
        let Ok(job) = validate(&spec) else { return Ok(()) };
        let (snapshot, now) = busy_snapshot(&shares);
        let body = review_of("j", &spec);
        let review: Review<'_, Object> = serde_json::from_slice(&body).expect("the review reads");
        let d = decide::review(review.request.expect("a request"), &snapshot, now);
        let scale = snapshot.learnt_scale(&spec);
        let operator = vramguard::operator::admit::decide(
            &job,
            &snapshot,
            &plan::ReservationIndex::new(),
            &[],
            now,
            scale,
        );
        let Ok(operator) = operator else { return Ok(()) };
        let said = d.warnings.join(" | ");
        match operator {
            Decision::Admit(a) if a.plan.changes.is_empty() => {
                prop_assert!(d.allowed, "the operator runs it as written; the webhook denied: {}", d.status.message);
                prop_assert!(d.warnings.is_empty(), "runs as written now, yet warned: {said}");
            }
            Decision::Admit(a) => {
                let product = &a.placement.devices[0].gpus[0].product;
                let promise = decide::ascii(format!(
                    "vramguard will run this on {product} with {}",
                    a.plan.changes.join(", ")
                ));
                prop_assert!(d.allowed, "the operator runs it shrunk; the webhook denied: {}", d.status.message);
                prop_assert!(
                    d.warnings.join(" ").contains(&promise),
                    "the operator runs {promise:?}; the webhook said {said}"
                );
            }
            Decision::Wait(_) => {
                prop_assert!(d.allowed, "the operator waits; the webhook denied: {}", d.status.message);
                prop_assert!(said.contains("cluster busy now"), "the operator waits; the webhook said {said}");
            }
            Decision::Reject(r) => {
                prop_assert!(
                    !d.allowed || said.contains("no node can take it now"),
                    "the operator rejects ({r}); the webhook allowed it saying {said:?}"
                );
            }
        }
    }
}
