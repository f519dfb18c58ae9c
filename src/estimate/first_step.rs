//! The first optimizer step: states created in a cache that backward filled.
//!
//! PyTorch's optimizers create their states on their first `step()`
//! (torch/optim/adamw.py `_init_group`: `state["exp_avg"] =
//! torch.zeros_like(p, ...)` when the parameter's state is empty; SGD's
//! momentum buffer likewise; bitsandbytes' `Optimizer8bit.init_state`), so in
//! the first step they are allocated after backward, when the caching
//! allocator holds the blocks of the activations backward freed. A freed
//! block serves a new tensor only if it is at least as large
//! (c10/cuda/CUDACachingAllocator.cpp, commit 001074d: `get_free_block`
//! takes the smallest cached block of the pool that fits, and splits it);
//! a state tensor larger than every cached block gets a new segment and the
//! cached blocks stay reserved beside it. The reserved peak of a run is then
//! the first step's reserved bytes before its optimizer step plus the state
//! and step temporaries no cached block could take, which the steady-state
//! phases do not show.
//!
//! Measured on an H200 (`benches/ground-truth`, full training with AdamW):
//! Llama-3.2-1B's reserved bytes exceed the steady step's peak allocation
//! plus its fragmentation by 2.3 GB: its tied 128k × 2048 embedding's fp32
//! moments (1 GiB each) fit none of the blocks backward left. DeepSpeed and
//! Megatron create their optimizer states when the engine starts, before any
//! activation exists, expandable segments reuse freed pages whatever the
//! size, and JAX and TensorFlow have allocators of their own: none of them
//! strands here.

use std::collections::BTreeMap;

use super::caching::{Churn, LARGE_BUFFER, SMALL_SIZE, allocation_size, round_size};
use super::step::StepModel;
use super::{Component, PhaseBytes, StepPhase};
use crate::api::{
    Framework, FsdpVersion, Offload, Precision, ResolvedModel, Strategy, TrainingMode, ValidatedJob,
};

/// At most this many tensors of one class are placed one by one; a class of
/// more is placed in proportion (its tensors are all the same size).
const MAX_PLACED: f64 = 100_000.0;

/// The reserved bytes at the first step's optimizer step, or 0 where the
/// job creates no states there (or none strand).
pub fn reserved(job: &ValidatedJob, model: &StepModel, phases: &[PhaseBytes]) -> f64 {
    let Some(opt) = phases.iter().find(|p| p.phase == StepPhase::OptimizerStep) else {
        return 0.0;
    };
    let states = opt.get(Component::OptimizerStates);
    let new = states + opt.get(Component::Temporaries);
    if new <= 0.0 || !creates_states_in_first_step(job) {
        return 0.0;
    }
    let Some(tensors) = state_tensors(job, new) else {
        return 0.0;
    };
    // The first step before its optimizer step: no states yet.
    let before = phases
        .iter()
        .filter(|p| p.phase != StepPhase::OptimizerStep)
        .map(|p| p.allocated() - states + model.allocator_overhead(p))
        .fold(0.0, f64::max);
    let churn = &model.stage.churn;
    let mut free = free_map(cached_blocks(churn));
    // Backward allocates the fused experts' gradients (and the expert loop's
    // transients) after the loss has freed its planes: they take cached
    // blocks before the states.
    let transients = expert_gradients(&mut free, churn);
    before + transients + place(&mut free, &tensors)
}

fn creates_states_in_first_step(job: &ValidatedJob) -> bool {
    let spec = job.spec();
    let p = &spec.parallelism;
    spec.training.framework == Framework::Pytorch
        && matches!(p.strategy, Strategy::Ddp | Strategy::Fsdp)
        && p.offload == Offload::None
        && spec.training.mode == TrainingMode::Full
        && !spec.training.optimizer_in_backward
        && !job.allocator_conf.expandable_segments
}

/// `(one tensor's bytes, all of the class's bytes)` of what the first
/// optimizer step allocates: `bytes` shared over the trainable parameters
/// by their elements, each parameter's state a tensor of its shape (or of
/// its shard's, under FSDP) in the states' dtype.
fn state_tensors(job: &ValidatedJob, bytes: f64) -> Option<Vec<(f64, f64)>> {
    let ResolvedModel::Transformer(a) = &job.model else {
        return None;
    };
    let spec = job.spec();
    let p = &spec.parallelism;
    let elem = match spec.training.precision {
        Precision::Bf16 | Precision::Fp16 => 2.0,
        _ => 4.0,
    };
    let tp = p.tensor_parallel.max(1) as f64;
    let (h, v, i) = (a.hidden as f64, a.vocab as f64, a.intermediate as f64);
    let attention = (a.heads + 2 * a.kv_heads) as f64 * a.head_dim as f64;
    // Transformers 5 keeps a block's experts in one 3-D tensor per
    // projection (`gate_up_proj`: experts × 2·intermediate × hidden); earlier
    // releases one linear per expert.
    let fused_experts = job.runtime.transformers.is_none_or(|t| t >= (5, 0));
    let linear = if a.experts > 0 && fused_experts {
        a.experts as f64 * 2.0 * i * h
    } else {
        h * i.max(attention)
    };
    let counts = super::params::count(a, job.head, job.num_labels)?;
    let blocks = (a.layers + a.decoder_layers).max(1) as f64;
    let mut classes = vec![
        (v * h / tp, counts.embedding as f64 / tp),
        (counts.head as f64 / tp, counts.head as f64 / tp),
        (linear / tp, counts.linear as f64 / tp),
        (h, counts.small as f64),
    ];
    if p.zero() >= 1 && p.strategy == Strategy::Fsdp {
        // FSDP2 shards each parameter; FSDP1 flattens a unit's parameters
        // into one tensor and shards that (the root unit holds the
        // embedding and the head).
        let dp = job.data_parallel.max(1) as f64;
        if p.fsdp_version == Some(FsdpVersion::V2) {
            classes.iter_mut().for_each(|c| c.0 /= dp);
        } else {
            let root = (counts.embedding + counts.head) as f64 / tp / dp;
            classes[0].0 = root;
            classes[1].0 = root;
            classes[2].0 = counts.linear as f64 / blocks / tp / dp;
        }
    }
    let total: f64 = classes.iter().map(|c| c.1).sum();
    if total <= 0.0 {
        return None;
    }
    Some(
        classes
            .into_iter()
            .filter(|c| c.1 > 0.0)
            .map(|(one, elems)| ((one * elem).min(bytes), bytes * elems / total))
            .collect(),
    )
}

/// The free blocks the first step's backward leaves cached, as `(size,
/// count)`: every block's saved tensors (or, checkpointed, its input and one
/// block's recomputed tensors), the temporaries, the loss's logits planes,
/// a gathered block, in the allocator's size classes.
fn cached_blocks(c: &Churn) -> Vec<(u64, u64)> {
    let r = c.width_ratio.max(0.0);
    let blocks = c.blocks.ceil().max(1.0);
    let per_block = if c.recompute > 0.0 {
        c.recompute
    } else {
        c.saved
    };
    let unit = per_block / (6.0 + 3.0 * r);
    let mut tensors = vec![(unit, 6.0), (unit * r, 3.0)];
    if c.recompute > 0.0 {
        tensors.push((c.saved, blocks));
    } else {
        tensors.iter_mut().for_each(|t| t.1 *= blocks);
    }
    tensors.extend([
        (c.temp_forward / 2.0, 2.0),
        (c.temp_backward / 2.0, 2.0),
        (c.logits, 3.0),
        (c.gathered, 1.0),
        (c.weight_forward, 1.0),
        (c.weight_backward, 1.0),
    ]);
    // Each tensor's segment by the allocator's own rule; requests under
    // 10 MiB share 20 MiB segments, which are whole free blocks once every
    // tensor in them is freed.
    let mut out = Vec::new();
    let mut shared = 0;
    for (size, count) in tensors {
        if !(size.is_finite() && count > 0.0) {
            continue;
        }
        let request = round_size(size.max(0.0) as u64);
        match allocation_size(request) {
            _ if request <= SMALL_SIZE => {}
            LARGE_BUFFER => shared += request * count as u64,
            segment => out.push((segment, count as u64)),
        }
    }
    if shared > 0 {
        out.push((LARGE_BUFFER, shared.div_ceil(LARGE_BUFFER)));
    }
    out
}

/// Place the fused experts' gradients the first step's backward allocates
/// (`Churn::expert_grads`), block by block from the last, between the
/// head's and the embedding's (`Churn::edge_grads`): each takes the smallest
/// cached block it fits (or a segment of its own), a block's down gradient
/// before its gate-and-up one. Under the per-expert loop (`Churn::expert_loop`)
/// each block's backward then makes one full-size transient per projection
/// and expert, one at a time, each freed once added: a cached block takes it
/// when one fits and gets it back whole, else it gets a segment of its own
/// that stays cached, for the next block's gradients. Returns the bytes of
/// those transients' new segments: reserved beyond the allocated bytes
/// before the optimizer steps.
fn expert_gradients(free: &mut BTreeMap<u64, u64>, c: &Churn) -> f64 {
    let [up, down] = c.expert_grads;
    if up < 1.0 {
        return 0.0;
    }
    let [head, embedding] = c.edge_grads;
    place(free, &[(head, head)]);
    let blocks = c.blocks.ceil().clamp(1.0, MAX_PLACED) as u64;
    let mut transients = 0.0;
    for _ in 0..blocks {
        place(free, &[(down, down)]);
        place(free, &[(up, up)]);
        if !c.expert_loop {
            continue;
        }
        for g in [down, up] {
            let request = round_size(g.max(0.0) as u64);
            if g < 1.0 || free.range(request..).next().is_some() {
                continue;
            }
            let segment = allocation_size(request);
            transients += segment as f64;
            *free.entry(segment).or_default() += 1;
        }
    }
    place(free, &[(embedding, embedding)]);
    transients
}

/// Free blocks by size: how many of each (at most `MAX_PLACED`).
fn free_map(blocks: Vec<(u64, u64)>) -> BTreeMap<u64, u64> {
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    for (size, count) in blocks {
        *free.entry(size).or_default() += count.min(MAX_PLACED as u64);
    }
    free
}

/// Bytes of `tensors` that no block of `blocks` can take (`place`).
#[cfg(test)]
fn unserved(blocks: Vec<(u64, u64)>, tensors: &[(f64, f64)]) -> f64 {
    place(&mut free_map(blocks), tensors)
}

/// Bytes of `tensors` that no block of `free` can take, placed largest
/// first, each in the smallest free block at least its rounded size (the
/// rest of the block, above 1 MiB, stays free; the block is taken from
/// `free`). Tensors of the small pool never use a large block.
fn place(free: &mut BTreeMap<u64, u64>, tensors: &[(f64, f64)]) -> f64 {
    let mut order: Vec<(f64, f64)> = tensors.to_vec();
    order.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out = 0.0;
    for (one, total) in order {
        let request = round_size(one.max(0.0) as u64);
        if request <= SMALL_SIZE {
            out += total;
            continue;
        }
        let n = (total / one).ceil().min(MAX_PLACED) as u64;
        // Once one finds no block, none of the same size does.
        let placed = (0..n).take_while(|_| take(free, request)).count() as u64;
        out += total * (n - placed) as f64 / n.max(1) as f64;
    }
    out
}

/// Take the smallest free block of at least `request` bytes, keeping its
/// rest above 1 MiB free; false when there is none.
fn take(free: &mut BTreeMap<u64, u64>, request: u64) -> bool {
    let Some((&block, n)) = free.range_mut(request..).next() else {
        return false;
    };
    *n -= 1;
    if *n == 0 {
        free.remove(&block);
    }
    if block - request > SMALL_SIZE {
        *free.entry(block - request).or_default() += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    #[test]
    fn a_tensor_larger_than_every_cached_block_is_unserved() {
        let gib = 1024.0 * MIB;
        // Two 300 MiB blocks: one 1 GiB tensor finds none, two of 256 MiB
        // find one each.
        let blocks = vec![(300 << 20, 2)];
        assert_eq!(unserved(blocks.clone(), &[(gib, gib)]), gib);
        assert_eq!(unserved(blocks.clone(), &[(256.0 * MIB, 512.0 * MIB)]), 0.0);
        // Three of 256 MiB: the third finds only 44 MiB rests.
        assert_eq!(unserved(blocks, &[(256.0 * MIB, 768.0 * MIB)]), 256.0 * MIB);
        // A split block's rest serves a smaller tensor.
        assert_eq!(
            unserved(
                vec![(300 << 20, 1)],
                &[(200.0 * MIB, 200.0 * MIB), (80.0 * MIB, 80.0 * MIB)]
            ),
            0.0
        );
    }

    #[test]
    fn the_expert_loop_leaves_a_new_pair_of_transients_per_block() {
        // Four blocks of 224 + 112 MiB expert gradients; the loss left three
        // 250 MiB planes cached.
        let (up, down) = (224.0 * MIB, 112.0 * MIB);
        let mut c = Churn {
            blocks: 4.0,
            logits: 250.0 * MIB,
            expert_grads: [up, down],
            ..Churn::default()
        };
        let planes = cached_blocks(&c);
        assert_eq!(planes, vec![(250 << 20, 3)]);
        // Without the loop the gradients take the planes and add nothing.
        let mut free = free_map(planes.clone());
        assert_eq!(expert_gradients(&mut free, &c), 0.0);
        assert!(free.range(112 << 20..).next().is_none());
        // With it the last block's transients fit the third plane; every
        // other block's find only the previous block's, which its own
        // gradients took: a new pair each, and the last pair stays cached
        // for the states.
        c.expert_loop = true;
        let mut free = free_map(planes);
        assert_eq!(expert_gradients(&mut free, &c), 3.0 * (up + down));
        assert_eq!(place(&mut free, &[(up, up), (down, down)]), 0.0);
        assert_eq!(place(&mut free, &[(down, down)]), down);
    }

    #[test]
    fn small_activations_share_twenty_mib_segments() {
        let c = Churn {
            blocks: 2.0,
            saved: 9.0 * 4.0 * MIB,
            width_ratio: 1.0,
            ..Churn::default()
        };
        // 18 tensors of 4 MiB: 72 MiB in four 20 MiB segments.
        assert_eq!(cached_blocks(&c), vec![(LARGE_BUFFER, 4)]);
    }
}
