//! Units of the server's memory budgets: requests, replies and callback sets are charged
//! in [`UNIT`]s, to their connection's budget and to the server's (`crate::admission`,
//! `crate::callbacks`).

/// Granularity of the memory budgets.
pub(crate) const UNIT: usize = 64 << 10;

/// Units a request's data costs (at least one, so that every reply in the queue counts).
pub(crate) fn units_for(bytes: usize) -> u32 {
    bytes.div_ceil(UNIT).max(1) as u32
}
