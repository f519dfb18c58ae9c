//! Label and field selectors, parsed from a query and matched against an
//! object's metadata.

use std::collections::HashMap;

use serde_json::Value;

#[derive(Clone, Debug)]
pub(super) enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Clone, Debug, Default)]
pub(super) struct Selector {
    pub(super) labels: Vec<Req>,
    pub(super) name: Option<String>,
    pub(super) namespace: Option<String>,
}

/// Split on commas outside parentheses.
pub(super) fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

pub(super) fn set_values(s: &str) -> Option<Vec<String>> {
    let s = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(s.split(',').map(|v| v.trim().to_string()).collect())
}

pub(super) fn parse_labels(s: &str) -> Result<Vec<Req>, String> {
    let mut out = Vec::new();
    for term in split_top(s) {
        let req = if let Some(k) = term.strip_prefix('!') {
            Req::NotExists(k.trim().into())
        } else if let Some((k, v)) = term.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once("==") {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once('=') {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once(" notin ") {
            Req::NotIn(k.trim().into(), set_values(v).ok_or(term.clone())?)
        } else if let Some((k, v)) = term.split_once(" in ") {
            Req::In(k.trim().into(), set_values(v).ok_or(term.clone())?)
        } else if term.contains(char::is_whitespace) {
            return Err(term);
        } else {
            Req::Exists(term)
        };
        out.push(req);
    }
    Ok(out)
}

impl Selector {
    pub(super) fn from_query(q: &HashMap<String, String>) -> Result<Selector, String> {
        let mut sel = Selector::default();
        if let Some(l) = q.get("labelSelector") {
            sel.labels =
                parse_labels(l).map_err(|t| format!("unable to parse requirement: {t}"))?;
        }
        if let Some(f) = q.get("fieldSelector") {
            for term in split_top(f) {
                let (k, v) = term
                    .split_once("==")
                    .or_else(|| term.split_once('='))
                    .ok_or_else(|| format!("invalid field selector: {term}"))?;
                match k.trim() {
                    "metadata.name" => sel.name = Some(v.trim().into()),
                    "metadata.namespace" => sel.namespace = Some(v.trim().into()),
                    other => {
                        return Err(format!(
                            "field label not supported by the test API server: {other}"
                        ));
                    }
                }
            }
        }
        Ok(sel)
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        if let Some(n) = &self.name
            && meta["name"].as_str() != Some(n)
        {
            return false;
        }
        if let Some(n) = &self.namespace
            && meta["namespace"].as_str().unwrap_or("") != n
        {
            return false;
        }
        let label = |k: &str| meta["labels"].get(k).and_then(|v| v.as_str());
        self.labels.iter().all(|r| match r {
            Req::Eq(k, v) => label(k) == Some(v),
            Req::Ne(k, v) => label(k) != Some(v),
            Req::Exists(k) => label(k).is_some(),
            Req::NotExists(k) => label(k).is_none(),
            Req::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
        })
    }
}
