//! Replays the committed corpora of the `agent_session` and `shm_ring`
//! fuzz targets (`fuzz/corpus/<target>/`) through the same entry points the
//! fuzzer calls (`server::fuzzing`), in a plain `cargo test`: every input
//! the campaigns kept, and every crash they found (fixed), must run with
//! all the targets' assertions holding.

use std::path::PathBuf;

/// Every file of `fuzz/corpus/<target>/`, by name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files = Vec::new();
    for entry in
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
    {
        let path = entry.expect("directory entry").path();
        if path.is_file() {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            files.push((name, std::fs::read(&path).expect("corpus file")));
        }
    }
    files.sort();
    files
}

/// Runs `run` on every input of `target`'s corpus, naming the one that
/// fails.
fn replay(target: &str, min_files: usize, run: fn(&[u8])) {
    let files = corpus(target);
    assert!(
        files.len() >= min_files,
        "fuzz/corpus/{target} has {} files, expected at least {min_files}",
        files.len()
    );
    for (name, bytes) in &files {
        let outcome = std::panic::catch_unwind(|| run(bytes));
        assert!(outcome.is_ok(), "{target} input {name} failed");
    }
}

#[test]
fn agent_session_corpus_replays() {
    replay("agent_session", 20, server::fuzzing::agent_session);
}

#[test]
fn shm_ring_corpus_replays() {
    replay("shm_ring", 20, server::fuzzing::shm_ring);
}
