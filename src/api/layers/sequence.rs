//! Attention and the token layers of a ViT: tokens, classToken, positionEmbedding,
//! selectToken.

use super::*;

impl Analyzer {
    pub(super) fn attention(&mut self, a: &Attention, kp: &Path, cur: Cur) -> Option<Cur> {
        let (dim, heads, bias, flash) = (a.dim, a.heads, a.bias, a.flash);
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

    /// [C, H, W] → [H·W, C]: a reshape and permute, a view.
    pub(super) fn tokens(&mut self, kp: &Path, cur: Cur) -> Option<Cur> {
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

    /// cat([class token, x]): a new tensor, promoted to the fp32 parameter's dtype.
    pub(super) fn class_token(&mut self, kp: &Path, cur: Cur) -> Option<Cur> {
        if !self.expect_rank(kp, cur, &[2], "[tokens, dim]") {
            return None;
        }
        let (t, d) = (cur.shape.d[0], cur.shape.d[1]);
        self.param(d, false);
        Some(self.out(Shape::new(&[t + 1, d]), Dt::Fp32))
    }

    /// x + a learned table of x's shape; the add keeps nothing.
    pub(super) fn position_embedding(&mut self, cur: Cur) -> Cur {
        let e = self.elems(cur);
        self.param(e, false);
        self.out(cur.shape, Dt::Fp32)
    }

    /// x[:, index]: a view; select keeps only sizes.
    pub(super) fn select_token(&mut self, index: u64, kp: &Path, cur: Cur) -> Option<Cur> {
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
