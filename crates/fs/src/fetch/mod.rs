//! Misses into the disk cache: fetching chunks from the origin, one fetch per chunk
//! however many readers want it, and readahead for sequential readers on a small pool of
//! threads. [`fetcher`] is the machinery the superblock owns (the in-flight table, the
//! readahead window and queue, the threads), knowing nothing of the superblock; [`fill`]
//! is the fetch itself over a borrowed superblock (origin I/O, and the write into the
//! cached object), readahead's jobs and whole-file prefetches. The superblock starts the
//! threads with a closure over a `Weak` of itself (`Superblock::new`). [`siblings`]
//! follows readers walking a directory in listing order and fetches the next files whole,
//! many at once.

pub(crate) mod fetcher;
mod fill;
pub(crate) mod siblings;

pub(crate) use fetcher::View;
