//! `fuzz <target> --iterations N [--seed S] [--corpus DIR]`, `fuzz <target> --write-corpus`,
//! `fuzz <target> --replay FILE...`: see the crate docs. Targets: `server-request`,
//! `client-reply`, `all`. Exits non-zero on any panic or allocation over its bound.

use std::path::PathBuf;
use std::process::ExitCode;

use hoardfs_fuzz::{Options, TARGETS, Target, alloc};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

const USAGE: &str = "usage: fuzz <server-request|client-reply|all> \
    [--iterations N] [--seed S] [--corpus DIR] | --write-corpus | --replay FILE...";

struct Args {
    targets: Vec<Target>,
    iterations: u64,
    seed: u64,
    corpus: Option<PathBuf>,
    write_corpus: bool,
    replay: Vec<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let target = it.next().ok_or(USAGE)?;
    let targets = match target.as_str() {
        "all" => TARGETS.to_vec(),
        t => vec![Target::from_name(t).ok_or_else(|| format!("unknown target {t:?}; {USAGE}"))?],
    };
    let mut a = Args {
        targets,
        iterations: 100_000,
        seed: 1,
        corpus: None,
        write_corpus: false,
        replay: Vec::new(),
    };
    let num = |v: Option<String>, what: &str| -> Result<u64, String> {
        let v = v.ok_or(format!("{what} needs a value"))?;
        v.replace('_', "")
            .parse()
            .map_err(|e| format!("{what} {v:?}: {e}"))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--iterations" | "-n" => a.iterations = num(it.next(), "--iterations")?,
            "--seed" => a.seed = num(it.next(), "--seed")?,
            "--corpus" => a.corpus = Some(it.next().ok_or("--corpus needs a directory")?.into()),
            "--write-corpus" => a.write_corpus = true,
            "--replay" => a.replay.extend(it.by_ref().map(PathBuf::from)),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fuzz: {e}");
            return ExitCode::from(2);
        }
    };
    if !alloc::installed() {
        eprintln!("fuzz: the counting allocator is not in use: allocations are not measured");
    }
    hoardfs_fuzz::quiet_panics();
    let mut failed = false;
    for target in args.targets {
        let dir = args
            .corpus
            .clone()
            .unwrap_or_else(|| hoardfs_fuzz::corpus_dir(target));
        if args.write_corpus {
            match hoardfs_fuzz::write_corpus(target, &dir) {
                Ok(n) => println!("{}: wrote {n} files to {}", target.name(), dir.display()),
                Err(e) => {
                    eprintln!("fuzz: {}: {e}", dir.display());
                    failed = true;
                }
            }
            continue;
        }
        if !args.replay.is_empty() {
            for f in &args.replay {
                let bytes = match std::fs::read(f) {
                    Ok(b) => b,
                    Err(e) => {
                        eprintln!("fuzz: {}: {e}", f.display());
                        failed = true;
                        continue;
                    }
                };
                match hoardfs_fuzz::run_one(target, &bytes) {
                    Ok(o) => println!("{}: {}: {o:?}", target.name(), f.display()),
                    Err(msg) => {
                        println!("{}: {}: PANIC {msg}", target.name(), f.display());
                        failed = true;
                    }
                }
            }
            continue;
        }
        let corpus = match hoardfs_fuzz::load_corpus(&dir) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("fuzz: corpus {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        };
        let opts = Options {
            iterations: args.iterations,
            seed: args.seed,
            corpus,
            keep: 5,
        };
        let r = hoardfs_fuzz::fuzz(target, &opts);
        let secs = r.elapsed.as_secs_f64();
        println!(
            "{}: {} inputs, {} panics, {} over the allocation bound; {} decoded, {} accepted; \
             largest allocation {} bytes; {:.1} s ({:.0} inputs/s, seed {}, {} corpus files)",
            target.name(),
            r.inputs,
            r.panics,
            r.over_bound,
            r.decoded,
            r.accepted,
            r.max_alloc,
            secs,
            r.inputs as f64 / secs.max(1e-9),
            args.seed,
            opts.corpus.len(),
        );
        for (why, input) in &r.failures {
            println!("  {why}\n  input ({} bytes): {}", input.len(), hex(input));
        }
        failed |= r.panics > 0 || r.over_bound > 0;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().take(512).map(|x| format!("{x:02x}")).collect()
}
