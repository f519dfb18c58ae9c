use super::*;
use serde_json::json;

fn run(layers: Value, input: &[u64]) -> Result<LayerStack, Vec<LayerError>> {
    let list = layers.as_array().expect("a list").clone();
    analyze(&list, input)
}

fn ok(layers: Value, input: &[u64]) -> LayerStack {
    run(layers, input).unwrap_or_else(|e| panic!("{e:?}"))
}

fn errs(layers: Value, input: &[u64]) -> Vec<LayerError> {
    run(layers, input).expect_err("must be rejected")
}

/// 784 → 256 → ReLU → dropout → 128 → ReLU → 10, by hand.
#[test]
fn mlp_parameters_and_saved_bytes_by_hand() {
    let s = ok(
        json!([
            {"linear": {"in": 784, "out": 256}},
            {"relu": {}},
            {"dropout": {"p": 0.5}},
            {"linear": {"in": 256, "out": 128}},
            {"relu": {}},
            {"linear": {"in": 128, "out": 10}},
        ]),
        &[784],
    );
    // (784·256 + 256) + (256·128 + 128) + (128·10 + 10)
    assert_eq!(s.parameters, 200_960 + 32_896 + 1_290);
    assert_eq!(s.autocast_parameters, s.parameters);
    assert_eq!(s.parameter_tensors, 6);
    assert_eq!(s.largest_param_elems, 784 * 256);
    assert_eq!(s.output_shape, vec![10]);
    // fp32: linear 1 keeps the input batch itself (counted as inputs, not here); ReLU 1 keeps
    // its output (256); dropout keeps a one-byte mask (256 B); linear 2 keeps dropout's
    // output (256); ReLU 2's output (128) is kept by ReLU 2 and linear 3, once.
    assert_eq!(s.saved.uniform_elems, 256 + 256 + 128);
    assert_eq!(s.saved.byte_elems, 256);
    assert_eq!(s.saved_bytes_per_sample(4.0, false), (640 * 4 + 256) as f64);
    assert_eq!(s.saved_bytes_per_sample(2.0, false), (640 * 2 + 256) as f64);
    // Autocast: linear 1 keeps a 16-bit copy of the fp32 input (784) on top.
    assert_eq!(s.saved.half_elems, 784 + 640);
    assert_eq!(s.saved_bytes_per_sample(2.0, true), (1424 * 2 + 256) as f64);
    // Under autocast at fp32 element size nothing is cast: same as fp32.
    assert_eq!(
        s.saved_bytes_per_sample(4.0, true),
        s.saved_bytes_per_sample(4.0, false)
    );
    assert_eq!(s.saved_tensors, 4);
    assert_eq!(s.saved_per_layer.len(), 6);
    assert_eq!(s.input_elems_per_sample, 784);
    assert!(!s.has_conv);
}

#[test]
fn in_place_activations_share_storage() {
    let net = |act: Value| {
        json!([
            {"conv2d": {"in": 3, "out": 8, "kernelSize": 3, "padding": 1, "bias": false}},
            {"batchnorm": {"features": 8}},
            act,
            {"conv2d": {"in": 8, "out": 8, "kernelSize": 3, "padding": 1, "bias": false}},
        ])
    };
    // BN keeps its input (the conv output, 8·8·8); the ReLU output is kept once by the ReLU
    // and the next conv, in place or not.
    for relu in [json!({"relu": {}}), json!({"relu": {"inplace": true}})] {
        let s = ok(net(relu), &[3, 8, 8]);
        assert_eq!(s.saved.uniform_elems, 512 + 512);
        assert_eq!(s.parameters, 3 * 8 * 9 + 16 + 8 * 8 * 9);
        assert_eq!(s.saved_fp32_elems_per_batch, 16);
        assert_eq!(s.buffer_bytes, 16 * 4 + 8);
        assert!(s.has_conv);
    }
    // Out of place, hardtanh (ReLU6) keeps its input as well: the BN output survives.
    let s = ok(net(json!({"relu6": {}})), &[3, 8, 8]);
    assert_eq!(s.saved.uniform_elems, 3 * 512);
    let s = ok(net(json!({"relu6": {"inplace": true}})), &[3, 8, 8]);
    assert_eq!(s.saved.uniform_elems, 2 * 512);
    // Under autocast the first conv keeps a 16-bit copy of the fp32 image too; BN runs on
    // the 16-bit conv output (it is on no autocast list).
    let s = ok(net(json!({"relu": {"inplace": true}})), &[3, 8, 8]);
    assert_eq!(s.saved.half_elems, 192 + 1024);
    assert_eq!(s.saved.autocast_fp32_elems, 0);
}

#[test]
fn layernorm_under_autocast_keeps_fp32_copies() {
    let s = ok(
        json!([
            {"linear": {"in": 16, "out": 16}},
            {"layernorm": {"dim": 16}},
            {"linear": {"in": 16, "out": 8}},
        ]),
        &[4, 16],
    );
    // Uniform: LN keeps the linear's output, linear 2 keeps LN's output; 2 stats per row.
    assert_eq!(s.saved.uniform_elems, 64 + 64);
    assert_eq!(s.saved.fp32_elems, 2 * 4);
    // Autocast: 16-bit copy of the input; LN up-casts its 16-bit input (fp32 copy); linear 2
    // down-casts LN's fp32 output (16-bit copy).
    assert_eq!(s.saved.half_elems, 64 + 64);
    assert_eq!(s.saved.autocast_fp32_elems, 64);
    assert_eq!(s.output_shape, vec![4, 8]);
    assert_eq!(s.parameters, 16 * 16 + 16 + 32 + 16 * 8 + 8);
    assert_eq!(s.autocast_parameters, s.parameters - 32);
}

#[test]
fn attention_eager_and_fused_by_hand() {
    let net = |flash: Value| json!([{"attention": {"dim": 8, "heads": 2, "flash": flash}}]);
    // T = 4, D = 8: qkv 96, q-scaled or fused output 32, out-projection copy 32;
    // scores 2 heads × 4 × 4 = 32; log-sum-exp 2 heads × 32 (padded) queries.
    let eager = ok(net(json!(false)), &[4, 8]);
    assert_eq!(eager.parameters, 4 * 64 + 4 * 8);
    assert_eq!(eager.saved.uniform_elems, 96 + 32 + 32 + 32);
    assert_eq!(eager.saved.half_elems, 32 + 96 + 32 + 32 + 32);
    assert_eq!(eager.saved.autocast_fp32_elems, 32);
    assert_eq!(eager.largest_param_elems, 3 * 64);
    let fused = ok(net(json!(true)), &[4, 8]);
    assert_eq!(fused.saved.uniform_elems, 96 + 32 + 32);
    assert_eq!(fused.saved.fp32_elems, 64);
    // Unset: the job decides.
    let unset = ok(json!([{"attention": {"dim": 8, "heads": 2}}]), &[4, 8]);
    for (elem, mixed) in [(4.0, false), (2.0, true), (2.0, false)] {
        assert_eq!(
            unset.saved_bytes_per_sample_with(elem, mixed, false),
            eager.saved_bytes_per_sample(elem, mixed)
        );
        assert_eq!(
            unset.saved_bytes_per_sample_with(elem, mixed, true),
            fused.saved_bytes_per_sample(elem, mixed)
        );
    }
    assert!(unset.has_attention);
}

#[test]
fn shape_errors_name_the_layer_and_both_numbers() {
    let e = errs(
        json!([
            {"linear": {"in": 784, "out": 256}},
            {"relu": {}},
            {"linear": {"in": 128, "out": 10}},
        ]),
        &[784],
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].0, "spec.model.layers[2].linear.in");
    assert!(
        e[0].1.contains("128") && e[0].1.contains("256"),
        "{}",
        e[0].1
    );

    let e = errs(
        json!([{"conv2d": {"in": 1, "out": 8, "kernelSize": 3}}]),
        &[3, 32, 32],
    );
    assert_eq!(e[0].0, "spec.model.layers[0].conv2d.in");
    assert!(e[0].1.contains("1 ≠ the incoming channels 3"), "{}", e[0].1);

    let e = errs(
        json!([{"conv2d": {"in": 3, "out": 8, "kernelSize": 7, "padding": 1}}]),
        &[3, 4, 4],
    );
    assert_eq!(e[0].0, "spec.model.layers[0].conv2d.kernelSize");
    assert!(
        e[0].1.contains("7 is larger than the padded input 6"),
        "{}",
        e[0].1
    );

    let e = errs(
        json!([
            {"flatten": {}},
            {"residual": {"layers": [{"linear": {"in": 5, "out": 4}}]}},
        ]),
        &[2, 2],
    );
    assert_eq!(e[0].0, "spec.model.layers[1].residual.layers[0].linear.in");

    let e = errs(
        json!([{"residual": {"layers": [{"linear": {"in": 4, "out": 8}}]}}]),
        &[4],
    );
    assert_eq!(e[0].0, "spec.model.layers[0].residual");
    assert!(
        e[0].1.contains("[8]") && e[0].1.contains("shortcut"),
        "{}",
        e[0].1
    );

    let e = errs(
        json!([{"conv2d": {"in": 3, "out": 8, "kernelSize": 3}}]),
        &[3, 32],
    );
    assert!(e[0].1.contains("[channels, height, width]"), "{}", e[0].1);

    let e = errs(
        json!([{"concat": {"branches": [
            [],
            [{"maxpool": {"kernelSize": 2}}],
        ]}}]),
        &[3, 8, 8],
    );
    assert_eq!(e[0].0, "spec.model.layers[0].concat.branches[1]");
}

#[test]
fn field_errors_are_all_reported_with_valid_choices() {
    let e = errs(
        json!([
            {"linear": {"in": 4, "out": 4, "bais": false}},
            {"relu": {}},
            {"conv3d": {}},
            {"linear": {"in": 4}},
            {"dropout": {"p": 1.5}},
            {"relu": {}, "gelu": {}},
            "relu",
        ]),
        &[4],
    );
    let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.model.layers[0].linear.bais",
            "spec.model.layers[2]",
            "spec.model.layers[3].linear.out",
            "spec.model.layers[4].dropout.p",
            "spec.model.layers[5]",
            "spec.model.layers[6]",
        ]
    );
    assert!(e[0].1.contains("valid fields: in, out, bias"), "{}", e[0].1);
    assert!(
        e[1].1.contains("\"conv3d\"") && e[1].1.contains("conv2d, batchnorm"),
        "{}",
        e[1].1
    );
    assert!(e[2].1.contains("missing"), "{}", e[2].1);

    let e = errs(json!([]), &[0, 3]);
    let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["spec.model.inputShape[0]", "spec.model.layers"]);

    let e = errs(
        json!([{"linear": {"in": 4, "out": 4}}, {"embedding": {"vocab": 10, "dim": 4}}]),
        &[4],
    );
    assert_eq!(e[0].0, "spec.model.layers[1].embedding");
}

#[test]
fn overflow_is_an_error_not_a_panic() {
    let big = MAX_DIM;
    // 2^72 input elements.
    let e = errs(json!([{"flatten": {}}]), &[big, big, big]);
    assert_eq!(e[0].0, "spec.model.inputShape");
    assert!(e[0].1.contains("overflow"), "{}", e[0].1);
    // 2^24 · 2^24 · 2^24 weights in one conv.
    let e = errs(
        json!([{"conv2d": {"in": big, "out": big, "kernelSize": [1, big]}}]),
        &[big, 1, big],
    );
    assert_eq!(e[0].0, "spec.model.layers[0]");
    assert!(e[0].1.contains("overflow"), "{}", e[0].1);
    // Attention scores heads × T² = 2^24 · 2^24 · 2^24.
    let e = errs(
        json!([{"attention": {"dim": big, "heads": big}}]),
        &[big, big],
    );
    assert_eq!(e[0].0, "spec.model.layers[0]");
    assert!(e[0].1.contains("overflow"), "{}", e[0].1);
    // Too many layers.
    let many: Vec<Value> = (0..=MAX_LAYERS).map(|_| json!({"relu": {}})).collect();
    let e = analyze(&many, &[4]).expect_err("too many");
    assert_eq!(e.len(), 1);
    assert!(e[0].1.contains("more than 65536 layers"), "{}", e[0].1);
    // Too deep.
    let mut deep = json!({"relu": {}});
    for _ in 0..=MAX_DEPTH + 1 {
        deep = json!({"residual": {"layers": [deep]}});
    }
    let e = errs(json!([deep]), &[4]);
    assert!(e[0].1.contains("nested more than"), "{}", e[0].1);
}

#[test]
fn pools_follow_pytorch_output_sizes() {
    let s = ok(
        json!([
            {"maxpool": {"kernelSize": 3, "stride": 2, "padding": 1}},
            {"maxpool": {"kernelSize": 3, "stride": 2, "ceilMode": true}},
            {"avgpool": {"kernelSize": 2}},
            {"adaptiveAvgPool": {"outputSize": [3, 2]}},
        ]),
        &[4, 112, 112],
    );
    // 112 → 56 (floor((112 + 2 - 3) / 2) + 1) → 28 (ceil((56 - 3) / 2) + 1) → 14 → [3, 2].
    assert_eq!(s.output_shape, vec![4, 3, 2]);
    // The first pool reads the input batch (not counted); indices 4·56·56 and 4·28·28.
    assert_eq!(s.saved.int64_elems, 4 * 56 * 56 + 4 * 28 * 28);
    // Kept: pool 1's output (by pool 2), pool 2's (by avgpool), avgpool's (by adaptive).
    assert_eq!(s.saved.uniform_elems, 4 * (56 * 56 + 28 * 28 + 14 * 14));
    // An output of 1 is a mean: nothing kept.
    let s = ok(
        json!([{"relu": {}}, {"adaptiveAvgPool": {"outputSize": 1}}]),
        &[4, 8, 8],
    );
    assert_eq!(s.saved.uniform_elems, 256);
    let e = errs(
        json!([{"maxpool": {"kernelSize": 2, "padding": 2}}]),
        &[1, 8, 8],
    );
    assert_eq!(e[0].0, "spec.model.layers[0].maxpool.padding");
}

#[test]
fn blocks_concat_gate_aux_and_tokens() {
    let s = ok(
        json!([
            {"conv2d": {"in": 3, "out": 4, "kernelSize": 1}},
            {"concat": {"branches": [
                [{"conv2d": {"in": 4, "out": 2, "kernelSize": 1}}],
                [],
            ]}},
            {"gate": {"layers": [{"adaptiveAvgPool": {"outputSize": 1}}, {"sigmoid": {}}]}},
            {"aux": {"layers": [{"flatten": {}}, {"linear": {"in": 96, "out": 5}}]}},
            {"tokens": {}},
            {"classToken": {}},
            {"positionEmbedding": {}},
            {"selectToken": {}},
            {"linear": {"in": 6, "out": 3}},
        ]),
        &[3, 4, 4],
    );
    assert_eq!(s.output_shape, vec![3]);
    assert_eq!(s.aux_output_elems_per_sample, 5);
    // conv 3→4 (16), conv 4→2 (10), aux linear (485), class token (6),
    // positions (17 × 6), head (21).
    assert_eq!(s.parameters, 16 + 10 + 96 * 5 + 5 + 6 + 17 * 6 + 21);
}

#[test]
fn embedding_mlp_on_token_ids() {
    let s = ok(
        json!([
            {"embedding": {"vocab": 1000, "dim": 32}},
            {"layernorm": {}},
            {"linear": {"in": 32, "out": 4}},
        ]),
        &[16],
    );
    assert_eq!(s.output_shape, vec![16, 4]);
    assert_eq!(s.parameters, 32_000 + 64 + 132);
    // The fp32 embedding output is kept by the LN (no copy: LN runs in fp32 anyway).
    assert_eq!(s.saved.autocast_fp32_elems, 512);
    assert_eq!(s.saved.half_elems, 512);
}

#[test]
fn layers_read_into_types_with_defaults() {
    let list = json!([
        {"conv2d": {"in": 3, "out": 8, "kernelSize": [3, 5], "padding": "same"}},
        {"relu": null},
        {"residual": {"layers": [{"gelu": {"approximate": "tanh"}}]}},
        {"attention": {"dim": 8, "heads": 2}},
    ]);
    let read = read(list.as_array().expect("a list"), LAYERS_PATH).expect("reads");
    assert_eq!(
        read[0],
        Layer::Conv2d(Conv {
            input: 3,
            out: 8,
            kernel_size: [3, 5],
            stride: [1, 1],
            padding: ConvPadding::Same,
            dilation: [1, 1],
            groups: 1,
            bias: true,
        })
    );
    assert_eq!(read[1], Layer::Relu { inplace: false });
    assert_eq!(
        read[2],
        Layer::Residual {
            layers: Layers {
                list: vec![Layer::Gelu { tanh: true }],
                complete: true,
            },
            shortcut: Layers {
                list: vec![],
                complete: true,
            },
        }
    );
    assert_eq!(
        read[3],
        Layer::Attention(Attention {
            dim: 8,
            heads: 2,
            bias: true,
            flash: None,
        })
    );
    assert_eq!(
        read.iter().map(Layer::kind).collect::<Vec<_>>(),
        ["conv2d", "relu", "residual", "attention"]
    );
}

/// A shape error before a bad element, a bad element nested in a block and a bad element
/// after it: all reported, each at its path, in the order of the list.
#[test]
fn every_bad_element_is_reported_beside_the_shape_errors() {
    let e = errs(
        json!([
            {"linear": {"in": 5, "out": 4}},
            {"residual": {"layers": [{"linear": {"in": 4, "out": 4, "bais": true}}]}},
            {"softmax": {"dim": 0}},
        ]),
        &[4],
    );
    let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.model.layers[0].linear.in",
            "spec.model.layers[1].residual.layers[0].linear.bais",
            "spec.model.layers[2].softmax.dim",
        ],
        "{e:?}"
    );
    // Inside a block: its body (a shape error at its second layer) before its shortcut
    // (a bad element), though the shortcut is read before any shape is propagated.
    let e = errs(
        json!([{"residual": {
            "layers": [{"relu": {}}, {"linear": {"in": 5, "out": 4}}],
            "shortcut": [{"relu": {"inplace": 1}}],
        }}]),
        &[4],
    );
    let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.model.layers[0].residual.layers[1].linear.in",
            "spec.model.layers[0].residual.shortcut[0].relu.inplace",
        ],
        "{e:?}"
    );
    // Reading alone reports the same bad elements, and no shape.
    let list = json!([
        {"linear": {"in": 5, "out": 4}},
        {"residual": {"layers": [{"linear": {"in": 4, "out": 4, "bais": true}}]}},
        {"softmax": {"dim": 0}},
    ]);
    let e = read(list.as_array().expect("a list"), LAYERS_PATH).expect_err("bad elements");
    assert_eq!(e.len(), 2, "{e:?}");
}

#[test]
fn one_layer_reads_with_serde_and_the_same_messages() {
    let l: Layer = serde_json::from_value(json!({"linear": {"in": 4, "out": 2, "bias": false}}))
        .expect("a layer");
    assert_eq!(
        l,
        Layer::Linear(Linear {
            input: 4,
            out: 2,
            bias: false,
        })
    );
    let e = serde_json::from_value::<Layer>(json!({"linear": {"in": 0}})).expect_err("bad");
    let shown = e.to_string();
    assert!(
        shown.contains("layer.linear.in: 0 is not allowed; expected an integer from 1 to")
            && shown.contains("layer.linear.out: missing"),
        "{shown}"
    );
    let e = serde_json::from_value::<Layer>(json!({"dense": {}})).expect_err("bad kind");
    assert!(
        e.to_string().contains("unknown layer kind \"dense\""),
        "{e}"
    );
}

/// A layer stays small: a list of thousands is read into memory before it is analysed.
#[test]
fn a_layer_is_small() {
    assert!(
        std::mem::size_of::<Layer>() <= 128,
        "{}",
        std::mem::size_of::<Layer>()
    );
}
