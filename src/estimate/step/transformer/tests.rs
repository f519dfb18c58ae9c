//! The parts of a transformer stage, each called on its own.

use super::*;
use crate::api::{ResolvedModel, test_job as job};
use crate::estimate::bounds::{End, Mechanism};
use crate::estimate::{gpus, stacks};

const POINT: Ends = Ends::all(End::Point);

fn arch(j: &ValidatedJob) -> Arch {
    match &j.model {
        ResolvedModel::Transformer(a) => *a,
        _ => panic!("the test job is a transformer"),
    }
}

/// The stack profile the estimator tries first for `j`.
fn profile(j: &ValidatedJob) -> Profile {
    stacks::profiles(j)[0]
}

/// `f` over the one-stage setting of `j` at `ends` under `profile`.
fn with<T>(j: &ValidatedJob, profile: &Profile, ends: &Ends, f: impl FnOnce(&Setting) -> T) -> T {
    let a = arch(j);
    let gpu = gpus::find("h100-80gb").expect("h100-80gb is in the catalog");
    f(&Setting::new(j, gpu, &a, true, true, profile, ends))
}

#[test]
fn deepspeed_zero3_keeps_the_head_and_prefetches_a_module() {
    // Llama-3-8B's head (128256 x 4096 = 5.25e8 elements) is the only module
    // kept from forward into backward (1e9 reuse distance); backward's first
    // prefetch takes the last block's down projection whole (5.9e7 elements,
    // DeepSpeed's 5e7 bucket). Not FSDP's two whole blocks.
    let j = job(
        "model: {preset: llama-3-8b}\nparallelism: {gpus: 8, strategy: deepspeed, zeroStage: 3}\n",
    );
    let p = profile(&j);
    let (h, vocab, ff) = (4096.0, 128256.0, 14336.0);
    with(&j, &p, &POINT, |st| {
        let w = weights::weights(st);
        assert_eq!(w.weight_transient, (vocab * h + ff * h) * st.elem);
        assert_ne!(w.weight_transient, 2.0 * st.block_gathered);
    });
    // The low end: nothing prefetched yet, the head alone (the embedding,
    // gathered at backward's end, is as large).
    let low = Ends::point_but(Mechanism::ShardGather, End::Low);
    with(&j, &p, &low, |st| {
        assert_eq!(weights::weights(st).weight_transient, vocab * h * st.elem);
    });
}

#[test]
fn zero3_gathers_two_blocks_at_the_point_and_three_at_the_high_end() {
    let j =
        job("model: {preset: llama-3-8b}\nparallelism: {gpus: 8, strategy: fsdp, zeroStage: 3}\n");
    let p = Profile {
        unsharded_stage_under_pp: false,
        frozen_units_stay_unsharded: false,
        ..profile(&j)
    };
    let stored = with(&j, &p, &POINT, |st| {
        let w = weights::weights(st);
        assert_eq!(w.weight_transient, 2.0 * st.block_gathered);
        // No autocast casts under ZeRO-3: the gathered blocks are the copies.
        assert_eq!(w.casts, 0.0);
        w.weights
    });
    let high = Ends::point_but(Mechanism::ShardGather, End::High);
    with(&j, &p, &high, |st| {
        let w = weights::weights(st);
        assert_eq!(w.weight_transient, 3.0 * st.block_gathered);
        assert_eq!(w.weights, stored);
    });
    // Unsharded, the same model stores eight times as much.
    let one = job("model: {preset: llama-3-8b}\n");
    let whole = with(&one, &profile(&one), &POINT, |st| {
        weights::weights(st).weights
    });
    assert_eq!(whole, stored * 8.0);
}

#[test]
fn a_prefix_adapter_keeps_activations_in_its_adapted_blocks_only() {
    let layered = job(
        "model: {preset: llama-3-8b}\ntraining: {mode: adapter, peft: {method: llama-adapter, layers: 8}}\n",
    );
    with(&layered, &profile(&layered), &POINT, |st| {
        let ctx = saved::act_context(st);
        assert_eq!(saved::kept_encoder_blocks(st, &ctx, 32.0), 8.0);
    });
    // Trained norms and linear scales (LLaMA-Adapter v2): every block keeps its
    // tensors, as LoRA's do.
    let v2 = job(
        "model: {preset: llama-3-8b}\ntraining: {mode: adapter, trainableParameters: 50000000}\n",
    );
    with(&v2, &profile(&v2), &POINT, |st| {
        let ctx = saved::act_context(st);
        assert!(ctx.scaled_linears);
        assert_eq!(saved::kept_encoder_blocks(st, &ctx, 32.0), 32.0);
    });
    let lora = job("model: {preset: llama-3-8b}\ntraining: {mode: lora}\n");
    with(&lora, &profile(&lora), &POINT, |st| {
        let ctx = saved::act_context(st);
        assert_eq!(saved::kept_encoder_blocks(st, &ctx, 32.0), 32.0);
    });
}

#[test]
fn pipeline_schedules_keep_their_micro_batches_in_flight() {
    let held = |st: &Setting| saved::pipeline_in_flight(st).held;
    let spec = |schedule: &str| {
        job(&format!(
            "model: {{preset: llama-3-8b}}\ntraining: {{globalBatchSize: 64}}\nparallelism: {{gpus: 16, strategy: megatron, tensorParallel: 2, pipelineParallel: 4, pipelineSchedule: {schedule}}}\n",
        ))
    };
    // 64 samples over 2 data-parallel ranks at micro-batch 1: 32 micro-batches.
    let gpipe = spec("gpipe");
    assert_eq!(with(&gpipe, &profile(&gpipe), &POINT, held), 32.0);
    let one_f_one_b = spec("1f1b");
    assert_eq!(
        with(&one_f_one_b, &profile(&one_f_one_b), &POINT, held),
        4.0
    );
}

/// Llama-3-8B on 4 pipeline ranks of 2 data-parallel ranks, 16 samples a
/// step at micro-batch 1: 8 micro-batches per pipeline.
fn pipelined(schedule: &str, virtual_stages: u64) -> ValidatedJob {
    job(&format!(
        "model: {{preset: llama-3-8b}}\ntraining: {{globalBatchSize: 16}}\nparallelism: {{gpus: 8, pipelineParallel: 4, pipelineSchedule: {schedule}, virtualStages: {virtual_stages}}}\n",
    ))
}

#[test]
fn zero_bubble_last_rank_keeps_split_micro_batches_and_their_output_gradients() {
    let gpu = gpus::find("h100-80gb").expect("h100-80gb is in the catalog");
    // (micro-batches held, activations, bytes of one logits gradient, of
    // one micro-batch's linear output gradients) on the last rank.
    let last = |j: &ValidatedJob, ends: &Ends| {
        let (a, p) = (arch(j), profile(j));
        let st = Setting::new(j, gpu, &a, false, true, &p, ends);
        let w = weights::weights(&st);
        let ctx = saved::act_context(&st);
        let logit_grad = st.tokens * st.vocab_rank * st.elem;
        // q 4096 + k, v 1024 each + o 4096 + gate, up 14336 each + down
        // 4096 elements per token, in each of the rank's 8 blocks.
        let output_grads = 43008.0 * st.tokens * st.elem * 8.0;
        (
            saved::pipeline_in_flight(&st).held,
            saved::saved(&st, &w, &ctx).activations,
            logit_grad,
            output_grads,
        )
    };
    let (one, plain, _, _) = last(&pipelined("1f1b", 1), &POINT);
    assert_eq!(one, 1.0);
    // ZB-H1's last rank defers its first weight passes: 4 micro-batches
    // held (8 pairs of 2 virtual stages), 4 pairs between I and W, 3 more
    // logits gradients than the head's own.
    let zb = pipelined("interleaved-zero-bubble", 2);
    let (held, point, logit_grad, output_grads) = last(&zb, &POINT);
    assert_eq!(held, 4.0);
    let expected = 4.0 * plain + 2.0 * output_grads + 3.0 * logit_grad;
    assert!(
        (point - expected).abs() < 1e-6 * expected,
        "{point} against {expected}"
    );
    // The low end keeps only the linears' inputs of the split ones.
    let (_, low, _, _) = last(&zb, &Ends::point_but(Mechanism::SplitBackward, End::Low));
    assert!(low < point && low > 2.0 * plain, "{low} {point}");
    // Schedules without the split hold no output gradients.
    let (held, dual, _, _) = last(&pipelined("dualpipev", 2), &POINT);
    assert_eq!(held, 4.5);
    assert_eq!(dual, 4.5 * plain);
}

#[test]
fn a_v_schedule_puts_the_embedding_and_the_head_on_rank_0() {
    let gpu = gpus::find("h100-80gb").expect("h100-80gb is in the catalog");
    let stages = |j: &ValidatedJob| {
        crate::estimate::step::StepModel::candidates(j, gpu, &profile(j), &POINT)
            .into_iter()
            .map(|m| m.stage)
            .collect::<Vec<_>>()
    };
    let v = stages(&pipelined("zbv-zero-bubble", 2));
    let plain = stages(&pipelined("1f1b", 1));
    // Rank 0: the head's logits and both the embedding's and the head's
    // weights (Llama-3-8B's are untied); rank p − 1: neither.
    assert!(v[0].logits_forward > 0.0);
    assert_eq!(v[0].logits_forward, plain[1].logits_forward);
    assert_eq!(v[1].logits_forward, 0.0);
    let head = 128256.0 * 4096.0;
    assert!(v[0].weights > plain[0].weights + head);
    assert!(v[1].weights < plain[0].weights);
}

#[test]
fn the_loss_keeps_three_fp32_planes_beyond_the_held_logits() {
    let j = job("model: {preset: llama-3-8b}\ntraining: {sequenceLength: 1024}\n");
    with(&j, &profile(&j), &POINT, |st| {
        let l = head::logits(st, st.tokens);
        let plane = st.tokens * st.vocab_rank;
        assert_eq!(l.logit_tokens, 1024.0);
        assert_eq!(l.backward - l.kept, 12.0 * plane);
        assert!(l.forward > l.kept);
    });
    // A stage without the head has no logits.
    let a = arch(&j);
    let gpu = gpus::find("h100-80gb").expect("h100-80gb is in the catalog");
    let p = profile(&j);
    let first = Setting::new(&j, gpu, &a, true, false, &p, &POINT);
    let l = head::logits(&first, first.tokens);
    assert_eq!((l.forward, l.backward, l.kept), (0.0, 0.0, 0.0));
}

#[test]
fn generation_holds_the_cache_at_its_full_length_for_the_last_token() {
    let j = job(
        "model: {preset: llama-3-8b}\ntraining: {mode: inference, sequenceLength: 1000, generation: {newTokens: 24}}\n",
    );
    with(&j, &profile(&j), &POINT, |st| {
        let d = inference::decode(st, 32.0);
        // Llama-3-8B: 8 KV heads of 128 at 2 bytes, K and V, 32 blocks.
        let per_position = 32.0 * 2.0 * 8.0 * 128.0 * 2.0;
        assert_eq!(d.kv_cache, per_position * 1000.0);
        assert_eq!(d.kv_decode, per_position * 1024.0);
        assert_eq!(d.decode_temp, per_position / 32.0 / 2.0 * 1024.0);
    });
    let training = job("model: {preset: llama-3-8b}\n");
    with(&training, &profile(&training), &POINT, |st| {
        assert_eq!(inference::decode(st, 32.0), inference::Decode::default());
    });
}

#[test]
fn a_weight_gradient_is_kept_as_made_and_only_autocast_adds_its_16_bit_copy() {
    // Llama-3-8B's untied head, 128256 x 4096: the largest matrix.
    let (h, vocab, ff) = (4096.0, 128256.0, 14336.0);
    let head_temp = |spec: &str| {
        let j = job(spec);
        with(&j, &profile(&j), &POINT, |st| {
            let ctx = saved::act_context(st);
            let t = saved::temporaries(st, &ctx, 0.0);
            let block = t.backward
                - st.tokens
                    * st.elem
                    * bounds::backward_temporaries(st.ends, st.i_width, st.h, 0.0);
            (t.head, block)
        })
    };
    // fp32: the matmul's output is the gradient AccumulateGrad keeps.
    let (head, block) = head_temp("model: {preset: llama-3-8b}\ntraining: {precision: fp32}\n");
    assert_eq!((head, block), (0.0, 0.0));
    // Autocast: the 16-bit gradient of the cast beside its fp32 copy; a
    // block's largest matrix's is a transient, the head's takes the place of
    // the head's cast, which its matmul's backward has released.
    let (head, block) =
        head_temp("model: {preset: llama-3-8b}\ntraining: {precision: bf16-mixed}\n");
    assert_eq!(head, 0.0);
    assert_eq!(block, ff * h * 2.0);
    // Accumulating micro-batches: the new fp32 gradient is added into `.grad`.
    let (head, _) = head_temp(
        "model: {preset: llama-3-8b}\ntraining: {precision: bf16-mixed, globalBatchSize: 2}\n",
    );
    assert_eq!(head, vocab * h * 4.0);
}

#[test]
fn an_untied_embedding_gradient_comes_last_and_a_tied_one_is_summed_into_the_heads() {
    let ends = |spec: &str| {
        let j = job(spec);
        with(&j, &profile(&j), &POINT, |st| {
            let w = weights::weights(st);
            let g = states::gradients(st, &w);
            (w.embedding * 4.0, g.grads_after_blocks, g.tail_temp)
        })
    };
    // Untied (Llama-3-8B): not live while the first block runs backward.
    let (embedding, after, tail) = ends("model: {preset: llama-3-8b}\n");
    assert_eq!((after, tail), (embedding, 0.0));
    // Tied (Llama-3.2-1B): the head's gradient waits for it, and the new
    // one is a transient until it is added in.
    let (embedding, after, tail) = ends("model: {preset: llama-3.2-1b}\n");
    assert_eq!((after, tail), (0.0, embedding));
    // Under ZeRO the largest matrix's gradient stays counted, as before.
    let (_, after, tail) =
        ends("model: {preset: llama-3-8b}\nparallelism: {gpus: 8, strategy: fsdp, zeroStage: 3}\n");
    assert_eq!(after, 0.0);
    assert!(tail > 0.0);
}

#[test]
fn only_tensors_of_ten_mib_or_more_get_a_rounded_segment_of_their_own() {
    let counts = |spec: &str| {
        let j = job(spec);
        let p = profile(&j);
        let gpu = gpus::find("h100-80gb").expect("h100-80gb is in the catalog");
        let s = transformer_stage(&j, gpu, &arch(&j), true, true, &p, &POINT);
        (s.large_tensors, s.own_segment_tensors)
    };
    // BERT-base: 768 x 3072 is 9 MiB in fp32, every block's tensor shares a
    // 20 MiB segment.
    let (counted, own) = counts("model: {preset: bert-base}\ntraining: {precision: fp32}\n");
    assert!(counted > 0.0);
    assert_eq!(own, 0.0);
    // Llama-3-8B in fp32 with AdamW: q, o (64 MiB) k, v (16 MiB) and the
    // three MLP matrices (224 MiB), in five copies, in each of 32 blocks.
    let (counted, own) = counts("model: {preset: llama-3-8b}\ntraining: {precision: fp32}\n");
    assert_eq!(own, 32.0 * 7.0 * 5.0);
    assert!(own <= counted);
}

/// Llama-3-8B: one block's linears (q and o 4096², k and v 4096 x 1024,
/// gate, up and down 4096 x 14336), the 32 blocks' and the untied head.
const LLAMA3_BLOCK_LINEAR: f64 = 218_103_808.0;
const LLAMA3_LINEAR: f64 = 32.0 * LLAMA3_BLOCK_LINEAR;
const LLAMA3_HEAD: f64 = 128_256.0 * 4096.0;

#[test]
fn float8_all_gather_gathers_a_blocks_linears_at_one_byte() {
    let spec = |float8: &str| {
        job(&format!(
            "model: {{preset: llama-3-8b}}\ntraining: {{{float8}}}\nparallelism: {{gpus: 8, strategy: fsdp, zeroStage: 3, fsdpVersion: \"2\"}}\n"
        ))
    };
    let fsdp2 = |j: &ValidatedJob| Profile {
        unsharded_stage_under_pp: false,
        frozen_units_stay_unsharded: false,
        ..profile(j)
    };
    let at = |j: &ValidatedJob, ends: &Ends| {
        with(j, &fsdp2(j), ends, |st| {
            let w = weights::weights(st);
            (st.block_gathered, w.weight_transient, w.casts)
        })
    };
    // bf16 under FSDP's mixed precision: two blocks gathered at two bytes.
    let bf16 = at(&spec(""), &POINT);
    assert_eq!(
        bf16,
        (LLAMA3_BLOCK_LINEAR * 2.0, 4.0 * LLAMA3_BLOCK_LINEAR, 0.0)
    );
    // Float8 all-gather: one byte per gathered element plus the shard's own
    // fp8 cast (an eighth); the saved fp8 weight is a view of the gathered one.
    let gathered = LLAMA3_BLOCK_LINEAR * (1.0 + 1.0 / 8.0);
    let ag = spec("float8: tensorwise, float8AllGather: true");
    assert_eq!(at(&ag, &POINT), (gathered, 2.0 * gathered, 0.0));
    // Tensorwise without it: bf16's gathers, and every block keeps the fp8
    // copy of its unsharded weights for backward (`float8Weight`), none at
    // the low end (the cast recomputed in backward).
    let tensorwise = spec("float8: tensorwise");
    assert_eq!(
        at(&tensorwise, &POINT),
        (bf16.0, bf16.1 + LLAMA3_LINEAR, LLAMA3_LINEAR)
    );
    let low = Ends::point_but(Mechanism::Float8Weight, End::Low);
    assert_eq!(at(&tensorwise, &low), bf16);
    // Rowwise keeps the high-precision weight backward gathers again.
    assert_eq!(at(&spec("float8: rowwise"), &POINT), bf16);
}

#[test]
fn float8_linears_take_no_autocast_cast_and_tensorwise_keeps_an_fp8_copy() {
    let spec = |float8: &str| {
        job(&format!(
            "model: {{preset: llama-3-8b}}\ntraining: {{precision: bf16-mixed{float8}}}\n"
        ))
    };
    let casts = |j: &ValidatedJob| {
        with(j, &profile(j), &POINT, |st| {
            let w = weights::weights(st);
            assert_eq!(w.weight_transient, w.casts);
            w.casts
        })
    };
    // bf16-mixed: a 16-bit cast of every linear and of the head.
    assert_eq!(casts(&spec("")), (LLAMA3_LINEAR + LLAMA3_HEAD) * 2.0);
    // The blocks' float8 linears cast their fp32 weights straight to fp8:
    // tensorwise keeps that copy (one byte), rowwise nothing; the head stays
    // a plain linear with its cast.
    assert_eq!(
        casts(&spec(", float8: tensorwise")),
        LLAMA3_LINEAR + LLAMA3_HEAD * 2.0
    );
    assert_eq!(casts(&spec(", float8: rowwise")), LLAMA3_HEAD * 2.0);
    assert_eq!(
        casts(&spec(", float8: rowwise-with-gw-hp")),
        LLAMA3_HEAD * 2.0
    );
    // Pure bf16 has no casts; tensorwise adds its fp8 copies.
    let pure =
        job("model: {preset: llama-3-8b}\ntraining: {precision: bf16, float8: tensorwise}\n");
    assert_eq!(casts(&pure), LLAMA3_LINEAR);
}

#[test]
fn a_float8_linear_casts_its_operands_by_recipe() {
    use crate::api::Float8Recipe::{Rowwise, RowwiseWithGwHp, Tensorwise};
    use crate::estimate::step::float8::{Linear, transients};
    // 1000 tokens through an up projection (4096 in, 14336 out) whose fp32
    // weight (58 720 256 elements) runs under bf16 autocast.
    let l = Linear {
        tokens: 1000.0,
        input: 4096.0,
        output: 14336.0,
        weight_bytes: 4.0,
    };
    let matrix = 4096.0 * 14336.0;
    // Tensorwise, the fp8 weight kept from forward: the input's cast in
    // forward; the gradient's two casts and the input's again in backward.
    assert_eq!(
        transients(Tensorwise, l, 2.0, 1.0, false),
        (4_096_000.0, 32_768_000.0)
    );
    // Not kept: the weight is cast in forward and again in backward.
    assert_eq!(
        transients(Tensorwise, l, 2.0, 0.0, false),
        (4_096_000.0 + matrix, 32_768_000.0 + matrix)
    );
    // Gathered in float8: no weight cast at all.
    assert_eq!(
        transients(Tensorwise, l, 2.0, 0.0, true),
        (4_096_000.0, 32_768_000.0)
    );
    // Rowwise: row scales, the weight cast in each pass, and backward's
    // high-precision `grad_output * 0` plane and `weight + zero` copy.
    assert_eq!(
        transients(Rowwise, l, 2.0, 0.0, false),
        (62_877_600.0, 355_123_008.0)
    );
    // The weight's gradient in high precision: one gradient cast (rowwise)
    // and one weight cast (tensorwise) in backward.
    assert_eq!(
        transients(RowwiseWithGwHp, l, 2.0, 0.0, false),
        (62_877_600.0, 73_060_256.0)
    );
}

#[test]
fn float8_transients_join_the_blocks_temporaries() {
    let spec = |float8: &str| {
        job(&format!(
            "model: {{preset: llama-3-8b}}\ntraining: {{microBatchSize: 1, sequenceLength: 1000{float8}}}\n"
        ))
    };
    let temps = |j: &ValidatedJob| {
        with(j, &profile(j), &POINT, |st| {
            let ctx = saved::act_context(st);
            let t = saved::temporaries(st, &ctx, 0.0);
            (t.forward, t.backward)
        })
    };
    let (f, b) = temps(&spec(""));
    // Tensorwise, its copy kept: in forward the down projection's input
    // cast (14336 per token) is the larger, in backward the up projection's
    // two gradient casts and its input's (2 x 14336 + 4096 per token; the
    // down projection's 2 x 4096 + 14336).
    let (f8, b8) = temps(&spec(", float8: tensorwise"));
    assert_eq!((f8 - f, b8 - b), (14_336_000.0, 32_768_000.0));
}
