//! Finding and loading the ONNX Runtime shared library, once per process.
//!
//! This module owns the process-wide ONNX Runtime environment. The library is
//! not linked at build time: it is the `libonnxruntime.so` that the
//! `onnxruntime` wheel installs into the repository's `.venv` (see
//! `scripts/setup.sh`), found by [`find_onnxruntime`] and loaded by
//! [`init_onnxruntime`]. Nobody has to set an environment variable: the
//! search starts from the running executable, then the repository this crate
//! was built from, then the current directory. `ORT_DYLIB_PATH` overrides it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use ort::environment::{Environment, GlobalThreadPoolOptions};

use crate::EngineError;

/// The environment variable that names the library explicitly.
///
/// # Examples
///
/// ```
/// use engine::{find_onnxruntime, ORT_DYLIB_ENV};
/// // Set, it names the library; unset, the venv of scripts/setup.sh is searched.
/// assert_eq!(ORT_DYLIB_ENV, "ORT_DYLIB_PATH");
/// let lib = find_onnxruntime()?;
/// assert!(lib.exists());
/// # Ok::<(), engine::EngineError>(())
/// ```
pub const ORT_DYLIB_ENV: &str = "ORT_DYLIB_PATH";

/// What was loaded.
///
/// # Examples
///
/// ```
/// let info = engine::init_onnxruntime(None)?;
/// println!("ONNX Runtime {} from {}", info.version, info.path.display());
/// assert_eq!(info.global_intra_threads, None);
/// # Ok::<(), engine::EngineError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrtRuntimeInfo {
    /// The shared library's path.
    pub path: PathBuf,
    /// ONNX Runtime's version, e.g. `1.31.1` (`unknown` if it could not be told).
    pub version: String,
    /// The size of the process-wide intra-op thread pool every session
    /// shares, or `None` when each session has its own pool (sized by
    /// [`OrtOptions`](crate::OrtOptions)).
    pub global_intra_threads: Option<usize>,
}

struct Runtime {
    env: Environment,
    info: OrtRuntimeInfo,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
/// Serialises initialisation; a failed attempt leaves `RUNTIME` empty so a
/// later call (say, after `scripts/setup.sh` ran) can try again.
static INIT: Mutex<()> = Mutex::new(());

/// The relative location, under a directory holding the venv, of the wheel's
/// library: `.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*`.
const VENV_PATTERN: &str = ".venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*";

/// Finds the ONNX Runtime shared library.
///
/// In order: the `ORT_DYLIB_PATH` environment variable if it is set (an error
/// if that file does not exist); else
/// `.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*`
/// under (a) the running executable's directory and each of its ancestors,
/// (b) the repository this crate was compiled in, (c) the current directory
/// and each of its ancestors. The error says what was searched and how to
/// fix it (run `scripts/setup.sh`, or set `ORT_DYLIB_PATH`).
///
/// # Examples
///
/// ```
/// let lib = engine::find_onnxruntime()?;
/// assert!(lib.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libonnxruntime.so")));
/// # Ok::<(), engine::EngineError>(())
/// ```
pub fn find_onnxruntime() -> Result<PathBuf, EngineError> {
    if let Some(p) = std::env::var_os(ORT_DYLIB_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(EngineError::Runtime(format!(
                "{ORT_DYLIB_ENV}={} does not name an existing file",
                path.display()
            )))
        };
    }
    let roots = search_roots();
    for root in &roots {
        if let Some(lib) = find_in_venv(root) {
            return Ok(lib);
        }
    }
    let searched: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(EngineError::Runtime(format!(
        "libonnxruntime.so not found: looked for {VENV_PATTERN} under {}. \
         Run scripts/setup.sh (it installs the onnxruntime wheel into .venv), \
         or set {ORT_DYLIB_ENV} to the library's path",
        searched.join(", ")
    )))
}

/// The directories [`find_onnxruntime`] looks in, in order, without repeats.
fn search_roots() -> Vec<PathBuf> {
    fn push(roots: &mut Vec<PathBuf>, dir: &Path) {
        if !roots.iter().any(|r| r == dir) {
            roots.push(dir.to_path_buf());
        }
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        let exe = exe.canonicalize().unwrap_or(exe);
        for dir in exe.parent().into_iter().flat_map(Path::ancestors) {
            push(&mut roots, dir);
        }
    }
    // The repository root, as seen when this crate was compiled.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..");
    push(&mut roots, &repo.canonicalize().unwrap_or(repo));
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            push(&mut roots, dir);
        }
    }
    roots
}

/// The wheel's library in `root/.venv`, if there is one. With several
/// candidates (several Pythons, several files) the choice is the first in
/// name order, so it is stable.
fn find_in_venv(root: &Path) -> Option<PathBuf> {
    let lib = root.join(".venv").join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| name_starts_with(&e.file_name(), "python3"))
        .map(|e| e.path())
        .collect();
    pythons.sort();
    for py in pythons {
        let capi = py.join("site-packages").join("onnxruntime").join("capi");
        let Ok(entries) = std::fs::read_dir(&capi) else {
            continue;
        };
        let mut libs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| name_starts_with(&e.file_name(), "libonnxruntime.so"))
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        libs.sort();
        if let Some(first) = libs.into_iter().next() {
            return Some(first);
        }
    }
    None
}

fn name_starts_with(name: &OsStr, prefix: &str) -> bool {
    name.to_str().is_some_and(|n| n.starts_with(prefix))
}

/// Loads ONNX Runtime and creates the process-wide environment, once.
///
/// `global_intra_threads`: `None` gives every session its own thread pool,
/// sized by its [`OrtOptions`](crate::OrtOptions) (the default, and what
/// [`OrtBackend::load`](crate::OrtBackend::load) does if nothing was
/// initialised first); `Some(n)` makes one pool of `n` intra-op threads that
/// every session shares, so many models on a small machine do not
/// oversubscribe its cores (the `OrtOptions` thread counts are then unused).
///
/// Idempotent and thread-safe: the first successful call decides; later
/// calls return the same [`OrtRuntimeInfo`] whatever they pass (look at its
/// `global_intra_threads` to see what is in force). A failed call changes
/// nothing, so it can be retried.
///
/// # Examples
///
/// ```
/// use engine::{init_onnxruntime, onnxruntime_info};
/// // One pool of two intra-op threads shared by every model of this process.
/// let info = init_onnxruntime(Some(2))?;
/// assert_eq!(info.global_intra_threads, Some(2));
/// // The first call decides.
/// assert_eq!(init_onnxruntime(None)?, info);
/// assert_eq!(onnxruntime_info(), Some(info));
/// # Ok::<(), engine::EngineError>(())
/// ```
pub fn init_onnxruntime(
    global_intra_threads: Option<usize>,
) -> Result<OrtRuntimeInfo, EngineError> {
    runtime(global_intra_threads).map(|r| r.info.clone())
}

/// What [`init_onnxruntime`] loaded, or `None` if nothing is loaded yet.
///
/// # Examples
///
/// ```
/// use engine::{onnxruntime_info, OrtBackend, OrtOptions};
/// assert_eq!(onnxruntime_info(), None); // nothing loaded yet
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
/// OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
/// assert!(onnxruntime_info().is_some());
/// # Ok::<(), engine::EngineError>(())
/// ```
pub fn onnxruntime_info() -> Option<OrtRuntimeInfo> {
    RUNTIME.get().map(|r| r.info.clone())
}

/// The process-wide environment, initialising it with per-session thread
/// pools if nothing did before.
pub(crate) fn environment() -> Result<&'static Environment, EngineError> {
    runtime(None).map(|r| &r.env)
}

fn runtime(global_intra_threads: Option<usize>) -> Result<&'static Runtime, EngineError> {
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let _guard = INIT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let path = find_onnxruntime()?;
    let rt_err = |what: &str, e: &dyn std::fmt::Display| {
        EngineError::Runtime(format!("{what} {}: {e}", path.display()))
    };
    let mut builder = ort::init_from(&path)
        .map_err(|e| rt_err("cannot load", &e))?
        .with_name("tensorwire")
        .with_telemetry(false);
    if let Some(n) = global_intra_threads {
        let pool = GlobalThreadPoolOptions::default()
            .with_intra_threads(n)
            .and_then(|p| p.with_inter_threads(1))
            .and_then(|p| p.with_thread_manager(crate::ort_threads::OrtThreads))
            .map_err(|e| rt_err("cannot configure a global thread pool for", &e))?;
        builder = builder.with_global_thread_pool(pool);
    }
    let env = builder
        .build()
        .map_err(|e| rt_err("cannot create an environment with", &e))?;
    let info = OrtRuntimeInfo {
        version: version_of(&path),
        path,
        global_intra_threads,
    };
    Ok(RUNTIME.get_or_init(|| Runtime { env, info }))
}

/// The loaded library's version. `ort` checks it (at least 1.31) but does not
/// expose it, so it is read from the build-info string (`git-branch=rel-1.31.1`)
/// or, failing that, from the file name (`libonnxruntime.so.1.31.1`).
fn version_of(path: &Path) -> String {
    version_from_build_info(ort::info())
        .or_else(|| version_from_file_name(path))
        .unwrap_or_else(|| "unknown".to_string())
}

fn version_from_build_info(info: &str) -> Option<String> {
    let rest = &info[info.find("git-branch=rel-")? + "git-branch=rel-".len()..];
    let v: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (!v.is_empty()).then_some(v)
}

fn version_from_file_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let v = name.strip_prefix("libonnxruntime.so.")?;
    (!v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.')).then(|| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(
            version_from_build_info("ORT Build Info: git-branch=rel-1.31.1, git-commit-id=abc")
                .as_deref(),
            Some("1.31.1")
        );
        assert_eq!(
            version_from_build_info("ORT Build Info: git-branch=main"),
            None
        );
        assert_eq!(
            version_from_file_name(Path::new("/x/libonnxruntime.so.1.31.1")).as_deref(),
            Some("1.31.1")
        );
        assert_eq!(
            version_from_file_name(Path::new("/x/libonnxruntime.so")),
            None
        );
    }

    #[test]
    fn venv_search_finds_the_wheel_layout() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(find_in_venv(dir.path()), None);
        let capi = dir
            .path()
            .join(".venv/lib/python3.11/site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).expect("mkdir");
        std::fs::write(capi.join("libonnxruntime_providers_shared.so"), b"").expect("write");
        assert_eq!(
            find_in_venv(dir.path()),
            None,
            "providers library is not the runtime"
        );
        std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"").expect("write");
        assert_eq!(
            find_in_venv(dir.path()),
            Some(capi.join("libonnxruntime.so.1.31.1"))
        );
    }

    #[test]
    fn search_roots_include_the_repository() {
        let roots = search_roots();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let repo = repo.canonicalize().unwrap_or(repo);
        assert!(roots.contains(&repo), "{roots:?}");
        // No repeats.
        for (i, r) in roots.iter().enumerate() {
            assert!(!roots[i + 1..].contains(r), "{r:?} twice");
        }
    }
}
