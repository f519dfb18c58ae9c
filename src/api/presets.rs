//! Built-in model catalog: the shapes of well-known checkpoints, so a spec can
//! say `preset: llama-3.1-8b` instead of spelling out every dimension.
//!
//! Every dimension is copied from the model's Hugging Face `config.json`
//! (named next to each entry). `published_parameters` is the parameter count
//! the model card, paper or checkpoint reports; where that count includes
//! tensors the [`Arch`] shape does not describe (a BERT pooler, Gemma 2's
//! extra norms, T5's relative-position tables, a router), the entry says so.

use super::arch::{Act, Arch, Kind, Mlp, Norm};
use families::{bert, gemma2, gpt2, neox, phi, qwen2, t5};

mod families;

/// One built-in model.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    /// Catalog name users write in `spec.model.preset`, lowercase kebab-case, e.g. "llama-3.1-8b".
    pub name: &'static str,
    /// Other accepted spellings (e.g. "meta-llama/Llama-3.1-8B", "llama3.1-8b"). May be empty.
    pub aliases: &'static [&'static str],
    /// Hugging Face repository the dimensions come from.
    pub hf_id: &'static str,
    /// Parameter count the model card / paper publishes (or the exact count of the HF checkpoint), for a test that checks our count from the dims.
    pub published_parameters: u64,
    pub arch: Arch,
}

pub const PRESETS: &[Preset] = &[
    // ---- GPT-2 ----
    // source: openai-community/gpt2/config.json
    Preset {
        name: "gpt2",
        aliases: &["openai-community/gpt2", "gpt2-small"],
        hf_id: "openai-community/gpt2",
        published_parameters: 124_439_808,
        arch: gpt2(12, 768, 12),
    },
    // source: openai-community/gpt2-medium/config.json
    Preset {
        name: "gpt2-medium",
        aliases: &["openai-community/gpt2-medium"],
        hf_id: "openai-community/gpt2-medium",
        published_parameters: 354_823_168,
        arch: gpt2(24, 1024, 16),
    },
    // source: openai-community/gpt2-large/config.json
    Preset {
        name: "gpt2-large",
        aliases: &["openai-community/gpt2-large"],
        hf_id: "openai-community/gpt2-large",
        published_parameters: 774_030_080,
        arch: gpt2(36, 1280, 20),
    },
    // source: openai-community/gpt2-xl/config.json
    Preset {
        name: "gpt2-xl",
        aliases: &["openai-community/gpt2-xl"],
        hf_id: "openai-community/gpt2-xl",
        published_parameters: 1_557_611_200,
        arch: gpt2(48, 1600, 25),
    },
    // ---- BERT / RoBERTa ----
    // source: google-bert/bert-base-uncased/config.json
    Preset {
        name: "bert-base",
        aliases: &["bert-base-uncased", "google-bert/bert-base-uncased"],
        hf_id: "google-bert/bert-base-uncased",
        // BertModel count, including the 768x768 pooler (not part of the dims).
        published_parameters: 109_482_240,
        arch: bert(12, 768, 12, 3072, 30522, 512, 2),
    },
    // source: google-bert/bert-large-uncased/config.json
    Preset {
        name: "bert-large",
        aliases: &["bert-large-uncased", "google-bert/bert-large-uncased"],
        hf_id: "google-bert/bert-large-uncased",
        // BertModel count, including the 1024x1024 pooler (not part of the dims).
        published_parameters: 335_141_888,
        arch: bert(24, 1024, 16, 4096, 30522, 512, 2),
    },
    // source: FacebookAI/roberta-base/config.json
    Preset {
        name: "roberta-base",
        aliases: &["FacebookAI/roberta-base"],
        hf_id: "FacebookAI/roberta-base",
        // RobertaModel count, including the 768x768 pooler (not part of the dims).
        published_parameters: 124_645_632,
        arch: bert(12, 768, 12, 3072, 50265, 514, 1),
    },
    // source: FacebookAI/roberta-large/config.json
    Preset {
        name: "roberta-large",
        aliases: &["FacebookAI/roberta-large"],
        hf_id: "FacebookAI/roberta-large",
        // RobertaModel count, including the 1024x1024 pooler (not part of the dims).
        published_parameters: 355_359_744,
        arch: bert(24, 1024, 16, 4096, 50265, 514, 1),
    },
    // ---- Llama 2 ----
    // source: meta-llama/Llama-2-7b-hf/config.json
    Preset {
        name: "llama-2-7b",
        aliases: &["meta-llama/Llama-2-7b-hf", "llama2-7b"],
        hf_id: "meta-llama/Llama-2-7b-hf",
        published_parameters: 6_738_415_616,
        arch: Arch::llama(32, 4096, 32, 32, 128, 11008, 32000, false),
    },
    // source: meta-llama/Llama-2-13b-hf/config.json
    Preset {
        name: "llama-2-13b",
        aliases: &["meta-llama/Llama-2-13b-hf", "llama2-13b"],
        hf_id: "meta-llama/Llama-2-13b-hf",
        published_parameters: 13_015_864_320,
        arch: Arch::llama(40, 5120, 40, 40, 128, 13824, 32000, false),
    },
    // source: meta-llama/Llama-2-70b-hf/config.json
    Preset {
        name: "llama-2-70b",
        aliases: &["meta-llama/Llama-2-70b-hf", "llama2-70b"],
        hf_id: "meta-llama/Llama-2-70b-hf",
        published_parameters: 68_976_648_192,
        arch: Arch::llama(80, 8192, 64, 8, 128, 28672, 32000, false),
    },
    // ---- Llama 3 / 3.1 / 3.2 ----
    // source: meta-llama/Meta-Llama-3-8B/config.json
    Preset {
        name: "llama-3-8b",
        aliases: &["meta-llama/Meta-Llama-3-8B", "llama3-8b"],
        hf_id: "meta-llama/Meta-Llama-3-8B",
        published_parameters: 8_030_261_248,
        arch: Arch::llama(32, 4096, 32, 8, 128, 14336, 128256, false),
    },
    // source: meta-llama/Meta-Llama-3-70B/config.json
    Preset {
        name: "llama-3-70b",
        aliases: &["meta-llama/Meta-Llama-3-70B", "llama3-70b"],
        hf_id: "meta-llama/Meta-Llama-3-70B",
        published_parameters: 70_553_706_496,
        arch: Arch::llama(80, 8192, 64, 8, 128, 28672, 128256, false),
    },
    // source: meta-llama/Llama-3.1-8B/config.json
    Preset {
        name: "llama-3.1-8b",
        aliases: &[
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Meta-Llama-3.1-8B",
            "llama3.1-8b",
        ],
        hf_id: "meta-llama/Llama-3.1-8B",
        published_parameters: 8_030_261_248,
        arch: Arch::llama(32, 4096, 32, 8, 128, 14336, 128256, false),
    },
    // source: meta-llama/Llama-3.1-70B/config.json
    Preset {
        name: "llama-3.1-70b",
        aliases: &[
            "meta-llama/Llama-3.1-70B",
            "meta-llama/Meta-Llama-3.1-70B",
            "llama3.1-70b",
        ],
        hf_id: "meta-llama/Llama-3.1-70B",
        published_parameters: 70_553_706_496,
        arch: Arch::llama(80, 8192, 64, 8, 128, 28672, 128256, false),
    },
    // source: meta-llama/Llama-3.1-405B/config.json
    Preset {
        name: "llama-3.1-405b",
        aliases: &[
            "meta-llama/Llama-3.1-405B",
            "meta-llama/Meta-Llama-3.1-405B",
            "llama3.1-405b",
        ],
        hf_id: "meta-llama/Llama-3.1-405B",
        published_parameters: 405_853_388_800,
        arch: Arch::llama(126, 16384, 128, 8, 128, 53248, 128256, false),
    },
    // source: meta-llama/Llama-3.2-1B/config.json
    Preset {
        name: "llama-3.2-1b",
        aliases: &["meta-llama/Llama-3.2-1B", "llama3.2-1b"],
        hf_id: "meta-llama/Llama-3.2-1B",
        published_parameters: 1_235_814_400,
        arch: Arch::llama(16, 2048, 32, 8, 64, 8192, 128256, true),
    },
    // source: meta-llama/Llama-3.2-3B/config.json
    Preset {
        name: "llama-3.2-3b",
        aliases: &["meta-llama/Llama-3.2-3B", "llama3.2-3b"],
        hf_id: "meta-llama/Llama-3.2-3B",
        published_parameters: 3_212_749_824,
        arch: Arch::llama(28, 3072, 24, 8, 128, 8192, 128256, true),
    },
    // source: meta-llama/Llama-3.3-70B-Instruct/config.json (the Llama 3.1 70B shape)
    Preset {
        name: "llama-3.3-70b",
        aliases: &["meta-llama/Llama-3.3-70B-Instruct", "llama3.3-70b"],
        hf_id: "meta-llama/Llama-3.3-70B-Instruct",
        published_parameters: 70_553_706_496,
        arch: Arch::llama(80, 8192, 64, 8, 128, 28672, 128256, false),
    },
    // ---- Mistral / Mixtral ----
    // source: mistralai/Mistral-7B-v0.1/config.json
    Preset {
        name: "mistral-7b",
        aliases: &["mistralai/Mistral-7B-v0.1", "mistral-7b-v0.1"],
        hf_id: "mistralai/Mistral-7B-v0.1",
        published_parameters: 7_241_732_096,
        arch: Arch::llama(32, 4096, 32, 8, 128, 14336, 32000, false),
    },
    // source: mistralai/Mistral-7B-Instruct-v0.2/config.json
    Preset {
        name: "mistral-7b-v0.2",
        aliases: &[
            "mistral-7b-instruct-v0.2",
            "mistralai/Mistral-7B-Instruct-v0.2",
        ],
        hf_id: "mistralai/Mistral-7B-Instruct-v0.2",
        published_parameters: 7_241_732_096,
        arch: Arch::llama(32, 4096, 32, 8, 128, 14336, 32000, false),
    },
    // source: mistralai/Mistral-7B-v0.3/config.json
    Preset {
        name: "mistral-7b-v0.3",
        aliases: &["mistralai/Mistral-7B-v0.3"],
        hf_id: "mistralai/Mistral-7B-v0.3",
        published_parameters: 7_248_023_552,
        arch: Arch::llama(32, 4096, 32, 8, 128, 14336, 32768, false),
    },
    // source: mistralai/Mixtral-8x7B-v0.1/config.json
    Preset {
        name: "mixtral-8x7b",
        aliases: &["mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b-v0.1"],
        hf_id: "mistralai/Mixtral-8x7B-v0.1",
        // Includes the per-layer router (8 x 4096 per layer).
        published_parameters: 46_702_792_704,
        arch: Arch {
            experts: 8,
            experts_per_token: 2,
            ..Arch::llama(32, 4096, 32, 8, 128, 14336, 32000, false)
        },
    },
    // ---- MoE with shared experts ----
    // source: deepseek-ai/deepseek-moe-16b-base/config.json (model_type deepseek: 64 routed
    // experts of 1408, 6 per token, 2 shared experts of 1408 in one MLP, the first block
    // dense with 10944; multi-head attention, not the latent attention of DeepSeek-V2/V3)
    Preset {
        name: "deepseek-moe-16b",
        aliases: &[
            "deepseek-ai/deepseek-moe-16b-base",
            "deepseek-ai/deepseek-moe-16b-chat",
        ],
        hf_id: "deepseek-ai/deepseek-moe-16b-base",
        // Model card: 16.4B.
        published_parameters: 16_400_000_000,
        arch: Arch {
            experts: 64,
            experts_per_token: 6,
            shared_intermediate: 2 * 1408,
            dense_layers: 1,
            dense_intermediate: 10944,
            ..Arch::llama(28, 2048, 16, 16, 128, 1408, 102400, false)
        },
    },
    // source: Qwen/Qwen1.5-MoE-A2.7B/config.json (model_type qwen2_moe: 60 routed experts
    // of 1408, 4 per token, one shared expert of 5632 whose 1-wide gate is not counted)
    Preset {
        name: "qwen1.5-moe-a2.7b",
        aliases: &["Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen1.5-MoE-A2.7B-Chat"],
        hf_id: "Qwen/Qwen1.5-MoE-A2.7B",
        // Model card: 14.3B in all, 2.7B activated.
        published_parameters: 14_300_000_000,
        arch: Arch {
            experts: 60,
            experts_per_token: 4,
            shared_intermediate: 5632,
            ..qwen2(24, 2048, 16, 16, 1408, 151936, false)
        },
    },
    // ---- Qwen2.5 ----
    // source: Qwen/Qwen2.5-0.5B/config.json
    Preset {
        name: "qwen2.5-0.5b",
        aliases: &["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct"],
        hf_id: "Qwen/Qwen2.5-0.5B",
        published_parameters: 494_032_768,
        arch: qwen2(24, 896, 14, 2, 4864, 151936, true),
    },
    // source: Qwen/Qwen2.5-1.5B/config.json
    Preset {
        name: "qwen2.5-1.5b",
        aliases: &["Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct"],
        hf_id: "Qwen/Qwen2.5-1.5B",
        published_parameters: 1_543_714_304,
        arch: qwen2(28, 1536, 12, 2, 8960, 151936, true),
    },
    // source: Qwen/Qwen2.5-3B/config.json
    Preset {
        name: "qwen2.5-3b",
        aliases: &["Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-3B-Instruct"],
        hf_id: "Qwen/Qwen2.5-3B",
        published_parameters: 3_085_938_688,
        arch: qwen2(36, 2048, 16, 2, 11008, 151936, true),
    },
    // source: Qwen/Qwen2.5-7B/config.json
    Preset {
        name: "qwen2.5-7b",
        aliases: &["Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"],
        hf_id: "Qwen/Qwen2.5-7B",
        published_parameters: 7_615_616_512,
        arch: qwen2(28, 3584, 28, 4, 18944, 152064, false),
    },
    // source: Qwen/Qwen2.5-14B/config.json
    Preset {
        name: "qwen2.5-14b",
        aliases: &["Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-14B-Instruct"],
        hf_id: "Qwen/Qwen2.5-14B",
        published_parameters: 14_770_033_664,
        arch: qwen2(48, 5120, 40, 8, 13824, 152064, false),
    },
    // source: Qwen/Qwen2.5-32B/config.json
    Preset {
        name: "qwen2.5-32b",
        aliases: &["Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct"],
        hf_id: "Qwen/Qwen2.5-32B",
        published_parameters: 32_763_876_352,
        arch: qwen2(64, 5120, 40, 8, 27648, 152064, false),
    },
    // source: Qwen/Qwen2.5-72B/config.json
    Preset {
        name: "qwen2.5-72b",
        aliases: &["Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"],
        hf_id: "Qwen/Qwen2.5-72B",
        published_parameters: 72_706_203_648,
        arch: qwen2(80, 8192, 64, 8, 29568, 152064, false),
    },
    // ---- Gemma / Gemma 2 ----
    // source: google/gemma-2b/config.json
    Preset {
        name: "gemma-2b",
        aliases: &["google/gemma-2b"],
        hf_id: "google/gemma-2b",
        published_parameters: 2_506_172_416,
        arch: Arch::llama(18, 2048, 8, 1, 256, 16384, 256000, true),
    },
    // source: google/gemma-7b/config.json
    Preset {
        name: "gemma-7b",
        aliases: &["google/gemma-7b"],
        hf_id: "google/gemma-7b",
        published_parameters: 8_537_680_896,
        arch: Arch::llama(28, 3072, 16, 16, 256, 24576, 256000, true),
    },
    // source: google/gemma-2-2b/config.json
    Preset {
        name: "gemma-2-2b",
        aliases: &["google/gemma-2-2b", "gemma2-2b"],
        hf_id: "google/gemma-2-2b",
        // Includes Gemma 2's post-attention and post-MLP norms (2 x 2304 per layer).
        published_parameters: 2_614_341_888,
        arch: gemma2(Arch::llama(26, 2304, 8, 4, 256, 9216, 256000, true)),
    },
    // source: google/gemma-2-9b/config.json
    Preset {
        name: "gemma-2-9b",
        aliases: &["google/gemma-2-9b", "gemma2-9b"],
        hf_id: "google/gemma-2-9b",
        // Includes Gemma 2's post-attention and post-MLP norms (2 x 3584 per layer).
        published_parameters: 9_241_705_984,
        arch: gemma2(Arch::llama(42, 3584, 16, 8, 256, 14336, 256000, true)),
    },
    // source: google/gemma-2-27b/config.json
    Preset {
        name: "gemma-2-27b",
        aliases: &["google/gemma-2-27b", "gemma2-27b"],
        hf_id: "google/gemma-2-27b",
        // Includes Gemma 2's post-attention and post-MLP norms (2 x 4608 per layer).
        published_parameters: 27_227_128_320,
        arch: gemma2(Arch::llama(46, 4608, 32, 16, 128, 36864, 256000, true)),
    },
    // source: mistralai/Mistral-Nemo-Base-2407/config.json
    Preset {
        name: "mistral-nemo-12b",
        aliases: &["mistralai/Mistral-Nemo-Base-2407", "mistral-nemo"],
        hf_id: "mistralai/Mistral-Nemo-Base-2407",
        // Model card: 12.2B.
        published_parameters: 12_200_000_000,
        arch: Arch::llama(40, 5120, 32, 8, 128, 14336, 131072, false),
    },
    // source: mistralai/Mistral-Small-24B-Base-2501/config.json
    Preset {
        name: "mistral-small-24b",
        aliases: &["mistralai/Mistral-Small-24B-Base-2501", "mistral-small"],
        hf_id: "mistralai/Mistral-Small-24B-Base-2501",
        // The checkpoint's count on its Hugging Face page: 23.6B.
        published_parameters: 23_600_000_000,
        arch: Arch::llama(40, 5120, 32, 8, 128, 32768, 131072, false),
    },
    // ---- Qwen3 (no QKV bias; a norm on queries and keys, head_dim weights per layer, not counted) ----
    // source: Qwen/Qwen3-4B/config.json
    Preset {
        name: "qwen3-4b",
        aliases: &["Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Base"],
        hf_id: "Qwen/Qwen3-4B",
        // Model card: 4.0B.
        published_parameters: 4_000_000_000,
        arch: Arch::llama(36, 2560, 32, 8, 128, 9728, 151936, true),
    },
    // source: Qwen/Qwen3-8B/config.json
    Preset {
        name: "qwen3-8b",
        aliases: &["Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"],
        hf_id: "Qwen/Qwen3-8B",
        // Model card: 8.2B.
        published_parameters: 8_200_000_000,
        arch: Arch::llama(36, 4096, 32, 8, 128, 12288, 151936, false),
    },
    // source: Qwen/Qwen3-32B/config.json
    Preset {
        name: "qwen3-32b",
        aliases: &["Qwen/Qwen3-32B"],
        hf_id: "Qwen/Qwen3-32B",
        // Model card: 32.8B.
        published_parameters: 32_800_000_000,
        arch: Arch::llama(64, 5120, 64, 8, 128, 25600, 151936, false),
    },
    // source: Qwen/Qwen3-30B-A3B/config.json (128 routed experts of width 768, 8 per token)
    Preset {
        name: "qwen3-30b-a3b",
        aliases: &["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"],
        hf_id: "Qwen/Qwen3-30B-A3B",
        // Model card: 30.5B in all, 3.3B activated.
        published_parameters: 30_500_000_000,
        arch: Arch {
            experts: 128,
            experts_per_token: 8,
            ..Arch::llama(48, 2048, 32, 4, 128, 768, 151936, false)
        },
    },
    // ---- Gemma 3 (text) ----
    // source: google/gemma-3-1b-pt/config.json (model_type gemma3_text: Gemma 2's extra
    // norms, no soft-capping, a query/key norm not counted; sliding-window layers hold
    // the same weights)
    Preset {
        name: "gemma-3-1b",
        aliases: &["google/gemma-3-1b-pt", "google/gemma-3-1b-it", "gemma3-1b"],
        hf_id: "google/gemma-3-1b-pt",
        // Model card: 1B.
        published_parameters: 1_000_000_000,
        arch: Arch {
            post_norms: true,
            ..Arch::llama(26, 1152, 4, 1, 256, 6912, 262144, true)
        },
    },
    // ---- Phi ----
    // source: microsoft/phi-1_5/config.json
    Preset {
        name: "phi-1.5",
        aliases: &["microsoft/phi-1_5", "phi-1_5"],
        hf_id: "microsoft/phi-1_5",
        // Includes the lm_head bias (51200).
        published_parameters: 1_418_270_720,
        arch: phi(24, 2048, 32, 8192),
    },
    // source: microsoft/phi-2/config.json
    Preset {
        name: "phi-2",
        aliases: &["microsoft/phi-2"],
        hf_id: "microsoft/phi-2",
        // Includes the lm_head bias (51200).
        published_parameters: 2_779_683_840,
        arch: phi(32, 2560, 32, 10240),
    },
    // source: microsoft/Phi-3-mini-4k-instruct/config.json
    Preset {
        name: "phi-3-mini",
        aliases: &[
            "microsoft/Phi-3-mini-4k-instruct",
            "phi-3-mini-4k",
            "phi-3-mini-4k-instruct",
        ],
        hf_id: "microsoft/Phi-3-mini-4k-instruct",
        published_parameters: 3_821_079_552,
        arch: Arch::llama(32, 3072, 32, 32, 96, 8192, 32064, false),
    },
    // source: microsoft/phi-4/config.json (model_type phi3: fused qkv and gate_up
    // projections, the same weights as separate ones)
    Preset {
        name: "phi-4",
        aliases: &["microsoft/phi-4"],
        hf_id: "microsoft/phi-4",
        // Model card: 14B; the checkpoint's count on its Hugging Face page: 14.7B.
        published_parameters: 14_700_000_000,
        arch: Arch::llama(40, 5120, 40, 10, 128, 17920, 100352, false),
    },
    // ---- Falcon ----
    // source: tiiuae/falcon-7b/config.json
    // multi_query: one shared K/V head; parallel_attn with a single input
    // LayerNorm; bias: false; no tie_word_embeddings key, so the head is tied
    // to word_embeddings (the config default).
    Preset {
        name: "falcon-7b",
        aliases: &["tiiuae/falcon-7b"],
        hf_id: "tiiuae/falcon-7b",
        // Unique parameters with the head tied to the embedding.
        published_parameters: 6_921_720_704,
        arch: Arch {
            kind: Kind::Decoder,
            layers: 32,
            decoder_layers: 0,
            hidden: 4544,
            heads: 71,
            kv_heads: 1,
            head_dim: 64,
            intermediate: 18176,
            vocab: 65024,
            mlp: Mlp::Standard,
            act: Act::Fused,
            tied: true,
            experts: 0,
            experts_per_token: 0,
            norm: Norm::LayerNorm,
            qkv_bias: false,
            linear_bias: false,
            max_positions: 0,
            type_vocab: 0,
            parallel_block: true,
            post_norms: false,
            attention_softcap: false,
            final_softcap: false,
            shared_intermediate: 0,
            dense_layers: 0,
            dense_intermediate: 0,
        },
    },
    // ---- StableLM ----
    // source: stabilityai/stablelm-3b-4e1t/config.json
    // Llama-like gated MLP and rotary positions, but LayerNorm (with bias);
    // use_qkv_bias: false.
    Preset {
        name: "stablelm-3b",
        aliases: &["stabilityai/stablelm-3b-4e1t", "stablelm-3b-4e1t"],
        hf_id: "stabilityai/stablelm-3b-4e1t",
        published_parameters: 2_795_443_200,
        arch: Arch {
            norm: Norm::LayerNorm,
            ..Arch::llama(32, 2560, 32, 32, 80, 6912, 50304, false)
        },
    },
    // source: stabilityai/stablelm-base-alpha-3b/config.json
    // GPT-NeoX layout: parallel residual (attention and MLP both read the
    // block input), LayerNorm, biases, untied head.
    Preset {
        name: "stablelm-base-alpha-3b",
        aliases: &["stabilityai/stablelm-base-alpha-3b", "stablelm-alpha-3b"],
        hf_id: "stabilityai/stablelm-base-alpha-3b",
        // Counted from the config's dims (the card says "3B"): two
        // LayerNorms per block as in the checkpoint, which this shape counts once.
        published_parameters: 3_637_321_728,
        arch: neox(16, 4096, 32, 50688),
    },
    // ---- TinyLlama ----
    // source: TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T/config.json
    Preset {
        name: "tinyllama-1.1b",
        aliases: &[
            "tinyllama",
            "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
            "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        ],
        hf_id: "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
        published_parameters: 1_100_048_384,
        arch: Arch::llama(22, 2048, 32, 4, 64, 5632, 32000, false),
    },
    // ---- T5 v1.0 ----
    // source: google-t5/t5-small/config.json
    Preset {
        name: "t5-small",
        aliases: &["google-t5/t5-small"],
        hf_id: "google-t5/t5-small",
        // Includes the relative-position bias tables (32 buckets x heads, per stack).
        published_parameters: 60_506_624,
        arch: t5(6, 512, 8, 2048),
    },
    // source: google-t5/t5-base/config.json
    Preset {
        name: "t5-base",
        aliases: &["google-t5/t5-base"],
        hf_id: "google-t5/t5-base",
        // Includes the relative-position bias tables (32 buckets x heads, per stack).
        published_parameters: 222_903_552,
        arch: t5(12, 768, 12, 3072),
    },
    // source: google-t5/t5-large/config.json
    Preset {
        name: "t5-large",
        aliases: &["google-t5/t5-large"],
        hf_id: "google-t5/t5-large",
        // Includes the relative-position bias tables (32 buckets x heads, per stack).
        published_parameters: 737_668_096,
        arch: t5(24, 1024, 16, 4096),
    },
    // ---- GPT-NeoX / Pythia ----
    // The counts below (GPT-NeoX-20B paper, Pythia paper table) include two
    // LayerNorms per block: NeoX's parallel residual normalises the attention
    // and MLP inputs separately.
    // source: EleutherAI/gpt-neox-20b/config.json
    Preset {
        name: "gpt-neox-20b",
        aliases: &["EleutherAI/gpt-neox-20b"],
        hf_id: "EleutherAI/gpt-neox-20b",
        published_parameters: 20_554_567_680,
        arch: neox(44, 6144, 64, 50432),
    },
    // source: EleutherAI/pythia-160m/config.json
    Preset {
        name: "pythia-160m",
        aliases: &["EleutherAI/pythia-160m"],
        hf_id: "EleutherAI/pythia-160m",
        published_parameters: 162_322_944,
        arch: neox(12, 768, 12, 50304),
    },
    // source: EleutherAI/pythia-410m/config.json
    Preset {
        name: "pythia-410m",
        aliases: &["EleutherAI/pythia-410m"],
        hf_id: "EleutherAI/pythia-410m",
        published_parameters: 405_334_016,
        arch: neox(24, 1024, 16, 50304),
    },
    // source: EleutherAI/pythia-1b/config.json
    Preset {
        name: "pythia-1b",
        aliases: &["EleutherAI/pythia-1b"],
        hf_id: "EleutherAI/pythia-1b",
        published_parameters: 1_011_781_632,
        arch: neox(16, 2048, 8, 50304),
    },
    // source: EleutherAI/pythia-1.4b/config.json
    Preset {
        name: "pythia-1.4b",
        aliases: &["EleutherAI/pythia-1.4b"],
        hf_id: "EleutherAI/pythia-1.4b",
        published_parameters: 1_414_647_808,
        arch: neox(24, 2048, 16, 50304),
    },
    // source: EleutherAI/pythia-2.8b/config.json
    Preset {
        name: "pythia-2.8b",
        aliases: &["EleutherAI/pythia-2.8b"],
        hf_id: "EleutherAI/pythia-2.8b",
        published_parameters: 2_775_208_960,
        arch: neox(32, 2560, 32, 50304),
    },
    // source: EleutherAI/pythia-6.9b/config.json
    Preset {
        name: "pythia-6.9b",
        aliases: &["EleutherAI/pythia-6.9b"],
        hf_id: "EleutherAI/pythia-6.9b",
        published_parameters: 6_857_302_016,
        arch: neox(32, 4096, 32, 50432),
    },
    // source: EleutherAI/pythia-12b/config.json
    Preset {
        name: "pythia-12b",
        aliases: &["EleutherAI/pythia-12b"],
        hf_id: "EleutherAI/pythia-12b",
        published_parameters: 11_846_072_320,
        arch: neox(36, 5120, 40, 50688),
    },
];

/// Do two catalog spellings name the same model? Case, and the separators
/// people write or leave out (`resnet50`, `ResNet-50`, `resnet_50`,
/// `vit-b/16`), do not count; dots do (`llama-3.1` is not `llama-31`).
pub fn same_name(a: &str, b: &str) -> bool {
    let key = |s: &str| {
        s.trim()
            .chars()
            .filter(|c| !matches!(c, '-' | '_' | ' ' | '/'))
            .map(|c| c.to_ascii_lowercase())
            .collect::<String>()
    };
    key(a) == key(b)
}

/// Look a preset up by name or alias, case- and separator-insensitively.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS
        .iter()
        .find(|p| same_name(p.name, name) || p.aliases.iter().any(|a| same_name(a, name)))
}

/// All catalog names, for error messages.
pub fn names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|p| p.name)
}

#[cfg(test)]
mod tests;
