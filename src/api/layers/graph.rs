//! Embeddings and the layers that join branches: residual, concat, gate, aux.

use super::*;

impl Analyzer {
    pub(super) fn embedding(
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

    pub(super) fn residual(
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

    pub(super) fn concat(
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

    pub(super) fn gate(
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

    pub(super) fn aux(
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
}
