//! A step's allocations replayed through [`CachingAllocator`]: what one
//! pipeline stage allocates and frees, the runs of shapes a job sees, and
//! the stranded share the estimate uses.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::{CachingAllocator, ROUND_LARGE, round_size};

/// At most this many blocks of a stage are replayed; the stranded bytes of
/// the rest are those of the replayed ones in proportion (each block repeats
/// the same allocations).
pub const REPLAYED_BLOCKS: u32 = 4;

/// The largest hidden-width tensor replayed as it is: 2^36 bytes (64 GiB).
const MAX_UNIT_OCTAVE: f64 = 36.0;

/// What one pipeline stage allocates and frees within a step, at the
/// largest shape the job runs (bytes per tensor group).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Churn {
    /// Transformer blocks (or layers) in the stage.
    pub blocks: f64,
    /// Bytes one block saves for backward.
    pub saved: f64,
    /// Bytes one checkpointed block recomputes in backward (0: not
    /// checkpointed, the saved tensors are the block's own).
    pub recompute: f64,
    /// The MLP's width over the hidden width: a block's tensors are six of
    /// hidden width and three of MLP width.
    pub width_ratio: f64,
    /// Transient bytes inside one block's forward and backward.
    pub temp_forward: f64,
    pub temp_backward: f64,
    /// One fp32 plane of the logits: the loss holds three at once (the
    /// upcast logits, their log-softmax, its gradient).
    pub logits: f64,
    /// One block's weight gradients when they are allocated in backward and
    /// freed after the step (`zero_grad(set_to_none=True)`), else 0.
    pub grads: f64,
    /// The largest linear's weight as a transient of its forward (and of a
    /// checkpointed block's recompute): a 4-bit or 8-bit weight dequantized
    /// for the matmul and freed after it. Each linear allocates its own,
    /// before its output, in proportion to its output's width.
    pub weight_forward: f64,
    /// The same in backward (AWQ dequantizes, casts and repeats it).
    pub weight_backward: f64,
    /// A block's parameters gathered whole (ZeRO-3, FSDP) before its forward
    /// and again before its backward, freed after it; 0 without sharding.
    pub gathered: f64,
    /// The gradients of one block's fused 3-D expert projections
    /// (gate-and-up, down) when backward allocates them (full training
    /// without sharding), else 0. Only the first step's placement reads
    /// them (`first_step`).
    pub expert_grads: [f64; 2],
    /// The head's and the embedding's gradients, the first and the last
    /// that backward makes (a tied table's at the head), placed with the
    /// experts' (`first_step`).
    pub edge_grads: [f64; 2],
    /// The experts run Transformers' per-expert loop (`bounds::expert_loop`):
    /// backward makes a full-size transient of each gradient per expert
    /// beyond the first, freed once added. Read by the first step's
    /// placement only; in later steps the transients find the blocks they
    /// left.
    pub expert_loop: bool,
}

/// How the step's shapes change over a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shapes {
    /// Every step the same shape (packed or padded to the full length).
    Fixed,
    /// Padded to each batch's longest sample: a new shape most steps.
    Varying,
}

/// One replayed run: bytes stranded beyond the live tensors at the peak, and
/// the largest churned bytes live at once (gradients apart).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replay {
    pub stranded: f64,
    pub churned: f64,
}

impl Replay {
    /// Stranded bytes as a share of the churned ones.
    pub fn share(&self) -> f64 {
        if self.churned > 0.0 {
            self.stranded / self.churned
        } else {
            0.0
        }
    }
}

struct Run {
    alloc: CachingAllocator,
    churned: u64,
    peak_churned: u64,
    oom: bool,
}

type Live = Option<(u32, u64)>;

impl Run {
    fn malloc(&mut self, bytes: f64, churn: bool) -> Live {
        if self.oom || bytes.is_nan() || bytes < 1.0 {
            return None;
        }
        let size = round_size(bytes.min(1e18) as u64);
        let Some(id) = self.alloc.malloc(size) else {
            self.oom = true;
            return None;
        };
        if churn {
            self.churned += size;
            self.peak_churned = self.peak_churned.max(self.churned);
        }
        Some((id, if churn { size } else { 0 }))
    }

    fn free(&mut self, t: Live) {
        if let Some((id, churn)) = t {
            self.alloc.free(id);
            self.churned -= churn;
        }
    }

    fn free_all(&mut self, ts: &mut Vec<Live>) {
        for t in ts.drain(..).rev() {
            self.free(t);
        }
    }

    /// A block's tensors of `bytes` in all: six of hidden width, three of
    /// the MLP's; the first seven are linears' outputs, each allocated
    /// while that linear's transient weight (`weight`, the MLP's; an
    /// attention linear's is smaller by the width ratio) is live.
    fn block_tensors(&mut self, bytes: f64, ratio: f64, weight: f64, out: &mut Vec<Live>) {
        let unit = bytes / (6.0 + 3.0 * ratio);
        for i in 0..9 {
            let wide = i % 3 == 2;
            let w = if i < 7 {
                self.malloc(
                    if wide {
                        weight
                    } else {
                        weight / ratio.max(1.0)
                    },
                    true,
                )
            } else {
                None
            };
            out.push(self.malloc(if wide { unit * ratio } else { unit }, true));
            self.free(w);
        }
    }

    /// Seven linears' transient weights in turn (backward's input and
    /// weight gradients), each freed before the next.
    fn weight_transients(&mut self, weight: f64, ratio: f64) {
        for i in 0..7 {
            let w = self.malloc(
                if i % 3 == 2 {
                    weight
                } else {
                    weight / ratio.max(1.0)
                },
                true,
            );
            self.free(w);
        }
    }
}

/// What one replay ended with.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    oom: bool,
    peak_reserved: u64,
    peak_allocated: u64,
    peak_churned: u64,
}

/// Replay `steps` (each the fraction of the largest shape it runs at) of the
/// step `c` describes through an allocator of `capacity` bytes, `blocks` of
/// its blocks.
fn replay_steps(c: &Churn, blocks: u32, steps: &[f64], expandable: bool, capacity: u64) -> Outcome {
    let mut run = Run {
        alloc: CachingAllocator::new(expandable, capacity),
        churned: 0,
        peak_churned: 0,
        oom: false,
    };
    let ratio = c.width_ratio.max(0.0);
    let mut saved: Vec<Vec<Live>> = (0..blocks).map(|_| Vec::new()).collect();
    let mut temps = Vec::new();
    let mut grads = Vec::new();
    let unit = if c.recompute > 0.0 {
        c.recompute
    } else {
        c.saved
    } / (6.0 + 3.0 * ratio);
    for &u in steps {
        // Forward: each block's temporaries around the tensors it saves.
        for block in saved.iter_mut() {
            let gathered = run.malloc(c.gathered, false);
            temps.push(run.malloc(u * c.temp_forward / 2.0, true));
            temps.push(run.malloc(u * c.temp_forward / 2.0, true));
            if c.recompute > 0.0 {
                run.weight_transients(c.weight_forward, ratio);
                block.push(run.malloc(u * c.saved, true));
            } else {
                run.block_tensors(u * c.saved, ratio, c.weight_forward, block);
            }
            run.free_all(&mut temps);
            run.free(gathered);
        }
        // The loss: the upcast logits, their log-softmax, its gradient.
        let logits = run.malloc(u * c.logits, true);
        let copy = run.malloc(u * c.logits, true);
        let dlogits = run.malloc(u * c.logits, true);
        run.free(copy);
        run.free(logits);
        // Backward, last block first: recomputed tensors, temporaries, the
        // block's weight gradients and its input's gradient.
        let mut grad_in = dlogits;
        let mut recomputed = Vec::new();
        for block in saved.iter_mut().rev() {
            let gathered = run.malloc(c.gathered, false);
            if c.recompute > 0.0 {
                run.block_tensors(u * c.recompute, ratio, c.weight_forward, &mut recomputed);
            }
            temps.push(run.malloc(u * c.temp_backward / 2.0, true));
            temps.push(run.malloc(u * c.temp_backward / 2.0, true));
            run.weight_transients(c.weight_backward, ratio);
            if c.grads > 0.0 {
                let g = c.grads / (4.0 + 3.0 * ratio);
                for i in 0..7 {
                    grads.push(run.malloc(if i < 4 { g } else { g * ratio }, false));
                }
            }
            let next = run.malloc(u * unit, true);
            run.free(grad_in);
            grad_in = next;
            run.free_all(&mut temps);
            run.free_all(&mut recomputed);
            run.free_all(block);
            run.free(gathered);
        }
        run.free(grad_in);
        // The optimizer step, then `zero_grad(set_to_none=True)`.
        run.free_all(&mut grads);
        if run.oom {
            break;
        }
        #[cfg(test)]
        assert!(run.alloc.consistent() && run.alloc.allocated() == 0);
    }
    Outcome {
        oom: run.oom,
        peak_reserved: run.alloc.peak_reserved(),
        peak_allocated: run.alloc.peak_allocated(),
        peak_churned: run.peak_churned,
    }
}

/// The fewest bytes a device must let the allocator reserve for the run
/// `steps` to finish: found by bisection between the live tensors' peak
/// and what the allocator reserves with no limit, to 1/64 of the latter.
fn replay(c: &Churn, blocks: u32, steps: &[f64], expandable: bool) -> Replay {
    let free = replay_steps(c, blocks, steps, expandable, u64::MAX);
    let (mut lo, mut hi) = (free.peak_allocated, free.peak_reserved);
    if !expandable {
        let tolerance = (hi / 64).max(ROUND_LARGE);
        while hi > lo + tolerance {
            let mid = lo + (hi - lo) / 2;
            if replay_steps(c, blocks, steps, expandable, mid).oom {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    let scale = c.blocks.max(1.0) / f64::from(blocks);
    Replay {
        stranded: hi.saturating_sub(free.peak_allocated) as f64 * scale,
        churned: free.peak_churned as f64 * scale,
    }
}

/// A run's shapes: `n` steps at fractions of the largest shape between 1/8
/// and 1, drawn by a fixed generator from `seed`, the largest among them.
fn varying_steps(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut steps: Vec<f64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            0.125 + 0.875 * ((x >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect();
    let at = (x % n as u64) as usize;
    steps[at] = 1.0;
    steps
}

/// Runs replayed per end: padded or packed runs repeat one shape, and a
/// repeated identical step finds the blocks of the step before it again, so
/// one step is replayed; variable
/// ones are replayed eight steps long in two drawn orders (the point is their mean) and in
/// ascending order, the order that strands most (each step outgrows every
/// cached block; the high end is the largest of the three).
pub(super) fn replays(c: &Churn, blocks: u32, shapes: Shapes, expandable: bool) -> (f64, f64) {
    let blocks = (c.blocks.ceil().max(1.0) as u32).min(blocks);
    match shapes {
        Shapes::Fixed => {
            let r = replay(c, blocks, &[1.0], expandable).share();
            (r, r)
        }
        Shapes::Varying => {
            let drawn: Vec<f64> = (1..=2)
                .map(|seed| replay(c, blocks, &varying_steps(seed, 8), expandable).share())
                .collect();
            let ascending: Vec<f64> = (0..8).map(|i| 0.125 + 0.875 * f64::from(i) / 7.0).collect();
            let worst = replay(c, blocks, &ascending, expandable).share();
            let mean = drawn.iter().sum::<f64>() / drawn.len() as f64;
            let high = drawn.iter().copied().fold(worst, f64::max);
            (mean, high)
        }
    }
}

/// A size relative to the unit tensor, rounded up to one of four steps per
/// doubling; under 1/64 of the unit it is left out.
fn ratio(x: f64, unit: f64) -> f64 {
    let r = x / unit;
    if r.is_nan() || r < 1.0 / 64.0 || !r.is_finite() {
        return 0.0;
    }
    ((r.log2() * 4.0).ceil() / 4.0).exp2()
}

type Key = ([u64; 11], bool, bool);

/// The stranded share of the churned bytes `(point, high)` for the step `c`
/// describes. The allocator's rules depend on sizes only through the 1, 10
/// and 20 MiB thresholds and the 2 MiB rounding, so a replay is made per
/// distinct shape of the churn (every size relative to one hidden-width
/// tensor, rounded up to a quarter of a doubling) and per doubling of that
/// tensor's size, at the middle of the doubling, and kept: at most 4 096.
pub fn stranded_share(c: &Churn, shapes: Shapes, expandable: bool) -> (f64, f64) {
    static CACHE: OnceLock<Mutex<HashMap<Key, (f64, f64)>>> = OnceLock::new();
    let width = c.width_ratio.max(0.0);
    let unit = c.saved.max(c.recompute) / (6.0 + 3.0 * width);
    if unit.is_nan() || unit < 1.0 || !unit.is_finite() {
        return (0.0, 0.0);
    }
    // Past 64 GiB a tensor is far above every threshold of the allocator and
    // the replay's shares no longer change with size: the doubling is capped
    // there, which also bounds the replay's page table.
    let octave = unit.log2().floor().min(MAX_UNIT_OCTAVE);
    let u = (octave + 0.5).exp2();
    let q = Churn {
        blocks: c.blocks.ceil().clamp(1.0, f64::from(REPLAYED_BLOCKS)),
        saved: ratio(c.saved, unit) * u,
        recompute: ratio(c.recompute, unit) * u,
        width_ratio: ratio(width, 1.0),
        temp_forward: ratio(c.temp_forward, unit) * u,
        temp_backward: ratio(c.temp_backward, unit) * u,
        logits: ratio(c.logits, unit) * u,
        grads: ratio(c.grads, unit) * u,
        weight_forward: ratio(c.weight_forward, unit) * u,
        weight_backward: ratio(c.weight_backward, unit) * u,
        gathered: ratio(c.gathered, unit) * u,
        // The steady step's replay leaves the experts' gradients out.
        expert_grads: [0.0; 2],
        edge_grads: [0.0; 2],
        expert_loop: false,
    };
    let key: Key = (
        [
            q.blocks,
            q.saved,
            q.recompute,
            q.width_ratio,
            q.temp_forward,
            q.temp_backward,
            q.logits,
            q.grads,
            q.weight_forward,
            q.weight_backward,
            q.gathered,
        ]
        .map(f64::to_bits),
        shapes == Shapes::Varying,
        expandable,
    );
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(hit) = cache.lock().map(|m| m.get(&key).copied()).ok().flatten() {
        return hit;
    }
    let out = replays(&q, REPLAYED_BLOCKS, shapes, expandable);
    if let Ok(mut m) = cache.lock() {
        if m.len() >= 4096 {
            m.clear();
        }
        m.insert(key, out);
    }
    out
}
