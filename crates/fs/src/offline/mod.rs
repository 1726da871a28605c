//! Disconnected operation (`--offline-writes`): the changes made while the origin is
//! unreachable, kept in a log in the cache directory and sent back once it answers.
//!
//! - the log and its state, below the superblock: [`state`] (`OfflineWrites`: the log of
//!   one mount and what the file system asks of it), [`cml`] (the client modify log: a
//!   `Pending` change per object, its durable [`cml::record`] and staging file), [`made`]
//!   (ids and attributes of objects made offline), [`log_view`] (a restored namespace
//!   made to agree with the log);
//! - the changes themselves, above it: [`staged`] (a file's content change) and [`names`]
//!   (changes to names and attributes);
//! - [`reintegrate`]: sending the changes back (the scheduler, each change's steps, the
//!   uploads and the names of conflict copies).
//!
//! Imports: the files below the superblock never import it (nor anything above it), and
//! files here import each other by path (`super::state::…`), not through this module, so
//! that the crate's modules form no circle through it.

pub(crate) mod cml;
pub(crate) mod log_view;
pub(crate) mod made;
pub(crate) mod names;
pub(crate) mod reintegrate;
pub(crate) mod staged;
pub(crate) mod state;
