//! DeepSpeed ZeRO-3's gathered parameters, phase by phase. Pure.
//!
//! DeepSpeed does not gather whole blocks as FSDP does: it gathers each
//! module's own parameters before that module runs and releases them after
//! it, keeping what the step's trace shows will be used again soon
//! (deepspeedai/DeepSpeed `deepspeed/runtime/zero/partitioned_param_coordinator.py`
//! at commit 00a31c9: `fetch_sub_module`, `release_sub_module`,
//! `__params_to_release`; the defaults in `deepspeed/runtime/zero/config.py`):
//!
//! - a module's parameters are gathered in its forward (and backward)
//!   pre-hook: `iter_params(module, recurse=z3_leaf_module(module))`, so a
//!   block's attention and MLP projections are gathered one module at a time;
//! - once the trace of a whole step is known, each fetch also prefetches the
//!   next modules of the trace, up to `stage3_prefetch_bucket_size` elements
//!   (default 5e7; a module is taken whole, so the bucket can be overshot by
//!   one module), within `stage3_max_live_parameters` (1e9);
//! - after a module runs, `__params_to_release` walks the trace from the next
//!   step on, counting every module's elements, and keeps the parameters that
//!   come again before `stage3_max_reuse_distance` elements (default 1e9) have
//!   been walked. Forward's last modules come again at the start of backward,
//!   after the modules that follow them twice (their forward, then their
//!   backward): a module is kept from its forward to its backward when the
//!   elements after it in forward are under half the distance. The LM head,
//!   last in forward and first in backward, is always kept; a 7B model's last
//!   blocks are kept with it, a 70B model's head alone is 1.05e9 elements;
//! - before the trace is complete (the first step), nothing is prefetched
//!   and every module is released after it runs;
//! - parameters under `stage3_param_persistence_threshold` elements (1e5)
//!   stay gathered for good: norms and biases, counted with the weights.
//!
//! The Hugging Face Trainer's DeepSpeed configs set the prefetch bucket to
//! `auto`, which it fills in as 0.9 × hidden² (transformers
//! `integrations/deepspeed.py`, `trainer_config_finalize`), and keep 1e9 for
//! the reuse distance and the live parameters.

use super::arch::Arch;
use super::bounds::{Ends, Mechanism};
use super::params::Counts;

/// DeepSpeed's default `stage3_max_reuse_distance` (elements).
pub const REUSE_DISTANCE: f64 = 1e9;
/// DeepSpeed's default `stage3_prefetch_bucket_size` (elements).
pub const PREFETCH_BUCKET: f64 = 5e7;
/// DeepSpeed's default `stage3_max_live_parameters` (elements): prefetching
/// stops where the gathered elements would pass it.
pub const MAX_LIVE: f64 = 1e9;

/// The Hugging Face Trainer's `auto` prefetch bucket for a model of this
/// hidden width: 0.9 × hidden².
pub fn hf_auto_prefetch_bucket(hidden: f64) -> f64 {
    0.9 * hidden * hidden
}

/// A transformer as ZeRO-3's trace sees it: the elements of each module
/// whose parameters are gathered, in the order forward runs them.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The input embedding(s).
    pub embedding: f64,
    /// One block's modules in forward order (q, k, v, o, then the MLP's).
    pub block: Vec<f64>,
    /// Blocks of the stage.
    pub blocks: f64,
    /// The output head; a tied head is the embedding's matrix gathered
    /// again, so it counts the embedding's elements.
    pub head: f64,
}

/// Elements gathered at once in each part of the step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gathered {
    /// From the loss through the head's backward into the last block's: the
    /// modules kept for reuse, and what the next fetch prefetched.
    pub turn: f64,
    /// The last module of backward (the embedding) with nothing left to
    /// prefetch.
    pub backward_end: f64,
}

impl Trace {
    /// The modules of `a` as ZeRO-3 fetches them, for a pipeline stage of
    /// `blocks` blocks: the embedding on the first stage, the head (a tied
    /// one is the embedding's matrix) on the last. A mixture-of-experts
    /// layer's routed experts are one module, as DeepSpeed recommends them
    /// (`set_z3_leaf_modules`) and as Transformers 5 keeps them (one 3-D
    /// tensor per projection).
    pub fn of(a: &Arch, counts: &Counts, blocks: f64, first: bool, last: bool) -> Trace {
        let h = a.hidden as f64;
        let q = (a.heads * a.head_dim) as f64;
        let kv = (a.kv_heads * a.head_dim) as f64;
        let mut block = vec![h * q, h * kv, h * kv, q * h];
        let matrices = a.mlp.matrices() as f64;
        let i = a.intermediate as f64;
        if a.experts > 0 {
            let e = a.experts as f64;
            block.push(h * e);
            block.push(e * matrices * h * i);
            if a.shared_intermediate > 0 {
                block.push(matrices * h * a.shared_intermediate as f64);
            }
        } else if matrices == 3.0 {
            block.extend([h * i, h * i, i * h]);
        } else {
            block.extend([h * i, i * h]);
        }
        let head = if counts.head > 0 {
            counts.head as f64
        } else if a.tied {
            (a.vocab * a.hidden) as f64
        } else {
            0.0
        };
        Trace {
            embedding: if first { counts.embedding as f64 } else { 0.0 },
            block,
            blocks,
            head: if last { head } else { 0.0 },
        }
    }

    /// Blocks of the stage, whole.
    fn whole_blocks(&self) -> usize {
        self.blocks.max(0.0).round() as usize
    }

    /// Elements of the module at `at` in forward's order walked backwards:
    /// 0 the head, then the blocks' modules from the last block's last one
    /// down, then the embedding.
    fn module(&self, at: usize) -> f64 {
        let m = self.block.len();
        match at {
            0 => self.head,
            i if i <= self.whole_blocks() * m => self.block[m - 1 - (i - 1) % m],
            _ => self.embedding,
        }
    }

    /// From module `from` on (in the order of [`Trace::module`]), the
    /// modules taken while the elements taken before each stay under
    /// `limit`: their elements, and where the walk stopped. Whole blocks are
    /// taken at once, so a stage of many small blocks costs no more than one
    /// of few large ones.
    fn take_below(&self, from: usize, limit: f64) -> (f64, usize) {
        let m = self.block.len();
        let blocks = self.whole_blocks();
        let end = blocks * m + 2;
        let per_block: f64 = self.block.iter().sum();
        let (mut taken, mut at) = (0.0, from);
        while at < end && taken < limit {
            if m > 0 && per_block > 0.0 && at >= 1 && at <= blocks * m && (at - 1) % m == 0 {
                // n whole blocks pass when the check before the last of
                // them, its first module in forward's order, still does:
                // taken + n × per_block − block[0] < limit.
                let left = blocks - (at - 1) / m;
                let fit = ((limit - taken + self.block[0]) / per_block).ceil() - 1.0;
                let n = (fit.max(0.0) as usize).min(left);
                if n > 0 {
                    taken += n as f64 * per_block;
                    at += n * m;
                    continue;
                }
            }
            taken += self.module(at);
            at += 1;
        }
        (taken, at)
    }

    /// Elements kept gathered from forward into backward: the trailing
    /// modules of forward whose elements after them, walked twice, stay
    /// under `reuse_distance` (`__params_to_release`: the walk stops once it
    /// has counted the distance, before the next module).
    pub fn kept_for_backward(&self, reuse_distance: f64) -> f64 {
        self.take_below(0, reuse_distance / 2.0).0
    }

    /// Elements the first fetch of backward prefetches: the modules after
    /// the kept ones in backward's order (those are there already), whole,
    /// until `bucket` is reached, within what `max_live` leaves beside the
    /// kept ones.
    pub fn prefetched(&self, reuse_distance: f64, bucket: f64, max_live: f64) -> f64 {
        let (kept, next) = self.take_below(0, reuse_distance / 2.0);
        let room = bucket.min((max_live - kept).max(0.0));
        self.take_below(next, room).0
    }

    /// Gathered elements by part of the step, for a complete trace (every
    /// step after the first) with these settings.
    pub fn gathered(&self, reuse_distance: f64, bucket: f64, max_live: f64) -> Gathered {
        let turn = self.kept_for_backward(reuse_distance)
            + self.prefetched(reuse_distance, bucket, max_live);
        Gathered {
            turn,
            backward_end: self.embedding,
        }
    }
}

/// Elements of a stage's parameters that DeepSpeed ZeRO-3 holds gathered at
/// once in a step: forward's last modules kept into backward and the first
/// prefetch of backward, or the embedding at backward's end if larger.
///
/// - point: the reuse distance and live parameters at DeepSpeed's defaults
///   (the Hugging Face Trainer's example configs keep them), the prefetch
///   bucket at DeepSpeed's 5e7 or, under the Trainer (`hf_auto`), its
///   `auto` 0.9 × hidden²;
/// - low: no prefetch issued yet (the modules kept for reuse only);
/// - high: the larger of the two buckets.
pub fn deepspeed_gathered(trace: &Trace, hidden: f64, hf_auto: bool, ends: &Ends) -> f64 {
    let auto = hf_auto_prefetch_bucket(hidden);
    let bucket = ends.pick(
        Mechanism::ShardGather,
        0.0,
        if hf_auto { auto } else { PREFETCH_BUCKET },
        auto.max(PREFETCH_BUCKET),
    );
    let g = trace.gathered(REUSE_DISTANCE, bucket, MAX_LIVE);
    g.turn.max(g.backward_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-3.1-8B: hidden 4096, 8 KV heads of 128, MLP 14336, vocabulary
    /// 128256, 32 blocks, untied head.
    fn llama_8b() -> Trace {
        let h = 4096.0;
        let kv = 1024.0;
        let ff = 14336.0;
        Trace {
            embedding: 128256.0 * h,
            block: vec![h * h, h * kv, h * kv, h * h, h * ff, h * ff, ff * h],
            blocks: 32.0,
            head: 128256.0 * h,
        }
    }

    /// Llama-2-7B: hidden 4096, MLP 11008, vocabulary 32000, 32 blocks.
    fn llama2_7b() -> Trace {
        let h = 4096.0;
        let ff = 11008.0;
        Trace {
            embedding: 32000.0 * h,
            block: vec![h * h, h * h, h * h, h * h, h * ff, h * ff, ff * h],
            blocks: 32.0,
            head: 32000.0 * h,
        }
    }

    #[test]
    fn the_trace_of_a_preset_is_its_modules() {
        let a = &crate::api::presets::find("llama-3.1-8b")
            .expect("a preset")
            .arch;
        let counts = crate::api::params::count(a, crate::api::Head::Lm, 0).expect("counts");
        let t = Trace::of(a, &counts, 32.0, true, true);
        assert_eq!(t, llama_8b());
        // A middle pipeline stage has neither the embedding nor the head.
        let mid = Trace::of(a, &counts, 8.0, false, false);
        assert_eq!((mid.embedding, mid.head, mid.blocks), (0.0, 0.0, 8.0));
    }

    #[test]
    fn the_ends_move_with_the_prefetch() {
        use crate::estimate::bounds::End;
        let t = llama_8b();
        let at = |end| {
            let ends = Ends::all(end);
            deepspeed_gathered(&t, 4096.0, false, &ends)
        };
        let (low, point, high) = (at(End::Low), at(End::Point), at(End::High));
        // The 8B head is kept alone; the embedding, as large, bounds the low end.
        assert_eq!(low, t.head);
        assert_eq!(point, t.head + 14336.0 * 4096.0);
        assert!(high >= point);
    }

    /// The walk one module at a time, as DeepSpeed's own loop goes.
    fn kept_module_by_module(t: &Trace, reuse_distance: f64) -> f64 {
        let (mut after, mut at) = (0.0, 0);
        while at < t.whole_blocks() * t.block.len() + 2 && 2.0 * after < reuse_distance {
            after += t.module(at);
            at += 1;
        }
        after
    }

    #[test]
    fn whole_blocks_at_once_keep_what_the_module_walk_keeps() {
        for t in [llama_8b(), llama2_7b()] {
            for r in [0.0, 1e6, 3e8, 6e8, 1e9, 2e9, 5e9, 1e12] {
                let (whole, one) = (t.kept_for_backward(r), kept_module_by_module(&t, r));
                assert!(
                    (whole - one).abs() <= 1e-9 * one.max(1.0),
                    "{r}: {whole} {one}"
                );
            }
        }
        // A stage of millions of tiny blocks is answered without walking
        // them: everything is kept, the embedding too.
        let tiny = Trace {
            embedding: 10.0,
            block: vec![1.0, 2.0, 3.0],
            blocks: 16_000_000.0,
            head: 10.0,
        };
        assert_eq!(tiny.kept_for_backward(REUSE_DISTANCE), 10.0 + 96e6 + 10.0);
    }

    #[test]
    fn a_large_head_is_kept_alone() {
        // 8B's head is 5.25e8 elements: the walk back to the last block's
        // down projection passes it twice (1.05e9 ≥ 1e9), so only the head
        // stays from forward into backward.
        let t = llama_8b();
        assert_eq!(t.kept_for_backward(REUSE_DISTANCE), t.head);
    }

    #[test]
    fn a_small_head_keeps_the_last_blocks_with_it() {
        // 7B's head is 1.31e8 elements: modules are kept until the elements
        // after them pass 5e8, about two blocks' worth.
        let t = llama2_7b();
        let kept = t.kept_for_backward(REUSE_DISTANCE);
        let block: f64 = t.block.iter().sum();
        assert!(kept > t.head + block, "{kept}");
        assert!(kept < t.head + 3.0 * block, "{kept}");
        // The kept modules' elements after the last kept one are under half
        // the distance; with one more they would not be.
        assert!(kept - t.block[0] < REUSE_DISTANCE / 2.0 + block);
    }

    #[test]
    fn a_shorter_reuse_distance_keeps_less() {
        let t = llama2_7b();
        assert!(t.kept_for_backward(1e8) < t.kept_for_backward(REUSE_DISTANCE));
        // Zero: nothing is kept, not even the head.
        assert_eq!(t.kept_for_backward(0.0), 0.0);
    }

    #[test]
    fn the_prefetch_takes_whole_modules_up_to_the_bucket() {
        let t = llama_8b();
        let kept = t.kept_for_backward(REUSE_DISTANCE);
        // The first module after the head in backward is the last block's
        // down projection, 5.9e7 elements: one module already passes 5e7.
        let pre = t.prefetched(REUSE_DISTANCE, PREFETCH_BUCKET, MAX_LIVE);
        assert_eq!(pre, 14336.0 * 4096.0);
        // The HF Trainer's auto bucket, 0.9 × 4096² = 1.5e7: still one module.
        let hf = t.prefetched(REUSE_DISTANCE, hf_auto_prefetch_bucket(4096.0), MAX_LIVE);
        assert_eq!(hf, pre);
        // No room under max live parameters: nothing is prefetched.
        assert_eq!(t.prefetched(REUSE_DISTANCE, PREFETCH_BUCKET, kept), 0.0);
    }

    #[test]
    fn kept_modules_are_not_prefetched_again() {
        let t = llama2_7b();
        let kept = t.kept_for_backward(REUSE_DISTANCE);
        let pre = t.prefetched(REUSE_DISTANCE, PREFETCH_BUCKET, MAX_LIVE);
        // The kept ones end inside the second-to-last block (at its value
        // projection); the prefetch takes its key and query projections and
        // the block before's down projection, whole modules until the bucket
        // is passed: 2 × 4096² + 11008 × 4096.
        assert_eq!(pre, 2.0 * 4096.0 * 4096.0 + 11008.0 * 4096.0);
        assert!((PREFETCH_BUCKET..PREFETCH_BUCKET + 11008.0 * 4096.0).contains(&pre));
        let g = t.gathered(REUSE_DISTANCE, PREFETCH_BUCKET, MAX_LIVE);
        assert_eq!(g.turn, kept + pre);
        assert_eq!(g.backward_end, t.embedding);
    }
}
