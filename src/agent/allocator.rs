//! The simulated GPU's allocator model: device memory as an address range cut
//! into segments, best-fit placement at the driver's granularity, and the
//! replay of an allocation history (`alloc`, `fill`, `freeEvery`, `freeLast`)
//! that leaves the holes a fragmented device has. Pure.

use serde::Deserialize;

use super::bytes::{ByteSize, human};

/// Why a simulated-GPU file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
    #[error("not valid YAML: {0}")]
    Syntax(String),
    /// A field is wrong; `path` names it (`gpus[1].processes[0].allocations[2]`).
    #[error("{path}: {reason}")]
    Field { path: String, reason: String },
}

pub(super) fn field(path: impl Into<String>, reason: impl Into<String>) -> SimError {
    SimError::Field {
        path: path.into(),
        reason: reason.into(),
    }
}

/// A process holding memory on the GPU.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimProcessSpec {
    pub pid: u32,
    /// One block this process holds (its context and tensors), placed first.
    #[serde(default)]
    pub used_bytes: Option<ByteSize>,
    /// The process's allocation history, replayed in order.
    #[serde(default)]
    pub allocations: Vec<AllocOp>,
}

/// One step of an allocation history: exactly one of `alloc`, `fill`,
/// `freeEvery`, `freeLast`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocOp {
    /// Allocate `count` blocks of this size.
    #[serde(default)]
    pub alloc: Option<ByteSize>,
    /// With `alloc`: how many blocks (default 1).
    #[serde(default)]
    pub count: Option<u32>,
    /// Allocate blocks of this size until the next one does not fit.
    #[serde(default)]
    pub fill: Option<ByteSize>,
    /// Free every n-th of the process's live blocks, in allocation order
    /// (`2`: the 2nd, 4th, 6th ... — every other one).
    #[serde(default)]
    pub free_every: Option<u32>,
    /// Free the n blocks allocated last.
    #[serde(default)]
    pub free_last: Option<u32>,
}

/// Most segments one simulated device holds: a history is a model of
/// fragmentation, not a benchmark (placement is linear in the segments).
pub const MAX_SEGMENTS: usize = 10_000;

fn too_many(alloc: &Allocator, path: &str) -> Result<(), SimError> {
    if alloc.segments.len() >= MAX_SEGMENTS {
        return Err(field(
            path,
            format!("more than {MAX_SEGMENTS} blocks on one GPU; use larger blocks"),
        ));
    }
    Ok(())
}

/// A segment of device memory held by `owner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    offset: u64,
    size: u64,
    owner: u32,
}

/// Device memory as an address range cut into segments; best-fit placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocator {
    capacity: u64,
    granularity: u64,
    /// Sorted by offset, non-overlapping.
    segments: Vec<Segment>,
}

impl Allocator {
    pub fn new(capacity: u64, granularity: u64) -> Allocator {
        Allocator {
            capacity,
            granularity: granularity.max(1),
            segments: Vec::new(),
        }
    }

    fn round(&self, bytes: u64) -> Option<u64> {
        bytes
            .div_ceil(self.granularity)
            .checked_mul(self.granularity)
    }

    /// Free ranges `(offset, size)` in address order.
    pub fn holes(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = 0;
        for s in &self.segments {
            if s.offset > at {
                out.push((at, s.offset - at));
            }
            at = s.offset + s.size;
        }
        if self.capacity > at {
            out.push((at, self.capacity - at));
        }
        out
    }

    pub fn granularity_bytes(&self) -> u64 {
        self.granularity
    }

    pub fn used_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    pub fn free_bytes(&self) -> u64 {
        self.capacity.saturating_sub(self.used_bytes())
    }

    pub fn largest_hole(&self) -> u64 {
        self.holes().into_iter().map(|(_, s)| s).max().unwrap_or(0)
    }

    /// Place `bytes` (rounded up to the granularity) in the smallest hole it
    /// fits, lowest address on ties; `None` when no hole is big enough.
    pub fn alloc(&mut self, bytes: u64, owner: u32) -> Option<u64> {
        let size = self.round(bytes.max(1))?;
        let (offset, _) = self
            .holes()
            .into_iter()
            .filter(|(_, s)| *s >= size)
            .min_by_key(|(o, s)| (*s, *o))?;
        let at = self.segments.partition_point(|s| s.offset < offset);
        self.segments.insert(
            at,
            Segment {
                offset,
                size,
                owner,
            },
        );
        Some(offset)
    }

    /// Place `bytes` (rounded up to the granularity) as a process's
    /// allocation is backed on a CUDA device: in one hole when one is big
    /// enough (best fit, as [`Allocator::alloc`]), else in pieces over the
    /// holes in address order, since the driver maps physical pages into
    /// the process's own contiguous virtual range and another process's
    /// blocks between them do not matter. The offsets of the segments
    /// taken; `None` (nothing taken) when less than that is free.
    pub fn alloc_pages(&mut self, bytes: u64, owner: u32) -> Option<Vec<u64>> {
        let size = self.round(bytes.max(1))?;
        if size > self.free_bytes() {
            return None;
        }
        if let Some(offset) = self.alloc(size, owner) {
            return Some(vec![offset]);
        }
        let mut left = size;
        let mut taken = Vec::new();
        for (offset, hole) in self.holes() {
            if left == 0 {
                break;
            }
            let piece = hole.min(left);
            let at = self.segments.partition_point(|s| s.offset < offset);
            self.segments.insert(
                at,
                Segment {
                    offset,
                    size: piece,
                    owner,
                },
            );
            taken.push(offset);
            left -= piece;
        }
        Some(taken)
    }

    /// Would `bytes` fit in one hole?
    pub fn fits(&self, bytes: u64) -> bool {
        self.round(bytes.max(1))
            .is_some_and(|size| self.largest_hole() >= size)
    }

    /// Free the segment at `offset`.
    pub fn free(&mut self, offset: u64) -> bool {
        match self.segments.iter().position(|s| s.offset == offset) {
            Some(i) => {
                self.segments.remove(i);
                true
            }
            None => false,
        }
    }

    pub fn used_by(&self, owner: u32) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.owner == owner)
            .map(|s| s.size)
            .sum()
    }
}

/// Replay one process's history into `alloc`, naming the failing step.
pub(super) fn replay(
    alloc: &mut Allocator,
    proc_: &SimProcessSpec,
    path: &str,
) -> Result<(), SimError> {
    let pid = proc_.pid;
    // Live blocks of this process, in allocation order (offsets).
    let mut live: Vec<u64> = Vec::new();
    let no_room = |alloc: &Allocator, bytes: u64| {
        format!(
            "{} does not fit: {} free in {} hole(s), the largest {}",
            human(bytes),
            human(alloc.free_bytes()),
            alloc.holes().len(),
            human(alloc.largest_hole())
        )
    };
    if let Some(used) = proc_.used_bytes {
        let at = alloc
            .alloc(used.bytes(), pid)
            .ok_or_else(|| field(format!("{path}.usedBytes"), no_room(alloc, used.bytes())))?;
        live.push(at);
    }
    for (i, op) in proc_.allocations.iter().enumerate() {
        let p = format!("{path}.allocations[{i}]");
        let given = [
            op.alloc.is_some(),
            op.fill.is_some(),
            op.free_every.is_some(),
            op.free_last.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given != 1 {
            return Err(field(
                p,
                "give exactly one of alloc, fill, freeEvery, freeLast",
            ));
        }
        if op.count.is_some() && op.alloc.is_none() {
            return Err(field(format!("{p}.count"), "only goes with alloc"));
        }
        if let Some(size) = op.alloc {
            for _ in 0..op.count.unwrap_or(1) {
                too_many(alloc, &p)?;
                let at = alloc
                    .alloc(size.bytes(), pid)
                    .ok_or_else(|| field(&p, no_room(alloc, size.bytes())))?;
                live.push(at);
            }
        } else if let Some(size) = op.fill {
            if size.bytes() == 0 {
                return Err(field(format!("{p}.fill"), "0 bytes would never fill"));
            }
            loop {
                too_many(alloc, &p)?;
                match alloc.alloc(size.bytes(), pid) {
                    Some(at) => live.push(at),
                    None => break,
                }
            }
        } else if let Some(n) = op.free_every {
            if n == 0 {
                return Err(field(
                    format!("{p}.freeEvery"),
                    "0 is not allowed; minimum is 1",
                ));
            }
            let n = n as usize;
            let mut keep = Vec::with_capacity(live.len());
            for (k, at) in live.into_iter().enumerate() {
                if (k + 1) % n == 0 {
                    alloc.free(at);
                } else {
                    keep.push(at);
                }
            }
            live = keep;
        } else if let Some(n) = op.free_last {
            let n = n as usize;
            if n > live.len() {
                return Err(field(
                    format!("{p}.freeLast"),
                    format!("{n} blocks asked, the process holds {}", live.len()),
                ));
            }
            for at in live.split_off(live.len() - n) {
                alloc.free(at);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn best_fit_takes_the_smallest_hole() {
        let mut a = Allocator::new(100 * MIB, 2 * MIB);
        let x = a.alloc(10 * MIB, 1).unwrap();
        let y = a.alloc(4 * MIB, 1).unwrap();
        let _z = a.alloc(20 * MIB, 1).unwrap();
        a.free(x);
        a.free(y);
        // x and y were adjacent: one 14 MiB hole, then the tail after z.
        assert_eq!(a.holes(), vec![(0, 14 * MIB), (34 * MIB, 66 * MIB)]);
        let w = a.alloc(3 * MIB, 2).unwrap();
        assert_eq!(w, 0, "the 14 MiB hole is the best fit for 4 MiB (rounded)");
        assert_eq!(a.used_bytes(), 24 * MIB);
    }

    #[test]
    fn pages_are_served_over_holes_when_no_hole_is_big_enough() {
        let mut a = Allocator::new(10 * GIB, 2 * MIB);
        let blocks: Vec<u64> = (0..10).map(|_| a.alloc(GIB, 1).unwrap()).collect();
        for b in blocks.iter().step_by(2) {
            a.free(*b);
        }
        // 5 GiB free in five 1 GiB holes: no 3 GiB block, but 3 GiB of pages.
        assert!(!a.fits(3 * GIB));
        assert_eq!(a.alloc(3 * GIB, 2), None);
        let pieces = a.alloc_pages(3 * GIB, 2).unwrap();
        assert_eq!(pieces.len(), 3);
        assert_eq!(a.used_by(2), 3 * GIB);
        assert_eq!(a.alloc_pages(3 * GIB, 3), None, "2 GiB are left");
        assert_eq!(a.used_by(3), 0, "a refused allocation takes nothing");
        // One hole big enough: one block, best fit.
        assert_eq!(a.alloc_pages(GIB, 4).map(|p| p.len()), Some(1));
        for p in pieces {
            assert!(a.free(p));
        }
        assert_eq!(a.free_bytes(), 4 * GIB);
    }

    #[test]
    fn free_every_other_fragments() {
        let mut a = Allocator::new(40 * GIB, 2 * MIB);
        let p = SimProcessSpec {
            pid: 7,
            used_bytes: None,
            allocations: vec![
                AllocOp {
                    fill: Some(ByteSize(GIB)),
                    ..Default::default()
                },
                AllocOp {
                    free_every: Some(2),
                    ..Default::default()
                },
            ],
        };
        replay(&mut a, &p, "p").unwrap();
        assert_eq!(a.free_bytes(), 20 * GIB);
        assert_eq!(a.largest_hole(), GIB);
        assert_eq!(a.used_by(7), 20 * GIB);
    }

    #[test]
    fn histories_are_bounded() {
        let mut a = Allocator::new(80 * GIB, 2 * MIB);
        let p = SimProcessSpec {
            pid: 1,
            used_bytes: None,
            allocations: vec![AllocOp {
                fill: Some(ByteSize(2 * MIB)),
                ..Default::default()
            }],
        };
        let e = replay(&mut a, &p, "p").unwrap_err();
        assert!(e.to_string().contains("more than 10000 blocks"), "{e}");
    }

    #[test]
    fn history_errors_name_the_step() {
        let mut a = Allocator::new(GIB, 2 * MIB);
        let p = SimProcessSpec {
            pid: 1,
            used_bytes: None,
            allocations: vec![AllocOp {
                alloc: Some(ByteSize(2 * GIB)),
                ..Default::default()
            }],
        };
        let e = replay(&mut a, &p, "gpus[0].processes[0]").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("gpus[0].processes[0].allocations[0]: 2.00 GiB does not fit"),
            "{e}"
        );
        let bad = SimProcessSpec {
            pid: 1,
            used_bytes: None,
            allocations: vec![AllocOp::default()],
        };
        let e = replay(&mut a, &bad, "p").unwrap_err();
        assert!(e.to_string().contains("exactly one of"), "{e}");
    }
}
