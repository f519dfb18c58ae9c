//! Table tests: each trainer's documented command lines, each kind's pods,
//! and the annotation's errors.

use serde_json::{Value, json};

use super::trainer::{Parsed, parse};
use super::*;
use crate::api::{Checkpointing, Optimizer, Precision, Stack, Strategy, TrainingMode};

fn words(s: &str) -> Vec<String> {
    shell::split_script(s).unwrap().remove(0)
}

fn found(s: &str) -> trainer::FromCommand {
    match parse(&words(s)) {
        Parsed::Found(f) => *f,
        other => panic!("{s}: {other:?}"),
    }
}

fn from<'a>(f: &'a trainer::FromCommand, field: &str) -> &'a str {
    f.sources
        .iter()
        .find(|s| s.field == field)
        .map(|s| s.from.as_str())
        .unwrap_or_else(|| panic!("no source for {field}: {:?}", f.sources))
}

/// (command as documented, preset, mode, micro, accumulation, precision, checkpointing, sequence)
type Row = (
    &'static str,
    &'static str,
    TrainingMode,
    u64,
    u64,
    Precision,
    Checkpointing,
    u64,
);

#[test]
fn transformers_and_trl_command_lines_as_documented() {
    let rows: &[Row] = &[
        // TRL README, SFT.
        (
            "python trl/scripts/sft.py --model_name_or_path Qwen/Qwen2.5-0.5B --dataset_name trl-lib/Capybara \
             --learning_rate 2.0e-5 --num_train_epochs 1 --packing --per_device_train_batch_size 2 \
             --gradient_accumulation_steps 8 --gradient_checkpointing --eos_token '<|im_end|>' \
             --eval_strategy steps --eval_steps 100 --output_dir Qwen2-0.5B-SFT --push_to_hub",
            "qwen2.5-0.5b",
            TrainingMode::Full,
            2,
            8,
            Precision::Fp32,
            Checkpointing::Full,
            2048,
        ),
        // TRL README, SFT with LoRA.
        (
            "python trl/scripts/sft.py --model_name_or_path Qwen/Qwen2.5-0.5B --dataset_name trl-lib/Capybara \
             --learning_rate 2.0e-4 --num_train_epochs 1 --packing --per_device_train_batch_size 2 \
             --gradient_accumulation_steps 8 --gradient_checkpointing --eval_strategy steps --eval_steps 100 \
             --use_peft --lora_r 32 --lora_alpha 16 --output_dir Qwen2-0.5B-SFT --push_to_hub",
            "qwen2.5-0.5b",
            TrainingMode::Lora,
            2,
            8,
            Precision::Fp32,
            Checkpointing::Full,
            2048,
        ),
        // Transformers' language-modeling example, on 8 GPUs.
        (
            "torchrun --nproc_per_node 8 run_clm.py --model_name_or_path openai-community/gpt2 \
             --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 --per_device_train_batch_size 8 \
             --per_device_eval_batch_size 8 --do_train --do_eval --output_dir /tmp/test-clm",
            "gpt2",
            TrainingMode::Full,
            8,
            1,
            Precision::Fp32,
            Checkpointing::None,
            2048,
        ),
        // accelerate with bf16, TRL's CLI spelling of booleans, a max sequence length.
        (
            "accelerate launch --num_processes 4 --mixed_precision bf16 sft.py \
             --model_name_or_path meta-llama/Llama-3.1-8B-Instruct --per_device_train_batch_size=4 \
             --gradient_accumulation_steps 8 --gradient_checkpointing True --max_seq_length 4096 \
             --use_peft --load_in_4bit --optim paged_adamw_8bit --attn_implementation flash_attention_2",
            "llama-3.1-8b",
            TrainingMode::Qlora,
            4,
            8,
            Precision::Bf16Mixed,
            Checkpointing::Full,
            4096,
        ),
        // TrainingArguments' defaults: micro-batch 8, fp32.
        (
            "trl sft --model_name_or_path meta-llama/Llama-3.2-1B --bf16 --output_dir out",
            "llama-3.2-1b",
            TrainingMode::Full,
            8,
            1,
            Precision::Bf16Mixed,
            Checkpointing::None,
            2048,
        ),
    ];
    for (cmd, preset, mode, micro, accum, precision, ckpt, seq) in rows {
        let f = found(cmd);
        assert_eq!(f.trainer, Trainer::HfTrainer, "{cmd}");
        assert_eq!(f.preset, *preset, "{cmd}");
        assert_eq!(f.training.mode, *mode, "{cmd}");
        assert_eq!(f.training.micro_batch_size, *micro, "{cmd}");
        assert_eq!(f.accumulation, *accum, "{cmd}");
        assert_eq!(f.training.precision, *precision, "{cmd}");
        assert_eq!(f.training.gradient_checkpointing, *ckpt, "{cmd}");
        assert_eq!(f.training.seq_len(), *seq, "{cmd}");
        assert_eq!(f.training.stack, Some(Stack::HfTrainer));
    }
    let lora = found(rows[1].0);
    assert_eq!(lora.training.lora.as_ref().unwrap().rank, 32);
    assert_eq!(lora.training.lora.as_ref().unwrap().alpha, 16.0);
    let q = found(rows[3].0);
    assert_eq!(q.training.optimizer, Optimizer::PagedAdamw8bit);
    assert_eq!(q.launcher_world, Some(4));
    assert_eq!(
        from(&q, "training.microBatchSize"),
        "--per_device_train_batch_size 4"
    );
    assert!(from(&q, "training.precision").contains("--mixed_precision bf16"));
    let d = found(rows[4].0);
    assert_eq!(
        from(&d, "training.microBatchSize"),
        "8, TrainingArguments' default"
    );
    assert_eq!(found(rows[2].0).launcher_world, Some(8));
}

#[test]
fn torchtune_command_lines_as_documented() {
    let rows: &[Row] = &[
        (
            "tune run lora_finetune_single_device --config llama3_1/8B_lora_single_device",
            "llama-3.1-8b",
            TrainingMode::Lora,
            2,
            1,
            Precision::Bf16,
            Checkpointing::Full,
            2048,
        ),
        (
            "tune run --nproc_per_node 4 full_finetune_distributed --config llama3_1/8B_full",
            "llama-3.1-8b",
            TrainingMode::Full,
            2,
            1,
            Precision::Bf16,
            Checkpointing::Full,
            2048,
        ),
        (
            "tune run lora_finetune_single_device --config llama3_1/8B_qlora_single_device",
            "llama-3.1-8b",
            TrainingMode::Qlora,
            2,
            1,
            Precision::Bf16,
            Checkpointing::Full,
            2048,
        ),
        (
            "tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device \
             batch_size=8 gradient_accumulation_steps=4 enable_activation_checkpointing=False \
             tokenizer.max_seq_len=1024 model.lora_rank=16 checkpointer.checkpoint_dir=/ckpt",
            "llama-3.2-1b",
            TrainingMode::Lora,
            8,
            4,
            Precision::Bf16,
            Checkpointing::None,
            1024,
        ),
    ];
    for (cmd, preset, mode, micro, accum, precision, ckpt, seq) in rows {
        let f = found(cmd);
        assert_eq!(f.trainer, Trainer::Torchtune, "{cmd}");
        assert_eq!(f.preset, *preset, "{cmd}");
        assert_eq!(f.training.mode, *mode, "{cmd}");
        assert_eq!(f.training.micro_batch_size, *micro, "{cmd}");
        assert_eq!(f.accumulation, *accum, "{cmd}");
        assert_eq!(f.training.precision, *precision, "{cmd}");
        assert_eq!(f.training.gradient_checkpointing, *ckpt, "{cmd}");
        assert_eq!(f.training.seq_len(), *seq, "{cmd}");
    }
    let dist = found(rows[1].0);
    assert_eq!(dist.strategy, Strategy::Fsdp);
    assert_eq!(dist.launcher_world, Some(4));
    let o = found(rows[3].0);
    assert_eq!(o.training.lora.as_ref().unwrap().rank, 16);
    assert_eq!(from(&o, "training.microBatchSize"), "batch_size=8");
    assert_eq!(
        from(&found(rows[0].0), "training.microBatchSize"),
        "2, torchtune's configs"
    );
}

#[test]
fn litgpt_command_lines_as_documented() {
    let rows: &[Row] = &[
        (
            "litgpt finetune_lora microsoft/phi-2",
            "phi-2",
            TrainingMode::Lora,
            1,
            0,
            Precision::Bf16Mixed,
            Checkpointing::None,
            2048,
        ),
        (
            "litgpt finetune_lora stabilityai/stablelm-base-alpha-3b --quantize bnb.nf4 --precision bf16-true",
            "stablelm-base-alpha-3b",
            TrainingMode::Qlora,
            1,
            0,
            Precision::Bf16,
            Checkpointing::None,
            2048,
        ),
        (
            "litgpt finetune_full meta-llama/Meta-Llama-3.1-8B-Instruct --devices 4 \
             --train.micro_batch_size 2 --train.global_batch_size 64 --train.max_seq_length 512",
            "llama-3.1-8b",
            TrainingMode::Full,
            2,
            8,
            Precision::Bf16Mixed,
            Checkpointing::None,
            512,
        ),
        (
            "litgpt finetune lora checkpoints/meta-llama/Llama-3.2-1B --train.micro_batch_size=4 --lora_r 16",
            "llama-3.2-1b",
            TrainingMode::Lora,
            4,
            0,
            Precision::Bf16Mixed,
            Checkpointing::None,
            2048,
        ),
    ];
    for (cmd, preset, mode, micro, accum, precision, ckpt, seq) in rows {
        let f = found(cmd);
        assert_eq!(f.trainer, Trainer::LitGpt, "{cmd}");
        assert_eq!(f.preset, *preset, "{cmd}");
        assert_eq!(f.training.mode, *mode, "{cmd}");
        assert_eq!(f.training.micro_batch_size, *micro, "{cmd}");
        assert_eq!(f.accumulation, *accum, "{cmd}");
        assert_eq!(f.training.precision, *precision, "{cmd}");
        assert_eq!(f.training.gradient_checkpointing, *ckpt, "{cmd}");
        assert_eq!(f.training.seq_len(), *seq, "{cmd}");
    }
    assert_eq!(found(rows[2].0).strategy, Strategy::Fsdp);
    assert_eq!(found(rows[3].0).training.lora.as_ref().unwrap().rank, 16);
}

#[test]
fn commands_that_say_too_little_say_why() {
    let rows = [
        (
            "python sft.py --model_name_or_path my-org/private-model",
            "not a model in vramguard's catalog",
        ),
        (
            "python sft.py --model_name_or_path gpt2 --per_device_train_batch_size $BS",
            "variable",
        ),
        (
            "python sft.py --model_name_or_path gpt2 --optim lion_32bit",
            "--optim lion_32bit",
        ),
        (
            "accelerate launch --use_deepspeed train.py --model_name_or_path gpt2",
            "--deepspeed",
        ),
        (
            "tune run lora_finetune_single_device --config ./my_config.yaml",
            "my_config.yaml",
        ),
        (
            "tune run lora_finetune_single_device --config llama3_1/8B_lora batch_size=big",
            "batch_size= big",
        ),
        ("litgpt finetune_lora some/unknown-model", "not a model"),
    ];
    for (cmd, says) in rows {
        match parse(&words(cmd)) {
            Parsed::Unreadable(why) => assert!(why.contains(says), "{cmd}: {why}"),
            other => panic!("{cmd}: {other:?}"),
        }
    }
    for cmd in ["python train.py --epochs 3", "echo hello", "nvidia-smi"] {
        assert_eq!(parse(&words(cmd)), Parsed::NotTrainer, "{cmd}");
    }
}

fn container(command: Value, gpus: u64) -> Value {
    json!({
        "name": "trainer",
        "image": "trainer:latest",
        "command": command,
        "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
    })
}

const HF: &str = "accelerate launch sft.py --model_name_or_path meta-llama/Llama-3.1-8B \
                  --per_device_train_batch_size 4 --gradient_accumulation_steps 8 --bf16";

fn job(annotations: Value) -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sft", "namespace": "team-a", "annotations": annotations},
        "spec": {
            "parallelism": 2,
            "completionMode": "Indexed",
            "template": {"spec": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "containers": [container(json!(["/bin/bash", "-c", HF]), 8)],
            }},
        },
    })
}

fn judged(kind: Kind, obj: &Value) -> Judged {
    match read(kind, obj) {
        Reading::Judge(j) => *j,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_kind_gives_its_pods_and_gpus() {
    let j = judged(Kind::Job, &job(json!({})));
    let p = &j.job.spec.parallelism;
    assert_eq!((p.gpus, p.gpus_per_node), (16, Some(8)));
    assert_eq!(j.products, ["NVIDIA-H100-80GB-HBM3"]);
    assert_eq!(j.origin, Origin::Command(Trainer::HfTrainer));
    assert_eq!(j.job.spec.training.global_batch_size, Some(4 * 8 * 16));
    assert_eq!(j.validated.gradient_accumulation_steps, 8);

    let jobset = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {"replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "d", "command": ["python", "driver.py"]}]}}}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2, "completions": 2,
                "template": {"spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product",
                            "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}},
                    "containers": [container(json!(["tune", "run", "--nproc_per_node", "4",
                        "lora_finetune_distributed", "--config", "llama3_1/8B_lora"]), 4)]}}}}},
        ]},
    });
    let j = judged(Kind::JobSet, &jobset);
    assert_eq!(
        j.job.spec.parallelism.gpus, 16,
        "2 replicas x 2 pods x 4 GPUs"
    );
    assert_eq!(j.products, ["NVIDIA-A100-SXM4-80GB"]);
    assert_eq!(j.origin, Origin::Command(Trainer::Torchtune));

    let trainjob = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "tj"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
            "trainer": {"image": "litgpt", "numNodes": 2,
                "command": ["litgpt", "finetune_lora", "meta-llama/Llama-3.2-1B", "--devices", "2"],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}}}},
    });
    let j = judged(Kind::TrainJob, &trainjob);
    assert_eq!(j.job.spec.parallelism.gpus, 4);
    assert_eq!(j.origin, Origin::Command(Trainer::LitGpt));
    assert!(
        j.sources
            .iter()
            .any(|s| s.from.contains("says 2 processes")),
        "{:?}",
        j.sources
    );

    let pytorchjob = json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "pj"},
        "spec": {"nprocPerNode": "1", "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": [container(json!(
                ["python", "run_clm.py", "--model_name_or_path", "gpt2", "--per_device_train_batch_size", "4"]), 1)]}}},
            "Worker": {"replicas": 3, "template": {"spec": {"containers": [container(json!(
                ["python", "run_clm.py", "--model_name_or_path", "gpt2", "--per_device_train_batch_size", "4"]), 1)]}}},
        }},
    });
    let j = judged(Kind::PyTorchJob, &pytorchjob);
    assert_eq!(j.job.spec.parallelism.gpus, 4);
    assert_eq!(j.job.spec.training.micro_batch_size, 4);
}

#[test]
fn what_is_not_judged_says_why() {
    let mut no_gpu = job(json!({}));
    no_gpu["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({});
    let Reading::NotJudged(why) = read(Kind::Job, &no_gpu) else {
        panic!()
    };
    assert!(why.contains("nvidia.com/gpu"), "{why}");

    let mut plain = job(json!({}));
    plain["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["python", "train.py"]);
    let Reading::NotJudged(why) = read(Kind::Job, &plain) else {
        panic!()
    };
    assert!(why.contains(TRAINING_ANNOTATION), "{why}");
}

/// A Job of `parallelism` pods, each container of `resources`.
fn mig_job(parallelism: u64, resources: &[Value]) -> Value {
    let mut j = job(json!({}));
    j["spec"]["parallelism"] = json!(parallelism);
    j["spec"]["template"]["spec"]["nodeSelector"] = json!({});
    let c = j["spec"]["template"]["spec"]["containers"][0].clone();
    j["spec"]["template"]["spec"]["containers"] = resources
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut c = c.clone();
            c["name"] = json!(format!("c{i}"));
            c["resources"] = r.clone();
            c
        })
        .collect();
    j
}

#[test]
fn mig_slices_are_judged_as_gpus_of_their_profile() {
    // (pods, containers' resources, profile and world judged, or the reason it is not)
    type MigRow = (u64, Vec<Value>, Result<(&'static str, u64), &'static str>);
    let rows: Vec<MigRow> = vec![
        (
            1,
            vec![json!({"limits": {"nvidia.com/mig-1g.10gb": 1}})],
            Ok(("1g.10gb", 1)),
        ),
        (
            1,
            vec![json!({"requests": {"nvidia.com/mig-3g.40gb": "1"}})],
            Ok(("3g.40gb", 1)),
        ),
        // Two pods of one slice: a world of 2 (placement then says slices take one rank).
        (
            2,
            vec![json!({"limits": {"nvidia.com/mig-2g.20gb": 1}})],
            Ok(("2g.20gb", 2)),
        ),
        // H100 profiles are named the same way.
        (
            1,
            vec![json!({"limits": {"nvidia.com/mig-7g.80gb": 1, "cpu": "8"}})],
            Ok(("7g.80gb", 1)),
        ),
        (
            1,
            vec![json!({"limits": {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1}})],
            Err("asks both"),
        ),
        (
            1,
            vec![
                json!({"limits": {"nvidia.com/mig-1g.10gb": 1}}),
                json!({"limits": {"nvidia.com/mig-2g.20gb": 1}}),
            ],
            Err("one MIG profile per pod"),
        ),
        (
            1,
            vec![json!({"limits": {"nvidia.com/mig-big": 1}})],
            Err("not a MIG profile"),
        ),
        (
            1,
            vec![json!({"limits": {"nvidia.com/mig-1g.10gb": "two"}})],
            Err("not a whole number"),
        ),
    ];
    for (pods, resources, want) in rows {
        let obj = mig_job(pods, &resources);
        match (read(Kind::Job, &obj), want) {
            (Reading::Judge(j), Ok((profile, world))) => {
                assert_eq!(j.mig.as_deref(), Some(profile), "{resources:?}");
                assert_eq!(j.job.spec.parallelism.gpus, world, "{resources:?}");
                let from = &j.sources[0].from;
                assert!(
                    from.contains(&format!("nvidia.com/mig-{profile}")),
                    "{from}"
                );
            }
            (Reading::NotJudged(why), Err(reason)) => {
                assert!(why.contains(reason), "{resources:?}: {why}");
            }
            (other, want) => panic!("{resources:?}: {other:?}, wanted {want:?}"),
        }
    }
    assert_eq!(mig_profile("nvidia.com/mig-1g.10gb"), Some("1g.10gb"));
    assert_eq!(mig_profile("nvidia.com/mig-1g.10gb.me"), None);
    assert_eq!(mig_profile("nvidia.com/gpu"), None);
    // A whole GPU is no slice.
    assert_eq!(judged(Kind::Job, &job(json!({}))).mig, None);
}

#[test]
fn the_annotation_wins_over_the_command_and_is_validated_as_a_training_job() {
    let good = "model: {preset: llama-3.1-70b}\ntraining: {mode: lora, microBatchSize: 2, precision: bf16}\n";
    let j = judged(Kind::Job, &job(json!({TRAINING_ANNOTATION: good})));
    assert_eq!(j.origin, Origin::Annotation);
    assert_eq!(j.job.spec.model.preset.as_deref(), Some("llama-3.1-70b"));
    assert_eq!(j.job.spec.parallelism.gpus, 16, "the pods' GPUs");

    let rows = [
        (
            "model: {preset: llama-3.1-8b}\ntraining: {microBatchSize: 0}\n",
            "metadata.annotations[vramguard.io/training].training.microBatchSize",
        ),
        (
            "model: {preset: llama-9}\n",
            "metadata.annotations[vramguard.io/training].model.preset",
        ),
        (
            "model: {preset: llama-3.1-8b}\ntraining: {precison: bf16}\n",
            "metadata.annotations[vramguard.io/training].training.precison",
        ),
        (
            "model: {preset: llama-3.1-8b}\ntemplate: {}\n",
            "metadata.annotations[vramguard.io/training].template",
        ),
        (
            "model: {preset: llama-3.1-8b}\nparallelism: {gpus: 4}\n",
            "metadata.annotations[vramguard.io/training].parallelism.gpus",
        ),
        (
            "model: [unclosed\n",
            "metadata.annotations[vramguard.io/training]",
        ),
        (
            "just a string",
            "metadata.annotations[vramguard.io/training]",
        ),
    ];
    for (text, path) in rows {
        let Reading::Invalid(errs) = read(Kind::Job, &job(json!({TRAINING_ANNOTATION: text})))
        else {
            panic!("{text}")
        };
        assert!(errs.iter().any(|e| e.path == path), "{text}: {errs:?}");
    }
    // The same spec as a TrainingJob gets the same reason.
    let Reading::Invalid(errs) = read(
        Kind::Job,
        &job(
            json!({TRAINING_ANNOTATION: "model: {preset: llama-3.1-8b}\ntraining: {microBatchSize: 0}\n"}),
        ),
    ) else {
        panic!()
    };
    let tj = parse::training_job(
        json!({"apiVersion": parse::API_VERSION, "kind": "TrainingJob",
        "spec": {"model": {"preset": "llama-3.1-8b"}, "training": {"microBatchSize": 0}}}),
    );
    let Err(parse::ParseError::Fields(tj_errs)) = tj else {
        panic!()
    };
    assert_eq!(errs[0].reason, tj_errs[0].reason);
}

#[test]
fn unreadable_pods_are_a_typed_error_naming_the_field() {
    let obj = mig_job(1, &[json!({"limits": {"nvidia.com/mig-1g.10gb": "two"}})]);
    let err = pod_sets(Kind::Job, &obj).unwrap_err();
    let path = "spec.template.spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]";
    assert_eq!(
        err,
        PodSetError::Field {
            path: path.to_string(),
            reason: "\"two\" is not a whole number of devices".to_string(),
        }
    );
    assert_eq!(
        err.to_string(),
        format!("{path}: \"two\" is not a whole number of devices")
    );
    let mixed = mig_job(
        1,
        &[
            json!({"limits": {"nvidia.com/mig-1g.10gb": 1}}),
            json!({"limits": {"nvidia.com/mig-2g.20gb": 1}}),
        ],
    );
    let err = pod_sets(Kind::Job, &mixed).unwrap_err();
    assert!(matches!(err, PodSetError::MixedMig { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "spec.template.spec.containers[1].resources asks nvidia.com/mig-2g.20gb, another \
         container nvidia.com/mig-1g.10gb; one MIG profile per pod is read"
    );
}
