//! The mechanisms' ends, one by one.

use super::*;

#[test]
fn every_mechanism_is_listed_once_in_order() {
    for (i, m) in Mechanism::ALL.iter().enumerate() {
        assert_eq!(*m as usize, i);
    }
}

#[test]
fn point_but_moves_one_mechanism_only() {
    let e = Ends::point_but(Mechanism::Fragmentation, End::High);
    for m in Mechanism::ALL {
        let want = if m == Mechanism::Fragmentation {
            End::High
        } else {
            End::Point
        };
        assert_eq!(e.of(m), want);
    }
}

#[test]
fn expandable_segments_and_fixed_shapes_narrow_fragmentation() {
    let c = crate::estimate::caching::tests::llama_block();
    let mut f = Facts::default();
    let share = |f: &Facts, end| fragmentation_share(&Ends::all(end), f, &c);
    let high = share(&f, End::High);
    assert!(share(&f, End::Point) < high);
    assert_eq!(share(&f, End::Low), 0.0);
    f.batching = Some(Batching::Packed);
    assert!(share(&f, End::High) < high);
    f.batching = None;
    f.allocator.expandable_segments = true;
    assert!(share(&f, End::High) < high);
}

#[test]
fn a_known_lazy_runtime_drops_the_eager_context() {
    let point = 512.0 * MIB;
    let unknown = cuda_context(&Ends::all(End::High), &Facts::default(), point);
    assert_eq!(unknown, EAGER_CONTEXT_HIGH);
    let mut f = Facts::default();
    f.runtime.cuda = Some((12, 1));
    f.runtime.pytorch = Some((2, 4));
    assert_eq!(
        cuda_context(&Ends::all(End::High), &f, point),
        point + 512.0 * MIB
    );
    f.runtime.cuda = Some((11, 3));
    assert_eq!(
        cuda_context(&Ends::all(End::High), &f, point),
        EAGER_CONTEXT_HIGH
    );
}

#[test]
fn transformers_release_pins_the_logits_copies() {
    let hi = Ends::all(End::High);
    let mut f = Facts::default();
    assert_eq!(logits_extra_bytes(&hi, &f, false, 2.0), 4.0);
    assert_eq!(logits_extra_bytes(&hi, &f, true, 2.0), 0.0);
    f.runtime.transformers = Some((4, 50));
    assert_eq!(logits_extra_bytes(&hi, &f, false, 2.0), 0.0);
    // 4.46 to 4.48: the shifted fp32 copy beside the model's 16-bit output.
    f.runtime.transformers = Some((4, 47));
    assert_eq!(
        logits_extra_bytes(&Ends::all(End::Point), &f, false, 2.0),
        4.0
    );
    // Up to 4.45 the model drops its 16-bit output when it upcasts.
    f.runtime.transformers = Some((4, 40));
    assert_eq!(
        logits_extra_bytes(&Ends::all(End::Point), &f, false, 2.0),
        2.0
    );
    assert_eq!(
        logits_extra_bytes(&Ends::all(End::Point), &f, false, 4.0),
        4.0
    );
}

#[test]
fn the_expert_loop_is_the_high_end_of_fused_transformers_experts() {
    let mut f = Facts::default();
    let hi = Ends::all(End::High);
    assert!(expert_loop(&hi, &f, 8, false));
    assert!(!expert_loop(&Ends::all(End::Point), &f, 8, false));
    assert!(!expert_loop(&Ends::all(End::Low), &f, 8, false));
    // A dense model, a stack with its own modules, a release with one
    // linear per expert.
    assert!(!expert_loop(&hi, &f, 0, false));
    assert!(!expert_loop(&hi, &f, 8, true));
    f.runtime.transformers = Some((4, 57));
    assert!(!expert_loop(&hi, &f, 8, false));
    f.runtime.transformers = Some((5, 17));
    assert!(expert_loop(&hi, &f, 8, false));
}
