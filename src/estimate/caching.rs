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
//! `bounds::fragmentation_share` takes each end as the larger of the
//! replay's share and a flat share for what the replay leaves out.

use std::collections::BTreeSet;

const MIN_BLOCK: u64 = 512;
pub(super) const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
pub(super) const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;
const NONE: u32 = u32::MAX;

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

mod replay;
pub use replay::{Churn, REPLAYED_BLOCKS, Replay, Shapes, stranded_share};

#[cfg(test)]
pub(crate) mod tests;
