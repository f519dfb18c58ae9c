//! `spec.model.layers`: an MLP, CNN or ViT written as a list of layers. Decides
//! the per-sample shapes (propagated from `spec.model.inputShape`), the
//! parameter count, and the tensors autograd keeps for backward, counted the
//! way PyTorch saves them. Pure: reads the JSON the spec carries, nothing else.
//!
//! Saved tensors are tracked by identity, not per layer: a ReLU's output that
//! the next conv also saves is one tensor; an in-place op reuses its input's
//! storage. Element sizes follow autocast's op lists (pytorch/pytorch
//! `aten/src/ATen/autocast_mode.cpp`): convs, linears, matmuls and attention run
//! in 16 bit and cast their inputs down (a new tensor when the input was fp32);
//! `layer_norm`, `group_norm` and `softmax` run in fp32 and cast their inputs
//! up; `batch_norm` is on no list, so under autocast it normalises the 16-bit
//! conv output (with fp32 weights and statistics) and saves that 16-bit input;
//! everything else keeps its input's dtype, and adding an fp32 parameter
//! (class token, position embedding) promotes to fp32. Without autocast every
//! float tensor has one dtype, so the same graph is counted twice: once
//! "uniform" (fp32, tf32, pure fp16/bf16) and once "autocast".

use std::fmt;

use serde_json::{Map, Value};

mod dense;
mod fields;
mod graph;
mod parse;
mod pointwise;
mod saved;
mod sequence;
mod typed;

pub use typed::{
    Attention, BatchNorm, Conv, ConvPadding, Embedding, GroupNorm, Layer, LayerNorm, Layers,
    Linear, Pool, Written,
};

/// One problem: (field path, reason).
pub type LayerError = (String, String);

/// Where the layer list lives in a TrainingJob.
pub const LAYERS_PATH: &str = "spec.model.layers";
/// Where the per-sample input shape lives.
pub const INPUT_SHAPE_PATH: &str = "spec.model.inputShape";
/// Largest dimension, channel count or kernel size accepted.
pub const MAX_DIM: u64 = 1 << 24;
/// Most per-sample dimensions a tensor may have ([C, H, W] needs 3).
pub const MAX_RANK: usize = 4;
/// Deepest nesting of residual / concat / gate / aux lists.
pub const MAX_DEPTH: usize = 16;
/// Most layers in one spec, nested ones included (keeps admission time bounded).
pub const MAX_LAYERS: u64 = 1 << 16;

/// The layer kinds, each written once: its variant and its name in the spec.
macro_rules! layer_kinds {
    ($($variant:ident = $name:literal,)*) => {
        /// Layer kinds, as written in the spec.
        pub const KINDS: &[&str] = &[$($name),*];

        /// A layer kind, parsed once; in the order of [`KINDS`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Kind {
            $($variant),*
        }

        const KIND_OF: &[Kind] = &[$(Kind::$variant),*];
    };
}

layer_kinds! {
    Linear = "linear",
    Conv1d = "conv1d",
    Conv2d = "conv2d",
    BatchNorm = "batchnorm",
    LayerNorm = "layernorm",
    GroupNorm = "groupnorm",
    Relu = "relu",
    Relu6 = "relu6",
    LeakyRelu = "leakyRelu",
    Gelu = "gelu",
    Silu = "silu",
    Sigmoid = "sigmoid",
    Tanh = "tanh",
    Softmax = "softmax",
    MaxPool = "maxpool",
    AvgPool = "avgpool",
    AdaptiveAvgPool = "adaptiveAvgPool",
    Dropout = "dropout",
    Flatten = "flatten",
    Embedding = "embedding",
    Residual = "residual",
    Concat = "concat",
    Gate = "gate",
    Aux = "aux",
    Attention = "attention",
    Tokens = "tokens",
    ClassToken = "classToken",
    PositionEmbedding = "positionEmbedding",
    SelectToken = "selectToken",
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        KINDS
            .iter()
            .position(|k| same_str(k, s))
            .map(|i| KIND_OF[i])
    }
}

/// String equality without a libc call: field and kind names are a few bytes long and compared
/// for every layer.
#[inline]
fn same_str(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

/// Elements autograd keeps for backward, per sample, by what sets their size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SavedCounts {
    /// Float elements when all float tensors share one dtype (fp32, tf32, pure 16 bit).
    pub uniform_elems: u64,
    /// Under autocast: float elements kept in 16 bit.
    pub half_elems: u64,
    /// Under autocast: float elements kept in fp32 (norm and softmax outputs, their up-cast inputs).
    pub autocast_fp32_elems: u64,
    /// fp32 whatever the precision: norm statistics, flash attention's log-sum-exp.
    pub fp32_elems: u64,
    /// int64: max-pool indices.
    pub int64_elems: u64,
    /// One byte each: dropout masks.
    pub byte_elems: u64,
    /// Attention scores of `attention` layers that leave `flash` unset, kept only when the job's
    /// attention is eager: as `uniform_elems`, `half_elems`, `autocast_fp32_elems`.
    pub eager_scores_uniform_elems: u64,
    pub eager_scores_half_elems: u64,
    pub eager_scores_fp32_elems: u64,
    /// Their fused (flash / memory-efficient SDPA) alternative: fp32 log-sum-exp per head and query.
    pub fused_lse_elems: u64,
}

impl SavedCounts {
    /// Bytes at activation element size `elem` (2 or 4), `mixed` = autocast, and whether attention
    /// whose `flash` is unset runs fused.
    pub fn bytes(&self, elem: f64, mixed: bool, fused_attention: bool) -> f64 {
        let f = |n: u64| n as f64;
        let autocast = mixed && elem < 4.0;
        let (floats, scores) = if autocast {
            (
                f(self.half_elems) * elem + f(self.autocast_fp32_elems) * 4.0,
                f(self.eager_scores_half_elems) * elem + f(self.eager_scores_fp32_elems) * 4.0,
            )
        } else {
            (
                f(self.uniform_elems) * elem,
                f(self.eager_scores_uniform_elems) * elem,
            )
        };
        let attention = if fused_attention {
            f(self.fused_lse_elems) * 4.0
        } else {
            scores
        };
        floats
            + attention
            + f(self.fp32_elems) * 4.0
            + f(self.int64_elems) * 8.0
            + f(self.byte_elems)
    }

    fn fields(&self) -> [u64; 10] {
        [
            self.uniform_elems,
            self.half_elems,
            self.autocast_fp32_elems,
            self.fp32_elems,
            self.int64_elems,
            self.byte_elems,
            self.eager_scores_uniform_elems,
            self.eager_scores_half_elems,
            self.eager_scores_fp32_elems,
            self.fused_lse_elems,
        ]
    }

    fn from_fields(a: [u64; 10]) -> SavedCounts {
        SavedCounts {
            uniform_elems: a[0],
            half_elems: a[1],
            autocast_fp32_elems: a[2],
            fp32_elems: a[3],
            int64_elems: a[4],
            byte_elems: a[5],
            eager_scores_uniform_elems: a[6],
            eager_scores_half_elems: a[7],
            eager_scores_fp32_elems: a[8],
            fused_lse_elems: a[9],
        }
    }

    /// What was added since `before` (counts only grow).
    fn since(&self, before: &SavedCounts) -> SavedCounts {
        let (a, b) = (self.fields(), before.fields());
        SavedCounts::from_fields(std::array::from_fn(|i| a[i].saturating_sub(b[i])))
    }
}

/// One analysed network: shapes propagated from the input.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerStack {
    /// Trainable parameters (torchvision's count: buffers excluded).
    pub parameters: u64,
    /// Parameters of convs, linears and attention projections: what autocast copies to 16 bit
    /// (and keeps for backward) on every forward. Norm and embedding weights stay fp32.
    pub autocast_parameters: u64,
    /// Parameter tensors (weights and biases), for allocator rounding.
    pub parameter_tensors: u64,
    /// Largest single parameter tensor, elements.
    pub largest_param_elems: u64,
    /// Buffers (batchnorm running mean/var in fp32, the int64 step counter), bytes.
    pub buffer_bytes: u64,
    /// What autograd keeps, per sample, all layers together.
    pub saved: SavedCounts,
    /// Per top-level layer (a residual block is one), in order.
    pub saved_per_layer: Vec<SavedCounts>,
    /// fp32 elements kept per step whatever the batch (batchnorm's saved mean and inverse std).
    pub saved_fp32_elems_per_batch: u64,
    /// Distinct tensors autograd keeps (without autocast), for allocator rounding.
    pub saved_tensors: u64,
    /// Largest single activation per sample, elements (any dtype, eager scores included).
    pub largest_activation_elems_per_sample: u64,
    /// Elements of the network input per sample.
    pub input_elems_per_sample: u64,
    /// Shape of the output per sample (the logits of a classifier).
    pub output_shape: Vec<u64>,
    /// Elements per sample of `aux` heads' outputs (extra logits for auxiliary losses).
    pub aux_output_elems_per_sample: u64,
    /// The network has a convolution: cuDNN's workspace applies.
    pub has_conv: bool,
    /// The network has self-attention.
    pub has_attention: bool,
    /// Layers, nested ones included.
    pub layer_count: u64,
    largest: Largest,
}

/// Largest tensors seen, elements, by dtype regime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Largest {
    uniform: u64,
    half: u64,
    autocast_fp32: u64,
    /// Bytes of fixed-size tensors (int64 indices).
    fixed_bytes: u64,
    scores: u64,
}

impl LayerStack {
    /// Per sample, bytes autograd keeps for backward at activation element size `elem` (2 or 4);
    /// `mixed`: autocast (convs/linears in 16 bit, norms and softmax in fp32). Attention whose
    /// `flash` is unset counts as eager.
    pub fn saved_bytes_per_sample(&self, elem: f64, mixed: bool) -> f64 {
        self.saved.bytes(elem, mixed, false)
    }

    /// As [`Self::saved_bytes_per_sample`], with attention whose `flash` is unset fused or not.
    pub fn saved_bytes_per_sample_with(
        &self,
        elem: f64,
        mixed: bool,
        fused_attention: bool,
    ) -> f64 {
        self.saved.bytes(elem, mixed, fused_attention)
    }

    /// Bytes the single top-level layer that keeps the most keeps, per sample.
    pub fn largest_layer_saved_bytes_per_sample(
        &self,
        elem: f64,
        mixed: bool,
        fused_attention: bool,
    ) -> f64 {
        self.saved_per_layer
            .iter()
            .map(|c| c.bytes(elem, mixed, fused_attention))
            .fold(0.0, f64::max)
    }

    /// Bytes of the largest single activation per sample.
    pub fn largest_activation_bytes_per_sample(
        &self,
        elem: f64,
        mixed: bool,
        fused_attention: bool,
    ) -> f64 {
        let l = &self.largest;
        let floats = if mixed && elem < 4.0 {
            (l.half as f64 * elem).max(l.autocast_fp32 as f64 * 4.0)
        } else {
            l.uniform as f64 * elem
        };
        let scores = if fused_attention {
            0.0
        } else if mixed && elem < 4.0 {
            l.scores as f64 * 4.0
        } else {
            l.scores as f64 * elem
        };
        floats.max(scores).max(l.fixed_bytes as f64)
    }

    /// Elements of the output per sample.
    pub fn output_elems_per_sample(&self) -> u64 {
        self.output_shape.iter().product()
    }
}

/// Analyse `layers` (as written under `spec.model.layers`) for inputs of `input_shape`
/// (per sample); every problem at once, each with its path.
pub fn analyze(layers: &[Value], input_shape: &[u64]) -> Result<LayerStack, Vec<LayerError>> {
    analyze_at(layers, input_shape, LAYERS_PATH)
}

/// As [`analyze`], with the layer list's path in errors set to `layers_path`.
pub fn analyze_at(
    layers: &[Value],
    input_shape: &[u64],
    layers_path: &str,
) -> Result<LayerStack, Vec<LayerError>> {
    let mut a = Analyzer {
        tensors: Vec::with_capacity(2 * layers.len() + 16),
        ..Analyzer::default()
    };
    let input = a.input(input_shape);
    if layers.is_empty() {
        a.err(
            &Path::Root(layers_path),
            "must list at least one layer, e.g. [{linear: {in: 784, out: 10}}]",
        );
    }
    // Every element's fields first, each problem at its path; then the shapes. The
    // problems are then told element by element, as the list is written.
    let first = a.errs.len();
    let read = a.read_list(layers, &Path::Root(layers_path), 0);
    a.shapes(&read, input, layers_path, first)
}

/// As [`analyze_at`], over layers built as types (the vision presets): the shapes only,
/// their problems at `layers_path`.
pub fn analyze_typed(
    layers: &Layers,
    input_shape: &[u64],
    layers_path: &str,
) -> Result<LayerStack, Vec<LayerError>> {
    let mut a = Analyzer {
        tensors: Vec::with_capacity(2 * layers.list.len() + 16),
        // What reading a written list counts: every element, nested ones too.
        layers_seen: count(layers),
        ..Analyzer::default()
    };
    let input = a.input(input_shape);
    let first = a.errs.len();
    a.shapes(layers, input, layers_path, first)
}

/// Layers in `layers`, those inside blocks and branches too.
fn count(layers: &Layers) -> u64 {
    layers
        .list
        .iter()
        .map(|l| {
            1 + match l {
                Layer::Residual { layers, shortcut } => count(layers) + count(shortcut),
                Layer::Concat { branches, .. } => branches.iter().map(count).sum(),
                Layer::Gate { layers } | Layer::Aux { layers } => count(layers),
                _ => 0,
            }
        })
        .sum()
}

/// `layers` (as written at `layers_path`) read into typed layers, every bad element
/// reported with its path. Shapes are not checked: [`analyze`] does that.
pub fn read(layers: &[Value], layers_path: &str) -> Result<Vec<Layer>, Vec<LayerError>> {
    let mut a = Analyzer::default();
    let read = a.read_list(layers, &Path::Root(layers_path), 0);
    if a.errs.is_empty() {
        Ok(read.list)
    } else {
        Err(a.errs)
    }
}

/// A path, formatted only when an error needs it.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'a str),
    Index(&'a Path<'a>, usize),
    Key(&'a Path<'a>, &'a str),
    /// A nested list of layers: its key, and its rank among the element's lists (a
    /// residual's `layers` before its `shortcut`).
    List(&'a Path<'a>, &'static str, u32),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root(s) => f.write_str(s),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
            Path::Key(p, k) | Path::List(p, k, _) => write!(f, "{p}.{k}"),
        }
    }
}

impl Path<'_> {
    /// Where the path is in the document, element by element: the indices of the elements
    /// and lists it passes through. Errors sorted by it come in the order of the elements.
    fn position(&self, out: &mut Vec<u32>) {
        match self {
            Path::Root(_) => {}
            Path::Index(p, i) => {
                p.position(out);
                out.push(u32::try_from(*i).unwrap_or(u32::MAX));
            }
            Path::Key(p, _) => p.position(out),
            Path::List(p, _, rank) => {
                p.position(out);
                out.push(*rank);
            }
        }
    }
}

/// Per-sample dimensions.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Shape {
    d: [u64; MAX_RANK],
    rank: usize,
}

impl Shape {
    fn new(dims: &[u64]) -> Shape {
        let mut d = [0; MAX_RANK];
        d[..dims.len()].copy_from_slice(dims);
        Shape {
            d,
            rank: dims.len(),
        }
    }

    fn dims(&self) -> &[u64] {
        &self.d[..self.rank]
    }

    fn elems(&self) -> Option<u64> {
        self.dims()
            .iter()
            .try_fold(1u64, |acc, &x| acc.checked_mul(x))
    }

    fn last(&self) -> u64 {
        self.d[self.rank - 1]
    }

    fn with(&self, i: usize, v: u64) -> Shape {
        let mut s = *self;
        s.d[i] = v;
        s
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, x) in self.dims().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{x}")?;
        }
        f.write_str("]")
    }
}

/// Dtype of a tensor under autocast (without autocast every float tensor has one dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dt {
    Half,
    Fp32,
}

impl Dt {
    fn promote(a: Dt, b: Dt) -> Dt {
        if a == Dt::Fp32 || b == Dt::Fp32 {
            Dt::Fp32
        } else {
            Dt::Half
        }
    }
}

#[derive(Clone, Copy)]
struct Tensor {
    /// Elements of the storage per sample (a view keeps all of them alive).
    elems: u64,
    dt: Dt,
    /// The network input: the data batch, counted as inputs, not activations.
    external: bool,
    saved_uniform: bool,
    saved_autocast: bool,
}

/// The tensor flowing between layers: a storage and the shape of the view onto it.
#[derive(Clone, Copy)]
struct Cur {
    id: usize,
    shape: Shape,
}

/// How a fixed-size saved tensor is stored.
#[derive(Clone, Copy)]
enum Fixed {
    Fp32,
    Int64,
    Byte,
}

#[derive(Default)]
struct Analyzer {
    tensors: Vec<Tensor>,
    counts: SavedCounts,
    per_layer: Vec<SavedCounts>,
    per_batch_fp32: u64,
    saved_tensors: u64,
    parameters: u64,
    autocast_parameters: u64,
    parameter_tensors: u64,
    largest_param: u64,
    buffer_bytes: u64,
    largest: Largest,
    aux_output: u64,
    has_conv: bool,
    has_attention: bool,
    /// The input is token ids (the first layer is an embedding).
    ids_input: bool,
    layers_seen: u64,
    too_many_reported: bool,
    overflow: bool,
    errs: Vec<LayerError>,
    /// Of each error in `errs`, where its path is ([`Path::position`]).
    positions: Vec<Vec<u32>>,
}

/// `*acc += n`, remembering an overflow instead of panicking.
fn add(acc: &mut u64, n: u64, overflow: &mut bool) {
    match acc.checked_add(n) {
        Some(v) => *acc = v,
        None => *overflow = true,
    }
}

fn mul(a: u64, b: u64, overflow: &mut bool) -> u64 {
    a.checked_mul(b).unwrap_or_else(|| {
        *overflow = true;
        0
    })
}

const OVERFLOW: &str =
    "its sizes overflow 64-bit arithmetic; the dimensions are too large to be a real network";

/// Field values of one layer, in the order of the kind's field names.
type Vals<'v> = [Option<&'v Value>; 8];

impl Analyzer {
    fn err(&mut self, path: &Path, reason: impl Into<String>) {
        self.errs.push((path.to_string(), reason.into()));
        let mut at = Vec::new();
        path.position(&mut at);
        self.positions.push(at);
    }

    /// The errors from `first` on, sorted by where their paths are (stable: one element's
    /// errors keep their order). A block's own shape error only comes when nothing inside
    /// it failed, so this is the order of one pass over the list.
    fn in_document_order(&mut self, first: usize) {
        let mut order: Vec<usize> = (first..self.errs.len()).collect();
        order.sort_by(|&a, &b| self.positions[a].cmp(&self.positions[b]));
        let mut taken: Vec<Option<LayerError>> = self.errs.drain(first..).map(Some).collect();
        for i in order {
            if let Some(e) = taken[i - first].take() {
                self.errs.push(e);
            }
        }
    }

    /// The shapes through `read` from `input`, the errors from `first` on told in the
    /// list's order.
    fn shapes(
        mut self,
        read: &Layers,
        input: Option<Cur>,
        layers_path: &str,
        first: usize,
    ) -> Result<LayerStack, Vec<LayerError>> {
        self.ids_input = matches!(read.list.first(), Some(Layer::Embedding(_)));
        let out = self.walk(read, &Path::Root(layers_path), input, 0);
        self.in_document_order(first);
        match (out, self.errs.is_empty()) {
            (Some(out), true) => Ok(self.finish(input, out)),
            (_, false) => Err(self.errs),
            // No error recorded but no shape: only when the input itself failed, which
            // records one.
            (None, true) => Err(vec![(
                layers_path.to_string(),
                "could not be analysed".to_string(),
            )]),
        }
    }

    // ---- Tensors and what autograd keeps ----

    fn input(&mut self, dims: &[u64]) -> Option<Cur> {
        let root = Path::Root(INPUT_SHAPE_PATH);
        let before = self.errs.len();
        if dims.is_empty() || dims.len() > MAX_RANK {
            self.err(
                &root,
                format!(
                    "{} dimensions given; give 1 to {MAX_RANK} per-sample dimensions, e.g. [3, 224, 224]",
                    dims.len()
                ),
            );
            return None;
        }
        for (i, &d) in dims.iter().enumerate() {
            if !(1..=MAX_DIM).contains(&d) {
                self.err(
                    &Path::Index(&root, i),
                    format!("{d} is not allowed; expected an integer from 1 to {MAX_DIM}"),
                );
            }
        }
        if self.errs.len() != before {
            return None;
        }
        let shape = Shape::new(dims);
        let Some(elems) = shape.elems() else {
            self.err(&root, OVERFLOW);
            return None;
        };
        self.tensors.push(Tensor {
            elems,
            dt: Dt::Fp32,
            external: true,
            saved_uniform: false,
            saved_autocast: false,
        });
        Some(Cur { id: 0, shape })
    }

    fn finish(self, input: Option<Cur>, out: Cur) -> LayerStack {
        let input_elems = input.map(|c| self.tensors[c.id].elems).unwrap_or(0);
        let l = self.largest;
        LayerStack {
            parameters: self.parameters,
            autocast_parameters: self.autocast_parameters,
            parameter_tensors: self.parameter_tensors,
            largest_param_elems: self.largest_param,
            buffer_bytes: self.buffer_bytes,
            saved: self.counts,
            saved_per_layer: self.per_layer,
            saved_fp32_elems_per_batch: self.per_batch_fp32,
            saved_tensors: self.saved_tensors,
            largest_activation_elems_per_sample: l
                .uniform
                .max(l.half)
                .max(l.autocast_fp32)
                .max(l.scores),
            input_elems_per_sample: input_elems,
            output_shape: out.shape.dims().to_vec(),
            aux_output_elems_per_sample: self.aux_output,
            has_conv: self.has_conv,
            has_attention: self.has_attention,
            layer_count: self.layers_seen,
            largest: l,
        }
    }

    // ---- Walking the list ----

    /// Propagate `cur` through `layers` (read already); `None` once a layer fails or past the
    /// end of a list cut at a bad element.
    fn walk(
        &mut self,
        layers: &Layers,
        path: &Path,
        mut cur: Option<Cur>,
        depth: usize,
    ) -> Option<Cur> {
        for (i, layer) in layers.list.iter().enumerate() {
            let lp = Path::Index(path, i);
            let before = self.counts;
            let errs = self.errs.len();
            cur = self.layer(layer, &lp, cur, depth);
            if self.overflow {
                self.overflow = false;
                if self.errs.len() == errs {
                    self.err(&lp, OVERFLOW);
                }
                cur = None;
            }
            if depth == 0 {
                self.per_layer.push(self.counts.since(&before));
            }
        }
        cur.filter(|_| layers.complete)
    }

    fn layer(&mut self, layer: &Layer, path: &Path, cur: Option<Cur>, depth: usize) -> Option<Cur> {
        // Without an incoming shape nothing is left to check: the fields were read already.
        let cur = cur?;
        let kp = Path::Key(path, layer.kind());
        let kp = &kp;
        match layer {
            Layer::Linear(l) => self.linear(l, kp, cur),
            Layer::Conv1d(c) => self.conv(c, kp, cur, 1),
            Layer::Conv2d(c) => self.conv(c, kp, cur, 2),
            Layer::BatchNorm(b) => self.batchnorm(b, kp, cur),
            Layer::LayerNorm(l) => self.layernorm(l, kp, cur),
            Layer::GroupNorm(g) => self.groupnorm(g, kp, cur),
            Layer::Relu { .. }
            | Layer::Relu6 { .. }
            | Layer::LeakyRelu { .. }
            | Layer::Gelu { .. }
            | Layer::Silu { .. }
            | Layer::Sigmoid
            | Layer::Tanh
            | Layer::Softmax => Some(self.activation(layer, cur)),
            Layer::MaxPool(p) => self.pool(p, kp, cur, true),
            Layer::AvgPool(p) => self.pool(p, kp, cur, false),
            Layer::AdaptiveAvgPool { output_size } => self.adaptive_pool(output_size, kp, cur),
            Layer::Dropout { p, inplace } => Some(self.dropout(*p, *inplace, cur)),
            Layer::Flatten => {
                let elems = self.elems(cur);
                Some(Cur {
                    id: cur.id,
                    shape: Shape::new(&[elems]),
                })
            }
            Layer::Embedding(e) => self.embedding(e, kp, cur, depth),
            Layer::Residual { layers, shortcut } => self.residual(layers, shortcut, kp, cur, depth),
            Layer::Concat { branches, dim } => self.concat(branches, *dim, kp, cur, depth),
            Layer::Gate { layers } => self.gate(layers, kp, cur, depth),
            Layer::Aux { layers } => self.aux(layers, kp, cur, depth),
            Layer::Attention(a) => self.attention(a, kp, cur),
            Layer::Tokens => self.tokens(kp, cur),
            Layer::ClassToken => self.class_token(kp, cur),
            Layer::PositionEmbedding => Some(self.position_embedding(cur)),
            Layer::SelectToken { index } => self.select_token(*index, kp, cur),
        }
    }
}

/// The name of a pooled or convolved dimension in a message.
fn axis(n: usize, i: usize) -> &'static str {
    match (n, i) {
        (1, _) => "length",
        (_, 0) => "height",
        _ => "width",
    }
}

#[cfg(test)]
mod tests;
