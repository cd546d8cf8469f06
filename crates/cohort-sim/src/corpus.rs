//! The fuzz corpus as test data: `fuzz/corpus/<target>/` holds the inputs libFuzzer starts
//! from (seeds built from real flights, records and datagrams, plus what the long runs found
//! and kept). Each protocol crate's `tests/fuzz_harness.rs` replays its targets' corpus
//! through the same harness function the fuzz target calls, so every input that ever
//! mattered to the fuzzer runs again in every `cargo test`, and writes the seeds when asked
//! (`scripts/fuzz-corpus.sh`).
//!
//! Owns only file access to `fuzz/`; what an input means is the harness's business.

use std::fs;
use std::path::{Path, PathBuf};

/// Named seeds of one target: `(name, input)`.
pub type Seeds = Vec<(String, Vec<u8>)>;

/// The workspace's `fuzz/` directory.
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// `fuzz/corpus/<target>`.
pub fn corpus_dir(target: &str) -> PathBuf {
    fuzz_dir().join("corpus").join(target)
}

/// Every fuzz target, from the file names in `fuzz/fuzz_targets/`, sorted.
pub fn targets() -> Vec<String> {
    read_dir_sorted(&fuzz_dir().join("fuzz_targets"))
        .into_iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect()
}

fn read_dir_sorted(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) => panic!("cannot read {}: {e}", dir.display()),
    };
    out.sort();
    out
}

/// Runs `harness` on every input in `fuzz/corpus/<target>/` and returns how many there
/// were. Panics (naming the file) if the target has no fuzz target file, if its corpus is
/// missing or empty, or if the harness panics on an input: a replayed finding fails the
/// test as it failed the fuzzer.
pub fn replay(target: &str, harness: impl Fn(&[u8])) -> usize {
    let source = fuzz_dir().join("fuzz_targets").join(format!("{target}.rs"));
    assert!(source.is_file(), "no fuzz target {}", source.display());
    let dir = corpus_dir(target);
    let files: Vec<PathBuf> = read_dir_sorted(&dir)
        .into_iter()
        .filter(|p| p.is_file())
        .collect();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    for file in &files {
        let data = fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| harness(&data)));
        if let Err(panic) = outcome {
            eprintln!("fuzz corpus input {} failed", file.display());
            std::panic::resume_unwind(panic);
        }
    }
    files.len()
}

/// Writes `seeds` into `fuzz/corpus/<target>/`, each as `seed-<name>` (characters other
/// than ASCII letters, digits, `-` and `_` become `_`), replacing older seeds of that name;
/// the other inputs there (the fuzzer's) are left alone.
pub fn write_seeds(target: &str, seeds: &[(String, Vec<u8>)]) {
    let dir = corpus_dir(target);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for (name, data) in seeds {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("seed-{safe}"));
        fs::write(&path, data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// `name-<i>` (two digits at least) for each of `inputs`, in order.
pub fn numbered(name: &str, inputs: impl IntoIterator<Item = Vec<u8>>) -> Seeds {
    inputs
        .into_iter()
        .enumerate()
        .map(|(i, d)| (format!("{name}-{i:02}"), d))
        .collect()
}

/// What every crate's `fuzz_corpus_replays` test does for one target: the seeds run through
/// `harness` (a seed that stopped being valid fails here, not silently in the fuzzer); with
/// `COHORT_WRITE_CORPUS=1` they are written into the corpus; then the whole corpus is
/// replayed ([`replay`]). Returns how many corpus inputs ran.
pub fn check(target: &str, harness: impl Fn(&[u8]), seeds: &Seeds) -> usize {
    assert!(!seeds.is_empty(), "{target}: no seeds");
    for (name, data) in seeds {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| harness(data)));
        if let Err(panic) = outcome {
            eprintln!("seed {name} of {target} failed");
            std::panic::resume_unwind(panic);
        }
    }
    if writing() {
        write_seeds(target, seeds);
    }
    let n = replay(target, harness);
    eprintln!("{target}: {n} corpus inputs");
    n
}

/// Whether this run should write seeds: `COHORT_WRITE_CORPUS=1` (set by
/// `scripts/fuzz-corpus.sh`).
pub fn writing() -> bool {
    std::env::var_os("COHORT_WRITE_CORPUS").is_some_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fuzz_target_has_a_corpus() {
        let targets = targets();
        assert!(targets.len() >= 20, "found {} fuzz targets", targets.len());
        for t in &targets {
            let dir = corpus_dir(t);
            assert!(
                read_dir_sorted(&dir).iter().any(|p| p.is_file()),
                "{} has no inputs",
                dir.display()
            );
        }
    }

    #[test]
    fn replay_reports_a_failing_input() {
        let target = targets().into_iter().next().unwrap_or_default();
        let r = std::panic::catch_unwind(|| replay(&target, |_| panic!("finding")));
        assert!(r.is_err());
        assert!(replay(&target, |_| {}) >= 1);
    }
}
