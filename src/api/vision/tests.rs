use super::*;
use std::collections::HashSet;

const MB: f64 = 1e6;

fn stack(name: &str) -> LayerStack {
    find(name)
        .expect("preset exists")
        .analyze(None, None)
        .unwrap_or_else(|e| panic!("{name}: {e:?}"))
}

#[test]
fn names_and_aliases_are_unique_and_found() {
    let mut seen = HashSet::new();
    for p in &PRESETS {
        for n in std::iter::once(&p.name).chain(p.aliases) {
            assert!(seen.insert(n.to_ascii_lowercase()), "{n} twice");
            assert_eq!(find(&n.to_ascii_uppercase()).map(|f| f.name), Some(p.name));
        }
        // No clash with the transformer catalog.
        assert!(super::super::presets::find(p.name).is_none(), "{}", p.name);
    }
    assert_eq!(names().count(), PRESETS.len());
    assert!(find("resnet-18").is_none());
}

#[test]
fn parameter_counts_match_torchvision() {
    for p in &PRESETS {
        let s = stack(p.name);
        let ours = s.parameters as f64;
        let published = p.published_parameters as f64;
        let err = (ours - published).abs() / published;
        let tolerance = if p.name == "inception-v3" { 0.02 } else { 0.01 };
        println!(
            "{:16} ours {:>12} published {:>12} ({:+.4} %)",
            p.name,
            s.parameters,
            p.published_parameters,
            100.0 * (ours - published) / published
        );
        assert!(
            err <= tolerance,
            "{}: {} vs {}",
            p.name,
            s.parameters,
            p.published_parameters
        );
        assert_eq!(s.output_shape, vec![1000], "{}", p.name);
        assert_eq!(s.has_attention, p.name.starts_with("vit"), "{}", p.name);
        assert!(s.has_conv, "{}", p.name);
    }
}

#[test]
fn inception_aux_head_and_size_without_it() {
    let s = stack("inception-v3");
    assert_eq!(s.aux_output_elems_per_sample, 1000);
    // torchvision publishes 23.8M for inference (aux head dropped): the aux head is
    // conv 768→128 (1x1) + BN, conv 128→768 (5x5) + BN, fc 768→1000.
    let aux = 768 * 128 + 2 * 128 + 128 * 768 * 25 + 2 * 768 + 768 * 1000 + 1000;
    let without = (s.parameters - aux) as f64;
    assert!((without - 23.8e6).abs() / 23.8e6 < 0.01, "{without}");
}

#[test]
fn num_classes_changes_only_the_heads() {
    let p = find("resnet-50").expect("preset");
    let s = p.analyze(None, Some(10)).expect("analyses");
    assert_eq!(s.parameters, 25_557_032 - 990 * 2048 - 990);
    assert_eq!(s.output_shape, vec![10]);
    let e = p.analyze(None, Some(0)).expect_err("0 classes");
    assert_eq!(e[0].0, "spec.model.numLabels");
}

/// ResNet-50 keeps, per 224x224 sample in fp32, every BN input, every ReLU output (shared with
/// the next conv or pool), max-pool indices and the block outputs: by hand, 12·w·HW per
/// bottleneck + 4·w·HW per downsample + the stem = 21.3M elements ≈ 85 MB.
///
/// Published totals bound it from above (they include weights, gradients, optimizer state, the
/// CUDA context, cuDNN workspaces and the caching allocator's slack, i.e. ~1-1.5 GB besides
/// activations):
/// - discuss.pytorch.org/t/resnet-alexnet-memory-usage/36280: ResNet-50 at batch 120 on
///   ImageNet "used about 10000mb" → ≤ 83 MB per sample, everything included;
/// - discuss.pytorch.org/t/resnet-50-takes-10-13gb-to-run-with-batch-size-of-96/117402
///   (cited in PatrickHua/SimSiam#51): 10.13 GB at batch 96 on 256x256 inputs → 105 MB per
///   256² sample, i.e. ≈ 81 MB at 224² (activations scale with pixels);
/// - NVIDIA DeepLearningExamples trains RN50 in fp32/TF32 at batch 256 on 40 GB A100s:
///   < 150 MB per sample.
///
/// The often-quoted "5-6 GB at batch 32" (≈ 150-190 MB per sample) is nvidia-smi with the
/// cuDNN benchmark workspaces and allocator caching; the tensors autograd keeps are what this
/// asserts, so the window is 70-110 MB.
#[test]
fn resnet50_saved_activations_per_sample() {
    let s = stack("resnet-50");
    let fp32 = s.saved_bytes_per_sample(4.0, false);
    let amp = s.saved_bytes_per_sample(2.0, true);
    println!(
        "resnet-50: fp32 {:.1} MB, amp {:.1} MB per sample; per batch fp32 stats {} elems",
        fp32 / MB,
        amp / MB,
        s.saved_fp32_elems_per_batch
    );
    assert!((70.0 * MB..=110.0 * MB).contains(&fp32), "{fp32}");
    // Under autocast convs, BN inputs and ReLU outputs are 16 bit; max-pool indices stay int64.
    assert!(amp > 0.5 * fp32 && amp < 0.55 * fp32, "{amp}");
    // Scales with pixels.
    let big = find("resnet-50")
        .expect("preset")
        .analyze(Some(&[3, 448, 448]), None)
        .expect("448 px");
    let ratio = big.saved_bytes_per_sample(4.0, false) / fp32;
    assert!((3.9..=4.1).contains(&ratio), "{ratio}");
}

/// CS231n's VGG-16 case study (cs231n.github.io/convolutional-networks, "VGGNet") lists the
/// forward activation of every layer; they add up to 15.2M values ≈ 61 MB per image in fp32
/// (the page's printed total, "24M ≈ 93MB", does not match its own list). PyTorch keeps each
/// conv's ReLU'd (in place) output once, each pool output again as the next conv's input,
/// int64 pool indices (1.5M × 8 B ≈ 12 MB), the classifier's inputs and dropout masks, and not
/// the input image: 61 - 0.6 + 12 ≈ 73 MB.
#[test]
fn vgg16_saved_activations_per_sample() {
    let s = stack("vgg-16");
    let fp32 = s.saved_bytes_per_sample(4.0, false);
    println!("vgg-16: fp32 {:.1} MB per sample", fp32 / MB);
    assert!((65.0 * MB..=80.0 * MB).contains(&fp32), "{fp32}");
    assert_eq!(
        s.saved.int64_elems,
        64 * 112 * 112 + 128 * 56 * 56 + 256 * 28 * 28 + 512 * 14 * 14 + 512 * 7 * 7
    );
}

#[test]
fn every_preset_has_sane_activations() {
    for p in &PRESETS {
        let s = stack(p.name);
        let fp32 = s.saved_bytes_per_sample_with(4.0, false, true);
        let amp = s.saved_bytes_per_sample_with(2.0, true, true);
        let eager = s.saved_bytes_per_sample_with(2.0, true, false);
        println!(
            "{:16} fp32 {:7.1} MB  amp {:7.1} MB  amp eager {:7.1} MB  largest layer {:6.1} MB  largest tensor {:5.1} MB",
            p.name,
            fp32 / MB,
            amp / MB,
            eager / MB,
            s.largest_layer_saved_bytes_per_sample(4.0, false, true) / MB,
            s.largest_activation_bytes_per_sample(4.0, false, true) / MB,
        );
        assert!(fp32 > 10.0 * MB && fp32 < 1000.0 * MB, "{}: {fp32}", p.name);
        assert!(
            amp < fp32 && amp > 0.4 * fp32,
            "{}: {amp} vs {fp32}",
            p.name
        );
        assert!(eager >= amp, "{}", p.name);
    }
}

#[test]
fn input_too_small_is_an_input_shape_error() {
    // Five 2x2 pools: 16 px reaches 1 px before the last one.
    let e = find("vgg-16")
        .expect("preset")
        .analyze(Some(&[3, 16, 16]), None)
        .expect_err("16 px cannot go through five 2x2 pools");
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].0, INPUT_SHAPE_PATH);
    assert!(e[0].1.starts_with("[3, 16, 16] does not fit vgg-16: at vgg-16[30].maxpool.kernelSize: 2 is larger than the padded input 1"), "{e:?}");
    let e = find("vgg-16")
        .expect("preset")
        .analyze(Some(&[1, 224, 224]), None)
        .expect_err("one channel");
    assert!(
        e[0].1.contains("conv2d.in: 3 ≠ the incoming channels 1"),
        "{e:?}"
    );
    // torchvision's ResNet takes any size down to 1 px (every stride-2 conv is padded).
    assert!(
        find("resnet-50")
            .expect("preset")
            .analyze(Some(&[3, 16, 16]), None)
            .is_ok()
    );
}

/// The presets' typed layers are what reading the same layers written out gives, and
/// analyse to the same stack: a user who writes a preset's list gets the preset's estimate.
#[test]
fn written_out_every_preset_reads_back_to_its_layers_and_stack() {
    for p in &PRESETS {
        let typed = p.layers(p.num_classes);
        let written: Vec<serde_json::Value> = typed.iter().map(Layer::to_json).collect();
        let read = layers::read(&written, p.name).unwrap_or_else(|e| panic!("{}: {e:?}", p.name));
        assert_eq!(read, typed, "{}", p.name);
        let from_written = layers::analyze_at(&written, p.input_shape, p.name)
            .unwrap_or_else(|e| panic!("{}: {e:?}", p.name));
        assert_eq!(from_written, stack(p.name), "{}", p.name);
    }
}

/// How long one analysis of a ResNet-50-sized `layers` list takes (the webhook validates
/// on every admission): the preset's layers written out as a user would write them.
#[test]
fn resnet50_analysis_time() {
    let layers: Vec<serde_json::Value> = find("resnet-50")
        .expect("preset")
        .layers(1000)
        .iter()
        .map(Layer::to_json)
        .collect();
    let n = 200;
    let t = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(layers::analyze(&layers, &[3, 224, 224]).expect("analyses"));
    }
    println!(
        "resnet-50 analyze: {:.1} µs",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
