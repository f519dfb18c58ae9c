//! The layers with weights over channels: linear, conv1d/conv2d and the norms.

use super::*;

impl Analyzer {
    pub(super) fn linear(&mut self, l: &Linear, kp: &Path, cur: Cur) -> Option<Cur> {
        let (fin, fout, bias) = (l.input, l.out, l.bias);
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

    pub(super) fn conv(&mut self, c: &Conv, kp: &Path, cur: Cur, n: usize) -> Option<Cur> {
        let (cin, cout, k, stride, dil, groups, bias) = (
            c.input,
            c.out,
            c.kernel_size,
            c.stride,
            c.dilation,
            c.groups,
            c.bias,
        );
        let (same, pad) = match c.padding {
            ConvPadding::Same => (true, [0; 2]),
            ConvPadding::Each(p) => (false, p),
        };
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

    pub(super) fn batchnorm(&mut self, b: &BatchNorm, kp: &Path, cur: Cur) -> Option<Cur> {
        let (features, affine, track) = (b.features, b.affine, b.track_running_stats);
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

    pub(super) fn layernorm(&mut self, l: &LayerNorm, kp: &Path, cur: Cur) -> Option<Cur> {
        let (dim, affine) = (l.dim, l.affine);
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

    pub(super) fn groupnorm(&mut self, g: &GroupNorm, kp: &Path, cur: Cur) -> Option<Cur> {
        let (groups, channels, affine) = (g.groups, g.channels, g.affine);
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
        if !c.is_multiple_of(groups) {
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
}
