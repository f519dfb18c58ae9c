//! Kubernetes-style conditions on `status.conditions`: one per type, the
//! transition time kept while the status stays the same.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types the operator sets.
pub const VALIDATED: &str = "Validated";
pub const PLACED: &str = "Placed";
pub const RUNNING: &str = "Running";
pub const COMPLETE: &str = "Complete";
pub const FAILED: &str = "Failed";
pub const OUT_OF_MEMORY: &str = "OutOfMemory";
pub const QUEUED: &str = "Queued";

/// Kubernetes caps a condition's message at 32 768 bytes; keep well under.
const MAX_MESSAGE: usize = 4096;

/// Cut `s` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max.saturating_sub(3);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

/// Set the condition of `type_`, keeping `lastTransitionTime` when its status
/// does not change.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" };
    let message = truncate(message, MAX_MESSAGE);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now.clone();
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        }),
    }
}

/// The condition of `type_`, if set.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn transition_time_moves_only_on_a_change() {
        let t0 = Time(Timestamp::from_second(1_000).unwrap());
        let t1 = Time(Timestamp::from_second(2_000).unwrap());
        let mut c = Vec::new();
        set(&mut c, PLACED, false, "Waiting", "full", Some(1), &t0);
        set(&mut c, PLACED, false, "Waiting", "still full", Some(1), &t1);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, t0);
        assert_eq!(c[0].message, "still full");
        set(&mut c, PLACED, true, "Placed", "node a", Some(2), &t1);
        assert_eq!(c[0].last_transition_time, t1);
        assert_eq!(c[0].observed_generation, Some(2));
        assert_eq!(get(&c, PLACED).map(|c| c.status.as_str()), Some("True"));
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate("abc", 10), "abc");
        let t = truncate(&"é".repeat(100), 11);
        assert!(t.len() <= 11 && t.ends_with("..."), "{t}");
    }
}
