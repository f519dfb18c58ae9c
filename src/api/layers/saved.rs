//! The saved-tensor bookkeeping: tensors by identity, their dtype under autocast and
//! without it, what autograd keeps, and the parameters.

use super::*;

impl Analyzer {
    pub(super) fn see_uniform(&mut self, elems: u64) {
        self.largest.uniform = self.largest.uniform.max(elems);
    }

    pub(super) fn see_autocast(&mut self, elems: u64, dt: Dt) {
        match dt {
            Dt::Half => self.largest.half = self.largest.half.max(elems),
            Dt::Fp32 => self.largest.autocast_fp32 = self.largest.autocast_fp32.max(elems),
        }
    }

    pub(super) fn new_tensor(&mut self, elems: u64, dt: Dt) -> usize {
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

    pub(super) fn autocast_bucket(&mut self, dt: Dt) -> &mut u64 {
        match dt {
            Dt::Half => &mut self.counts.half_elems,
            Dt::Fp32 => &mut self.counts.autocast_fp32_elems,
        }
    }

    pub(super) fn keep_uniform(&mut self, id: usize) {
        let t = self.tensors[id];
        if !t.external && !t.saved_uniform {
            self.tensors[id].saved_uniform = true;
            self.saved_tensors += 1;
            add(&mut self.counts.uniform_elems, t.elems, &mut self.overflow);
        }
    }

    pub(super) fn keep_autocast(&mut self, id: usize) {
        let t = self.tensors[id];
        if !t.external && !t.saved_autocast {
            self.tensors[id].saved_autocast = true;
            let mut o = false;
            add(self.autocast_bucket(t.dt), t.elems, &mut o);
            self.overflow |= o;
        }
    }

    /// An op saves this tensor as it is.
    pub(super) fn keep(&mut self, id: usize) {
        self.keep_uniform(id);
        self.keep_autocast(id);
    }

    /// An op saves its input after autocast cast it to `dt`: the tensor itself when it already
    /// has that dtype, else a new copy (autocast caches casts of parameters only).
    pub(super) fn keep_as(&mut self, cur: Cur, dt: Dt, elems: u64) {
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
    pub(super) fn keep_new(&mut self, elems: u64, dt: Dt) {
        let id = self.new_tensor(elems, dt);
        self.keep(id);
    }

    pub(super) fn keep_fixed(&mut self, elems: u64, kind: Fixed) {
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

    pub(super) fn param(&mut self, elems: u64, autocast: bool) {
        add(&mut self.parameters, elems, &mut self.overflow);
        if autocast {
            add(&mut self.autocast_parameters, elems, &mut self.overflow);
        }
        self.parameter_tensors += 1;
        self.largest_param = self.largest_param.max(elems);
    }

    pub(super) fn dt(&self, cur: Cur) -> Dt {
        self.tensors[cur.id].dt
    }

    /// Output of an op that keeps its input's dtype.
    pub(super) fn same(&mut self, cur: Cur, shape: Shape) -> Cur {
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
    pub(super) fn out(&mut self, shape: Shape, dt: Dt) -> Cur {
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
    pub(super) fn can_modify(&self, cur: Cur) -> bool {
        let t = &self.tensors[cur.id];
        !t.external && !t.saved_uniform && !t.saved_autocast
    }

    pub(super) fn elems(&mut self, cur: Cur) -> u64 {
        cur.shape.elems().unwrap_or_else(|| {
            self.overflow = true;
            0
        })
    }

    // ---- Input ----
}
