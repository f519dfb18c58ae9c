//! Activations, pooling and dropout.

use super::*;

impl Analyzer {
    pub(super) fn activation(
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

    pub(super) fn pool(
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

    pub(super) fn adaptive_pool(
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

    pub(super) fn dropout(
        &mut self,
        body: &Map<String, Value>,
        kp: &Path,
        cur: Option<Cur>,
    ) -> Option<Cur> {
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
}
