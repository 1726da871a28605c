//! Conflicts recorded by reintegration: one JSON object per line in `cml/conflicts`.

use serde::{Deserialize, Serialize};

/// One conflict, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// When (seconds since the epoch).
    pub at: u64,
    /// The path whose change conflicted.
    pub path: String,
    /// Where this client's version was put instead.
    pub copy: String,
    /// Why.
    pub reason: String,
}

/// A conflict as one JSON line.
pub(super) fn conflict_line(c: &Conflict) -> String {
    let mut line = serde_json::to_string(c).expect("a conflict serialises");
    line.push('\n');
    line
}

/// Parses a line written by [`conflict_line`].
pub(super) fn parse_conflict(line: &str) -> Option<Conflict> {
    serde_json::from_str(line).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_round_trip_with_awkward_names() {
        let c = Conflict {
            at: 5,
            path: "/d/we\"ird\\name\n".into(),
            copy: "/d/x.conflict-h-1".into(),
            reason: "changed on the server".into(),
        };
        let line = conflict_line(&c);
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(parse_conflict(line.trim_end()), Some(c));
    }
}
