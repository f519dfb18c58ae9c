//! Trainer stacks: what each one does that sets memory, in one place.
//!
//! A [`Profile`] is a plain value of behaviours (how FSDP reshards frozen
//! units, whether the loop keeps the logits through backward, which AdamW
//! implementation steps, whether a job accumulates gradients when no global
//! batch is given, how 4-bit weights are dequantized, how a chunked loss
//! chunks). The step model asks the profile; it never branches on a stack's
//! name. Every behaviour names the file and commit of the stack it was read
//! from.
//!
//! A job that names no stack could run under any of them: the point estimate
//! uses the plain PyTorch loop (`custom`), and the upper end of the interval is
//! the largest estimate over every stack's profile still possible for the job.
//! Fields the user sets (`globalBatchSize`, `optimizerImplementation`,
//! `parallelism.fsdpVersion`, `loss`) override the profile, so a fully
//! specified job has a narrow interval.

use crate::api::{
    FsdpVersion, Loss, OptimizerImplementation, Quantization, Stack, Strategy, TrainingMode,
    ValidatedJob,
};

/// How a stack's 4-bit linears run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantLibrary {
    /// bitsandbytes `Linear4bit` (Transformers, PEFT, LitGPT, Unsloth, axolotl):
    /// `dequantize_4bit` to the storage dtype, then a cast to the compute dtype
    /// (two 16-bit copies at the cast), and `MatMul4Bit` keeps state per call.
    /// bitsandbytes/autograd/_functions.py, `MatMul4Bit.forward`
    /// (bitsandbytes-foundation/bitsandbytes).
    Bitsandbytes,
    /// torchao `NF4Tensor` (torchtune's QLoRA): `linear_nf4` dequantizes once
    /// to the input's dtype and its autograd function saves only the NF4
    /// weight, not the input. torchao/dtypes/nf4tensor.py, `LinearNF4.forward`
    /// (pytorch/ao); torchtune/modules/low_precision/_register_nf4_dispatch.py.
    Torchao,
}

/// How a chunked loss splits the tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossChunking {
    /// Fixed chunks of this many tokens: LitGPT's `lm_head_chunk_size=128`
    /// and `chunked_cross_entropy(..., chunk_size=128)`
    /// (Lightning-AI/litgpt litgpt/finetune/lora.py @ c16c72c04ce0774d23f08506dfd369c612f2d52f).
    Tokens(u32),
    /// A fixed number of chunks over the sequence: torchtune's
    /// `CEWithChunkedOutputLoss(num_output_chunks=8)`, the model emitting one
    /// logits tensor per chunk and upcasting per chunk
    /// (pytorch/torchtune torchtune/modules/loss/ce_chunked_output_loss.py @
    /// 1bf50ae24f99d453a40380d6f272f024a3122048).
    Count(u32),
}

/// The behaviours of one trainer stack that set memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Profile {
    /// The stack this profile belongs to (None: the plain PyTorch loop used
    /// as the point estimate of a job that names none).
    pub stack: Option<Stack>,
    /// FSDP units whose parameters are all frozen stay unsharded from the
    /// all-gather of their backward until backward ends. FSDP1 without the
    /// reshard-only hook behaves so (LitGPT's published sharded LoRA rows show
    /// it). FSDP1 since torch 2.1 reshards them from a hook on the unit's
    /// inputs (torch/distributed/fsdp/_runtime_utils.py,
    /// `_register_post_backward_reshard_only_hook`), and FSDP2 reshards every
    /// unit after its backward whatever requires grad
    /// (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py,
    /// `post_backward`; pytorch/pytorch @ 62a45b6f4461ee49783ff548ea11285d696c2ef3).
    pub frozen_units_stay_unsharded: bool,
    /// FSDP shards over the data-parallel × context-parallel ranks (torchtitan
    /// builds the `dp_shard_cp` mesh and applies `fully_shard` over it:
    /// pytorch/torchtitan torchtitan/distributed/parallel_dims.py @
    /// 6404b932421f5ce382e7dac5ad381b2c17b1373c), not over data parallel only.
    pub shards_over_context_parallel: bool,
    /// The training loop still holds the model's logits while backward runs.
    pub logits_kept: bool,
    /// A frozen 16-bit linear saves its input for backward. PyTorch's autograd
    /// saves `mm`'s first operand only when the weight needs a gradient
    /// (tools/autograd/gen_variable_type.py, `guard_for`, pytorch/pytorch @
    /// 9e69e8210c01ff23aff82df3806f7dbe0ec106d2), so a plain loop does not;
    /// LitGPT's published LoRA rows keep that much more per token, which is
    /// why its profile sets this (docs/DESIGN.md, "Calibration").
    pub frozen_linear_saves_input: bool,
    /// Every LoRA module drops out its input on its own: PEFT's
    /// `Linear.forward` calls `self.lora_dropout[adapter](x)` per module
    /// (huggingface/peft src/peft/tuners/lora/layer.py). LitGPT's fused
    /// `LoRAQKVLinear` drops out once for q, k and v
    /// (Lightning-AI/litgpt litgpt/lora.py @ c16c72c04ce0774d23f08506dfd369c612f2d52f).
    pub lora_dropout_per_module: bool,
    /// The AdamW implementation that steps.
    pub optimizer: OptimizerImplementation,
    /// Without a `globalBatchSize` the stack accumulates gradients over
    /// micro-batches (its defaults set a global batch larger than one
    /// micro-batch), so gradients are live through forward.
    pub accumulates_by_default: bool,
    pub quantization: QuantLibrary,
    pub loss_chunking: LossChunking,
    /// The stack computes the loss with its own code, not through a
    /// Transformers model's `forward(labels=...)` (whose logits copies differ
    /// between releases: `bounds::logits_extra_bytes`).
    pub own_loss: bool,
    /// Under pipeline parallelism FSDP does not reshard a stage's blocks after
    /// forward, so every block of the stage stays gathered from its forward
    /// through its backward: torchtitan's `apply_fsdp` sets
    /// `reshard_after_forward=False` when `pp_enabled` under its default
    /// `reshard_after_forward_policy` ("to avoid per-microbatch all-gathers";
    /// pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py).
    pub unsharded_stage_under_pp: bool,
}

/// A plain PyTorch loop: `torch.optim.AdamW()` with no implementation asked
/// for runs foreach on CUDA (torch/optim/optimizer.py,
/// `_default_to_fused_or_foreach`); `logits = model(x); loss = f(logits);
/// loss.backward()` keeps `logits` alive in the caller; no accumulation unless
/// the loop is written for it; FSDP as torch ≥ 2.1 ships it.
const CUSTOM: Profile = Profile {
    stack: Some(Stack::Custom),
    frozen_units_stay_unsharded: false,
    shards_over_context_parallel: false,
    logits_kept: true,
    frozen_linear_saves_input: false,
    lora_dropout_per_module: true,
    optimizer: OptimizerImplementation::Foreach,
    accumulates_by_default: false,
    quantization: QuantLibrary::Bitsandbytes,
    loss_chunking: LossChunking::Tokens(128),
    own_loss: false,
    unsharded_stage_under_pp: false,
};

/// The profiles of `stack`, most likely first. Where a stack's own default
/// changed between its releases, each variant is listed.
fn stack_profiles(stack: Stack) -> Vec<Profile> {
    let base = Profile {
        stack: Some(stack),
        ..CUSTOM
    };
    match stack {
        Stack::Custom => vec![CUSTOM],
        // Trainer.compute_loss returns only the loss unless asked for the
        // outputs, so the logits die before `accelerator.backward(loss)`
        // (huggingface/transformers src/transformers/trainer.py, `compute_loss`,
        // @ d0fed636753eeb35d790126c4496d06847983d60); the loss upcasts to fp32
        // inside `ForCausalLMLoss` (src/transformers/loss/loss_utils.py, same
        // commit). TrainingArguments' default `optim` is `adamw_torch_fused`
        // from torch 2.8 on and `adamw_torch` (foreach) before.
        Stack::HfTrainer => vec![
            Profile {
                logits_kept: false,
                optimizer: OptimizerImplementation::Fused,
                ..base
            },
            Profile {
                logits_kept: false,
                optimizer: OptimizerImplementation::Foreach,
                ..base
            },
        ],
        // Unsloth runs inside TRL's trainer with bitsandbytes 4-bit weights and
        // `adamw_8bit` by its recipes' choice, and patches the models' forward
        // with its own cross-entropy (unslothai/unsloth unsloth/models/llama.py,
        // `fast_cross_entropy_loss`), so Transformers' loss path does not run.
        Stack::Unsloth => vec![Profile {
            own_loss: true,
            logits_kept: false,
            optimizer: OptimizerImplementation::Fused,
            ..base
        }],
        // Recipes `del logits` before backward ("free logits otherwise it
        // peaks backward memory"), build AdamW with `fused: True`, shard with
        // FSDP2 `fully_shard`, and quantize with torchao NF4
        // (pytorch/torchtune recipes/full_finetune_distributed.py,
        // recipes/lora_finetune_distributed.py, recipes/configs/*,
        // @ 1bf50ae24f99d453a40380d6f272f024a3122048).
        Stack::Torchtune => vec![Profile {
            own_loss: true,
            logits_kept: false,
            optimizer: OptimizerImplementation::Fused,
            quantization: QuantLibrary::Torchao,
            loss_chunking: LossChunking::Count(8),
            ..base
        }],
        // `del pred` before `loss.backward()`, `Optimizer.implementation =
        // "fused"`, FSDP2 over dp_shard × cp (pytorch/torchtitan
        // torchtitan/train.py, torchtitan/config/job_config.py @
        // 6404b932421f5ce382e7dac5ad381b2c17b1373c).
        Stack::Torchtitan => vec![Profile {
            own_loss: true,
            logits_kept: false,
            optimizer: OptimizerImplementation::Fused,
            shards_over_context_parallel: true,
            unsharded_stage_under_pp: true,
            ..base
        }],
        // `logits = model(input_ids, lm_head_chunk_size=128)` stays in scope
        // through `fabric.backward(loss / accum)`; `global_batch_size=16,
        // micro_batch_size=1` by default; torch's AdamW (foreach); Lightning's
        // FSDP1 strategy (Lightning-AI/litgpt litgpt/finetune/lora.py @
        // c16c72c04ce0774d23f08506dfd369c612f2d52f).
        Stack::Litgpt => vec![Profile {
            own_loss: true,
            frozen_units_stay_unsharded: true,
            frozen_linear_saves_input: true,
            lora_dropout_per_module: false,
            accumulates_by_default: true,
            ..base
        }],
        // `training_step` returns the loss; the logits are its locals, gone
        // before automatic optimization calls backward. Optimizer as the user
        // configures it (torch's AdamW: foreach).
        Stack::Lightning => vec![Profile {
            logits_kept: false,
            ..base
        }],
        // DeepSpeed steps its own FusedAdam (multi_tensor_apply, no full-size
        // temporaries) and ZeRO-3 releases every partitioned parameter after
        // use from module hooks, frozen or not; the loop around the engine is
        // the user's (deepspeedai/DeepSpeed deepspeed/ops/adam/fused_adam.py,
        // deepspeed/runtime/zero/parameter_offload.py).
        Stack::Deepspeed => vec![Profile {
            optimizer: OptimizerImplementation::Fused,
            ..base
        }],
        // Megatron-LM's forward_step returns the loss (the vocab-parallel
        // cross entropy consumes the logits) and its distributed optimizer
        // steps with Apex/TE FusedAdam (NVIDIA/Megatron-LM
        // megatron/core/pipeline_parallel/schedules.py, megatron/core/optimizer/__init__.py).
        Stack::Megatron => vec![Profile {
            own_loss: true,
            logits_kept: false,
            optimizer: OptimizerImplementation::Fused,
            ..base
        }],
    }
}

/// Every stack, for the interval of a job that names none.
pub const ALL_STACKS: [Stack; 9] = [
    Stack::Custom,
    Stack::HfTrainer,
    Stack::Torchtune,
    Stack::Torchtitan,
    Stack::Litgpt,
    Stack::Lightning,
    Stack::Deepspeed,
    Stack::Megatron,
    Stack::Unsloth,
];

impl Profile {
    /// The profile with the user's explicit fields applied and every
    /// behaviour that cannot matter for `job` set to one value, so that two
    /// profiles that give the same bytes compare equal.
    fn for_job(mut self, job: &ValidatedJob) -> Profile {
        let t = &job.spec().training;
        let p = &job.spec().parallelism;
        if let Some(imp) = t.optimizer_implementation {
            self.optimizer = imp;
        }
        if let Some(v) = p.fsdp_version {
            // FSDP2 reshards every unit after its backward; FSDP1 as the stack runs it.
            if v == FsdpVersion::V2 {
                self.frozen_units_stay_unsharded = false;
            }
        }
        let fsdp_frozen = p.zero() == 3
            && p.strategy == Strategy::Fsdp
            && t.mode != TrainingMode::Full
            && t.mode != TrainingMode::Inference;
        if !fsdp_frozen {
            self.frozen_units_stay_unsharded = false;
        }
        if p.context_parallel <= 1 || p.zero() == 0 {
            self.shards_over_context_parallel = false;
        }
        if p.pipeline_parallel <= 1 || p.zero() != 3 {
            self.unsharded_stage_under_pp = false;
        }
        if t.global_batch_size.is_some() || t.mode == TrainingMode::Inference {
            self.accumulates_by_default = false;
        }
        if !matches!(
            job.quantization,
            Quantization::Nf4 | Quantization::Nf4Double
        ) {
            self.quantization = QuantLibrary::Bitsandbytes;
        }
        if t.loss != Loss::Chunked {
            self.loss_chunking = LossChunking::Tokens(128);
        }
        if matches!(t.mode, TrainingMode::Full | TrainingMode::Inference)
            || job.quantization != Quantization::None
        {
            self.frozen_linear_saves_input = false;
        }
        if t.mode == TrainingMode::Inference {
            self.logits_kept = false;
        }
        if t.loss == Loss::Chunked || t.mode == TrainingMode::Inference {
            self.own_loss = true;
        }
        if job.lora.as_ref().is_none_or(|l| l.dropout <= 0.0) {
            self.lora_dropout_per_module = true;
        }
        self.stack = None;
        self
    }
}

/// The profiles a job can run under, each applied to the job, duplicates
/// removed: the first is the point estimate's, the others bound it above.
pub fn profiles(job: &ValidatedJob) -> Vec<Profile> {
    let named = job.spec().training.stack;
    let candidates: Vec<Profile> = match named {
        Some(s) => stack_profiles(s),
        None => ALL_STACKS.iter().flat_map(|s| stack_profiles(*s)).collect(),
    };
    let mut out: Vec<Profile> = Vec::with_capacity(candidates.len());
    for c in candidates {
        let stack = c.stack;
        let mut applied = c.for_job(job);
        if out.iter().any(|o| Profile { stack: None, ..*o } == applied) {
            continue;
        }
        applied.stack = stack;
        out.push(applied);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::api::test_job as job;

    #[test]
    fn a_named_stack_has_its_own_profiles_only() {
        let j = job("model: {preset: llama-3-8b}\ntraining: {stack: torchtune}\n");
        let ps = profiles(&j);
        assert_eq!(ps.len(), 1);
        assert_eq!(ps[0].stack, Some(Stack::Torchtune));
        assert!(!ps[0].logits_kept);
        assert_eq!(ps[0].optimizer, OptimizerImplementation::Fused);
    }

    #[test]
    fn no_stack_puts_the_plain_loop_first_and_keeps_distinct_others() {
        let j = job("model: {preset: llama-3-8b}\n");
        let ps = profiles(&j);
        assert_eq!(ps[0].stack, Some(Stack::Custom));
        assert!(ps.len() > 1);
        for (i, a) in ps.iter().enumerate() {
            for b in &ps[i + 1..] {
                assert_ne!(Profile { stack: None, ..*a }, Profile { stack: None, ..*b });
            }
        }
    }

    #[test]
    fn user_fields_narrow_the_set() {
        let open = job("model: {preset: llama-3-8b}\n");
        let pinned = job(
            "model: {preset: llama-3-8b}\ntraining: {globalBatchSize: 1, optimizerImplementation: fused}\n",
        );
        assert!(profiles(&pinned).len() < profiles(&open).len());
        assert!(profiles(&pinned)
            .iter()
            .all(|p| p.optimizer == OptimizerImplementation::Fused && !p.accumulates_by_default));
    }

    #[test]
    fn fsdp2_never_keeps_frozen_units_unsharded() {
        let j = job(
            "model: {preset: llama-3-8b}\ntraining: {mode: lora, stack: litgpt}\nparallelism: {gpus: 4, zeroStage: 3, strategy: fsdp, fsdpVersion: 2}\n",
        );
        assert!(profiles(&j).iter().all(|p| !p.frozen_units_stay_unsharded));
        let v1 = job(
            "model: {preset: llama-3-8b}\ntraining: {mode: lora, stack: litgpt}\nparallelism: {gpus: 4, zeroStage: 3, strategy: fsdp}\n",
        );
        assert!(profiles(&v1)[0].frozen_units_stay_unsharded);
    }
}
