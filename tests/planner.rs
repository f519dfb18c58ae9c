//! The planner end to end: the cheapest change that fits (shrink) for the jobs
//! a user tries first, and properties over generated jobs and clusters: every
//! plan fits by the estimator's own numbers, changes only allowed fields and
//! keeps the effective batch; Reject mode never changes the spec; placement
//! never puts a rank on a GPU it does not fit.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use vramguard::api::{
    self, AdjustableField, FitMode, GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus, NodeTaint,
    TrainingJobSpec, ValidatedJob,
};
use vramguard::estimate::{self, GpuProduct, gpus};
use vramguard::plan::{
    self, Allowance, GpuView, Need, PlaceOutcome, Request, Reservation, Settings, effective_batch,
    place_with, shrink,
};

const GIB: u64 = 1 << 30;

fn job(yaml: &str) -> ValidatedJob {
    let spec: TrainingJobSpec = serde_saphyr::from_str(yaml).expect("test YAML parses");
    api::validate(&spec).expect("test spec is valid")
}

fn gpu(name: &str) -> &'static GpuProduct {
    gpus::find(name).expect("catalog GPU")
}

fn empty(g: &GpuProduct) -> GpuView {
    GpuView::empty(g.usable_bytes())
}

/// Re-estimates the plan's job and checks it fits `view` with the job's margin.
fn fits_by_the_estimator(
    job: &ValidatedJob,
    plan: &plan::Plan,
    g: &'static GpuProduct,
    view: GpuView,
) {
    let applied = plan.apply(job).expect("the job takes a returned plan");
    let e = estimate::estimate(&applied, g).expect("a returned plan can be estimated");
    assert_eq!(e.status, plan.estimate, "the plan carries its own estimate");
    let v = plan::fit(
        e.status.per_gpu_bytes,
        e.status.largest_tensor_bytes,
        job.spec().fit_policy.safety_margin,
        view,
    );
    assert!(v.fits, "plan {:?} does not fit: {v:?}", plan.changes);
    assert_eq!(effective_batch(&applied), effective_batch(job));
}

const FULL_8B_A100: &str = "
model: {preset: llama-3.1-8b}
training: {mode: full, microBatchSize: 8, sequenceLength: 4096, precision: bf16-mixed,
           optimizer: adamw, attention: flash}
fitPolicy:
  mode: Adjust
  allow: [microBatchSize, gradientCheckpointing, precision, optimizer, zeroStage, loss]
";

#[test]
fn llama_8b_full_fine_tune_on_one_a100_80gb() {
    let j = job(FULL_8B_A100);
    let g = gpu("a100-80gb");
    let s = shrink(&j, g, empty(g)).expect("estimates");
    println!("{}", serde_json::to_string_pretty(&s).expect("serializes"));
    assert!(!s.as_written.fits);
    match &s.plan {
        Some(p) => {
            // If it fits at all, it needs an 8-bit optimizer or checkpointing.
            let f = p.changed_fields();
            assert!(
                f.contains(&AdjustableField::Optimizer)
                    || f.contains(&AdjustableField::GradientCheckpointing),
                "{:?}",
                p.changes
            );
            fits_by_the_estimator(&j, p, g, empty(g));
        }
        None => {
            // Weights, fp32 gradients and Adam states of 8B parameters alone exceed 80 GB on
            // one GPU with no data-parallel ranks to shard over: say so, and what would fit.
            let a = s.advice.as_ref().expect("advice when nothing fits");
            assert!(a.plan_if_allowed.is_none());
            assert!(!a.gpus.is_empty(), "{}", a.message);
            assert!(!a.gpus.contains(&"a100-80gb"));
            assert!(a.gpus.contains(&"h200"), "{:?}", a.gpus);
            assert!(a.message.contains("needs a GPU with ≥"), "{}", a.message);
        }
    }
}

#[test]
fn llama_8b_full_fine_tune_over_8_a100_80gb_shards() {
    // The same job on 8 data-parallel ranks: sharding makes it fit.
    let j = job(&format!("{FULL_8B_A100}parallelism: {{gpus: 8}}\n"));
    let g = gpu("a100-80gb");
    let s = shrink(&j, g, empty(g)).expect("estimates");
    let p = s.plan.as_ref().expect("fits with sharding");
    println!("{}", p.summary());
    assert!(p.settings.zero_stage >= 1, "{:?}", p.changes);
    fits_by_the_estimator(&j, p, g, empty(g));
}

const LORA_70B: &str = "
model: {preset: llama-3-70b}
training: {mode: lora, lora: {rank: 16, targetModules: [q_proj, k_proj, v_proj, o_proj]},
           microBatchSize: 4, globalBatchSize: 64, sequenceLength: 4096, precision: bf16,
           attention: flash, batching: packed,
           runtime: {pytorch: '2.4.0', cuda: '12.4', transformers: '4.50.0'}}
fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing, zeroStage]}
";

#[test]
fn llama_70b_lora_on_8_a100_40gb() {
    // DeepSpeed: 70B bf16 weights are 140 GB, replicated they cannot fit a 40 GB card; ZeRO-3
    // shards them (17.5 GB per rank) and a smaller micro-batch or checkpointing makes room for
    // the activations and the 128k-vocabulary logits.
    // At the upper end of its range the 128k-vocabulary logits need the chunked loss too.
    // At 4096 tokens even micro-batch 1 with all of these is 0.3 GiB past 40 GB at the upper
    // end (NCCL's measured fixed cost and Hopper-measured context), so 2048-token samples.
    let j = job(&format!(
        "{}parallelism: {{gpus: 8, strategy: deepspeed}}\n",
        LORA_70B
            .replace("zeroStage]", "zeroStage, loss]")
            .replace("sequenceLength: 4096", "sequenceLength: 2048")
    ));
    let g = gpu("a100-40gb");
    let s = shrink(&j, g, empty(g)).expect("estimates");
    println!("{}", serde_json::to_string_pretty(&s).expect("serializes"));
    assert!(!s.as_written.fits);
    let p = s.plan.as_ref().expect("fits once sharded");
    println!("{}", p.summary());
    assert_eq!(p.settings.zero_stage, 3, "{:?}", p.changes);
    fits_by_the_estimator(&j, p, g, empty(g));
    let status = p.to_status();
    assert_eq!(
        status.gradient_accumulation_steps * status.micro_batch_size * 8,
        64
    );

    // FSDP keeps frozen base weights unsharded once backward has gathered them (LoRA freezes
    // all of them), so sharding does not help: the planner says it cannot fit and why.
    let j = job(&format!(
        "{LORA_70B}parallelism: {{gpus: 8, strategy: fsdp}}\n"
    ));
    let s = shrink(&j, g, empty(g)).expect("estimates");
    let a = s.advice.as_ref().expect("does not fit");
    println!("{}", a.message);
    assert!(a.plan_if_allowed.is_none());
    assert!(
        a.message.contains("does not fit a100-40gb"),
        "{}",
        a.message
    );
}

#[test]
fn a_job_that_fits_only_with_zero_3() {
    // Llama-3.1-8B full fine-tune over 8 A100 40GB: replicated weights (fp32 under autocast,
    // 32 GB) leave no room; only sharding the parameters too fits.
    let j = job("
model: {preset: llama-3.1-8b}
training: {mode: full, microBatchSize: 1, globalBatchSize: 8, sequenceLength: 2048,
           precision: bf16-mixed, gradientCheckpointing: full, attention: flash}
parallelism: {gpus: 8, strategy: fsdp, zeroStage: 0}
fitPolicy: {mode: Adjust, allow: [zeroStage]}
");
    let g = gpu("a100-40gb");
    let s = shrink(&j, g, empty(g)).expect("estimates");
    let p = s.plan.as_ref().expect("fits with ZeRO-3");
    println!("{}", p.summary());
    assert_eq!(p.changes, vec!["zeroStage: 0 → 3"]);
    fits_by_the_estimator(&j, p, g, empty(g));
    for stage in 0..3 {
        let k = j
            .with_settings(&vramguard::plan::Settings {
                zero_stage: stage,
                ..vramguard::plan::Settings::of(&j)
            })
            .expect("a ZeRO stage the job takes");
        let e = estimate::estimate(&k, g).expect("estimates");
        let v = plan::fit(
            e.status.per_gpu_bytes,
            e.status.largest_tensor_bytes,
            0.05,
            empty(g),
        );
        assert!(!v.fits, "ZeRO-{stage} fits too");
    }

    // The same job under Reject: no plan, and advice that names the policy change.
    let r = j.with_fit_mode(FitMode::Reject);
    let s = shrink(&r, g, empty(g)).expect("estimates");
    assert!(s.plan.is_none());
    let a = s.advice.expect("advice");
    println!("{}", a.message);
    assert!(
        a.policy_changes
            .iter()
            .any(|c| c.starts_with("allow zeroStage (3 over 8")),
        "{:?}",
        a.policy_changes
    );
}

#[test]
fn not_allowed_says_what_to_allow() {
    // Only microBatchSize allowed, already at 1: ZeRO would fit.
    let j = job("
model: {preset: llama-3.1-8b}
training: {mode: full, microBatchSize: 1, globalBatchSize: 8, sequenceLength: 2048,
           precision: bf16-mixed, gradientCheckpointing: full, attention: flash}
parallelism: {gpus: 8, strategy: fsdp, zeroStage: 0}
fitPolicy: {mode: Adjust, allow: [microBatchSize]}
");
    let g = gpu("a100-40gb");
    let s = shrink(&j, g, empty(g)).expect("estimates");
    let a = s.advice.expect("advice");
    println!("{}", a.message);
    assert!(
        a.policy_changes
            .iter()
            .any(|c| c.starts_with("allow zeroStage"))
    );
    assert!(a.message.contains("no change in allow [microBatchSize]"));
}

// ---- properties ----

fn generated_job() -> impl Strategy<Value = TrainingJobSpec> {
    let presets = prop::sample::select(vec![
        "gpt2",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "llama-3.1-8b",
        "mistral-7b",
        "qwen2.5-7b",
    ]);
    let mode = prop::sample::select(vec!["full", "lora", "qlora"]);
    let precision = prop::sample::select(vec!["fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16"]);
    let optimizer = prop::sample::select(vec!["adamw", "adam", "sgd", "paged-adamw", "adamw-8bit"]);
    let ckpt = prop::sample::select(vec!["none", "selective", "full"]);
    let micro = prop::sample::select(vec![1u64, 2, 3, 4, 6, 8, 12, 16]);
    let accum = 1u64..=4;
    let seq = prop::sample::select(vec![512u64, 1024, 2048, 4096, 8192]);
    let gpus = prop::sample::select(vec![1u64, 2, 4, 8]);
    let zero = 0u8..=3;
    let global = any::<bool>();
    let adjust = prop::bool::weighted(0.8);
    let allow = prop::sample::subsequence(
        vec![
            "microBatchSize",
            "precision",
            "gradientCheckpointing",
            "optimizer",
            "zeroStage",
            "loss",
        ],
        0..=6,
    );
    let min_micro = 1u64..=4;
    (
        (presets, mode, precision, optimizer, ckpt),
        (micro, accum, seq, gpus, zero, global),
        (adjust, allow, min_micro),
    )
        .prop_map(
            |(
                (preset, mode, precision, optimizer, ckpt),
                (micro, accum, seq, gpus, zero, global),
                (adjust, allow, min_micro),
            )| {
                let global = if global {
                    format!("globalBatchSize: {},", micro * accum * gpus)
                } else {
                    String::new()
                };
                let yaml = format!(
                    "
model: {{preset: {preset}}}
training: {{mode: {mode}, microBatchSize: {micro}, {global} sequenceLength: {seq},
           precision: {precision}, optimizer: {optimizer}, gradientCheckpointing: {ckpt}}}
parallelism: {{gpus: {gpus}, zeroStage: {zero}, strategy: fsdp}}
fitPolicy: {{mode: {}, allow: [{}], minMicroBatchSize: {}}}
",
                    if adjust { "Adjust" } else { "Reject" },
                    allow.join(", "),
                    min_micro.min(micro)
                );
                serde_saphyr::from_str(&yaml).expect("generated YAML parses")
            },
        )
}

fn generated_gpu() -> impl Strategy<Value = (&'static GpuProduct, u64)> {
    let cards: Vec<&'static GpuProduct> = gpus::GPUS.iter().collect();
    (prop::sample::select(cards), 0u64..=60).prop_map(|(g, used_pct)| {
        // A GPU with part of its memory already used by someone else.
        (g, g.usable_bytes() / 100 * (100 - used_pct))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_fits_keeps_the_batch_and_respects_the_policy(
        spec in generated_job(),
        (g, free) in generated_gpu(),
    ) {
        let Ok(j) = api::validate(&spec) else { return Ok(()) };
        let view = GpuView { total_bytes: g.total_bytes, free_bytes: free, largest_block_bytes: free };
        let Ok(s) = shrink(&j, g, view) else { return Ok(()) };
        prop_assert_eq!(s.plan.is_none(), s.advice.is_some());
        let allowed = Allowance::from_policy(&j.spec().fit_policy);
        if let Some(p) = &s.plan {
            fits_by_the_estimator(&j, p, g, view);
            prop_assert!(p.slowdown >= 1.0);
            for f in p.changed_fields() {
                prop_assert!(allowed.allows(f), "{:?} changed, allow {:?}", f, j.spec().fit_policy.allow);
            }
            prop_assert!(p.settings.micro_batch_size >= j.spec().fit_policy.min_micro_batch_size);
            prop_assert!(p.settings.micro_batch_size <= j.spec().training.micro_batch_size);
            if j.spec().fit_policy.mode == FitMode::Reject || s.as_written.fits {
                // Never changed: the plan is the spec as written.
                prop_assert!(p.changes.is_empty());
                prop_assert_eq!(p.settings, Settings::of(&j));
            }
        }
        if let Some(a) = &s.advice {
            prop_assert!(!s.as_written.fits);
            if let Some(p) = &a.plan_if_allowed {
                fits_by_the_estimator(&j, p, g, view);
                prop_assert!(!a.policy_changes.is_empty());
            }
        }
    }
}

// ---- placement ----

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("valid time")
}

fn generated_node(i: usize) -> impl Strategy<Value = GpuNode> {
    let gpu = (
        prop::sample::select(vec![
            ("NVIDIA H100 80GB HBM3", 80u64),
            ("NVIDIA A100-SXM4-40GB", 40),
            ("NVIDIA L4", 22),
        ]),
        0u64..=100,
        0u64..=100,
        any::<bool>(),
        prop::bool::weighted(0.9),
    );
    (
        prop::collection::vec(gpu, 1..=8),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
    )
        .prop_map(move |(gpus, stale, tainted)| {
            let name = format!("node-{i:02}");
            let gpus: Vec<GpuStatus> = gpus
                .into_iter()
                .enumerate()
                .map(
                    |(k, ((product, total_gib), free_pct, block_pct, has_block, healthy))| {
                        let total = total_gib * GIB;
                        let free = total / 100 * free_pct;
                        GpuStatus {
                            index: u32::try_from(k).expect("few GPUs"),
                            product: product.into(),
                            total_bytes: total,
                            free_bytes: free,
                            largest_free_block_bytes: has_block.then_some(free / 100 * block_pct),
                            healthy,
                            ..GpuStatus::default()
                        }
                    },
                )
                .collect();
            let probe = if stale {
                1_800_000_000 - 1000
            } else {
                1_800_000_000 - 10
            };
            let mut n = GpuNode::new(
                &name,
                GpuNodeSpec {
                    node_name: name.clone(),
                    ttl_seconds: 120,
                    taints: if tainted {
                        vec![NodeTaint {
                            key: "dedicated".into(),
                            value: None,
                            effect: "NoSchedule".into(),
                        }]
                    } else {
                        Vec::new()
                    },
                },
            );
            n.status = Some(GpuNodeStatus {
                gpu_count: u32::try_from(gpus.len()).expect("few GPUs"),
                gpus,
                probe_time: Some(Time(Timestamp::from_second(probe).expect("valid time"))),
                ..GpuNodeStatus::default()
            });
            n
        })
}

fn generated_cluster() -> impl Strategy<Value = Vec<GpuNode>> {
    (1usize..=12).prop_flat_map(|n| (0..n).map(generated_node).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn placement_never_puts_a_rank_where_it_does_not_fit(
        nodes in generated_cluster(),
        need_gib in 1u64..=70,
        tensor_gib in 0u64..=8,
        (ranks, per_node) in prop::sample::select(vec![(1u64, 1u64), (2, 2), (4, 4), (8, 8), (4, 2), (8, 4), (16, 8)]),
        reserved in prop::collection::vec((0usize..12, 0u32..8, 0u64..=30), 0..6),
    ) {
        let reservations: Vec<Reservation> = reserved
            .iter()
            .map(|(n, g, b)| Reservation { node: format!("node-{n:02}"), gpu_index: *g, mig_index: None, bytes: b * GIB })
            .collect();
        let margin = 0.05;
        let request = Request { gpus: ranks, gpus_per_node: per_node, safety_margin: margin, tolerations: &[], now: now() };
        let need = Need { per_gpu_bytes: need_gib * GIB, largest_tensor_bytes: tensor_gib * GIB, allocator: None };
        let out = place_with(&request, &nodes, &reservations, &mut |_| Some(need));
        if let PlaceOutcome::Placed(a) = &out {
            prop_assert_eq!(a.nodes.len() as u64, ranks.div_ceil(per_node));
            let mut seen = std::collections::HashSet::new();
            for na in &a.nodes {
                prop_assert!(seen.insert(na.node.clone()), "node used twice");
                prop_assert_eq!(na.gpus.len() as u64, ranks.min(per_node));
                let node = nodes.iter().find(|n| n.spec.node_name == na.node).expect("a known node");
                prop_assert!(node.spec.taints.is_empty());
                let status = node.status.as_ref().expect("status");
                let probe = status.probe_time.as_ref().expect("probed");
                prop_assert!(now().as_second() - probe.0.as_second() <= 120);
                let mut idx = std::collections::HashSet::new();
                for d in &na.gpus {
                    prop_assert!(idx.insert(d.index), "GPU used twice");
                    let g = status.gpus.iter().find(|g| g.index == d.index).expect("a known GPU");
                    prop_assert!(g.healthy);
                    let held: u64 = reservations
                        .iter()
                        .filter(|r| r.node == na.node && r.gpu_index == d.index)
                        .map(|r| r.bytes)
                        .sum();
                    let free = g.free_bytes.saturating_sub(held);
                    let block = g.largest_free_block_bytes.unwrap_or(free).min(free);
                    prop_assert!(plan::with_margin(need.per_gpu_bytes, margin) <= free);
                    prop_assert!(need.largest_tensor_bytes <= block);
                }
            }
        }
    }
}

fn example_cluster() -> Vec<GpuNode> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/cluster.yaml"
    ))
    .expect("examples/cluster.yaml is readable");
    api::parse::documents(&text)
        .expect("YAML")
        .into_iter()
        .map(|d| api::parse::gpu_node(d).expect("a GpuNode"))
        .collect()
}

fn newest_probe(nodes: &[GpuNode]) -> Timestamp {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.probe_time.as_ref().map(|t| t.0))
        .max()
        .expect("probed nodes")
}

#[test]
fn example_cluster_places_jobs() {
    let nodes = example_cluster();
    assert_eq!(nodes.len(), 4);
    let now = newest_probe(&nodes);

    // A small LoRA job (~12 GiB at the point, above 20 GiB at the upper end with its runtime
    // unknown: the logits copies of a 128k vocabulary and the eager CUDA context): best fit is
    // the smallest slot that holds the upper end, the 3g.40gb MIG slice, not an empty 40 or
    // 80 GB card.
    let small = job("
model: {preset: llama-3.2-1b}
training: {mode: lora, microBatchSize: 4, sequenceLength: 2048, precision: bf16,
           gradientCheckpointing: full, attention: flash}
");
    let out = plan::place(&small, &nodes, &[], &[], now).expect("estimates");
    println!(
        "{}",
        serde_json::to_string_pretty(&out).expect("serializes")
    );
    let a = out.assignment().expect("placed");
    assert_eq!(a.nodes[0].node, "gpu-a100-mig");
    assert_eq!(a.nodes[0].gpus[0].mig_profile.as_deref(), Some("3g.40gb"));

    // 8 ranks: only the idle H100 node has 8 GPUs free (the other is tainted).
    let eight = job("
model: {preset: llama-3.1-8b}
training: {mode: full, microBatchSize: 1, globalBatchSize: 64, sequenceLength: 4096,
           precision: bf16-mixed, gradientCheckpointing: full, attention: flash}
parallelism: {gpus: 8, zeroStage: 3, strategy: fsdp}
");
    let out = plan::place(&eight, &nodes, &[], &[], now).expect("estimates");
    let a = out.assignment().expect("placed");
    assert_eq!(a.to_status().node, "gpu-h100-a");
    assert_eq!(a.to_status().gpus, (0..8).collect::<Vec<u32>>());

    // 4 ranks of ~25 GiB: the A100 40GB node has only 3 GPUs with room (GPU 2 is busy), so the
    // job goes to the H100s; with the H100 node held by admitted jobs it waits for GPU 2.
    let four = job("
model: {preset: llama-3.2-3b}
training: {mode: full, microBatchSize: 1, globalBatchSize: 16, sequenceLength: 4096,
           precision: bf16-mixed, gradientCheckpointing: full, attention: flash}
parallelism: {gpus: 4, zeroStage: 3, strategy: fsdp}
");
    let out = plan::place(&four, &nodes, &[], &[], now).expect("estimates");
    let a = out.assignment().expect("placed");
    assert_eq!(a.to_status().node, "gpu-h100-a");
    let held: Vec<Reservation> = (0..8)
        .map(|g| Reservation {
            node: "gpu-h100-a".into(),
            gpu_index: g,
            mig_index: None,
            bytes: 70 * GIB,
        })
        .collect();
    match plan::place(&four, &nodes, &held, &[], now).expect("estimates") {
        PlaceOutcome::Wait { reason } => {
            println!("{reason}");
            assert!(
                reason.contains("the best, gpu-a100-b, has room on 3 of the 4 GPUs a node needs"),
                "{reason}"
            );
            assert!(reason.contains("it fits gpu-a100-b once"), "{reason}");
            assert!(
                reason.contains("tainted (gpu-h100-infer: dedicated=inference:NoSchedule)"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Tolerating the taint: the inference node's two idle GPUs are not enough for 4 ranks.
    let tolerate = ["dedicated".to_string()];
    let out = plan::place(&four, &nodes, &held, &tolerate, now).expect("estimates");
    assert!(matches!(out, PlaceOutcome::Wait { .. }), "{out:?}");
}

// ---- the command line ----

fn vramguard(args: &[&str]) -> (i32, serde_json::Value) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramguard"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs");
    let code = out.status.code().expect("the binary exits");
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    (code, json)
}

#[test]
fn estimate_prints_the_plan_and_the_placement() {
    // Does not fit an A100 40GB as written; microBatchSize is allowed: a plan, still exit 1.
    let (code, v) = vramguard(&[
        "estimate",
        "-f",
        "examples/llama-3.1-8b-lora-h100.yaml",
        "--gpu",
        "a100-40gb",
        "--cluster",
        "examples/cluster.yaml",
        "-o",
        "json",
    ]);
    assert_eq!(code, 1, "{v}");
    let plan = &v["plan"];
    assert_eq!(plan["gpu"], "a100-40gb", "{v}");
    assert!(
        plan["microBatchSize"].as_u64().expect("a number") < 4,
        "{v}"
    );
    assert!(
        plan["changes"][0]
            .as_str()
            .expect("a change")
            .starts_with("microBatchSize: 4 → ")
    );
    assert_eq!(v["verdicts"][0]["plan"]["changes"], plan["changes"], "{v}");
    // As written it needs an 80 GB card: the idle H100 node, GPU 0.
    assert_eq!(v["placement"]["decision"], "placed", "{v}");
    assert_eq!(v["placement"]["nodes"][0]["node"], "gpu-h100-a", "{v}");

    // A cluster file that is not GpuNodes: bad input.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramguard"))
        .args([
            "estimate",
            "-f",
            "examples/llama-3.1-8b-lora-h100.yaml",
            "--cluster",
            "examples/llama-3.1-8b-lora-h100.yaml",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cluster examples/llama-3.1-8b-lora-h100.yaml: document 1: kind"),
        "{err}"
    );
}
