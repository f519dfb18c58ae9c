//! What `estimate` and `max` say about bad input, as text lines (`error: SOURCE: DOCUMENT:
//! PATH: REASON`) or, with `--error-format json`, as one JSON object on standard error that a
//! program reads without parsing English: `{"errors": [{"source", "document", "path",
//! "reason", "flag", "message"}, ...]}` (the Python package's `SpecError` is made from it).

use std::io::Write;

use clap::ValueEnum;
use serde::Serialize;

/// How bad input is reported on standard error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ErrorFormat {
    /// `error: ...` lines, for a person.
    #[default]
    Text,
    /// One JSON object, `{"errors": [...]}`, for a program.
    Json,
}

/// One problem: a field (or flag, or file) and why it is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file or `flags` the job came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Which document of the source (its name, or `document N`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<String>,
    /// The field path (`spec.training.microBatchSize`), flag (`--gpu`) or file the problem
    /// is about, when the message names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Why it is wrong and, where known, what would be valid.
    pub reason: String,
    /// The flag that set the field, when a flag did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
    /// The whole line the text form prints (without `error: `).
    pub message: String,
}

#[derive(Serialize)]
struct Report<'a> {
    errors: &'a [Problem],
}

/// The problems of one run, written once it ends.
#[derive(Debug, Default)]
pub struct Problems {
    format: ErrorFormat,
    list: Vec<Problem>,
}

impl Problems {
    pub fn new(format: ErrorFormat) -> Self {
        Self {
            format,
            list: Vec::new(),
        }
    }

    /// True when a problem was recorded.
    pub fn any(&self) -> bool {
        !self.list.is_empty()
    }

    /// Every line of `text` as a problem of `document` in `source`.
    pub fn add(&mut self, source: Option<&str>, document: Option<&str>, text: &str) {
        for line in text.lines() {
            self.list.push(problem(source, document, line));
        }
    }

    /// Write the problems to `err` in the chosen format.
    pub fn write(&self, err: &mut dyn Write) {
        if self.list.is_empty() {
            return;
        }
        match self.format {
            ErrorFormat::Text => {
                for p in &self.list {
                    let _ = writeln!(err, "error: {}", p.message);
                }
            }
            ErrorFormat::Json => {
                if let Ok(text) = serde_json::to_string(&Report { errors: &self.list }) {
                    let _ = writeln!(err, "{text}");
                }
            }
        }
    }
}

/// Split a `path: reason (set by --flag)` line.
fn problem(source: Option<&str>, document: Option<&str>, line: &str) -> Problem {
    let message = [source, document, Some(line)]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(": ");
    let (path, rest) = match line.split_once(": ") {
        Some((head, rest)) if !head.is_empty() && !head.contains(char::is_whitespace) => {
            (Some(head.to_string()), rest)
        }
        _ => (None, line),
    };
    let (reason, flag) = match rest
        .strip_suffix(')')
        .and_then(|r| r.rsplit_once(" (set by "))
    {
        Some((reason, flag)) if flag.starts_with("--") => (reason, Some(flag.to_string())),
        _ => (rest, None),
    };
    Problem {
        source: source.map(str::to_string),
        document: document.map(str::to_string),
        path,
        reason: reason.to_string(),
        flag,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_line_splits_into_path_reason_and_flag() {
        let p = problem(
            Some("flags"),
            Some("job"),
            "spec.training.mode: unknown mode \"lorax\"; valid: full, lora (set by --mode)",
        );
        assert_eq!(p.path.as_deref(), Some("spec.training.mode"));
        assert_eq!(p.reason, "unknown mode \"lorax\"; valid: full, lora");
        assert_eq!(p.flag.as_deref(), Some("--mode"));
        assert_eq!(
            p.message,
            "flags: job: spec.training.mode: unknown mode \"lorax\"; valid: full, lora (set by --mode)"
        );
    }

    #[test]
    fn a_sentence_has_no_path() {
        let p = problem(None, None, "no job given: name a file");
        assert_eq!(p.path, None);
        assert_eq!(p.reason, "no job given: name a file");
        assert_eq!(p.message, "no job given: name a file");
    }

    #[test]
    fn text_and_json_carry_every_line() {
        let mut p = Problems::new(ErrorFormat::Json);
        p.add(
            Some("f.yaml"),
            Some("document 2"),
            "spec.a: bad\nspec.b: worse",
        );
        let mut out = Vec::new();
        p.write(&mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
        let paths: Vec<&str> = v["errors"]
            .as_array()
            .expect("list")
            .iter()
            .map(|e| e["path"].as_str().expect("path"))
            .collect();
        assert_eq!(paths, ["spec.a", "spec.b"]);
        let mut text = Vec::new();
        Problems {
            format: ErrorFormat::Text,
            ..p
        }
        .write(&mut text);
        assert_eq!(
            String::from_utf8(text).expect("UTF-8"),
            "error: f.yaml: document 2: spec.a: bad\nerror: f.yaml: document 2: spec.b: worse\n"
        );
    }
}
