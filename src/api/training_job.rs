//! The `TrainingJob` custom resource: the user-facing contract of DESIGN.md.
//! Plain data with serde and schemars; no I/O. Defaults live here so that the
//! CRD schema, the CLI and the webhook all agree on them.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema::{preserve_object, preserve_object_list};

mod float8;
mod parallelism;
mod status;
pub use float8::Float8Recipe;
pub use parallelism::*;
pub use status::*;

/// A training (or inference) job whose per-GPU memory vramguard estimates,
/// fits and places before anything runs.
// Several printer columns repeat `type_`, which clippy reads as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "vramguard.io",
    version = "v1alpha1",
    kind = "TrainingJob",
    namespaced,
    status = "TrainingJobStatus",
    shortname = "tj",
    category = "vramguard",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Model", type_ = "string", json_path = ".status.model"),
    printcolumn(name = "GPUs", type_ = "integer", json_path = ".spec.parallelism.gpus"),
    printcolumn(
        name = "Per-GPU",
        type_ = "string",
        json_path = ".status.perGpu",
        description = "estimated memory per GPU"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.placement.node"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
// What the estimate, plan and placement rest on cannot change: the API server enforces it
// with transition rules even when the webhook is down (the webhook says the same).
#[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.model == oldSelf.model", "message": "spec.model cannot change on a TrainingJob; delete and re-create the job"},
        {"rule": "self.training.mode == oldSelf.training.mode", "message": "spec.training.mode cannot change on a TrainingJob; delete and re-create the job"}
]))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingJobSpec {
    /// The model: exactly one of preset, transformer, hfConfig, layers, custom.
    pub model: ModelSpec,
    /// How the model is trained (or served).
    #[serde(default)]
    pub training: TrainingSpec,
    /// How the work is split over GPUs.
    #[serde(default)]
    pub parallelism: ParallelismSpec,
    /// What vramguard may change to make the job fit.
    #[serde(default)]
    pub fit_policy: FitPolicy,
    /// Pod template of the trainer (a core/v1 PodTemplateSpec, kept as written:
    /// the operator reads it as `k8s_openapi`'s type when it builds the Job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_object")]
    pub template: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The model, given one way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
        {"rule": "[has(self.preset), has(self.transformer), has(self.hfConfig), has(self.layers), has(self.custom)].filter(x, x).size() == 1", "message": "set exactly one of preset, transformer, hfConfig, layers, custom"},
        {"rule": "!has(self.layers) || has(self.inputShape)", "message": "inputShape is required with layers"}
]))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// Name of a built-in catalog model, e.g. `llama-3.1-8b`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Transformer dimensions given explicitly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformer: Option<TransformerSpec>,
    /// A Hugging Face `config.json` object, read as-is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_object")]
    pub hf_config: Option<serde_json::Map<String, serde_json::Value>>,
    /// An MLP/CNN as a list of layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_object_list")]
    pub layers: Option<Vec<serde_json::Value>>,
    /// Per-sample input shape, for `layers` and vision presets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_shape: Option<Vec<u64>>,
    /// Output head; default: `lm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<Head>,
    /// Classes of a `classification` head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_labels: Option<u64>,
    /// A model known only by its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomModel>,
}

/// Explicit transformer dimensions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!has(self.kvHeads) || (self.kvHeads > 0 && self.attentionHeads % self.kvHeads == 0)", "message": "kvHeads must divide attentionHeads"},
        {"rule": "has(self.headDim) || self.hiddenSize % self.attentionHeads == 0", "message": "attentionHeads must divide hiddenSize unless headDim is set"},
        {"rule": "!has(self.experts) || self.experts == 0 ? (!has(self.expertsPerToken) || self.expertsPerToken == 0) : (has(self.expertsPerToken) && self.expertsPerToken >= 1 && self.expertsPerToken <= self.experts)", "message": "expertsPerToken must be between 1 and experts (0 for dense models)"},
        {"rule": "(has(self.experts) && self.experts > 0) || ((!has(self.sharedIntermediateSize) || self.sharedIntermediateSize == 0) && (!has(self.denseLayers) || self.denseLayers == 0))", "message": "sharedIntermediateSize and denseLayers need experts > 0"},
        {"rule": "!has(self.denseLayers) || self.denseLayers == 0 || (self.denseLayers < self.layers && has(self.denseIntermediateSize))", "message": "denseLayers must be fewer than layers and needs denseIntermediateSize"}
]))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransformerSpec {
    /// decoder | encoder | encoder-decoder.
    #[serde(default)]
    pub kind: TransformerKind,
    /// Transformer blocks.
    #[schemars(range(min = 1))]
    pub layers: u64,
    /// Model width.
    #[schemars(range(min = 1))]
    pub hidden_size: u64,
    /// Query heads.
    #[schemars(range(min = 1))]
    pub attention_heads: u64,
    /// Key/value heads (GQA/MQA); default: attentionHeads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u64>,
    /// Per-head width; default: hiddenSize / attentionHeads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// MLP width; default: 4 × hiddenSize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<u64>,
    /// Vocabulary size.
    #[schemars(range(min = 1))]
    pub vocab_size: u64,
    /// gated (SwiGLU/GeGLU, 3 matrices) | standard (2 matrices).
    #[serde(default)]
    pub mlp: MlpKind,
    /// Output projection shares the embedding's weights.
    #[serde(default)]
    pub tied_embeddings: bool,
    /// Experts per MoE layer (0: dense).
    #[serde(default)]
    pub experts: u64,
    /// Experts each token is routed to.
    #[serde(default)]
    pub experts_per_token: u64,
    /// MLP width every token of an MoE block passes through beside its routed
    /// experts: the shared experts together (DeepSeek-MoE: n_shared_experts ×
    /// moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size); 0: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_intermediate_size: u64,
    /// Leading blocks of an MoE model whose MLP is dense, not routed
    /// (DeepSeek's first_k_dense_replace); 0: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dense_layers: u64,
    /// MLP width of those dense blocks (DeepSeek's intermediate_size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_intermediate_size: Option<u64>,
    /// Decoder blocks of an encoder-decoder model; default: layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_layers: Option<u64>,
    /// layernorm | rmsnorm; default: rmsnorm for gated MLPs, layernorm otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm: Option<NormKind>,
    /// Linear layers carry biases; default: false.
    #[serde(default)]
    pub bias: bool,
    /// Learned absolute position embeddings (rows); 0 for rotary.
    #[serde(default)]
    pub max_positions: u64,
    /// Attention and MLP read one normed input side by side (GPT-J, NeoX,
    /// Phi, Falcon); default: false, or the preset named by the
    /// `vramguard.io/preset-hint` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_block: Option<bool>,
    /// Extra norms after attention and after the MLP (Gemma 2); default:
    /// false, or the hinted preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_norms: Option<bool>,
    /// Attention scores are tanh soft-capped (Gemma 2), so attention runs
    /// eagerly and keeps its score matrices; default: false, or the hinted preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_softcap: Option<bool>,
    /// Logits are tanh soft-capped before the loss (Gemma 2); default: false,
    /// or the hinted preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcap: Option<bool>,
}

/// decoder | encoder | encoder-decoder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TransformerKind {
    #[default]
    Decoder,
    Encoder,
    EncoderDecoder,
}

/// gated | standard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum MlpKind {
    #[default]
    Gated,
    Standard,
}

/// layernorm | rmsnorm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    Layernorm,
    Rmsnorm,
}

/// lm | classification | none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Head {
    Lm,
    Classification,
    None,
}

/// A model known by its size alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomModel {
    /// Total parameters.
    pub parameters: f64,
    /// Bytes of activations kept for backward per sample (at this sequence length and precision).
    pub activation_bytes_per_sample: f64,
}

/// How the model is trained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!has(self.globalBatchSize) || self.globalBatchSize % self.microBatchSize == 0", "message": "globalBatchSize must be a multiple of microBatchSize (times the data-parallel ranks)"},
        {"rule": "self.mode != 'qlora' || !has(self.quantization) || self.quantization != 'none'", "message": "mode qlora needs quantized base weights (quantization nf4, nf4-double, gptq or awq)"},
        {"rule": "self.mode != 'full' || !has(self.quantization) || self.quantization == 'none'", "message": "quantized base weights cannot be trained in mode full"},
        {"rule": "!has(self.lora) || self.mode == 'lora' || self.mode == 'qlora'", "message": "lora is only used with mode lora or qlora"},
        {"rule": "!has(self.weightsLoad) || self.weightsLoad != 'fp32-cast' || (has(self.precision) && (self.precision == 'bf16' || self.precision == 'fp16'))", "message": "weightsLoad fp32-cast is only used with precision bf16 or fp16 (16-bit weights cast from an fp32 build)"},
        {"rule": "!has(self.float8) || !has(self.precision) || self.precision == 'bf16-mixed' || self.precision == 'fp16-mixed' || self.precision == 'bf16'", "message": "float8 is only used with precision bf16-mixed, fp16-mixed or bf16 (torchao casts 16-bit matmul operands to float8)"},
        {"rule": "!has(self.float8) || !has(self.quantization) || self.quantization == 'none'", "message": "float8 cannot be used with quantized base weights (Float8Linear replaces unquantized nn.Linear modules)"},
        {"rule": "!has(self.float8AllGather) || !self.float8AllGather || (has(self.float8) && self.float8 == 'tensorwise')", "message": "float8AllGather needs float8 tensorwise (torchao's float8 all-gather takes tensorwise scaling only)"}
]))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingSpec {
    #[serde(default)]
    pub mode: TrainingMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSpec>,
    /// Explicit count of trainable parameters (adapters, partial freezing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainable_parameters: Option<f64>,
    /// Base weights: none | int8 | nf4 | nf4-double | gptq | awq; default: the
    /// `quantization_config` of `model.hfConfig` when it names gptq or awq,
    /// else nf4 for qlora and none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// Bits per weight of a gptq (2, 3, 4 or 8) or awq (4) checkpoint; default
    /// 4, or `quantization_config.bits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization_bits: Option<u8>,
    /// Input rows sharing one scale and zero point in a gptq or awq checkpoint
    /// (`group_size`; -1: one group per whole row); default 128, or
    /// `quantization_config.group_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization_group_size: Option<i64>,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub micro_batch_size: u64,
    /// Optional; accumulation = global / (micro × data-parallel ranks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch_size: Option<u64>,
    /// Tokens per sample at the peak (longest padded or packed sample).
    /// Default: 2048, or the model's learned position table where it is
    /// shorter (GPT-2: 1024, BERT: 512), which no sample may pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub sequence_length: Option<u64>,
    /// Encoder-decoder models (T5, BART): tokens per target sample, which the
    /// decoder and the loss run over (`max_target_length`); `sequenceLength`
    /// is then the source's. Default: sequenceLength.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub target_length: Option<u64>,
    #[serde(default)]
    pub precision: Precision,
    /// How the weights reach the GPU: dtype | fp32-cast. `dtype` (default):
    /// created or loaded in the training dtype (`torch_dtype=`, `dtype="auto"`),
    /// or cast before the move to the GPU. `fp32-cast`, with precision bf16 or
    /// fp16 only: built or loaded at fp32 on the GPU and cast there
    /// (`from_config` under a CUDA device, or `from_pretrained(...,
    /// device_map="cuda")` without a dtype before Transformers 5, then
    /// `.to(torch.bfloat16)`); the caching allocator keeps the freed fp32
    /// blocks reserved: the range's high end adds one byte per byte of 16-bit
    /// weights (`fp32Build`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_load: Option<WeightsLoad>,
    /// torchao float8 training: tensorwise | rowwise | rowwise-with-gw-hp,
    /// torchao's `Float8LinearRecipeName`s, with which the blocks' linears
    /// become `Float8Linear` (torchtitan `--model.converters float8`). With
    /// precision bf16-mixed, fp16-mixed or bf16 and unquantized weights;
    /// absent: no float8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float8: Option<Float8Recipe>,
    /// FSDP2 all-gathers the float8 linears' weights in float8, cast on each
    /// shard before the gather (torchtitan `enable_fsdp_float8_all_gather`):
    /// the gathered blocks' linears at 1 byte per element. Needs float8
    /// tensorwise and FSDP2 full sharding.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub float8_all_gather: bool,
    #[serde(default)]
    pub optimizer: Optimizer,
    #[serde(default)]
    pub optimizer_in_backward: bool,
    #[serde(default)]
    pub gradient_checkpointing: Checkpointing,
    #[serde(default)]
    pub activation_offloading: bool,
    #[serde(default)]
    pub attention: Attention,
    #[serde(default)]
    pub loss: Loss,
    /// The model runs under `torch.compile` (TorchInductor): a dense decoder
    /// trained in full then saves the partitioner's cut for backward, not
    /// eager's set (the `compiledActivations` mechanism).
    #[serde(default)]
    pub compile: bool,
    #[serde(default)]
    pub framework: Framework,
    /// Bytes of dataset or buffers kept on the GPU.
    #[serde(default)]
    pub data_on_gpu_bytes: u64,
    /// The trainer stack that runs the job; absent: unknown, and the estimate
    /// carries an upper end over every stack's behaviour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<Stack>,
    /// The AdamW implementation, when the job sets one (overrides the stack's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_implementation: Option<OptimizerImplementation>,
    /// Checkpoint every N-th block only (torchtitan's and torchtune's
    /// `ac_option: N`); default 1: every block, under `gradientCheckpointing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub checkpoint_every: Option<u64>,
    /// The parameter-efficient method of mode `adapter` (and GaLore under mode `full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peft: Option<PeftSpec>,
    /// The PyTorch, CUDA and Transformers releases the job runs with
    /// (optional; read from the trainer image's tag where it says). They
    /// narrow the estimate's range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<crate::api::RuntimeSpec>,
    /// packed | padded | variable: how batches are shaped. Absent: unknown,
    /// and the range covers variable-length batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batching: Option<crate::api::Batching>,
    /// mode inference: what generation adds to the prompt (`sequenceLength`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationSpec>,
}

/// Generation after the prompt (mode inference): the KV cache grows past the
/// prompt's `sequenceLength` by the tokens generated, or is allocated at a
/// fixed length up front.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GenerationSpec {
    /// Tokens generated after the prompt (`max_new_tokens`).
    #[serde(default)]
    pub new_tokens: u64,
    /// A KV cache allocated at this many positions before the prompt runs
    /// (Transformers' `StaticCache` `max_cache_len`); absent: the cache grows
    /// to sequenceLength + newTokens (`DynamicCache`). At least sequenceLength + newTokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_length: Option<u64>,
}

impl Default for TrainingSpec {
    fn default() -> Self {
        TrainingSpec {
            mode: TrainingMode::default(),
            lora: None,
            trainable_parameters: None,
            quantization: None,
            quantization_bits: None,
            target_length: None,
            quantization_group_size: None,
            micro_batch_size: 1,
            global_batch_size: None,
            sequence_length: None,
            precision: Precision::default(),
            weights_load: None,
            float8: None,
            float8_all_gather: false,
            optimizer: Optimizer::default(),
            optimizer_in_backward: false,
            gradient_checkpointing: Checkpointing::default(),
            activation_offloading: false,
            attention: Attention::default(),
            loss: Loss::default(),
            compile: false,
            framework: Framework::default(),
            data_on_gpu_bytes: 0,
            stack: None,
            optimizer_implementation: None,
            checkpoint_every: None,
            peft: None,
            runtime: None,
            batching: None,
            generation: None,
        }
    }
}

fn one() -> u64 {
    1
}

/// The tokens per sample of a job that does not say, on a model whose
/// positions are not a learned table.
pub const DEFAULT_SEQUENCE_LENGTH: u64 = 2048;

impl TrainingSpec {
    /// Tokens per sample: as written, else [`DEFAULT_SEQUENCE_LENGTH`].
    /// Validation writes the length it resolved (the default shortened to
    /// a learned position table) into the spec a `ValidatedJob` holds.
    pub fn seq_len(&self) -> u64 {
        self.sequence_length.unwrap_or(DEFAULT_SEQUENCE_LENGTH)
    }
}

/// full | lora | qlora | adapter | inference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrainingMode {
    #[default]
    Full,
    Lora,
    Qlora,
    Adapter,
    Inference,
}

/// LoRA adapter shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoraSpec {
    #[serde(default = "default_lora_rank")]
    #[schemars(range(min = 1))]
    pub rank: u64,
    #[serde(default = "default_lora_alpha")]
    pub alpha: f64,
    /// Dropout on the adapter input (its mask and output are kept for backward); 0 turns it off.
    #[serde(default = "default_lora_dropout")]
    pub dropout: f64,
    /// Projections that get adapters: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj lm_head, or the model's own names for them (c_attn, query_key_value, W_pack, qkv_proj, c_proj, c_fc, fc1, fc2, dense, dense_h_to_4h, dense_4h_to_h, gate_up_proj, query, key, value, q, k, v, o, wi, wo, w1, w2, w3).
    #[serde(default = "default_target_modules")]
    pub target_modules: Vec<String>,
    /// lora | dora | rslora (rsLoRA changes the scaling only: the same memory as LoRA).
    #[serde(default)]
    pub variant: LoraVariant,
    /// Modules trained in full beside the adapters (PEFT's `modules_to_save`):
    /// embed_tokens and/or lm_head, or a model's own names for them (wte,
    /// word_embeddings, embed_in, tok_embeddings, embed_out, output).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules_to_save: Vec<String>,
}

impl Default for LoraSpec {
    fn default() -> Self {
        LoraSpec {
            rank: default_lora_rank(),
            alpha: default_lora_alpha(),
            dropout: default_lora_dropout(),
            target_modules: default_target_modules(),
            variant: LoraVariant::default(),
            modules_to_save: Vec::new(),
        }
    }
}

fn default_lora_rank() -> u64 {
    8
}

fn default_lora_alpha() -> f64 {
    16.0
}

fn default_lora_dropout() -> f64 {
    0.05
}

fn default_target_modules() -> Vec<String> {
    vec!["q_proj".into(), "v_proj".into()]
}

/// lora | dora | rslora.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoraVariant {
    #[default]
    Lora,
    Dora,
    Rslora,
}

/// hf-trainer | torchtune | torchtitan | litgpt | lightning | deepspeed | megatron | unsloth | custom.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Stack {
    /// Hugging Face Trainer, accelerate, TRL, axolotl.
    HfTrainer,
    Torchtune,
    Torchtitan,
    Litgpt,
    Lightning,
    Deepspeed,
    Megatron,
    Unsloth,
    /// A plain PyTorch training loop.
    Custom,
}

/// for-loop | foreach | fused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerImplementation {
    ForLoop,
    Foreach,
    Fused,
}

/// FSDP1 (`FullyShardedDataParallel`) or FSDP2 (`fully_shard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FsdpVersion {
    #[serde(rename = "1")]
    V1,
    #[serde(rename = "2")]
    V2,
}

/// A parameter-efficient method beyond LoRA.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeftSpec {
    pub method: PeftMethod,
    /// Virtual tokens of prompt or prefix tuning (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub virtual_tokens: Option<u64>,
    /// Rank of VeRA's shared projections or of GaLore's projection (default 256 / 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rank: Option<u64>,
    /// Projections the method adapts (IA3: k_proj v_proj down_proj; VeRA: q_proj v_proj).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_modules: Option<Vec<String>>,
    /// LLaMA-Adapter: how many of the top blocks are adapted (default: from
    /// trainableParameters, else every block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub layers: Option<u64>,
}

/// llama-adapter | ia3 | vera | prompt-tuning | prefix-tuning | ln-tuning | galore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PeftMethod {
    LlamaAdapter,
    Ia3,
    Vera,
    PromptTuning,
    PrefixTuning,
    LnTuning,
    Galore,
}

/// none | int8 | nf4 | nf4-double (bitsandbytes) | gptq | awq (pre-quantized
/// checkpoints, `quantization_config.quant_method` in the model's config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Quantization {
    #[default]
    None,
    Int8,
    Nf4,
    Nf4Double,
    Gptq,
    Awq,
}

impl Quantization {
    /// A checkpoint quantized ahead of time (GPTQ, AWQ): its bits and group
    /// size come from its `quantization_config`.
    pub fn is_prequantized(self) -> bool {
        matches!(self, Quantization::Gptq | Quantization::Awq)
    }
}

/// fp32 | tf32 | fp16-mixed | bf16-mixed | fp16 | bf16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Precision {
    #[serde(rename = "fp32")]
    Fp32,
    #[serde(rename = "tf32")]
    Tf32,
    #[serde(rename = "fp16-mixed")]
    Fp16Mixed,
    #[default]
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
    #[serde(rename = "fp16")]
    Fp16,
    #[serde(rename = "bf16")]
    Bf16,
}

/// dtype | fp32-cast.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WeightsLoad {
    // Created or loaded directly in the training dtype (`torch_dtype=`,
    // `dtype="auto"`), or cast before the move to the GPU.
    #[default]
    Dtype,
    // Built or loaded at fp32 on the GPU, then cast to 16 bits there.
    #[serde(rename = "fp32-cast")]
    Fp32Cast,
}

/// adamw | adam | sgd | sgd-momentum | adafactor | adamw-8bit | paged-adamw | paged-adamw-8bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    #[default]
    Adamw,
    Adam,
    Sgd,
    SgdMomentum,
    Adafactor,
    #[serde(rename = "adamw-8bit")]
    Adamw8bit,
    PagedAdamw,
    #[serde(rename = "paged-adamw-8bit")]
    PagedAdamw8bit,
    /// torchao's `AdamW4bit`: both moments in 4 bits per value with an fp32
    /// scale per 128-value block.
    #[serde(rename = "adamw-4bit")]
    Adamw4bit,
}

/// none | selective | op-selective | full. `selective` is Megatron's
/// (recompute the attention core and the MLP activation); `op-selective` is
/// PyTorch's op-level policy (save every other matmul and the attention output,
/// torchtitan's `selective_ac_option: op`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Checkpointing {
    #[default]
    None,
    Selective,
    OpSelective,
    Full,
}

/// eager | sdpa | flash.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    Eager,
    #[default]
    Sdpa,
    Flash,
}

/// standard | chunked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    #[default]
    Standard,
    Chunked,
}

/// pytorch | tensorflow | jax.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    #[default]
    Pytorch,
    Tensorflow,
    Jax,
}

/// What vramguard may change to make a job fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.safetyMargin >= 0.0 && self.safetyMargin < 1.0", "message": "safetyMargin must be a fraction in [0, 1)"}
]))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FitPolicy {
    /// Reject: as written or not at all | Adjust: may change what `allow` lists.
    #[serde(default)]
    pub mode: FitMode,
    #[serde(default = "default_allow")]
    pub allow: Vec<AdjustableField>,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_micro_batch_size: u64,
    /// Fraction of headroom kept on top of the estimate.
    #[serde(default = "default_safety_margin")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub safety_margin: f64,
    #[serde(default = "default_max_oom_retries")]
    pub max_oom_retries: u32,
}

impl Default for FitPolicy {
    fn default() -> Self {
        FitPolicy {
            mode: FitMode::default(),
            allow: default_allow(),
            min_micro_batch_size: 1,
            safety_margin: default_safety_margin(),
            max_oom_retries: default_max_oom_retries(),
        }
    }
}

fn default_allow() -> Vec<AdjustableField> {
    vec![
        AdjustableField::MicroBatchSize,
        AdjustableField::GradientCheckpointing,
    ]
}

fn default_safety_margin() -> f64 {
    0.05
}

fn default_max_oom_retries() -> u32 {
    3
}

/// Reject | Adjust.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FitMode {
    #[default]
    Reject,
    Adjust,
}

/// Fields the fit policy may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AdjustableField {
    MicroBatchSize,
    Precision,
    GradientCheckpointing,
    Optimizer,
    ZeroStage,
    Loss,
}

/// Serde's test for a count left out when zero.
fn is_zero(n: &u64) -> bool {
    *n == 0
}
