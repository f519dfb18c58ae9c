use super::replay::replays;
use super::*;

const M: u64 = 1 << 20;

#[test]
fn sizes_round_as_the_allocator_rounds() {
    assert_eq!(round_size(1), 512);
    assert_eq!(round_size(513), 1024);
    assert_eq!(allocation_size(M), 2 * M);
    assert_eq!(allocation_size(M + 512), 20 * M);
    assert_eq!(allocation_size(10 * M - 512), 20 * M);
    assert_eq!(allocation_size(10 * M + 1), 12 * M);
}

#[test]
fn mid_sized_requests_share_a_20_mib_segment_and_merge_when_freed() {
    let mut a = CachingAllocator::new(false, u64::MAX);
    let x = a.malloc(6 * M).unwrap();
    let y = a.malloc(6 * M).unwrap();
    let z = a.malloc(6 * M).unwrap();
    assert_eq!((a.reserved(), a.segments()), (20 * M, 1));
    a.free(x);
    a.free(y);
    // 12 MiB free in front, 2 MiB behind z: an 11 MiB request fits.
    let w = a.malloc(11 * M).unwrap();
    assert_eq!(a.reserved(), 20 * M);
    a.free(w);
    a.free(z);
    // Everything merged back: the whole segment serves 20 MiB.
    a.malloc(20 * M).unwrap();
    assert_eq!((a.reserved(), a.segments()), (20 * M, 1));
}

#[test]
fn an_unused_segment_is_released_and_a_split_one_runs_out_of_memory() {
    let mut a = CachingAllocator::new(false, 60 * M);
    let big = a.malloc(30 * M).unwrap();
    a.free(big);
    // 30 + 40 MiB is over 60: the unused 30 MiB segment goes back first.
    let b = a.malloc(40 * M).unwrap();
    assert_eq!(a.reserved(), 40 * M);
    a.free(b);
    // The 40 MiB block serves 6 MiB and keeps 34 MiB free behind it.
    let live = a.malloc(6 * M).unwrap();
    assert_eq!(a.reserved(), 40 * M);
    // 36 MiB fits neither the 34 MiB remainder nor, as a new segment,
    // the 20 MiB the device has left, and the segment holds a live
    // block: out of memory with 54 MiB free.
    assert_eq!(a.malloc(36 * M), None);
    a.free(live);
    assert_eq!(a.malloc(36 * M).map(|_| a.reserved()), Some(40 * M));
}

#[test]
fn a_small_remainder_of_a_large_block_is_not_split_off() {
    let mut a = CachingAllocator::new(false, u64::MAX);
    let x = a.malloc(12 * M).unwrap();
    a.free(x);
    // 12 MiB serves 11.5 MiB whole (0.5 MiB left is not over 1 MiB).
    a.malloc(11 * M + M / 2).unwrap();
    assert_eq!(a.allocated(), 12 * M);
}

#[test]
fn expandable_segments_map_only_the_pages_live_tensors_touch() {
    let mut a = CachingAllocator::new(true, u64::MAX);
    let x = a.malloc(30 * M).unwrap();
    let y = a.malloc(30 * M).unwrap();
    a.free(x);
    // 30 MiB free in front: the 40 MiB request extends the segment at
    // its end; the pages x left are free and not counted.
    a.malloc(40 * M).unwrap();
    // y spans pages 1-2 (20-60 MiB), the new block 60-100 MiB: pages
    // 3-4 (60-100). Four 20 MiB pages.
    assert_eq!(a.reserved(), 80 * M);
    a.free(y);
    assert_eq!(a.reserved(), 40 * M);
}

/// A 4096-wide block at micro-batch 1 × 4096 tokens in bf16, 32 of them,
/// with Llama 3's 128 256-token head.
pub(crate) fn llama_block() -> Churn {
    let t = 4096.0 * 4096.0 * 2.0;
    Churn {
        blocks: 32.0,
        saved: t * (6.0 + 3.0 * 2.6875),
        width_ratio: 2.6875,
        temp_forward: 2.0 * t,
        temp_backward: 4.0 * t,
        logits: 4096.0 * 128_256.0 * 4.0,
        ..Churn::default()
    }
}

/// A GPTQ-quantized 4096-wide block with a 14336-wide MLP at 512 tokens:
/// each linear dequantizes its weight (the MLP's is 28 times a hidden-width
/// activation) before its output is allocated.
fn dequantizing_block() -> Churn {
    let t = 512.0 * 4096.0 * 2.0;
    Churn {
        blocks: 32.0,
        saved: t * (6.0 + 3.0 * 3.5),
        width_ratio: 3.5,
        temp_forward: 2.0 * t,
        temp_backward: 4.0 * t,
        logits: 512.0 * 128_256.0 * 4.0,
        weight_forward: 28.0 * t,
        weight_backward: 28.0 * t,
        ..Churn::default()
    }
}

#[test]
fn saved_outputs_placed_in_freed_weight_blocks_strand_their_segments() {
    // Best fit puts a linear's output in the block the previous linear's
    // dequantized weight left: the segment then holds a saved tensor for
    // the rest of the step and the next weight needs a segment of its own.
    let (fixed, _) = stranded_share(&dequantizing_block(), Shapes::Fixed, false);
    let (plain, _) = stranded_share(&llama_block(), Shapes::Fixed, false);
    assert!(
        fixed > 0.15 && fixed > 4.0 * plain,
        "{fixed} against {plain}"
    );
    // One growing segment merges the freed weight with its neighbours.
    let (expandable, _) = stranded_share(&dequantizing_block(), Shapes::Fixed, true);
    assert!(expandable < fixed / 3.0, "{expandable} against {fixed}");
}

#[test]
fn one_repeated_shape_strands_little_and_variable_shapes_strand_more() {
    let c = llama_block();
    let (fixed, fixed_high) = stranded_share(&c, Shapes::Fixed, false);
    let (point, high) = stranded_share(&c, Shapes::Varying, false);
    assert!(fixed < 0.05, "{fixed}");
    assert_eq!(fixed, fixed_high);
    assert!(point > fixed, "{point} > {fixed}");
    assert!(high >= point, "{high} >= {point}");
}

#[test]
fn expandable_segments_strand_less_than_fixed_segments() {
    let c = llama_block();
    let (_, high) = stranded_share(&c, Shapes::Varying, false);
    let (_, high_exp) = stranded_share(&c, Shapes::Varying, true);
    assert!(high_exp < high, "{high_exp} < {high}");
}

#[test]
fn the_replay_is_independent_of_blocks_past_the_replayed_ones() {
    let mut c = llama_block();
    let a = stranded_share(&c, Shapes::Varying, false);
    c.blocks = 80.0;
    assert_eq!(stranded_share(&c, Shapes::Varying, false), a);
}

#[test]
fn a_failed_expandable_request_holds_nothing() {
    let mut a = CachingAllocator::new(true, 40 * M);
    a.malloc(30 * M).unwrap();
    // 30 + 30 MiB touches three 20 MiB pages: over 40 MiB.
    assert_eq!(a.malloc(30 * M), None);
    assert_eq!((a.allocated(), a.reserved()), (30 * M, 40 * M));
}

#[test]
fn absurd_sizes_replay_at_the_capped_size_in_bounded_memory() {
    let mut c = llama_block();
    for x in [
        &mut c.saved,
        &mut c.temp_forward,
        &mut c.temp_backward,
        &mut c.logits,
    ] {
        *x *= 1e9;
    }
    for expandable in [false, true] {
        let (point, high) = stranded_share(&c, Shapes::Varying, expandable);
        assert!(point.is_finite() && high.is_finite() && high >= point);
    }
    c.saved = f64::NAN;
    assert_eq!(stranded_share(&c, Shapes::Varying, true), (0.0, 0.0));
}

/// The figures docs/DESIGN.md quotes: `cargo test --release --lib
/// caching::tests::a_llama_block -- --nocapture`.
#[test]
fn a_llama_block() {
    let c = llama_block();
    let started = std::time::Instant::now();
    let mut shares = Vec::new();
    for (shapes, expandable) in [
        (Shapes::Fixed, false),
        (Shapes::Varying, false),
        (Shapes::Fixed, true),
        (Shapes::Varying, true),
    ] {
        let (point, high) = replays(&c, REPLAYED_BLOCKS, shapes, expandable);
        eprintln!("{shapes:?} expandable {expandable}: point {point:.3} high {high:.3}");
        shares.push(high);
    }
    eprintln!("four replays in {:?}", started.elapsed());
    // On fixed-size segments varying shapes strand more than one shape;
    // expandable segments strand less than fixed-size ones either way.
    assert!(shares[1] > shares[0], "{shares:?}");
    assert!(
        shares[2] <= shares[0] && shares[3] < shares[1],
        "{shares:?}"
    );
}
