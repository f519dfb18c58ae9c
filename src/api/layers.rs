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

/// Layer kinds, as written in the spec.
pub const KINDS: &[&str] = &[
    "linear",
    "conv1d",
    "conv2d",
    "batchnorm",
    "layernorm",
    "groupnorm",
    "relu",
    "relu6",
    "leakyRelu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "softmax",
    "maxpool",
    "avgpool",
    "adaptiveAvgPool",
    "dropout",
    "flatten",
    "embedding",
    "residual",
    "concat",
    "gate",
    "aux",
    "attention",
    "tokens",
    "classToken",
    "positionEmbedding",
    "selectToken",
];

/// A layer kind, parsed once; in the order of [`KINDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Linear,
    Conv1d,
    Conv2d,
    BatchNorm,
    LayerNorm,
    GroupNorm,
    Relu,
    Relu6,
    LeakyRelu,
    Gelu,
    Silu,
    Sigmoid,
    Tanh,
    Softmax,
    MaxPool,
    AvgPool,
    AdaptiveAvgPool,
    Dropout,
    Flatten,
    Embedding,
    Residual,
    Concat,
    Gate,
    Aux,
    Attention,
    Tokens,
    ClassToken,
    PositionEmbedding,
    SelectToken,
}

const KIND_OF: [Kind; 29] = [
    Kind::Linear,
    Kind::Conv1d,
    Kind::Conv2d,
    Kind::BatchNorm,
    Kind::LayerNorm,
    Kind::GroupNorm,
    Kind::Relu,
    Kind::Relu6,
    Kind::LeakyRelu,
    Kind::Gelu,
    Kind::Silu,
    Kind::Sigmoid,
    Kind::Tanh,
    Kind::Softmax,
    Kind::MaxPool,
    Kind::AvgPool,
    Kind::AdaptiveAvgPool,
    Kind::Dropout,
    Kind::Flatten,
    Kind::Embedding,
    Kind::Residual,
    Kind::Concat,
    Kind::Gate,
    Kind::Aux,
    Kind::Attention,
    Kind::Tokens,
    Kind::ClassToken,
    Kind::PositionEmbedding,
    Kind::SelectToken,
];

const _: () = assert!(KINDS.len() == KIND_OF.len());

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
    let input = a.input(layers, input_shape);
    if layers.is_empty() {
        a.err(
            &Path::Root(layers_path),
            "must list at least one layer, e.g. [{linear: {in: 784, out: 10}}]",
        );
    }
    let out = a.walk(layers, &Path::Root(layers_path), input, 0);
    match (out, a.errs.is_empty()) {
        (Some(out), true) => Ok(a.finish(input, out)),
        (_, false) => Err(a.errs),
        // No error recorded but no shape: only when the input itself failed, which records one.
        (None, true) => Err(vec![(
            layers_path.to_string(),
            "could not be analysed".to_string(),
        )]),
    }
}

/// A path, formatted only when an error needs it.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'a str),
    Index(&'a Path<'a>, usize),
    Key(&'a Path<'a>, &'a str),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root(s) => f.write_str(s),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
            Path::Key(p, k) => write!(f, "{p}.{k}"),
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
    }

    // ---- Tensors and what autograd keeps ----

    fn see_uniform(&mut self, elems: u64) {
        self.largest.uniform = self.largest.uniform.max(elems);
    }

    fn see_autocast(&mut self, elems: u64, dt: Dt) {
        match dt {
            Dt::Half => self.largest.half = self.largest.half.max(elems),
            Dt::Fp32 => self.largest.autocast_fp32 = self.largest.autocast_fp32.max(elems),
        }
    }

    fn new_tensor(&mut self, elems: u64, dt: Dt) -> usize {
        self.see_uniform(elems);
        self.see_autocast(elems, dt);
        self.tensors.push(Tensor {
            elems,
            dt,
            external: false,
            saved_uniform: false,
            saved_autocast: false,
        });
        self.tensors.len() - 1
    }

    fn autocast_bucket(&mut self, dt: Dt) -> &mut u64 {
        match dt {
            Dt::Half => &mut self.counts.half_elems,
            Dt::Fp32 => &mut self.counts.autocast_fp32_elems,
        }
    }

    fn keep_uniform(&mut self, id: usize) {
        let t = self.tensors[id];
        if !t.external && !t.saved_uniform {
            self.tensors[id].saved_uniform = true;
            self.saved_tensors += 1;
            add(&mut self.counts.uniform_elems, t.elems, &mut self.overflow);
        }
    }

    fn keep_autocast(&mut self, id: usize) {
        let t = self.tensors[id];
        if !t.external && !t.saved_autocast {
            self.tensors[id].saved_autocast = true;
            let mut o = false;
            add(self.autocast_bucket(t.dt), t.elems, &mut o);
            self.overflow |= o;
        }
    }

    /// An op saves this tensor as it is.
    fn keep(&mut self, id: usize) {
        self.keep_uniform(id);
        self.keep_autocast(id);
    }

    /// An op saves its input after autocast cast it to `dt`: the tensor itself when it already
    /// has that dtype, else a new copy (autocast caches casts of parameters only).
    fn keep_as(&mut self, cur: Cur, dt: Dt, elems: u64) {
        self.keep_uniform(cur.id);
        if self.tensors[cur.id].dt == dt {
            self.keep_autocast(cur.id);
        } else {
            self.see_autocast(elems, dt);
            let mut o = false;
            add(self.autocast_bucket(dt), elems, &mut o);
            self.overflow |= o;
        }
    }

    /// A new tensor of dtype `dt` that only autograd holds (a clone, a noise mask, a copy).
    fn keep_new(&mut self, elems: u64, dt: Dt) {
        let id = self.new_tensor(elems, dt);
        self.keep(id);
    }

    fn keep_fixed(&mut self, elems: u64, kind: Fixed) {
        let (acc, size) = match kind {
            Fixed::Fp32 => (&mut self.counts.fp32_elems, 4),
            Fixed::Int64 => (&mut self.counts.int64_elems, 8),
            Fixed::Byte => (&mut self.counts.byte_elems, 1),
        };
        add(acc, elems, &mut self.overflow);
        let bytes = mul(elems, size, &mut self.overflow);
        self.largest.fixed_bytes = self.largest.fixed_bytes.max(bytes);
        self.saved_tensors += 1;
    }

    fn param(&mut self, elems: u64, autocast: bool) {
        add(&mut self.parameters, elems, &mut self.overflow);
        if autocast {
            add(&mut self.autocast_parameters, elems, &mut self.overflow);
        }
        self.parameter_tensors += 1;
        self.largest_param = self.largest_param.max(elems);
    }

    fn dt(&self, cur: Cur) -> Dt {
        self.tensors[cur.id].dt
    }

    /// Output of an op that keeps its input's dtype.
    fn same(&mut self, cur: Cur, shape: Shape) -> Cur {
        let elems = shape.elems().unwrap_or_else(|| {
            self.overflow = true;
            0
        });
        let dt = self.dt(cur);
        Cur {
            id: self.new_tensor(elems, dt),
            shape,
        }
    }

    /// Output of `dt`.
    fn out(&mut self, shape: Shape, dt: Dt) -> Cur {
        let elems = shape.elems().unwrap_or_else(|| {
            self.overflow = true;
            0
        });
        Cur {
            id: self.new_tensor(elems, dt),
            shape,
        }
    }

    /// An in-place op may overwrite this tensor without breaking backward: nothing saved it
    /// and it is not the caller's input batch.
    fn can_modify(&self, cur: Cur) -> bool {
        let t = &self.tensors[cur.id];
        !t.external && !t.saved_uniform && !t.saved_autocast
    }

    fn elems(&mut self, cur: Cur) -> u64 {
        cur.shape.elems().unwrap_or_else(|| {
            self.overflow = true;
            0
        })
    }

    // ---- Input ----

    fn input(&mut self, layers: &[Value], dims: &[u64]) -> Option<Cur> {
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
        self.ids_input = layers
            .first()
            .and_then(Value::as_object)
            .is_some_and(|o| o.len() == 1 && o.contains_key("embedding"));
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

    fn walk(
        &mut self,
        list: &[Value],
        path: &Path,
        mut cur: Option<Cur>,
        depth: usize,
    ) -> Option<Cur> {
        if depth > MAX_DEPTH {
            self.err(
                path,
                format!("nested more than {MAX_DEPTH} deep; flatten the blocks"),
            );
            return None;
        }
        for (i, v) in list.iter().enumerate() {
            let lp = Path::Index(path, i);
            self.layers_seen += 1;
            if self.layers_seen > MAX_LAYERS {
                if !self.too_many_reported {
                    self.too_many_reported = true;
                    self.err(
                        &lp,
                        format!("more than {MAX_LAYERS} layers in all; describe the model as spec.model.custom"),
                    );
                }
                return None;
            }
            let before = self.counts;
            let errs = self.errs.len();
            cur = self.layer(v, &lp, cur, depth);
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
        cur
    }

    fn layer(&mut self, v: &Value, path: &Path, cur: Option<Cur>, depth: usize) -> Option<Cur> {
        let Some(obj) = v.as_object() else {
            self.err(
                path,
                format!("{v} is not a layer; write an object with one key naming its kind, e.g. {{relu: {{}}}}"),
            );
            return None;
        };
        let mut it = obj.iter();
        let (Some((kind, body)), None) = (it.next(), it.next()) else {
            let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            self.err(
                path,
                format!(
                    "a layer is an object with exactly one key, its kind (e.g. {{conv2d: {{...}}}}); found {} keys [{}]",
                    keys.len(),
                    keys.join(", ")
                ),
            );
            return None;
        };
        let empty = Map::new();
        let body = match body {
            Value::Object(m) => m,
            Value::Null => &empty,
            other => {
                self.err(
                    &Path::Key(path, kind),
                    format!("{other} is not an object of the layer's fields; write {kind}: {{}} when it has none"),
                );
                return None;
            }
        };
        let kp = Path::Key(path, kind);
        let kp = &kp;
        let Some(k) = Kind::parse(kind) else {
            self.err(
                path,
                format!(
                    "unknown layer kind {kind:?}; valid kinds: {}",
                    KINDS.join(", ")
                ),
            );
            return None;
        };
        match k {
            Kind::Linear => self.linear(body, kp, cur),
            Kind::Conv1d => self.conv(body, kp, cur, 1),
            Kind::Conv2d => self.conv(body, kp, cur, 2),
            Kind::BatchNorm => self.batchnorm(body, kp, cur),
            Kind::LayerNorm => self.layernorm(body, kp, cur),
            Kind::GroupNorm => self.groupnorm(body, kp, cur),
            Kind::Relu
            | Kind::Relu6
            | Kind::LeakyRelu
            | Kind::Gelu
            | Kind::Silu
            | Kind::Sigmoid
            | Kind::Tanh
            | Kind::Softmax => self.activation(body, kp, cur, k),
            Kind::MaxPool => self.pool(body, kp, cur, true),
            Kind::AvgPool => self.pool(body, kp, cur, false),
            Kind::AdaptiveAvgPool => self.adaptive_pool(body, kp, cur),
            Kind::Dropout => self.dropout(body, kp, cur),
            Kind::Flatten => {
                self.fields(body, kp, &[])?;
                let cur = cur?;
                let elems = self.elems(cur);
                Some(Cur {
                    id: cur.id,
                    shape: Shape::new(&[elems]),
                })
            }
            Kind::Embedding => self.embedding(body, kp, cur, depth),
            Kind::Residual => self.residual(body, kp, cur, depth),
            Kind::Concat => self.concat(body, kp, cur, depth),
            Kind::Gate => self.gate(body, kp, cur, depth),
            Kind::Aux => self.aux(body, kp, cur, depth),
            Kind::Attention => self.attention(body, kp, cur),
            Kind::Tokens | Kind::ClassToken | Kind::PositionEmbedding | Kind::SelectToken => {
                self.token_op(body, kp, cur, k)
            }
        }
    }

    // ---- Reading fields ----

    /// The layer's fields in the order of `names`; `None` (after reporting) on an unknown one.
    fn fields<'v>(
        &mut self,
        body: &'v Map<String, Value>,
        kp: &Path,
        names: &[&str],
    ) -> Option<Vals<'v>> {
        let mut vals: Vals<'v> = [None; 8];
        let mut ok = true;
        for (k, v) in body {
            match names.iter().position(|n| same_str(n, k)) {
                Some(i) => vals[i] = Some(v),
                None => {
                    ok = false;
                    let valid = if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    };
                    self.err(
                        &Path::Key(kp, k),
                        format!("unknown field; valid fields: {valid}"),
                    );
                }
            }
        }
        ok.then_some(vals)
    }

    /// An integer in `min..=max` (or the default when absent).
    fn int(
        &mut self,
        kp: &Path,
        name: &str,
        v: Option<&Value>,
        default: Option<u64>,
        min: u64,
        max: u64,
    ) -> Option<u64> {
        match v {
            None | Some(Value::Null) => {
                if default.is_none() {
                    self.err(&Path::Key(kp, name), "missing; this layer needs it");
                }
                default
            }
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Some(n),
                _ => {
                    self.err(
                        &Path::Key(kp, name),
                        format!("{v} is not allowed; expected an integer from {min} to {max}"),
                    );
                    None
                }
            },
        }
    }

    /// An integer or a list of `n` integers, one per spatial dimension.
    fn spatial(
        &mut self,
        kp: &Path,
        name: &str,
        v: Option<&Value>,
        default: Option<u64>,
        n: usize,
        min: u64,
    ) -> Option<[u64; 2]> {
        let p = Path::Key(kp, name);
        match v {
            Some(Value::Array(items)) => {
                let vals: Vec<Option<u64>> = items
                    .iter()
                    .map(|x| x.as_u64().filter(|x| (min..=MAX_DIM).contains(x)))
                    .collect();
                if vals.len() != n || vals.iter().any(Option::is_none) {
                    self.err(
                        &p,
                        format!("{} is not allowed; expected an integer from {min} to {MAX_DIM} or a list of {n} of them", Value::Array(items.clone())),
                    );
                    return None;
                }
                let mut out = [1; 2];
                for (o, x) in out.iter_mut().zip(vals) {
                    *o = x.unwrap_or(1);
                }
                Some(out)
            }
            other => self
                .int(kp, name, other, default, min, MAX_DIM)
                .map(|x| [x; 2]),
        }
    }

    fn flag(&mut self, kp: &Path, name: &str, v: Option<&Value>, default: bool) -> Option<bool> {
        match v {
            None | Some(Value::Null) => Some(default),
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                self.err(&Path::Key(kp, name), format!("{v} is not a boolean"));
                None
            }
        }
    }

    fn opt_flag(&mut self, kp: &Path, name: &str, v: Option<&Value>) -> Option<Option<bool>> {
        match v {
            None | Some(Value::Null) => Some(None),
            _ => self.flag(kp, name, v, false).map(Some),
        }
    }

    /// A number in `lo..=hi` (inclusive), or the default.
    fn number(
        &mut self,
        kp: &Path,
        name: &str,
        v: Option<&Value>,
        default: f64,
        lo: f64,
        hi: f64,
    ) -> Option<f64> {
        match v {
            None | Some(Value::Null) => Some(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Some(x),
                _ => {
                    self.err(
                        &Path::Key(kp, name),
                        format!("{v} is not allowed; expected a number from {lo} to {hi}"),
                    );
                    None
                }
            },
        }
    }

    fn list<'v>(
        &mut self,
        kp: &Path,
        name: &str,
        v: Option<&'v Value>,
        required: bool,
    ) -> Option<&'v [Value]> {
        match v {
            Some(Value::Array(items)) => Some(items),
            None | Some(Value::Null) if !required => Some(&[]),
            None | Some(Value::Null) => {
                self.err(&Path::Key(kp, name), "missing; give a list of layers");
                None
            }
            Some(v) => {
                self.err(&Path::Key(kp, name), format!("{v} is not a list of layers"));
                None
            }
        }
    }

    /// The incoming shape must have `rank` dimensions, the first of them channels.
    fn expect_rank(&mut self, kp: &Path, cur: Cur, ranks: &[usize], what: &str) -> bool {
        if ranks.contains(&cur.shape.rank) {
            return true;
        }
        self.err(
            kp,
            format!("needs input {what}; the incoming shape is {}", cur.shape),
        );
        false
    }

    // ---- Layers ----

    fn linear(&mut self, body: &Map<String, Value>, kp: &Path, cur: Option<Cur>) -> Option<Cur> {
        let v = self.fields(body, kp, &["in", "out", "bias"])?;
        let fin = self.int(kp, "in", v[0], None, 1, MAX_DIM);
        let fout = self.int(kp, "out", v[1], None, 1, MAX_DIM);
        let bias = self.flag(kp, "bias", v[2], true);
        let (fin, fout, bias, cur) = (fin?, fout?, bias?, cur?);
        if cur.shape.last() != fin {
            self.err(
                &Path::Key(kp, "in"),
                format!(
                    "{fin} ≠ the incoming feature size {} (shape {}); a linear acts on the last dimension",
                    cur.shape.last(),
                    cur.shape
                ),
            );
            return None;
        }
        let elems = self.elems(cur);
        // addmm/matmul keep the input for the weight's gradient.
        self.keep_as(cur, Dt::Half, elems);
        let w = mul(fin, fout, &mut self.overflow);
        self.param(w, true);
        if bias {
            self.param(fout, true);
        }
        let shape = cur.shape.with(cur.shape.rank - 1, fout);
        Some(self.out(shape, Dt::Half))
    }

    fn conv(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        n: usize,
    ) -> Option<Cur> {
        let v = self.fields(
            body,
            kp,
            &[
                "in",
                "out",
                "kernelSize",
                "stride",
                "padding",
                "dilation",
                "groups",
                "bias",
            ],
        )?;
        let cin = self.int(kp, "in", v[0], None, 1, MAX_DIM);
        let cout = self.int(kp, "out", v[1], None, 1, MAX_DIM);
        let k = self.spatial(kp, "kernelSize", v[2], None, n, 1);
        let stride = self.spatial(kp, "stride", v[3], Some(1), n, 1);
        let same = matches!(v[4], Some(Value::String(s)) if s == "same");
        let valid = matches!(v[4], Some(Value::String(s)) if s == "valid");
        let pad = if same || valid {
            Some([0; 2])
        } else {
            self.spatial(kp, "padding", v[4], Some(0), n, 0)
        };
        let dil = self.spatial(kp, "dilation", v[5], Some(1), n, 1);
        let groups = self.int(kp, "groups", v[6], Some(1), 1, MAX_DIM);
        let bias = self.flag(kp, "bias", v[7], true);
        let (cin, cout, k, stride, pad, dil, groups, bias) =
            (cin?, cout?, k?, stride?, pad?, dil?, groups?, bias?);
        let cur = cur?;
        let what = if n == 1 {
            "[channels, length]"
        } else {
            "[channels, height, width]"
        };
        if !self.expect_rank(kp, cur, &[n + 1], what) {
            return None;
        }
        let channels = cur.shape.d[0];
        let before = self.errs.len();
        if channels != cin {
            self.err(
                &Path::Key(kp, "in"),
                format!(
                    "{cin} ≠ the incoming channels {channels} (shape {})",
                    cur.shape
                ),
            );
        }
        if cin % groups != 0 || cout % groups != 0 {
            self.err(
                &Path::Key(kp, "groups"),
                format!("{groups} does not divide in {cin} and out {cout}"),
            );
        }
        if same && stride.iter().take(n).any(|&s| s != 1) {
            self.err(
                &Path::Key(kp, "padding"),
                "same needs stride 1 (PyTorch rejects padding='same' for strided convolutions)",
            );
        }
        let mut shape = cur.shape;
        for i in 0..n {
            let x = cur.shape.d[1 + i];
            let span = mul(dil[i], k[i] - 1, &mut self.overflow) + 1;
            if same {
                continue;
            }
            let padded = x + 2 * pad[i];
            if span > padded {
                let dilated = if dil[i] > 1 {
                    format!(" (dilated to {span})")
                } else {
                    String::new()
                };
                self.err(
                    &Path::Key(kp, "kernelSize"),
                    format!(
                        "{}{dilated} is larger than the padded input {padded} ({x} + 2 × padding {}) along {}",
                        k[i],
                        pad[i],
                        axis(n, i)
                    ),
                );
                break;
            }
            shape.d[1 + i] = (padded - span) / stride[i] + 1;
        }
        if self.errs.len() != before {
            return None;
        }
        shape.d[0] = cout;
        let elems = self.elems(cur);
        // convolution_backward needs the input for the weight's gradient.
        self.keep_as(cur, Dt::Half, elems);
        let per_out = k[..n]
            .iter()
            .fold(cin / groups, |a, &x| mul(a, x, &mut self.overflow));
        let w = mul(cout, per_out, &mut self.overflow);
        self.param(w, true);
        if bias {
            self.param(cout, true);
        }
        self.has_conv = true;
        Some(self.out(shape, Dt::Half))
    }

    fn batchnorm(&mut self, body: &Map<String, Value>, kp: &Path, cur: Option<Cur>) -> Option<Cur> {
        let v = self.fields(
            body,
            kp,
            &["features", "eps", "momentum", "affine", "trackRunningStats"],
        )?;
        let features = match v[0] {
            None | Some(Value::Null) => None,
            f => self.int(kp, "features", f, None, 1, MAX_DIM).map(Some)?,
        };
        self.number(kp, "eps", v[1], 1e-5, 0.0, 1.0)?;
        self.number(kp, "momentum", v[2], 0.1, 0.0, 1.0)?;
        let affine = self.flag(kp, "affine", v[3], true)?;
        let track = self.flag(kp, "trackRunningStats", v[4], true)?;
        let cur = cur?;
        // BatchNorm1d on [F] or [C, L], BatchNorm2d on [C, H, W]: channels come first.
        let c = cur.shape.d[0];
        if let Some(f) = features.filter(|&f| f != c) {
            self.err(
                &Path::Key(kp, "features"),
                format!("{f} ≠ the incoming channels {c} (shape {})", cur.shape),
            );
            return None;
        }
        // cudnn_batch_norm saves its input plus the batch mean and inverse std (per channel).
        self.keep(cur.id);
        let stats = mul(2, c, &mut self.overflow);
        add(&mut self.per_batch_fp32, stats, &mut self.overflow);
        if affine {
            self.param(c, false);
            self.param(c, false);
        }
        if track {
            let b = mul(stats, 4, &mut self.overflow) + 8;
            add(&mut self.buffer_bytes, b, &mut self.overflow);
        }
        Some(self.same(cur, cur.shape))
    }

    fn layernorm(&mut self, body: &Map<String, Value>, kp: &Path, cur: Option<Cur>) -> Option<Cur> {
        let v = self.fields(body, kp, &["dim", "eps", "affine"])?;
        let dim = match v[0] {
            None | Some(Value::Null) => None,
            d => self.int(kp, "dim", d, None, 1, MAX_DIM).map(Some)?,
        };
        self.number(kp, "eps", v[1], 1e-5, 0.0, 1.0)?;
        let affine = self.flag(kp, "affine", v[2], true)?;
        let cur = cur?;
        let d = cur.shape.last();
        if let Some(x) = dim.filter(|&x| x != d) {
            self.err(
                &Path::Key(kp, "dim"),
                format!("{x} ≠ the incoming last dimension {d} (shape {}); layernorm normalises the last dimension", cur.shape),
            );
            return None;
        }
        let elems = self.elems(cur);
        // Autocast runs layer_norm in fp32: it keeps the fp32 input and a mean and rstd per row.
        self.keep_as(cur, Dt::Fp32, elems);
        let stats = mul(2, elems / d, &mut self.overflow);
        self.keep_fixed(stats, Fixed::Fp32);
        if affine {
            self.param(d, false);
            self.param(d, false);
        }
        Some(self.out(cur.shape, Dt::Fp32))
    }

    fn groupnorm(&mut self, body: &Map<String, Value>, kp: &Path, cur: Option<Cur>) -> Option<Cur> {
        let v = self.fields(body, kp, &["groups", "channels", "eps", "affine"])?;
        let groups = self.int(kp, "groups", v[0], None, 1, MAX_DIM);
        let channels = match v[1] {
            None | Some(Value::Null) => Some(None),
            c => self.int(kp, "channels", c, None, 1, MAX_DIM).map(Some),
        };
        let eps = self.number(kp, "eps", v[2], 1e-5, 0.0, 1.0);
        let affine = self.flag(kp, "affine", v[3], true);
        let (groups, channels, _, affine, cur) = (groups?, channels?, eps?, affine?, cur?);
        if !self.expect_rank(kp, cur, &[2, 3, 4], "[channels, ...]") {
            return None;
        }
        let c = cur.shape.d[0];
        if let Some(x) = channels.filter(|&x| x != c) {
            self.err(
                &Path::Key(kp, "channels"),
                format!("{x} ≠ the incoming channels {c} (shape {})", cur.shape),
            );
            return None;
        }
        if c % groups != 0 {
            self.err(
                &Path::Key(kp, "groups"),
                format!("{groups} does not divide the incoming channels {c}"),
            );
            return None;
        }
        let elems = self.elems(cur);
        // group_norm is on autocast's fp32 list; it keeps the input and a mean and rstd per group.
        self.keep_as(cur, Dt::Fp32, elems);
        self.keep_fixed(2 * groups, Fixed::Fp32);
        if affine {
            self.param(c, false);
            self.param(c, false);
        }
        Some(self.out(cur.shape, Dt::Fp32))
    }

    fn activation(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        kind: Kind,
    ) -> Option<Cur> {
        let names: &[&str] = match kind {
            Kind::Relu | Kind::Relu6 | Kind::Silu => &["inplace"],
            Kind::LeakyRelu => &["inplace", "negativeSlope"],
            Kind::Gelu => &["approximate"],
            Kind::Softmax => &["dim"],
            _ => &[],
        };
        let v = self.fields(body, kp, names)?;
        let inplace = if names.first() == Some(&"inplace") {
            self.flag(kp, "inplace", v[0], false)?
        } else {
            false
        };
        if kind == Kind::LeakyRelu {
            self.number(kp, "negativeSlope", v[1], 0.01, -1e6, 1e6)?;
        }
        if kind == Kind::Gelu {
            match v[0] {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if s == "none" || s == "tanh" => {}
                Some(x) => {
                    self.err(
                        &Path::Key(kp, "approximate"),
                        format!("{x} is not allowed; use none or tanh"),
                    );
                    return None;
                }
            }
        }
        if kind == Kind::Softmax {
            match v[0] {
                None | Some(Value::Null) => {}
                Some(x) if x.as_i64() == Some(-1) => {}
                Some(x) => {
                    self.err(
                        &Path::Key(kp, "dim"),
                        format!("{x} is not supported; softmax runs over the last dimension (-1)"),
                    );
                    return None;
                }
            }
        }
        let cur = cur?;
        let inplace = inplace && self.can_modify(cur);
        let elems = self.elems(cur);
        Some(match kind {
            // threshold_backward / hardtanh_ / leaky_relu_ use the result: in place it is the
            // input's storage; ReLU keeps its result even out of place.
            Kind::Relu | Kind::Relu6 | Kind::LeakyRelu if inplace => {
                self.keep(cur.id);
                cur
            }
            Kind::Relu | Kind::Sigmoid | Kind::Tanh => {
                let out = self.same(cur, cur.shape);
                self.keep(out.id);
                out
            }
            // Out of place, hardtanh and leaky_relu keep their input.
            Kind::Relu6 | Kind::LeakyRelu | Kind::Gelu => {
                self.keep(cur.id);
                self.same(cur, cur.shape)
            }
            // silu keeps its input; in place the input is overwritten, so an input-sized tensor
            // of its original values is kept besides the output (the same bytes either way).
            Kind::Silu if inplace => {
                let dt = self.dt(cur);
                self.keep_new(elems, dt);
                cur
            }
            Kind::Silu => {
                self.keep(cur.id);
                self.same(cur, cur.shape)
            }
            // softmax is on autocast's fp32 list and keeps its result.
            _ => {
                let out = self.out(cur.shape, Dt::Fp32);
                self.keep(out.id);
                out
            }
        })
    }

    fn pool(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        max: bool,
    ) -> Option<Cur> {
        let names: &[&str] = if max {
            &["kernelSize", "stride", "padding", "dilation", "ceilMode"]
        } else {
            &[
                "kernelSize",
                "stride",
                "padding",
                "ceilMode",
                "countIncludePad",
            ]
        };
        let v = self.fields(body, kp, names)?;
        let cur = cur?;
        if !self.expect_rank(
            kp,
            cur,
            &[2, 3],
            "[channels, length] or [channels, height, width]",
        ) {
            return None;
        }
        let n = cur.shape.rank - 1;
        let k = self.spatial(kp, "kernelSize", v[0], None, n, 1);
        let stride = match k {
            Some(k) => match v[1] {
                None | Some(Value::Null) => Some(k),
                s => self.spatial(kp, "stride", s, None, n, 1),
            },
            None => None,
        };
        let pad = self.spatial(kp, "padding", v[2], Some(0), n, 0);
        let (dil, ceil) = if max {
            (
                self.spatial(kp, "dilation", v[3], Some(1), n, 1),
                self.flag(kp, "ceilMode", v[4], false),
            )
        } else {
            let c = self.flag(kp, "ceilMode", v[3], false);
            let _ = self.flag(kp, "countIncludePad", v[4], true)?;
            (Some([1; 2]), c)
        };
        let (k, stride, pad, dil, ceil) = (k?, stride?, pad?, dil?, ceil?);
        let mut shape = cur.shape;
        let before = self.errs.len();
        for i in 0..n {
            let x = cur.shape.d[1 + i];
            let span = mul(dil[i], k[i] - 1, &mut self.overflow) + 1;
            let limit = if max { span / 2 } else { k[i] / 2 };
            if pad[i] > limit {
                self.err(
                    &Path::Key(kp, "padding"),
                    format!(
                        "{} is more than half the kernel {} (PyTorch rejects it)",
                        pad[i], k[i]
                    ),
                );
                break;
            }
            let padded = x + 2 * pad[i];
            if span > padded {
                self.err(
                    &Path::Key(kp, "kernelSize"),
                    format!(
                        "{} is larger than the padded input {padded} ({x} + 2 × padding {}) along {}",
                        k[i],
                        pad[i],
                        axis(n, i)
                    ),
                );
                break;
            }
            let s = stride[i];
            let mut o = (padded - span + if ceil { s - 1 } else { 0 }) / s + 1;
            // PyTorch: the last window must start inside the input or its left padding.
            if ceil && (o - 1) * s >= x + pad[i] {
                o -= 1;
            }
            shape.d[1 + i] = o;
        }
        if self.errs.len() != before {
            return None;
        }
        // max_pool saves its input and int64 indices; avg_pool2d_backward takes the input too.
        self.keep(cur.id);
        let out = self.same(cur, shape);
        if max {
            let e = self.elems(out);
            self.keep_fixed(e, Fixed::Int64);
        }
        Some(out)
    }

    fn adaptive_pool(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
    ) -> Option<Cur> {
        let v = self.fields(body, kp, &["outputSize"])?;
        let cur = cur?;
        if !self.expect_rank(
            kp,
            cur,
            &[2, 3],
            "[channels, length] or [channels, height, width]",
        ) {
            return None;
        }
        let n = cur.shape.rank - 1;
        let size = self.spatial(kp, "outputSize", v[0], None, n, 1)?;
        let mut shape = cur.shape;
        shape.d[1..=n].copy_from_slice(&size[..n]);
        // An output of 1 is computed as mean(), which saves only sizes
        // (ATen adaptive_avg_pool2d); otherwise the pool keeps its input.
        if size[..n].iter().any(|&s| s != 1) {
            self.keep(cur.id);
        }
        Some(self.same(cur, shape))
    }

    fn dropout(&mut self, body: &Map<String, Value>, kp: &Path, cur: Option<Cur>) -> Option<Cur> {
        let v = self.fields(body, kp, &["p", "inplace"])?;
        let p = self.number(kp, "p", v[0], 0.5, 0.0, 1.0);
        let inplace = self.flag(kp, "inplace", v[1], false);
        let (p, inplace, cur) = (p?, inplace?, cur?);
        if p == 0.0 {
            return Some(cur);
        }
        if p >= 1.0 {
            return Some(self.same(cur, cur.shape));
        }
        let elems = self.elems(cur);
        if inplace && self.can_modify(cur) {
            // In place, dropout multiplies by a noise tensor of the input's dtype and keeps it.
            let dt = self.dt(cur);
            self.keep_new(elems, dt);
            return Some(cur);
        }
        // native_dropout keeps a one-byte mask.
        self.keep_fixed(elems, Fixed::Byte);
        Some(self.same(cur, cur.shape))
    }

    fn embedding(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        depth: usize,
    ) -> Option<Cur> {
        let v = self.fields(body, kp, &["vocab", "dim", "paddingIdx"])?;
        let vocab = self.int(kp, "vocab", v[0], None, 1, MAX_DIM);
        let dim = self.int(kp, "dim", v[1], None, 1, MAX_DIM);
        if let Some(p) = v[2].filter(|p| !p.is_null()) {
            self.int(kp, "paddingIdx", Some(p), None, 0, MAX_DIM)?;
        }
        let (vocab, dim, cur) = (vocab?, dim?, cur?);
        if depth != 0 || cur.id != 0 || !self.ids_input {
            self.err(
                kp,
                "takes token ids: it must be the first layer, with spec.model.inputShape the ids per sample (e.g. [512])",
            );
            return None;
        }
        if cur.shape.rank >= MAX_RANK {
            self.err(
                kp,
                format!(
                    "its output would have more than {MAX_RANK} dimensions (input {})",
                    cur.shape
                ),
            );
            return None;
        }
        let table = mul(vocab, dim, &mut self.overflow);
        self.param(table, false);
        let mut shape = cur.shape;
        shape.d[shape.rank] = dim;
        shape.rank += 1;
        // The ids are kept (the input batch); the fp32 table is not autocast: fp32 output.
        Some(self.out(shape, Dt::Fp32))
    }

    fn residual(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        depth: usize,
    ) -> Option<Cur> {
        let v = self.fields(body, kp, &["layers", "shortcut"])?;
        let layers = self.list(kp, "layers", v[0], true);
        let shortcut = self.list(kp, "shortcut", v[1], false);
        let (layers, shortcut) = (layers?, shortcut?);
        let lp = Path::Key(kp, "layers");
        let sp = Path::Key(kp, "shortcut");
        let body_out = self.walk(layers, &lp, cur, depth + 1);
        let short_out = self.walk(shortcut, &sp, cur, depth + 1);
        let (b, s, input) = (body_out?, short_out?, cur?);
        if b.shape != s.shape {
            let reason = if shortcut.is_empty() {
                format!(
                    "the block's output {} does not match its input {}; add a shortcut: [...] that maps the input to the output's shape",
                    b.shape, input.shape
                )
            } else {
                format!(
                    "the block's output {} does not match the shortcut's output {}",
                    b.shape, s.shape
                )
            };
            self.err(kp, reason);
            return None;
        }
        // The add keeps nothing for backward.
        let dt = Dt::promote(self.dt(b), self.dt(s));
        Some(self.out(b.shape, dt))
    }

    fn concat(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        depth: usize,
    ) -> Option<Cur> {
        let v = self.fields(body, kp, &["branches", "dim"])?;
        let dim = self.int(kp, "dim", v[1], Some(0), 0, MAX_RANK as u64 - 1);
        let bp = Path::Key(kp, "branches");
        let branches = match v[0] {
            Some(Value::Array(b)) if !b.is_empty() => Some(b),
            other => {
                let found = other
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "missing".into());
                self.err(
                    &bp,
                    format!("{found}: give a non-empty list of branches, each a list of layers ([] for the input itself)"),
                );
                None
            }
        };
        let mut outs = Vec::new();
        let mut ok = true;
        for (i, br) in branches?.iter().enumerate() {
            let ip = Path::Index(&bp, i);
            let out = match br {
                Value::Array(list) => self.walk(list, &ip, cur, depth + 1),
                other => {
                    self.err(&ip, format!("{other} is not a list of layers"));
                    None
                }
            };
            ok &= out.is_some();
            outs.extend(out);
        }
        let (dim, _) = (dim? as usize, cur?);
        if !ok {
            return None;
        }
        let first = outs[0];
        if dim >= first.shape.rank {
            self.err(
                &Path::Key(kp, "dim"),
                format!(
                    "{dim} is not a dimension of the branches' output {}",
                    first.shape
                ),
            );
            return None;
        }
        let mut shape = first.shape;
        let mut dt = self.dt(first);
        for (i, o) in outs.iter().enumerate().skip(1) {
            let agree = o.shape.rank == first.shape.rank
                && (0..first.shape.rank).all(|j| j == dim || o.shape.d[j] == first.shape.d[j]);
            if !agree {
                self.err(
                    &Path::Index(&bp, i),
                    format!(
                        "output {} does not match branch 0's {} outside dimension {dim}",
                        o.shape, first.shape
                    ),
                );
                return None;
            }
            shape.d[dim] = shape.d[dim].checked_add(o.shape.d[dim]).unwrap_or_else(|| {
                self.overflow = true;
                0
            });
            dt = Dt::promote(dt, self.dt(*o));
        }
        // cat keeps only sizes.
        Some(self.out(shape, dt))
    }

    fn gate(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        depth: usize,
    ) -> Option<Cur> {
        let v = self.fields(body, kp, &["layers"])?;
        let layers = self.list(kp, "layers", v[0], true)?;
        let s = self.walk(layers, &Path::Key(kp, "layers"), cur, depth + 1);
        let (s, x) = (s?, cur?);
        let fits = s.shape.rank == x.shape.rank
            && (0..x.shape.rank).all(|j| s.shape.d[j] == x.shape.d[j] || s.shape.d[j] == 1);
        if !fits {
            self.err(
                kp,
                format!(
                    "the gate's output {} does not broadcast over its input {}",
                    s.shape, x.shape
                ),
            );
            return None;
        }
        // input * gate: mul keeps both operands when both need gradients.
        self.keep(x.id);
        self.keep(s.id);
        let dt = Dt::promote(self.dt(x), self.dt(s));
        Some(self.out(x.shape, dt))
    }

    fn aux(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        depth: usize,
    ) -> Option<Cur> {
        let v = self.fields(body, kp, &["layers"])?;
        let layers = self.list(kp, "layers", v[0], true)?;
        let out = self.walk(layers, &Path::Key(kp, "layers"), cur, depth + 1)?;
        let e = self.elems(out);
        add(&mut self.aux_output, e, &mut self.overflow);
        cur
    }

    fn attention(&mut self, body: &Map<String, Value>, kp: &Path, cur: Option<Cur>) -> Option<Cur> {
        let v = self.fields(body, kp, &["dim", "heads", "bias", "flash"])?;
        let dim = self.int(kp, "dim", v[0], None, 1, MAX_DIM);
        let heads = self.int(kp, "heads", v[1], None, 1, MAX_DIM);
        let bias = self.flag(kp, "bias", v[2], true);
        let flash = self.opt_flag(kp, "flash", v[3]);
        let (dim, heads, bias, flash, cur) = (dim?, heads?, bias?, flash?, cur?);
        if !self.expect_rank(kp, cur, &[2], "[tokens, dim]") {
            return None;
        }
        let (t, d) = (cur.shape.d[0], cur.shape.d[1]);
        if d != dim {
            self.err(
                &Path::Key(kp, "dim"),
                format!(
                    "{dim} ≠ the incoming feature size {d} (shape {})",
                    cur.shape
                ),
            );
            return None;
        }
        if dim % heads != 0 {
            self.err(
                &Path::Key(kp, "heads"),
                format!("{heads} does not divide dim {dim}"),
            );
            return None;
        }
        let td = self.elems(cur);
        let o = &mut self.overflow;
        let qkv_elems = mul(3, td, o);
        let scores = mul(mul(heads, t, o), t, o);
        let lse = mul(heads, t.div_ceil(32) * 32, o);
        // qkv projection keeps its input; q, k and v are views of its (copied) output, kept by
        // the attention kernel or the score matmuls; the output projection keeps its own copy
        // of the heads' output (a permute + contiguous).
        self.keep_as(cur, Dt::Half, td);
        self.keep_new(qkv_elems, Dt::Half);
        self.keep_new(td, Dt::Half);
        // Fused kernels keep their output and a log-sum-exp; eager attention keeps q scaled
        // (the same size) and the softmax output (fp32 under autocast) plus its 16-bit copy
        // for the matmul with v.
        self.keep_new(td, Dt::Half);
        match flash {
            Some(true) => self.keep_fixed(lse, Fixed::Fp32),
            Some(false) => {
                let s = self.out(Shape::new(&[heads, t, t]), Dt::Fp32);
                self.keep(s.id);
                self.keep_as(s, Dt::Half, scores);
            }
            None => {
                let c = &mut self.counts;
                let o = &mut self.overflow;
                add(&mut c.eager_scores_uniform_elems, scores, o);
                add(&mut c.eager_scores_fp32_elems, scores, o);
                add(&mut c.eager_scores_half_elems, scores, o);
                add(&mut c.fused_lse_elems, lse, o);
                self.largest.scores = self.largest.scores.max(scores);
            }
        }
        let dd = mul(dim, dim, &mut self.overflow);
        let in_proj = mul(3, dd, &mut self.overflow);
        self.param(in_proj, true);
        self.param(dd, true);
        if bias {
            self.param(3 * dim, true);
            self.param(dim, true);
        }
        self.has_attention = true;
        Some(self.out(cur.shape, Dt::Half))
    }

    fn token_op(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
        kind: Kind,
    ) -> Option<Cur> {
        let names: &[&str] = if kind == Kind::SelectToken {
            &["index"]
        } else {
            &[]
        };
        let v = self.fields(body, kp, names)?;
        let index = if kind == Kind::SelectToken {
            self.int(kp, "index", v[0], Some(0), 0, MAX_DIM)?
        } else {
            0
        };
        let cur = cur?;
        match kind {
            // [C, H, W] → [H·W, C]: a reshape and permute, a view.
            Kind::Tokens => {
                if !self.expect_rank(
                    kp,
                    cur,
                    &[2, 3],
                    "[channels, length] or [channels, height, width]",
                ) {
                    return None;
                }
                let c = cur.shape.d[0];
                let n = self.elems(cur) / c;
                Some(Cur {
                    id: cur.id,
                    shape: Shape::new(&[n, c]),
                })
            }
            // cat([class token, x]): a new tensor, promoted to the fp32 parameter's dtype.
            Kind::ClassToken => {
                if !self.expect_rank(kp, cur, &[2], "[tokens, dim]") {
                    return None;
                }
                let (t, d) = (cur.shape.d[0], cur.shape.d[1]);
                self.param(d, false);
                Some(self.out(Shape::new(&[t + 1, d]), Dt::Fp32))
            }
            // x + a learned table of x's shape; the add keeps nothing.
            Kind::PositionEmbedding => {
                let e = self.elems(cur);
                self.param(e, false);
                Some(self.out(cur.shape, Dt::Fp32))
            }
            // x[:, index]: a view; select keeps only sizes.
            _ => {
                if !self.expect_rank(kp, cur, &[2], "[tokens, dim]") {
                    return None;
                }
                if index >= cur.shape.d[0] {
                    self.err(
                        &Path::Key(kp, "index"),
                        format!("{index} is out of range for {} tokens", cur.shape.d[0]),
                    );
                    return None;
                }
                Some(Cur {
                    id: cur.id,
                    shape: Shape::new(&[cur.shape.d[1]]),
                })
            }
        }
    }
}

fn axis(n: usize, i: usize) -> &'static str {
    match (n, i) {
        (1, _) => "length",
        (_, 0) => "height",
        _ => "width",
    }
}

#[cfg(test)]
mod tests;
