//! Vision presets: torchvision's image classifiers written as `spec.model.layers`
//! lists, so `preset: resnet-50` goes through the same shape propagation and
//! saved-tensor accounting as a hand-written CNN. Pure.
//!
//! Each builder follows the torchvision module named in `source` layer by
//! layer (bias flags, paddings, in-place activations, dropout placement), so
//! the parameter count lands on torchvision's published number. What is left
//! out keeps no memory worth counting: EfficientNet's stochastic depth (it
//! keeps one scalar per sample), dropouts with p = 0.

use std::sync::OnceLock;

use serde_json::json;

use super::layers::{
    self, Attention, BatchNorm, Conv, ConvPadding, INPUT_SHAPE_PATH, Layer, LayerError, LayerNorm,
    LayerStack, Layers, Linear, MAX_DIM, Pool, Written,
};

/// One built-in image model.
#[derive(Debug)]
pub struct VisionPreset {
    /// Catalog name users write in `spec.model.preset`, e.g. "resnet-50".
    pub name: &'static str,
    /// Other accepted spellings (torchvision's builder name).
    pub aliases: &'static [&'static str],
    /// The torchvision module the layers follow.
    pub source: &'static str,
    /// torchvision's parameter count for 1000 classes (its model documentation).
    pub published_parameters: u64,
    /// Per-sample input the model is published for.
    pub input_shape: &'static [u64],
    /// Classes of the published head.
    pub num_classes: u64,
    build: fn(u64) -> Vec<Layer>,
}

const PRESETS: [VisionPreset; 8] = [
    VisionPreset {
        name: "resnet-50",
        aliases: &["resnet50"],
        source: "torchvision.models.resnet50 (ResNet v1.5: stride on the 3x3 conv)",
        published_parameters: 25_557_032,
        input_shape: &[3, 224, 224],
        num_classes: 1000,
        build: resnet50,
    },
    VisionPreset {
        name: "resnet-101",
        aliases: &["resnet101"],
        source: "torchvision.models.resnet101",
        published_parameters: 44_549_160,
        input_shape: &[3, 224, 224],
        num_classes: 1000,
        build: resnet101,
    },
    VisionPreset {
        name: "vgg-16",
        aliases: &["vgg16"],
        source: "torchvision.models.vgg16 (no batchnorm)",
        published_parameters: 138_357_544,
        input_shape: &[3, 224, 224],
        num_classes: 1000,
        build: vgg16,
    },
    VisionPreset {
        name: "mobilenet-v2",
        aliases: &["mobilenet_v2", "mobilenetv2"],
        source: "torchvision.models.mobilenet_v2 (width 1.0)",
        published_parameters: 3_504_872,
        input_shape: &[3, 224, 224],
        num_classes: 1000,
        build: mobilenet_v2,
    },
    VisionPreset {
        name: "efficientnet-b0",
        aliases: &["efficientnet_b0"],
        source: "torchvision.models.efficientnet_b0",
        published_parameters: 5_288_548,
        input_shape: &[3, 224, 224],
        num_classes: 1000,
        build: efficientnet_b0,
    },
    VisionPreset {
        name: "inception-v3",
        aliases: &["inception_v3"],
        source: "torchvision.models.inception_v3 (aux_logits=True; 23.8M without the aux head)",
        published_parameters: 27_161_264,
        input_shape: &[3, 299, 299],
        num_classes: 1000,
        build: inception_v3,
    },
    VisionPreset {
        name: "vit-b-16",
        aliases: &["vit_b_16", "vit-b/16"],
        source: "torchvision.models.vit_b_16",
        published_parameters: 86_567_656,
        input_shape: &[3, 224, 224],
        num_classes: 1000,
        build: vit_b_16,
    },
    VisionPreset {
        name: "vit-l-16",
        aliases: &["vit_l_16", "vit-l/16"],
        source: "torchvision.models.vit_l_16",
        published_parameters: 304_326_632,
        input_shape: &[3, 224, 224],
        num_classes: 1000,
        build: vit_l_16,
    },
];

/// Layer lists and analyses at the published input and classes, built once.
static LAYERS: [OnceLock<Layers>; PRESETS.len()] = [const { OnceLock::new() }; PRESETS.len()];
static STACKS: [OnceLock<LayerStack>; PRESETS.len()] = [const { OnceLock::new() }; PRESETS.len()];

impl VisionPreset {
    fn index(&self) -> usize {
        PRESETS
            .iter()
            .position(|p| p.name == self.name)
            .expect("every VisionPreset lives in PRESETS")
    }

    /// The layer list with a head of `num_classes` outputs.
    pub fn layers(&self, num_classes: u64) -> Vec<Layer> {
        (self.build)(num_classes)
    }

    /// Analyse the preset for `input_shape` (default: the published one) and `num_classes`
    /// (default: 1000). A shape the network cannot take is an error on `spec.model.inputShape`
    /// naming the layer it fails at.
    pub fn analyze(
        &self,
        input_shape: Option<&[u64]>,
        num_classes: Option<u64>,
    ) -> Result<LayerStack, Vec<LayerError>> {
        let i = self.index();
        let classes = num_classes.unwrap_or(self.num_classes);
        if !(1..=MAX_DIM).contains(&classes) {
            return Err(vec![(
                "spec.model.numLabels".to_string(),
                format!("{classes} is not allowed; expected an integer from 1 to {MAX_DIM}"),
            )]);
        }
        let shape = input_shape.unwrap_or(self.input_shape);
        let published = shape == self.input_shape && classes == self.num_classes;
        if published && let Some(s) = STACKS[i].get() {
            return Ok(s.clone());
        }
        let built;
        let list: &Layers = if classes == self.num_classes {
            LAYERS[i].get_or_init(|| typed(self.layers(self.num_classes)))
        } else {
            built = typed(self.layers(classes));
            &built
        };
        let stack = layers::analyze_typed(list, shape, self.name).map_err(|errs| {
            errs.into_iter()
                .map(|(path, reason)| {
                    if path.starts_with(INPUT_SHAPE_PATH) {
                        (path, reason)
                    } else {
                        (
                            INPUT_SHAPE_PATH.to_string(),
                            format!("{shape:?} does not fit {}: at {path}: {reason}", self.name),
                        )
                    }
                })
                .collect::<Vec<_>>()
        })?;
        if published {
            // Another thread may have won the race; either value is the same.
            let _ = STACKS[i].set(stack.clone());
        }
        Ok(stack)
    }
}

/// The preset called `name` (or one of its aliases), case-insensitively.
pub fn find(name: &str) -> Option<&'static VisionPreset> {
    use super::presets::same_name;
    PRESETS
        .iter()
        .find(|p| same_name(p.name, name) || p.aliases.iter().any(|a| same_name(a, name)))
}

/// All vision preset names, for error messages.
pub fn names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|p| p.name)
}

// ---- Building blocks ----
// Each builds the layer `spec.model.layers` would read from the same fields written
// out (the defaults of the fields left unwritten are the reader's).

/// A complete list (nothing in it failed to read).
fn typed(list: Vec<Layer>) -> Layers {
    Layers {
        list,
        complete: true,
    }
}

fn conv(cin: u64, cout: u64, k: u64, stride: u64, pad: u64, groups: u64, bias: bool) -> Layer {
    Layer::Conv2d(Conv {
        input: cin,
        out: cout,
        kernel_size: [k; 2],
        stride: [stride; 2],
        padding: ConvPadding::Each([pad; 2]),
        dilation: [1; 2],
        groups,
        bias,
    })
}

fn bn(c: u64, eps: f64) -> Layer {
    Layer::BatchNorm(BatchNorm {
        features: Some(c),
        eps,
        momentum: 0.1,
        affine: true,
        track_running_stats: true,
    })
}

fn relu(inplace: bool) -> Layer {
    Layer::Relu { inplace }
}

fn relu6(inplace: bool) -> Layer {
    Layer::Relu6 { inplace }
}

fn silu(inplace: bool) -> Layer {
    Layer::Silu { inplace }
}

fn linear(i: u64, o: u64) -> Layer {
    Layer::Linear(Linear {
        input: i,
        out: o,
        bias: true,
    })
}

/// A pool's written kernel size, stride and padding.
fn pool(k: u64, stride: u64, pad: u64) -> Box<Pool> {
    Box::new(Pool {
        kernel_size: Written(Some(json!(k))),
        stride: Written(Some(json!(stride))),
        padding: Written(Some(json!(pad))),
        ..Pool::default()
    })
}

fn maxpool(k: u64, stride: u64, pad: u64) -> Layer {
    Layer::MaxPool(pool(k, stride, pad))
}

fn avgpool(k: u64, stride: u64, pad: u64) -> Layer {
    Layer::AvgPool(pool(k, stride, pad))
}

fn adaptive(size: u64) -> Layer {
    Layer::AdaptiveAvgPool {
        output_size: Written(Some(json!(size))),
    }
}

fn flatten() -> Layer {
    Layer::Flatten
}

fn dropout(p: f64, inplace: bool) -> Layer {
    Layer::Dropout { p, inplace }
}

fn residual(layers: Vec<Layer>, shortcut: Vec<Layer>) -> Layer {
    Layer::Residual {
        layers: typed(layers),
        shortcut: typed(shortcut),
    }
}

fn concat(branches: Vec<Vec<Layer>>) -> Layer {
    Layer::Concat {
        branches: branches.into_iter().map(typed).collect(),
        dim: 0,
    }
}

/// torchvision's Conv2dNormActivation: conv without bias, batchnorm, activation (in place).
fn conv_bn_act(
    cin: u64,
    cout: u64,
    k: u64,
    stride: u64,
    groups: u64,
    eps: f64,
    a: fn(bool) -> Layer,
) -> Vec<Layer> {
    vec![
        conv(cin, cout, k, stride, (k - 1) / 2, groups, false),
        bn(cout, eps),
        a(true),
    ]
}

// ---- ResNet ----

/// torchvision `ResNet` with `Bottleneck` blocks: `blocks` per stage.
fn resnet(blocks: [u64; 4], classes: u64) -> Vec<Layer> {
    let relu = || relu(true);
    let mut l = vec![
        conv(3, 64, 7, 2, 3, 1, false),
        bn(64, 1e-5),
        relu(),
        maxpool(3, 2, 1),
    ];
    let mut inplanes = 64;
    for (stage, &n) in blocks.iter().enumerate() {
        let width = 64u64 << stage;
        let out = width * 4;
        for b in 0..n {
            let stride = if b == 0 && stage > 0 { 2 } else { 1 };
            let body = vec![
                conv(inplanes, width, 1, 1, 0, 1, false),
                bn(width, 1e-5),
                relu(),
                conv(width, width, 3, stride, 1, 1, false),
                bn(width, 1e-5),
                relu(),
                conv(width, out, 1, 1, 0, 1, false),
                bn(out, 1e-5),
            ];
            let shortcut = if b == 0 {
                vec![conv(inplanes, out, 1, stride, 0, 1, false), bn(out, 1e-5)]
            } else {
                vec![]
            };
            // `out += identity; out = self.relu(out)`: the add and the ReLU are in place.
            l.push(residual(body, shortcut));
            l.push(relu());
            inplanes = out;
        }
    }
    l.extend([adaptive(1), flatten(), linear(inplanes, classes)]);
    l
}

fn resnet50(classes: u64) -> Vec<Layer> {
    resnet([3, 4, 6, 3], classes)
}

fn resnet101(classes: u64) -> Vec<Layer> {
    resnet([3, 4, 23, 3], classes)
}

// ---- VGG ----

/// torchvision `vgg16`: configuration "D", ReLU(inplace=True), 7x7 adaptive pool.
fn vgg16(classes: u64) -> Vec<Layer> {
    const CFG: [u64; 18] = [
        64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
    ];
    let mut l = Vec::new();
    let mut c = 3;
    for v in CFG {
        if v == 0 {
            l.push(maxpool(2, 2, 0));
        } else {
            l.push(conv(c, v, 3, 1, 1, 1, true));
            l.push(relu(true));
            c = v;
        }
    }
    l.extend([
        adaptive(7),
        flatten(),
        linear(512 * 7 * 7, 4096),
        relu(true),
        dropout(0.5, false),
        linear(4096, 4096),
        relu(true),
        dropout(0.5, false),
        linear(4096, classes),
    ]);
    l
}

// ---- MobileNet v2 ----

/// torchvision `mobilenet_v2`: inverted residuals with ReLU6(inplace=True).
fn mobilenet_v2(classes: u64) -> Vec<Layer> {
    // (expansion t, channels c, repeats n, stride s)
    const SETTINGS: [(u64, u64, u64, u64); 7] = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ];
    let mut l = conv_bn_act(3, 32, 3, 2, 1, 1e-5, relu6);
    let mut inp = 32;
    for (t, c, n, s) in SETTINGS {
        for i in 0..n {
            let stride = if i == 0 { s } else { 1 };
            let hidden = inp * t;
            let mut body = Vec::new();
            if t != 1 {
                body.extend(conv_bn_act(inp, hidden, 1, 1, 1, 1e-5, relu6));
            }
            body.extend(conv_bn_act(hidden, hidden, 3, stride, hidden, 1e-5, relu6));
            body.extend([conv(hidden, c, 1, 1, 0, 1, false), bn(c, 1e-5)]);
            if stride == 1 && inp == c {
                l.push(residual(body, vec![]));
            } else {
                l.extend(body);
            }
            inp = c;
        }
    }
    l.extend(conv_bn_act(inp, 1280, 1, 1, 1, 1e-5, relu6));
    l.extend([
        adaptive(1),
        flatten(),
        dropout(0.2, false),
        linear(1280, classes),
    ]);
    l
}

// ---- EfficientNet-B0 ----

/// torchvision `efficientnet_b0`: MBConv blocks with squeeze-and-excitation, SiLU(inplace=True),
/// batchnorm eps 1e-3.
fn efficientnet_b0(classes: u64) -> Vec<Layer> {
    // (expand ratio, kernel, stride, in, out, layers)
    const STAGES: [(u64, u64, u64, u64, u64, u64); 7] = [
        (1, 3, 1, 32, 16, 1),
        (6, 3, 2, 16, 24, 2),
        (6, 5, 2, 24, 40, 2),
        (6, 3, 2, 40, 80, 3),
        (6, 5, 1, 80, 112, 3),
        (6, 5, 2, 112, 192, 4),
        (6, 3, 1, 192, 320, 1),
    ];
    const EPS: f64 = 1e-3;
    let mut l = conv_bn_act(3, 32, 3, 2, 1, EPS, silu);
    for (expand, k, s, cin, cout, n) in STAGES {
        for i in 0..n {
            let (inp, stride) = if i == 0 { (cin, s) } else { (cout, 1) };
            let expanded = inp * expand;
            let squeeze = (inp / 4).max(1);
            let mut body = Vec::new();
            if expanded != inp {
                body.extend(conv_bn_act(inp, expanded, 1, 1, 1, EPS, silu));
            }
            body.extend(conv_bn_act(
                expanded, expanded, k, stride, expanded, EPS, silu,
            ));
            // SqueezeExcitation: scale = sigmoid(fc2(silu(fc1(avgpool(x))))); x * scale.
            body.push(Layer::Gate {
                layers: typed(vec![
                    adaptive(1),
                    conv(expanded, squeeze, 1, 1, 0, 1, true),
                    silu(false),
                    conv(squeeze, expanded, 1, 1, 0, 1, true),
                    Layer::Sigmoid,
                ]),
            });
            body.extend([conv(expanded, cout, 1, 1, 0, 1, false), bn(cout, EPS)]);
            if stride == 1 && inp == cout {
                l.push(residual(body, vec![]));
            } else {
                l.extend(body);
            }
        }
    }
    l.extend(conv_bn_act(320, 1280, 1, 1, 1, EPS, silu));
    l.extend([
        adaptive(1),
        flatten(),
        dropout(0.2, true),
        linear(1280, classes),
    ]);
    l
}

// ---- Inception v3 ----

/// torchvision `BasicConv2d`: conv without bias, batchnorm (eps 1e-3), ReLU in place; kernels
/// and paddings as (height, width).
fn basic(cin: u64, cout: u64, k: [u64; 2], stride: u64, pad: [u64; 2]) -> Vec<Layer> {
    vec![
        Layer::Conv2d(Conv {
            input: cin,
            out: cout,
            kernel_size: k,
            stride: [stride; 2],
            padding: ConvPadding::Each(pad),
            dilation: [1; 2],
            groups: 1,
            bias: false,
        }),
        bn(cout, 1e-3),
        relu(true),
    ]
}

fn b1(cin: u64, cout: u64) -> Vec<Layer> {
    basic(cin, cout, [1, 1], 1, [0, 0])
}

fn chain(parts: Vec<Vec<Layer>>) -> Vec<Layer> {
    parts.into_iter().flatten().collect()
}

fn inception_a(cin: u64, pool: u64) -> Layer {
    concat(vec![
        b1(cin, 64),
        chain(vec![b1(cin, 48), basic(48, 64, [5, 5], 1, [2, 2])]),
        chain(vec![
            b1(cin, 64),
            basic(64, 96, [3, 3], 1, [1, 1]),
            basic(96, 96, [3, 3], 1, [1, 1]),
        ]),
        chain(vec![vec![avgpool(3, 1, 1)], b1(cin, pool)]),
    ])
}

fn inception_b(cin: u64) -> Layer {
    concat(vec![
        basic(cin, 384, [3, 3], 2, [0, 0]),
        chain(vec![
            b1(cin, 64),
            basic(64, 96, [3, 3], 1, [1, 1]),
            basic(96, 96, [3, 3], 2, [0, 0]),
        ]),
        vec![maxpool(3, 2, 0)],
    ])
}

fn inception_c(c7: u64) -> Layer {
    let (r17, c71) = (([1, 7], [0, 3]), ([7, 1], [3, 0]));
    concat(vec![
        b1(768, 192),
        chain(vec![
            b1(768, c7),
            basic(c7, c7, r17.0, 1, r17.1),
            basic(c7, 192, c71.0, 1, c71.1),
        ]),
        chain(vec![
            b1(768, c7),
            basic(c7, c7, c71.0, 1, c71.1),
            basic(c7, c7, r17.0, 1, r17.1),
            basic(c7, c7, c71.0, 1, c71.1),
            basic(c7, 192, r17.0, 1, r17.1),
        ]),
        chain(vec![vec![avgpool(3, 1, 1)], b1(768, 192)]),
    ])
}

fn inception_d(cin: u64) -> Layer {
    concat(vec![
        chain(vec![b1(cin, 192), basic(192, 320, [3, 3], 2, [0, 0])]),
        chain(vec![
            b1(cin, 192),
            basic(192, 192, [1, 7], 1, [0, 3]),
            basic(192, 192, [7, 1], 1, [3, 0]),
            basic(192, 192, [3, 3], 2, [0, 0]),
        ]),
        vec![maxpool(3, 2, 0)],
    ])
}

/// The 1x3 / 3x1 pair whose outputs InceptionE concatenates.
fn split_13_31() -> Layer {
    concat(vec![
        basic(384, 384, [1, 3], 1, [0, 1]),
        basic(384, 384, [3, 1], 1, [1, 0]),
    ])
}

fn inception_e(cin: u64) -> Layer {
    concat(vec![
        b1(cin, 320),
        chain(vec![b1(cin, 384), vec![split_13_31()]]),
        chain(vec![
            b1(cin, 448),
            basic(448, 384, [3, 3], 1, [1, 1]),
            vec![split_13_31()],
        ]),
        chain(vec![vec![avgpool(3, 1, 1)], b1(cin, 192)]),
    ])
}

/// torchvision `inception_v3` in training mode: the auxiliary head runs on Mixed_6e.
fn inception_v3(classes: u64) -> Vec<Layer> {
    let mut l = chain(vec![
        basic(3, 32, [3, 3], 2, [0, 0]),
        basic(32, 32, [3, 3], 1, [0, 0]),
        basic(32, 64, [3, 3], 1, [1, 1]),
        vec![maxpool(3, 2, 0)],
        b1(64, 80),
        basic(80, 192, [3, 3], 1, [0, 0]),
        vec![maxpool(3, 2, 0)],
    ]);
    l.extend([
        inception_a(192, 32),
        inception_a(256, 64),
        inception_a(288, 64),
        inception_b(288),
        inception_c(128),
        inception_c(160),
        inception_c(160),
        inception_c(192),
    ]);
    let aux = chain(vec![
        vec![avgpool(5, 3, 0)],
        b1(768, 128),
        basic(128, 768, [5, 5], 1, [0, 0]),
        vec![adaptive(1), flatten(), linear(768, classes)],
    ]);
    l.push(Layer::Aux { layers: typed(aux) });
    l.extend([
        inception_d(768),
        inception_e(1280),
        inception_e(2048),
        adaptive(1),
        dropout(0.5, false),
        flatten(),
        linear(2048, classes),
    ]);
    l
}

// ---- Vision Transformer ----

/// torchvision `VisionTransformer` with 16x16 patches: conv patch embedding, class token,
/// learned positions, pre-norm encoder blocks (LayerNorm eps 1e-6, GELU MLP), the class
/// token's final state into the head. Attention leaves `flash` unset: torchvision calls
/// `nn.MultiheadAttention(need_weights=False)`, which runs scaled_dot_product_attention, so
/// the job's `attention` setting decides.
fn vit(layers: u64, hidden: u64, heads: u64, mlp: u64, classes: u64) -> Vec<Layer> {
    let ln = || {
        Layer::LayerNorm(LayerNorm {
            dim: None,
            eps: 1e-6,
            affine: true,
        })
    };
    let mut l = vec![
        conv(3, hidden, 16, 16, 0, 1, true),
        Layer::Tokens,
        Layer::ClassToken,
        Layer::PositionEmbedding,
    ];
    for _ in 0..layers {
        l.push(residual(
            vec![
                ln(),
                Layer::Attention(Attention {
                    dim: hidden,
                    heads,
                    bias: true,
                    flash: None,
                }),
            ],
            vec![],
        ));
        l.push(residual(
            vec![
                ln(),
                linear(hidden, mlp),
                Layer::Gelu { tanh: false },
                linear(mlp, hidden),
            ],
            vec![],
        ));
    }
    l.extend([
        ln(),
        Layer::SelectToken { index: 0 },
        linear(hidden, classes),
    ]);
    l
}

fn vit_b_16(classes: u64) -> Vec<Layer> {
    vit(12, 768, 12, 3072, classes)
}

fn vit_l_16(classes: u64) -> Vec<Layer> {
    vit(24, 1024, 16, 4096, classes)
}

#[cfg(test)]
mod tests;
