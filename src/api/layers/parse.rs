//! Reading `spec.model.layers` into [`Layer`]s, element by element: each bad element is
//! reported at its path and the reading goes on, so one pass names every problem of the
//! fields. What depends on the incoming shape is checked afterwards, over the typed list.

use super::*;

impl Analyzer {
    /// The list at `path`, `depth` lists deep; cut (not `complete`) at its first bad element.
    pub(super) fn read_list(&mut self, list: &[Value], path: &Path, depth: usize) -> Layers {
        let mut out = Layers {
            list: Vec::with_capacity(list.len().min(64)),
            complete: true,
        };
        if depth > MAX_DEPTH {
            self.err(
                path,
                format!("nested more than {MAX_DEPTH} deep; flatten the blocks"),
            );
            out.complete = false;
            return out;
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
                out.complete = false;
                return out;
            }
            match self.read_layer(v, &lp, depth) {
                Some(layer) if out.complete => out.list.push(layer),
                Some(_) => {}
                None => out.complete = false,
            }
        }
        out
    }

    /// One element: an object with one key, its kind, whose value holds the fields.
    pub(super) fn read_layer(&mut self, v: &Value, path: &Path, depth: usize) -> Option<Layer> {
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
        self.read_fields(k, body, &Path::Key(path, kind), depth)
    }

    fn read_fields(
        &mut self,
        k: Kind,
        body: &Map<String, Value>,
        kp: &Path,
        depth: usize,
    ) -> Option<Layer> {
        Some(match k {
            Kind::Linear => Layer::Linear(self.read_linear(body, kp)?),
            Kind::Conv1d => Layer::Conv1d(self.read_conv(body, kp, 1)?),
            Kind::Conv2d => Layer::Conv2d(self.read_conv(body, kp, 2)?),
            Kind::BatchNorm => Layer::BatchNorm(self.read_batchnorm(body, kp)?),
            Kind::LayerNorm => Layer::LayerNorm(self.read_layernorm(body, kp)?),
            Kind::GroupNorm => Layer::GroupNorm(self.read_groupnorm(body, kp)?),
            Kind::Relu
            | Kind::Relu6
            | Kind::LeakyRelu
            | Kind::Gelu
            | Kind::Silu
            | Kind::Sigmoid
            | Kind::Tanh
            | Kind::Softmax => self.read_activation(body, kp, k)?,
            Kind::MaxPool => Layer::MaxPool(Box::new(self.read_pool(body, kp, true)?)),
            Kind::AvgPool => Layer::AvgPool(Box::new(self.read_pool(body, kp, false)?)),
            Kind::AdaptiveAvgPool => {
                let v = self.fields(body, kp, &["outputSize"])?;
                Layer::AdaptiveAvgPool {
                    output_size: Written(v[0].cloned()),
                }
            }
            Kind::Dropout => {
                let v = self.fields(body, kp, &["p", "inplace"])?;
                let p = self.number(kp, "p", v[0], 0.5, 0.0, 1.0);
                let inplace = self.flag(kp, "inplace", v[1], false);
                Layer::Dropout {
                    p: p?,
                    inplace: inplace?,
                }
            }
            Kind::Flatten => {
                self.fields(body, kp, &[])?;
                Layer::Flatten
            }
            Kind::Embedding => Layer::Embedding(self.read_embedding(body, kp)?),
            Kind::Residual => self.read_residual(body, kp, depth)?,
            Kind::Concat => self.read_concat(body, kp, depth)?,
            Kind::Gate | Kind::Aux => {
                let v = self.fields(body, kp, &["layers"])?;
                let list = self.list(kp, "layers", v[0], true)?;
                let layers = self.read_list(list, &Path::List(kp, "layers", 0), depth + 1);
                if k == Kind::Gate {
                    Layer::Gate { layers }
                } else {
                    Layer::Aux { layers }
                }
            }
            Kind::Attention => Layer::Attention(self.read_attention(body, kp)?),
            Kind::Tokens | Kind::ClassToken | Kind::PositionEmbedding => {
                self.fields(body, kp, &[])?;
                match k {
                    Kind::Tokens => Layer::Tokens,
                    Kind::ClassToken => Layer::ClassToken,
                    _ => Layer::PositionEmbedding,
                }
            }
            Kind::SelectToken => {
                let v = self.fields(body, kp, &["index"])?;
                let index = self.int(kp, "index", v[0], Some(0), 0, MAX_DIM)?;
                Layer::SelectToken { index }
            }
        })
    }

    fn read_linear(&mut self, body: &Map<String, Value>, kp: &Path) -> Option<Linear> {
        let v = self.fields(body, kp, &["in", "out", "bias"])?;
        let input = self.int(kp, "in", v[0], None, 1, MAX_DIM);
        let out = self.int(kp, "out", v[1], None, 1, MAX_DIM);
        let bias = self.flag(kp, "bias", v[2], true);
        Some(Linear {
            input: input?,
            out: out?,
            bias: bias?,
        })
    }

    fn read_conv(&mut self, body: &Map<String, Value>, kp: &Path, n: usize) -> Option<Conv> {
        let names = [
            "in",
            "out",
            "kernelSize",
            "stride",
            "padding",
            "dilation",
            "groups",
            "bias",
        ];
        let v = self.fields(body, kp, &names)?;
        let input = self.int(kp, "in", v[0], None, 1, MAX_DIM);
        let out = self.int(kp, "out", v[1], None, 1, MAX_DIM);
        let kernel_size = self.spatial(kp, "kernelSize", v[2], None, n, 1);
        let stride = self.spatial(kp, "stride", v[3], Some(1), n, 1);
        let padding = match v[4] {
            Some(Value::String(s)) if s == "same" => Some(ConvPadding::Same),
            Some(Value::String(s)) if s == "valid" => Some(ConvPadding::Each([0; 2])),
            p => self
                .spatial(kp, "padding", p, Some(0), n, 0)
                .map(ConvPadding::Each),
        };
        let dilation = self.spatial(kp, "dilation", v[5], Some(1), n, 1);
        let groups = self.int(kp, "groups", v[6], Some(1), 1, MAX_DIM);
        let bias = self.flag(kp, "bias", v[7], true);
        Some(Conv {
            input: input?,
            out: out?,
            kernel_size: kernel_size?,
            stride: stride?,
            padding: padding?,
            dilation: dilation?,
            groups: groups?,
            bias: bias?,
        })
    }

    /// An optional size: absent or null is `None`.
    fn opt_int(&mut self, kp: &Path, name: &str, v: Option<&Value>) -> Option<Option<u64>> {
        match v {
            None | Some(Value::Null) => Some(None),
            f => self.int(kp, name, f, None, 1, MAX_DIM).map(Some),
        }
    }

    fn read_batchnorm(&mut self, body: &Map<String, Value>, kp: &Path) -> Option<BatchNorm> {
        let v = self.fields(
            body,
            kp,
            &["features", "eps", "momentum", "affine", "trackRunningStats"],
        )?;
        Some(BatchNorm {
            features: self.opt_int(kp, "features", v[0])?,
            eps: self.number(kp, "eps", v[1], 1e-5, 0.0, 1.0)?,
            momentum: self.number(kp, "momentum", v[2], 0.1, 0.0, 1.0)?,
            affine: self.flag(kp, "affine", v[3], true)?,
            track_running_stats: self.flag(kp, "trackRunningStats", v[4], true)?,
        })
    }

    fn read_layernorm(&mut self, body: &Map<String, Value>, kp: &Path) -> Option<LayerNorm> {
        let v = self.fields(body, kp, &["dim", "eps", "affine"])?;
        Some(LayerNorm {
            dim: self.opt_int(kp, "dim", v[0])?,
            eps: self.number(kp, "eps", v[1], 1e-5, 0.0, 1.0)?,
            affine: self.flag(kp, "affine", v[2], true)?,
        })
    }

    fn read_groupnorm(&mut self, body: &Map<String, Value>, kp: &Path) -> Option<GroupNorm> {
        let v = self.fields(body, kp, &["groups", "channels", "eps", "affine"])?;
        let groups = self.int(kp, "groups", v[0], None, 1, MAX_DIM);
        let channels = self.opt_int(kp, "channels", v[1]);
        let eps = self.number(kp, "eps", v[2], 1e-5, 0.0, 1.0);
        let affine = self.flag(kp, "affine", v[3], true);
        Some(GroupNorm {
            groups: groups?,
            channels: channels?,
            eps: eps?,
            affine: affine?,
        })
    }

    fn read_activation(&mut self, body: &Map<String, Value>, kp: &Path, k: Kind) -> Option<Layer> {
        let names: &[&str] = match k {
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
        Some(match k {
            Kind::Relu => Layer::Relu { inplace },
            Kind::Relu6 => Layer::Relu6 { inplace },
            Kind::Silu => Layer::Silu { inplace },
            Kind::LeakyRelu => Layer::LeakyRelu {
                inplace,
                negative_slope: self.number(kp, "negativeSlope", v[1], 0.01, -1e6, 1e6)?,
            },
            Kind::Gelu => match v[0] {
                None | Some(Value::Null) => Layer::Gelu { tanh: false },
                Some(Value::String(s)) if s == "none" || s == "tanh" => {
                    Layer::Gelu { tanh: s == "tanh" }
                }
                Some(x) => {
                    self.err(
                        &Path::Key(kp, "approximate"),
                        format!("{x} is not allowed; use none or tanh"),
                    );
                    return None;
                }
            },
            Kind::Softmax => match v[0] {
                None | Some(Value::Null) => Layer::Softmax,
                Some(x) if x.as_i64() == Some(-1) => Layer::Softmax,
                Some(x) => {
                    self.err(
                        &Path::Key(kp, "dim"),
                        format!("{x} is not supported; softmax runs over the last dimension (-1)"),
                    );
                    return None;
                }
            },
            Kind::Sigmoid => Layer::Sigmoid,
            _ => Layer::Tanh,
        })
    }

    fn read_pool(&mut self, body: &Map<String, Value>, kp: &Path, max: bool) -> Option<Pool> {
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
        let w = |i: usize| Written(v[i].cloned());
        Some(if max {
            Pool {
                kernel_size: w(0),
                stride: w(1),
                padding: w(2),
                dilation: w(3),
                ceil_mode: w(4),
                count_include_pad: Written(None),
            }
        } else {
            Pool {
                kernel_size: w(0),
                stride: w(1),
                padding: w(2),
                dilation: Written(None),
                ceil_mode: w(3),
                count_include_pad: w(4),
            }
        })
    }

    fn read_embedding(&mut self, body: &Map<String, Value>, kp: &Path) -> Option<Embedding> {
        let v = self.fields(body, kp, &["vocab", "dim", "paddingIdx"])?;
        let vocab = self.int(kp, "vocab", v[0], None, 1, MAX_DIM);
        let dim = self.int(kp, "dim", v[1], None, 1, MAX_DIM);
        let padding_idx = match v[2].filter(|p| !p.is_null()) {
            Some(p) => Some(self.int(kp, "paddingIdx", Some(p), None, 0, MAX_DIM)?),
            None => None,
        };
        Some(Embedding {
            vocab: vocab?,
            dim: dim?,
            padding_idx,
        })
    }

    fn read_residual(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        depth: usize,
    ) -> Option<Layer> {
        let v = self.fields(body, kp, &["layers", "shortcut"])?;
        let layers = self.list(kp, "layers", v[0], true);
        let shortcut = self.list(kp, "shortcut", v[1], false);
        let (layers, shortcut) = (layers?, shortcut?);
        Some(Layer::Residual {
            layers: self.read_list(layers, &Path::List(kp, "layers", 0), depth + 1),
            shortcut: self.read_list(shortcut, &Path::List(kp, "shortcut", 1), depth + 1),
        })
    }

    /// A concat with a bad `dim` still has its branches read, for their problems.
    fn read_concat(&mut self, body: &Map<String, Value>, kp: &Path, depth: usize) -> Option<Layer> {
        let v = self.fields(body, kp, &["branches", "dim"])?;
        let dim = self.int(kp, "dim", v[1], Some(0), 0, MAX_RANK as u64 - 1);
        let bp = Path::List(kp, "branches", 0);
        let written = match v[0] {
            Some(Value::Array(b)) if !b.is_empty() => b,
            other => {
                let found = other
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "missing".into());
                self.err(
                    &bp,
                    format!("{found}: give a non-empty list of branches, each a list of layers ([] for the input itself)"),
                );
                return None;
            }
        };
        let mut branches = Vec::with_capacity(written.len().min(64));
        for (i, br) in written.iter().enumerate() {
            let ip = Path::Index(&bp, i);
            branches.push(match br {
                Value::Array(list) => self.read_list(list, &ip, depth + 1),
                other => {
                    self.err(&ip, format!("{other} is not a list of layers"));
                    Layers::default()
                }
            });
        }
        Some(Layer::Concat {
            branches,
            dim: dim? as usize,
        })
    }

    fn read_attention(&mut self, body: &Map<String, Value>, kp: &Path) -> Option<Attention> {
        let v = self.fields(body, kp, &["dim", "heads", "bias", "flash"])?;
        let dim = self.int(kp, "dim", v[0], None, 1, MAX_DIM);
        let heads = self.int(kp, "heads", v[1], None, 1, MAX_DIM);
        let bias = self.flag(kp, "bias", v[2], true);
        let flash = self.opt_flag(kp, "flash", v[3]);
        Some(Attention {
            dim: dim?,
            heads: heads?,
            bias: bias?,
            flash: flash?,
        })
    }
}
