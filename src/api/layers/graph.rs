//! Embeddings and the layers that join branches: residual, concat, gate, aux.

use super::*;

impl Analyzer {
    pub(super) fn embedding(
        &mut self,
        e: &Embedding,
        kp: &Path,
        cur: Cur,
        depth: usize,
    ) -> Option<Cur> {
        let (vocab, dim) = (e.vocab, e.dim);
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

    pub(super) fn residual(
        &mut self,
        layers: &Layers,
        shortcut: &Layers,
        kp: &Path,
        input: Cur,
        depth: usize,
    ) -> Option<Cur> {
        let body_out = self.walk(layers, &Path::List(kp, "layers", 0), Some(input), depth + 1);
        let short_out = self.walk(
            shortcut,
            &Path::List(kp, "shortcut", 1),
            Some(input),
            depth + 1,
        );
        let (b, s) = (body_out?, short_out?);
        if b.shape != s.shape {
            let reason = if shortcut.list.is_empty() {
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

    pub(super) fn concat(
        &mut self,
        branches: &[Layers],
        dim: usize,
        kp: &Path,
        cur: Cur,
        depth: usize,
    ) -> Option<Cur> {
        let bp = Path::List(kp, "branches", 0);
        let mut outs = Vec::with_capacity(branches.len());
        let mut ok = true;
        for (i, br) in branches.iter().enumerate() {
            let out = self.walk(br, &Path::Index(&bp, i), Some(cur), depth + 1);
            ok &= out.is_some();
            outs.extend(out);
        }
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

    pub(super) fn gate(&mut self, layers: &Layers, kp: &Path, x: Cur, depth: usize) -> Option<Cur> {
        let s = self.walk(layers, &Path::List(kp, "layers", 0), Some(x), depth + 1)?;
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

    /// An auxiliary head: its output is extra logits; the main path goes on from its input.
    pub(super) fn aux(
        &mut self,
        layers: &Layers,
        kp: &Path,
        cur: Cur,
        depth: usize,
    ) -> Option<Cur> {
        let out = self.walk(layers, &Path::List(kp, "layers", 0), Some(cur), depth + 1)?;
        let e = self.elems(out);
        add(&mut self.aux_output, e, &mut self.overflow);
        Some(cur)
    }
}
