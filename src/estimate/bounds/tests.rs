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

#[test]
fn an_fp32_build_is_the_high_end_only_where_the_job_declares_it() {
    let job = |training: &str, parallelism: &str| {
        crate::api::test_job(&format!(
            "model: {{preset: llama-3-8b}}\ntraining: {{microBatchSize: 1, sequenceLength: 512, {training}}}\nparallelism: {{{parallelism}}}\n"
        ))
    };
    let at = |end, j: &crate::api::ValidatedJob| fp32_build(&Ends::all(end), j);
    let declared = "precision: bf16, weightsLoad: fp32-cast";
    for load in [declared, "precision: fp16, weightsLoad: fp32-cast"] {
        let j = job(load, "gpus: 1");
        assert_eq!(at(End::High, &j), 1.0, "{load}");
        assert_eq!(at(End::Point, &j), 0.0, "{load}");
        assert_eq!(at(End::Low, &j), 0.0, "{load}");
    }
    // Loaded in its dtype, said or not: nothing at any end.
    for load in ["precision: bf16", "precision: bf16, weightsLoad: dtype"] {
        let j = job(load, "gpus: 1");
        for end in [End::Low, End::Point, End::High] {
            assert_eq!(at(end, &j), 0.0, "{load}");
        }
    }
    // Declared, but the cast's blocks are not stranded: ZeRO-3 and FSDP shard the
    // weights, a quantizer loads them itself, expandable segments reuse any page.
    let sharded = job(declared, "gpus: 8, strategy: deepspeed, zeroStage: 3");
    assert_eq!(at(End::High, &sharded), 0.0);
    assert_eq!(
        at(End::High, &job(declared, "gpus: 8, strategy: fsdp")),
        0.0
    );
    let quantized = job(
        "mode: qlora, precision: bf16, weightsLoad: fp32-cast",
        "gpus: 1",
    );
    assert_eq!(at(End::High, &quantized), 0.0);
    let mut expandable = job(declared, "gpus: 1");
    expandable.allocator_conf.expandable_segments = true;
    assert_eq!(at(End::High, &expandable), 0.0);
}

#[test]
fn a_declared_fp32_build_lifts_only_the_upper_end_of_reserved() {
    let gpu = crate::api::gpus::find("h200").expect("catalog GPU");
    let yaml = |load: &str| {
        format!(
            "model: {{preset: llama-3.2-1b}}\ntraining: {{mode: lora, microBatchSize: 1, sequenceLength: 512, precision: bf16{load}}}\n"
        )
    };
    let estimate = |load: &str| {
        crate::estimate::estimate(&crate::api::test_job(&yaml(load)), gpu).expect("estimates")
    };
    let (plain, said, cast) = (
        estimate(""),
        estimate(", weightsLoad: dtype"),
        estimate(", weightsLoad: fp32-cast"),
    );
    assert_eq!(plain.status, said.status);
    let (p, c) = (&plain.status, &cast.status);
    let (pu, cu) = (
        p.upper.as_ref().expect("upper"),
        c.upper.as_ref().expect("upper"),
    );
    let weights = p.breakdown.weights as f64;
    let lifted = (cu.peak_reserved_bytes as f64 - pu.peak_reserved_bytes as f64) / weights;
    assert!(
        (lifted - 1.0).abs() < 0.01,
        "upper reserved rose by {lifted} × the weights"
    );
    assert_eq!(p.peak_reserved_bytes, c.peak_reserved_bytes);
    assert_eq!(p.lower, c.lower);
    assert_eq!(pu.peak_allocated_bytes, cu.peak_allocated_bytes);
    let named =
        |s: &crate::api::EstimateStatus| s.spread.iter().any(|r| r.mechanism == "fp32Build");
    assert!(named(c) && !named(p), "{:?}", c.spread);
}

#[test]
fn only_a_tensorwise_float8_linear_without_the_float8_gather_keeps_an_fp8_weight() {
    use crate::api::{Float8Recipe, TrainingSpec};
    let spec = |float8, float8_all_gather| TrainingSpec {
        float8,
        float8_all_gather,
        ..TrainingSpec::default()
    };
    let at = |end, t: &TrainingSpec| float8_weight_saved(&Ends::all(end), t);
    let tensorwise = spec(Some(Float8Recipe::Tensorwise), false);
    assert_eq!(
        [End::Low, End::Point, End::High].map(|e| at(e, &tensorwise)),
        [0.0, 1.0, 1.0]
    );
    for t in [
        spec(None, false),
        spec(Some(Float8Recipe::Tensorwise), true),
        spec(Some(Float8Recipe::Rowwise), false),
        spec(Some(Float8Recipe::RowwiseWithGwHp), false),
    ] {
        for end in [End::Low, End::Point, End::High] {
            assert_eq!(at(end, &t), 0.0, "{t:?}");
        }
    }
}
