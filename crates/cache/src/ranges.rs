//! A small set of disjoint, sorted byte ranges (`[start, end)`), for the bytes of absent
//! chunks that a write through this client has already put into a data file.

/// Disjoint, sorted, non-adjacent half-open ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet(Vec<(u64, u64)>);

impl RangeSet {
    /// Adds `[a, b)`, merging with overlapping or touching ranges.
    pub fn insert(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let (mut a, mut b) = (a, b);
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(x, y) in &self.0 {
            if y < a || x > b {
                out.push((x, y));
            } else {
                a = a.min(x);
                b = b.max(y);
            }
        }
        out.push((a, b));
        out.sort_unstable();
        self.0 = out;
    }

    /// Removes `[a, b)`.
    pub fn remove(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(x, y) in &self.0 {
            if y <= a || x >= b {
                out.push((x, y));
                continue;
            }
            if x < a {
                out.push((x, a));
            }
            if y > b {
                out.push((b, y));
            }
        }
        self.0 = out;
    }

    /// Whether every byte of `[a, b)` is in the set.
    pub fn covers(&self, a: u64, b: u64) -> bool {
        a >= b || self.0.iter().any(|&(x, y)| x <= a && b <= y)
    }

    /// Drops everything at or beyond `end`.
    pub fn clip(&mut self, end: u64) {
        self.remove(end, u64::MAX);
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::RangeSet;

    #[test]
    fn insert_merges_and_remove_splits() {
        let mut r = RangeSet::default();
        r.insert(10, 20);
        r.insert(30, 40);
        assert!(!r.covers(10, 40));
        r.insert(20, 30);
        assert!(r.covers(10, 40));
        r.remove(15, 35);
        assert!(r.covers(10, 15) && r.covers(35, 40));
        assert!(!r.covers(14, 16) && !r.covers(34, 36));
        r.clip(12);
        assert_eq!(r, {
            let mut e = RangeSet::default();
            e.insert(10, 12);
            e
        });
        r.remove(0, 100);
        assert!(r.is_empty() && r.covers(5, 5));
    }
}
