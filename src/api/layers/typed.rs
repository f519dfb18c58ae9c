//! The layers as types: one variant of [`Layer`] per kind of [`KINDS`], each with its
//! fields read, checked and defaulted. A list is read element by element (see `parse.rs`),
//! so every bad element is reported with its path; the shapes are then propagated over the
//! typed list, never over the JSON.

use super::*;

/// One layer, as `spec.model.layers` writes it (`{kind: {fields}}`), fields checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Layer {
    Linear(Linear),
    Conv1d(Conv),
    Conv2d(Conv),
    BatchNorm(BatchNorm),
    LayerNorm(LayerNorm),
    GroupNorm(GroupNorm),
    Relu { inplace: bool },
    Relu6 { inplace: bool },
    LeakyRelu { inplace: bool, negative_slope: f64 },
    Gelu { tanh: bool },
    Silu { inplace: bool },
    Sigmoid,
    Tanh,
    Softmax,
    MaxPool(Box<Pool>),
    AvgPool(Box<Pool>),
    AdaptiveAvgPool { output_size: Written },
    Dropout { p: f64, inplace: bool },
    Flatten,
    Embedding(Embedding),
    Residual { layers: Layers, shortcut: Layers },
    Concat { branches: Vec<Layers>, dim: usize },
    Gate { layers: Layers },
    Aux { layers: Layers },
    Attention(Attention),
    Tokens,
    ClassToken,
    PositionEmbedding,
    SelectToken { index: u64 },
}

impl Layer {
    /// The kind, as the spec names it.
    pub fn kind(&self) -> &'static str {
        KINDS[self.kind_index()]
    }

    fn kind_index(&self) -> usize {
        let k = match self {
            Layer::Linear(_) => Kind::Linear,
            Layer::Conv1d(_) => Kind::Conv1d,
            Layer::Conv2d(_) => Kind::Conv2d,
            Layer::BatchNorm(_) => Kind::BatchNorm,
            Layer::LayerNorm(_) => Kind::LayerNorm,
            Layer::GroupNorm(_) => Kind::GroupNorm,
            Layer::Relu { .. } => Kind::Relu,
            Layer::Relu6 { .. } => Kind::Relu6,
            Layer::LeakyRelu { .. } => Kind::LeakyRelu,
            Layer::Gelu { .. } => Kind::Gelu,
            Layer::Silu { .. } => Kind::Silu,
            Layer::Sigmoid => Kind::Sigmoid,
            Layer::Tanh => Kind::Tanh,
            Layer::Softmax => Kind::Softmax,
            Layer::MaxPool(_) => Kind::MaxPool,
            Layer::AvgPool(_) => Kind::AvgPool,
            Layer::AdaptiveAvgPool { .. } => Kind::AdaptiveAvgPool,
            Layer::Dropout { .. } => Kind::Dropout,
            Layer::Flatten => Kind::Flatten,
            Layer::Embedding(_) => Kind::Embedding,
            Layer::Residual { .. } => Kind::Residual,
            Layer::Concat { .. } => Kind::Concat,
            Layer::Gate { .. } => Kind::Gate,
            Layer::Aux { .. } => Kind::Aux,
            Layer::Attention(_) => Kind::Attention,
            Layer::Tokens => Kind::Tokens,
            Layer::ClassToken => Kind::ClassToken,
            Layer::PositionEmbedding => Kind::PositionEmbedding,
            Layer::SelectToken { .. } => Kind::SelectToken,
        };
        k as usize
    }
}

/// A list of layers as read. When an element could not be read (its problems are
/// reported), the list holds the layers before it and is not `complete`: nothing after a
/// bad layer has a known input, so no shape is propagated past it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layers {
    pub list: Vec<Layer>,
    pub complete: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    /// `in`: the incoming feature size.
    pub input: u64,
    pub out: u64,
    pub bias: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Conv {
    /// `in`: the incoming channels.
    pub input: u64,
    pub out: u64,
    /// Per spatial axis (a conv1d uses the first).
    pub kernel_size: [u64; 2],
    pub stride: [u64; 2],
    pub padding: ConvPadding,
    pub dilation: [u64; 2],
    pub groups: u64,
    pub bias: bool,
}

/// A convolution's padding: `same` (the output keeps the input's size), or per axis
/// (`valid` is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvPadding {
    Same,
    Each([u64; 2]),
}

#[derive(Clone, Debug, PartialEq)]
pub struct BatchNorm {
    pub features: Option<u64>,
    pub eps: f64,
    pub momentum: f64,
    pub affine: bool,
    pub track_running_stats: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm {
    pub dim: Option<u64>,
    pub eps: f64,
    pub affine: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GroupNorm {
    pub groups: u64,
    pub channels: Option<u64>,
    pub eps: f64,
    pub affine: bool,
}

/// A pool's fields. Its sizes are one per spatial axis of the incoming shape, so they are
/// read against that shape when the layer is reached.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pool {
    pub kernel_size: Written,
    pub stride: Written,
    pub padding: Written,
    /// Max pools only.
    pub dilation: Written,
    pub ceil_mode: Written,
    /// Average pools only.
    pub count_include_pad: Written,
}

/// A field as written, read when the layer is reached: what it may be depends on the
/// incoming shape (how many spatial axes it has).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Written(pub Option<Value>);

#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    pub vocab: u64,
    pub dim: u64,
    pub padding_idx: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    pub dim: u64,
    pub heads: u64,
    pub bias: bool,
    /// Unset: fused or eager as the job's attention is.
    pub flash: Option<bool>,
}

/// Read one layer with serde: the same checks and messages as a layer list's elements,
/// every problem of the layer in one message.
impl<'de> serde::Deserialize<'de> for Layer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Layer, D::Error> {
        let v = Value::deserialize(d)?;
        let mut a = Analyzer::default();
        match a.read_layer(&v, &Path::Root("layer"), 0) {
            Some(layer) if a.errs.is_empty() => Ok(layer),
            _ => {
                let lines: Vec<String> = a.errs.iter().map(|(p, r)| format!("{p}: {r}")).collect();
                Err(serde::de::Error::custom(lines.join("; ")))
            }
        }
    }
}

#[cfg(test)]
impl Layer {
    /// The layer as `spec.model.layers` writes it, every field spelled out: what a user
    /// writing the same layer would give (tests read it back, and time reading it).
    pub fn to_json(&self) -> Value {
        use serde_json::json;
        let list = |l: &Layers| Value::Array(l.list.iter().map(Layer::to_json).collect());
        let mut body = Map::new();
        macro_rules! set {
            ($k:expr, $v:expr $(,)?) => {{
                body.insert($k.to_string(), $v);
            }};
        }
        match self {
            Layer::Linear(l) => {
                set!("in", json!(l.input));
                set!("out", json!(l.out));
                set!("bias", json!(l.bias));
            }
            Layer::Conv1d(c) => body.extend(conv_json(c, 1)),
            Layer::Conv2d(c) => body.extend(conv_json(c, 2)),
            Layer::BatchNorm(b) => {
                if let Some(f) = b.features {
                    set!("features", json!(f));
                }
                set!("eps", json!(b.eps));
                set!("momentum", json!(b.momentum));
                set!("affine", json!(b.affine));
                set!("trackRunningStats", json!(b.track_running_stats));
            }
            Layer::LayerNorm(l) => {
                if let Some(d) = l.dim {
                    set!("dim", json!(d));
                }
                set!("eps", json!(l.eps));
                set!("affine", json!(l.affine));
            }
            Layer::GroupNorm(g) => {
                set!("groups", json!(g.groups));
                if let Some(c) = g.channels {
                    set!("channels", json!(c));
                }
                set!("eps", json!(g.eps));
                set!("affine", json!(g.affine));
            }
            Layer::Relu { inplace } | Layer::Relu6 { inplace } | Layer::Silu { inplace } => {
                set!("inplace", json!(inplace));
            }
            Layer::LeakyRelu {
                inplace,
                negative_slope,
            } => {
                set!("inplace", json!(inplace));
                set!("negativeSlope", json!(negative_slope));
            }
            Layer::Gelu { tanh } => set!("approximate", json!(if *tanh { "tanh" } else { "none" })),
            Layer::MaxPool(p) | Layer::AvgPool(p) => {
                let fields = [
                    ("kernelSize", &p.kernel_size),
                    ("stride", &p.stride),
                    ("padding", &p.padding),
                    ("dilation", &p.dilation),
                    ("ceilMode", &p.ceil_mode),
                    ("countIncludePad", &p.count_include_pad),
                ];
                body.extend(
                    fields
                        .into_iter()
                        .filter_map(|(k, w)| Some((k.to_string(), w.0.clone()?))),
                );
            }
            Layer::AdaptiveAvgPool { output_size } => {
                if let Some(v) = &output_size.0 {
                    set!("outputSize", v.clone());
                }
            }
            Layer::Dropout { p, inplace } => {
                set!("p", json!(p));
                set!("inplace", json!(inplace));
            }
            Layer::Embedding(e) => {
                set!("vocab", json!(e.vocab));
                set!("dim", json!(e.dim));
                if let Some(i) = e.padding_idx {
                    set!("paddingIdx", json!(i));
                }
            }
            Layer::Residual { layers, shortcut } => {
                set!("layers", list(layers));
                set!("shortcut", list(shortcut));
            }
            Layer::Concat { branches, dim } => {
                set!(
                    "branches",
                    Value::Array(branches.iter().map(list).collect())
                );
                set!("dim", json!(dim));
            }
            Layer::Gate { layers } | Layer::Aux { layers } => set!("layers", list(layers)),
            Layer::Attention(a) => {
                set!("dim", json!(a.dim));
                set!("heads", json!(a.heads));
                set!("bias", json!(a.bias));
                if let Some(f) = a.flash {
                    set!("flash", json!(f));
                }
            }
            Layer::SelectToken { index } => set!("index", json!(index)),
            Layer::Sigmoid
            | Layer::Tanh
            | Layer::Softmax
            | Layer::Flatten
            | Layer::Tokens
            | Layer::ClassToken
            | Layer::PositionEmbedding => {}
        }
        let mut m = Map::new();
        m.insert(self.kind().to_string(), Value::Object(body));
        Value::Object(m)
    }
}

/// A convolution's fields as written, `n` spatial axes: a size both axes share as one
/// integer.
#[cfg(test)]
fn conv_json(c: &Conv, n: usize) -> Map<String, Value> {
    use serde_json::json;
    let spatial = |a: [u64; 2]| match (n, a[0] == a[1]) {
        (_, true) => json!(a[0]),
        (1, false) => json!([a[0]]),
        _ => json!(a),
    };
    let padding = match c.padding {
        ConvPadding::Same => json!("same"),
        ConvPadding::Each(p) => spatial(p),
    };
    [
        ("in", json!(c.input)),
        ("out", json!(c.out)),
        ("kernelSize", spatial(c.kernel_size)),
        ("stride", spatial(c.stride)),
        ("padding", padding),
        ("dilation", spatial(c.dilation)),
        ("groups", json!(c.groups)),
        ("bias", json!(c.bias)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
