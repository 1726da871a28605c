//! A short fuzz run of every target with allocations measured, and the seed corpus: each
//! file decodes and passes the checks.

use hoardfs_fuzz::{Options, TARGETS, alloc};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

#[test]
fn corpus_is_valid_and_a_short_run_finds_nothing() {
    assert!(alloc::installed());
    hoardfs_fuzz::quiet_panics();
    for target in TARGETS {
        let corpus = hoardfs_fuzz::load_corpus(&hoardfs_fuzz::corpus_dir(target)).unwrap();
        assert!(
            corpus.len() >= 20,
            "{}: {} files",
            target.name(),
            corpus.len()
        );
        for input in &corpus {
            let o = hoardfs_fuzz::run_one(target, input).unwrap();
            assert!(
                o.decoded && o.accepted && !o.over_bound,
                "{}: {o:?}",
                target.name()
            );
        }
        let opts = Options {
            iterations: 20_000,
            seed: 7,
            corpus,
            keep: 3,
        };
        let r = hoardfs_fuzz::fuzz(target, &opts);
        assert_eq!(r.inputs, 20_000);
        assert!(
            r.panics == 0 && r.over_bound == 0,
            "{}: {} panics, {} over the allocation bound: {:?}",
            target.name(),
            r.panics,
            r.over_bound,
            r.failures
        );
        // The inputs reach past the decoder, and not all of them do.
        assert!(r.accepted > 1000 && r.decoded < r.inputs, "{r:?}");
    }
}
