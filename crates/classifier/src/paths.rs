//! Where the classifier's files are: the defaults built by
//! `scripts/setup.sh`, found from anywhere in a checkout.
//!
//! A relative path is looked up in the current directory first and, if it
//! is not there, under the repository root recorded when this crate was
//! compiled (`CARGO_MANIFEST_DIR/../..`), so `tensorwire classify` works from
//! any directory of the checkout it was built from.

use std::path::{Path, PathBuf};

/// The default model, relative to the repository root.
pub const DEFAULT_MODEL: &str = "models/build/tweet_classifier.onnx";
/// The default tokenizer, relative to the repository root.
pub const DEFAULT_TOKENIZER: &str = "models/build/minilm_tokenizer.json";
/// The sample input, relative to the repository root.
pub const SAMPLE_TWEETS: &str = "examples/classifier/tweets.txt";
/// Python `tokenizers` output for [`SAMPLE_TWEETS`], relative to the
/// repository root.
pub const SAMPLE_TOKENS: &str = "examples/classifier/tweets.tokens.json";
/// What to run when a file `scripts/setup.sh` builds is missing.
pub const SETUP_HINT: &str = "run `bash scripts/setup.sh` to build it";

/// The repository root this crate was compiled in.
pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// `path` as given when it is absolute or exists relative to the current
/// directory; else the same relative path under [`repo_root`] if that
/// exists; else `path` as given (so an error names what the user typed).
pub fn resolve(path: &Path) -> PathBuf {
    if path.is_absolute() || path.exists() {
        return path.to_path_buf();
    }
    let in_repo = repo_root().join(path);
    if in_repo.exists() {
        in_repo
    } else {
        path.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_against_the_repository() {
        // Cargo.toml exists at the root; tests run in the crate directory.
        let p = resolve(Path::new("crates/classifier/Cargo.toml"));
        assert!(p.is_file(), "{}", p.display());
        let missing = Path::new("no/such/file.onnx");
        assert_eq!(resolve(missing), missing);
        let abs = Path::new("/no/such/abs.onnx");
        assert_eq!(resolve(abs), abs);
        assert!(repo_root().join("Cargo.toml").is_file());
    }
}
