//! Activations, pooling and dropout.

use super::*;

impl Analyzer {
    /// Always has an output: an activation takes any shape.
    pub(super) fn activation(&mut self, layer: &Layer, cur: Cur) -> Cur {
        let inplace = match layer {
            Layer::Relu { inplace }
            | Layer::Relu6 { inplace }
            | Layer::LeakyRelu { inplace, .. }
            | Layer::Silu { inplace } => *inplace,
            _ => false,
        };
        let inplace = inplace && self.can_modify(cur);
        let elems = self.elems(cur);
        match layer {
            // threshold_backward / hardtanh_ / leaky_relu_ use the result: in place it is the
            // input's storage; ReLU keeps its result even out of place.
            Layer::Relu { .. } | Layer::Relu6 { .. } | Layer::LeakyRelu { .. } if inplace => {
                self.keep(cur.id);
                cur
            }
            Layer::Relu { .. } | Layer::Sigmoid | Layer::Tanh => {
                let out = self.same(cur, cur.shape);
                self.keep(out.id);
                out
            }
            // Out of place, hardtanh and leaky_relu keep their input.
            Layer::Relu6 { .. } | Layer::LeakyRelu { .. } | Layer::Gelu { .. } => {
                self.keep(cur.id);
                self.same(cur, cur.shape)
            }
            // silu keeps its input; in place the input is overwritten, so an input-sized tensor
            // of its original values is kept besides the output (the same bytes either way).
            Layer::Silu { .. } if inplace => {
                let dt = self.dt(cur);
                self.keep_new(elems, dt);
                cur
            }
            Layer::Silu { .. } => {
                self.keep(cur.id);
                self.same(cur, cur.shape)
            }
            // softmax is on autocast's fp32 list and keeps its result.
            _ => {
                let out = self.out(cur.shape, Dt::Fp32);
                self.keep(out.id);
                out
            }
        }
    }

    pub(super) fn pool(&mut self, p: &Pool, kp: &Path, cur: Cur, max: bool) -> Option<Cur> {
        if !self.expect_rank(
            kp,
            cur,
            &[2, 3],
            "[channels, length] or [channels, height, width]",
        ) {
            return None;
        }
        let n = cur.shape.rank - 1;
        let k = self.spatial(kp, "kernelSize", p.kernel_size.0.as_ref(), None, n, 1);
        let stride = match k {
            Some(k) => match p.stride.0.as_ref() {
                None | Some(Value::Null) => Some(k),
                s => self.spatial(kp, "stride", s, None, n, 1),
            },
            None => None,
        };
        let pad = self.spatial(kp, "padding", p.padding.0.as_ref(), Some(0), n, 0);
        let (dil, ceil) = if max {
            (
                self.spatial(kp, "dilation", p.dilation.0.as_ref(), Some(1), n, 1),
                self.flag(kp, "ceilMode", p.ceil_mode.0.as_ref(), false),
            )
        } else {
            let c = self.flag(kp, "ceilMode", p.ceil_mode.0.as_ref(), false);
            let _ = self.flag(kp, "countIncludePad", p.count_include_pad.0.as_ref(), true)?;
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

    pub(super) fn adaptive_pool(&mut self, size: &Written, kp: &Path, cur: Cur) -> Option<Cur> {
        if !self.expect_rank(
            kp,
            cur,
            &[2, 3],
            "[channels, length] or [channels, height, width]",
        ) {
            return None;
        }
        let n = cur.shape.rank - 1;
        let size = self.spatial(kp, "outputSize", size.0.as_ref(), None, n, 1)?;
        let mut shape = cur.shape;
        shape.d[1..=n].copy_from_slice(&size[..n]);
        // An output of 1 is computed as mean(), which saves only sizes
        // (ATen adaptive_avg_pool2d); otherwise the pool keeps its input.
        if size[..n].iter().any(|&s| s != 1) {
            self.keep(cur.id);
        }
        Some(self.same(cur, shape))
    }

    /// Always has an output: dropout takes any shape.
    pub(super) fn dropout(&mut self, p: f64, inplace: bool, cur: Cur) -> Cur {
        if p == 0.0 {
            return cur;
        }
        if p >= 1.0 {
            return self.same(cur, cur.shape);
        }
        let elems = self.elems(cur);
        if inplace && self.can_modify(cur) {
            // In place, dropout multiplies by a noise tensor of the input's dtype and keeps it.
            let dt = self.dt(cur);
            self.keep_new(elems, dt);
            return cur;
        }
        // native_dropout keeps a one-byte mask.
        self.keep_fixed(elems, Fixed::Byte);
        self.same(cur, cur.shape)
    }
}
