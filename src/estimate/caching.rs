//! PyTorch's CUDA caching allocator, replayed over a step's allocations.
//!
//! The allocator's reserved bytes exceed the live tensors' because freed
//! blocks stay in their segments: a block cached at one size serves a later
//! request only when it is at least as large, and a split segment goes back
//! to the driver only once every block in it is free. How much is stranded
//! depends on the order and sizes of the step's allocations, so it is not a
//! constant share: this module replays a step's churn (saved activations,
//! temporaries, logits, gradients that `zero_grad(set_to_none=True)` frees)
//! through the allocator's own rules and reports what stays stranded.
//!
//! The rules, from pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp`
//! (commit 001074d25084fdb87a799823e395a50f5ec044d3):
//! - `round_size`: requests round up to a multiple of 512 bytes;
//! - `get_pool`: requests up to 1 MiB use the small pool, larger ones the
//!   large pool, and a block never moves between pools;
//! - `get_allocation_size`: a new segment is 2 MiB for a small request,
//!   20 MiB for one under 10 MiB, else the request rounded up to 2 MiB;
//! - `get_free_block`: best fit, the smallest cached block at least as
//!   large as the request (lowest address first among equals);
//! - `should_split`: a small block splits when 512 bytes or more remain, a
//!   large one when more than 1 MiB remains (any 512 with
//!   `expandable_segments`); the request takes the front of the block;
//! - `free_block` / `try_merge_blocks`: a freed block merges with free
//!   neighbours of its own segment, never across segments;
//! - `release_cached_blocks`: when `cudaMalloc` fails, every cached segment
//!   with no block in use goes back to the driver and the allocation is
//!   retried; only then is out-of-memory raised.
//! - Note [Expandable Segments]: one segment per pool that grows by mapping
//!   pages (2 MiB for the small pool, 20 MiB for the large one) at its end,
//!   so neighbouring free blocks merge, and free pages are unmapped on the
//!   retry.
//!
//! The replay runs the allocator on a device of a given capacity and finds,
//! by bisection, the smallest capacity on which the run finishes: what is
//! reserved beyond the live tensors there is what no retry recovers.
//!
//! Not yet used by the estimate (`bounds::fragmentation_share` still states
//! flat shares): on some one-shape steps the replay strands about twice the
//! flat point, unexplained so far.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock};

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;
const NONE: u32 = u32::MAX;

/// At most this many blocks of a stage are replayed; the stranded bytes of
/// the rest are those of the replayed ones in proportion (each block repeats
/// the same allocations).
pub const REPLAYED_BLOCKS: u32 = 4;

/// The largest hidden-width tensor replayed as it is: 2^36 bytes (64 GiB).
const MAX_UNIT_OCTAVE: f64 = 36.0;

/// `round_size`: multiples of 512 bytes, at least 512.
pub fn round_size(size: u64) -> u64 {
    size.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

/// `get_allocation_size`: the bytes of a new segment for a rounded request.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[derive(Clone, Copy, Debug)]
struct Block {
    pool: usize,
    segment: u32,
    offset: u64,
    size: u64,
    allocated: bool,
    prev: u32,
    next: u32,
}

/// The caching allocator of one device and one stream.
#[derive(Debug)]
pub struct CachingAllocator {
    expandable: bool,
    /// Bytes the device lets it reserve.
    capacity: u64,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    /// Free blocks per pool (0 small, 1 large): (size, segment, offset, id).
    free: [BTreeSet<(u64, u32, u64, u32)>; 2],
    /// Per segment: its bytes, 0 once released.
    segments: Vec<u64>,
    /// Expandable segments: the one segment of each pool, its mapped end,
    /// and how many live bytes touch each of its pages.
    grow: [Option<u32>; 2],
    pages: [Vec<u64>; 2],
    touched: u64,
    reserved: u64,
    allocated: u64,
    peak_reserved: u64,
    peak_allocated: u64,
}

fn pool_of(size: u64) -> usize {
    usize::from(size > SMALL_SIZE)
}

fn page_of(pool: usize) -> u64 {
    if pool == 0 {
        SMALL_BUFFER
    } else {
        LARGE_BUFFER
    }
}

impl CachingAllocator {
    /// An allocator on a device that lets it reserve `capacity` bytes.
    pub fn new(expandable: bool, capacity: u64) -> CachingAllocator {
        CachingAllocator {
            expandable,
            capacity,
            blocks: Vec::new(),
            spare: Vec::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            segments: Vec::new(),
            grow: [None, None],
            pages: [Vec::new(), Vec::new()],
            touched: 0,
            reserved: 0,
            allocated: 0,
            peak_reserved: 0,
            peak_allocated: 0,
        }
    }

    /// Bytes the device holds for this allocator: its segments, or with
    /// expandable segments the pages some live tensor touches.
    pub fn reserved(&self) -> u64 {
        if self.expandable {
            self.touched
        } else {
            self.reserved
        }
    }

    #[cfg(test)]
    fn allocated(&self) -> u64 {
        self.allocated
    }

    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    pub fn peak_allocated(&self) -> u64 {
        self.peak_allocated
    }

    /// Every cached block merged with its free neighbours: no two free
    /// blocks side by side, and the blocks of each segment tile it.
    #[cfg(test)]
    fn consistent(&self) -> bool {
        let mut tiled = vec![0u64; self.segments.len()];
        for b in self.blocks.iter().filter(|b| b.size > 0) {
            tiled[b.segment as usize] += b.size;
            if !b.allocated && b.next != NONE && !self.blocks[b.next as usize].allocated {
                return false;
            }
        }
        let free: usize = self.free.iter().map(BTreeSet::len).sum();
        let unallocated = self
            .blocks
            .iter()
            .filter(|b| b.size > 0 && !b.allocated)
            .count();
        free == unallocated && tiled.iter().zip(&self.segments).all(|(t, s)| t == s)
    }

    /// Cached segments.
    #[cfg(test)]
    fn segments(&self) -> usize {
        self.segments.iter().filter(|s| **s > 0).count()
    }

    fn new_block(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(id) => {
                self.blocks[id as usize] = b;
                id
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn key(&self, id: u32) -> (u64, u32, u64, u32) {
        let b = &self.blocks[id as usize];
        (b.size, b.segment, b.offset, id)
    }

    /// `release_cached_blocks`: every segment with no block in use.
    fn release_cached(&mut self) {
        for pool in 0..2 {
            let whole: Vec<(u64, u32, u64, u32)> = self.free[pool]
                .iter()
                .filter(|k| {
                    let b = &self.blocks[k.3 as usize];
                    b.prev == NONE && b.next == NONE && Some(b.segment) != self.grow[pool]
                })
                .copied()
                .collect();
            for k in whole {
                self.free[pool].remove(&k);
                self.reserved -= self.segments[k.1 as usize];
                self.segments[k.1 as usize] = 0;
                self.blocks[k.3 as usize].size = 0;
                self.spare.push(k.3);
            }
        }
    }

    /// `cudaMalloc` of a new segment; past the capacity, the cached segments
    /// no block uses are released and it is retried once.
    fn new_segment(&mut self, pool: usize, size: u64) -> Option<u32> {
        if self.reserved + size > self.capacity {
            self.release_cached();
            if self.reserved + size > self.capacity {
                return None;
            }
        }
        let segment = self.segments.len() as u32;
        self.segments.push(size);
        self.reserved += size;
        let id = self.new_block(Block {
            pool,
            segment,
            offset: 0,
            size,
            allocated: false,
            prev: NONE,
            next: NONE,
        });
        self.free[pool].insert(self.key(id));
        Some(id)
    }

    /// Expandable segments: extend the pool's one segment by `size` at its
    /// end (merged with a free block that ends it).
    fn grow_segment(&mut self, pool: usize, size: u64) -> u32 {
        let Some(segment) = self.grow[pool] else {
            let segment = self.segments.len() as u32;
            self.segments.push(size);
            self.reserved += size;
            let id = self.new_block(Block {
                pool,
                segment,
                offset: 0,
                size,
                allocated: false,
                prev: NONE,
                next: NONE,
            });
            self.free[pool].insert(self.key(id));
            self.grow[pool] = Some(segment);
            return id;
        };
        let end = self.segments[segment as usize];
        self.segments[segment as usize] = end + size;
        self.reserved += size;
        let last = self
            .blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.segment == segment && b.size > 0 && b.offset + b.size == end)
            .map(|(i, _)| i as u32);
        match last {
            Some(id) if !self.blocks[id as usize].allocated => {
                let k = self.key(id);
                self.free[pool].remove(&k);
                self.blocks[id as usize].size += size;
                self.free[pool].insert(self.key(id));
                id
            }
            last => {
                let id = self.new_block(Block {
                    pool,
                    segment,
                    offset: end,
                    size,
                    allocated: false,
                    prev: last.unwrap_or(NONE),
                    next: NONE,
                });
                if let Some(l) = last {
                    self.blocks[l as usize].next = id;
                }
                self.free[pool].insert(self.key(id));
                id
            }
        }
    }

    fn touch(&mut self, pool: usize, offset: u64, size: u64, add: bool) {
        let page = page_of(pool);
        let first = offset / page;
        let last = (offset + size - 1) / page;
        let pages = &mut self.pages[pool];
        if pages.len() <= last as usize {
            pages.resize(last as usize + 1, 0);
        }
        for p in first..=last {
            let lo = (p * page).max(offset);
            let hi = ((p + 1) * page).min(offset + size);
            let slot = &mut pages[p as usize];
            if add {
                if *slot == 0 {
                    self.touched += page;
                }
                *slot += hi - lo;
            } else {
                *slot -= hi - lo;
                if *slot == 0 {
                    self.touched -= page;
                }
            }
        }
    }

    /// Allocate `size` bytes: the block's id, or `None` for out-of-memory.
    /// With expandable segments the pages mapped are the pages live blocks
    /// touch (free ones are unmapped on the retry), checked against the
    /// capacity.
    pub fn malloc(&mut self, size: u64) -> Option<u32> {
        let size = round_size(size);
        let pool = pool_of(size);
        let found = self.free[pool].range((size, 0, 0, 0)..).next().copied();
        let id = match found {
            Some(k) => k.3,
            None if self.expandable => {
                let page = page_of(pool);
                self.grow_segment(pool, size.div_ceil(page) * page)
            }
            None => self.new_segment(pool, allocation_size(size))?,
        };
        let k = self.key(id);
        self.free[pool].remove(&k);
        let remaining = self.blocks[id as usize].size - size;
        let split = if pool == 0 || self.expandable {
            remaining >= MIN_BLOCK
        } else {
            remaining > SMALL_SIZE
        };
        if split {
            let b = self.blocks[id as usize];
            let rest = self.new_block(Block {
                pool,
                segment: b.segment,
                offset: b.offset + size,
                size: remaining,
                allocated: false,
                prev: id,
                next: b.next,
            });
            if b.next != NONE {
                self.blocks[b.next as usize].prev = rest;
            }
            let blk = &mut self.blocks[id as usize];
            blk.next = rest;
            blk.size = size;
            self.free[pool].insert(self.key(rest));
        }
        let b = &mut self.blocks[id as usize];
        b.allocated = true;
        let (offset, bytes) = (b.offset, b.size);
        self.allocated += bytes;
        if self.expandable {
            self.touch(pool, offset, bytes, true);
        }
        if self.reserved() > self.capacity {
            // Expandable pages past the capacity: the mapping fails and the
            // block goes back, so a failed request holds nothing.
            self.free(id);
            return None;
        }
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.peak_reserved = self.peak_reserved.max(self.reserved());
        Some(id)
    }

    /// Free the block `id`, merging it with free neighbours.
    pub fn free(&mut self, id: u32) {
        let b = self.blocks[id as usize];
        debug_assert!(b.allocated);
        let pool = b.pool;
        self.allocated -= b.size;
        if self.expandable {
            self.touch(pool, b.offset, b.size, false);
        }
        self.blocks[id as usize].allocated = false;
        for neighbour in [b.prev, b.next] {
            if neighbour == NONE || self.blocks[neighbour as usize].allocated {
                continue;
            }
            let n = self.blocks[neighbour as usize];
            self.free[pool].remove(&self.key(neighbour));
            let me = &mut self.blocks[id as usize];
            if n.offset < me.offset {
                me.offset = n.offset;
                me.prev = n.prev;
                if n.prev != NONE {
                    self.blocks[n.prev as usize].next = id;
                }
            } else {
                me.next = n.next;
                if n.next != NONE {
                    self.blocks[n.next as usize].prev = id;
                }
            }
            self.blocks[id as usize].size += n.size;
            self.blocks[neighbour as usize].size = 0;
            self.spare.push(neighbour);
        }
        self.free[pool].insert(self.key(id));
    }
}

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
    /// the MLP's.
    fn block_tensors(&mut self, bytes: f64, ratio: f64, out: &mut Vec<Live>) {
        let unit = bytes / (6.0 + 3.0 * ratio);
        for i in 0..9 {
            let b = if i % 3 == 2 { unit * ratio } else { unit };
            out.push(self.malloc(b, true));
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
            temps.push(run.malloc(u * c.temp_forward / 2.0, true));
            temps.push(run.malloc(u * c.temp_forward / 2.0, true));
            if c.recompute > 0.0 {
                block.push(run.malloc(u * c.saved, true));
            } else {
                run.block_tensors(u * c.saved, ratio, block);
            }
            run.free_all(&mut temps);
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
            if c.recompute > 0.0 {
                run.block_tensors(u * c.recompute, ratio, &mut recomputed);
            }
            temps.push(run.malloc(u * c.temp_backward / 2.0, true));
            temps.push(run.malloc(u * c.temp_backward / 2.0, true));
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
fn replays(c: &Churn, blocks: u32, shapes: Shapes, expandable: bool) -> (f64, f64) {
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

type Key = ([u64; 8], bool, bool);

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

#[cfg(test)]
mod tests;
