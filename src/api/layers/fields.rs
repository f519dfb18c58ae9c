//! The readers of a layer's fields: whole numbers, spatial pairs, flags, numbers and
//! lists, each checked and its problems reported at its path.

use super::*;

impl Analyzer {
    /// The layer's fields in the order of `names`; `None` (after reporting) on an unknown one.
    pub(super) fn fields<'v>(
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
    pub(super) fn int(
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
    pub(super) fn spatial(
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

    pub(super) fn flag(
        &mut self,
        kp: &Path,
        name: &str,
        v: Option<&Value>,
        default: bool,
    ) -> Option<bool> {
        match v {
            None | Some(Value::Null) => Some(default),
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                self.err(&Path::Key(kp, name), format!("{v} is not a boolean"));
                None
            }
        }
    }

    pub(super) fn opt_flag(
        &mut self,
        kp: &Path,
        name: &str,
        v: Option<&Value>,
    ) -> Option<Option<bool>> {
        match v {
            None | Some(Value::Null) => Some(None),
            _ => self.flag(kp, name, v, false).map(Some),
        }
    }

    /// A number in `lo..=hi` (inclusive), or the default.
    pub(super) fn number(
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

    pub(super) fn list<'v>(
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
    pub(super) fn expect_rank(&mut self, kp: &Path, cur: Cur, ranks: &[usize], what: &str) -> bool {
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
}
