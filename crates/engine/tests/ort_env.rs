//! `ORT_DYLIB_PATH` overrides the search. This is its own test binary (its
//! own process) with a single test, because it changes the environment.

use engine::{find_onnxruntime, EngineError, OrtBackend, OrtOptions, ORT_DYLIB_ENV};

#[test]
fn ort_dylib_path_overrides_the_search() {
    std::env::remove_var(ORT_DYLIB_ENV);
    let found = find_onnxruntime().unwrap_or_else(|e| {
        panic!("{e}\n(run scripts/setup.sh: it installs ONNX Runtime into .venv)")
    });

    // A path that does not exist is an error naming it, not a fallback to the search.
    std::env::set_var(ORT_DYLIB_ENV, "/nonexistent/libonnxruntime.so");
    match find_onnxruntime() {
        Err(EngineError::Runtime(m)) => {
            assert!(m.contains("/nonexistent/libonnxruntime.so"), "{m}")
        }
        other => panic!("expected Runtime error, got {other:?}"),
    }
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/build/digits_mlp.onnx");
    if model.is_file() {
        assert!(matches!(
            OrtBackend::load("digits", &model, &OrtOptions::default()),
            Err(EngineError::Runtime(_))
        ));
    }

    // An empty value counts as unset.
    std::env::set_var(ORT_DYLIB_ENV, "");
    assert_eq!(find_onnxruntime().expect("search"), found);

    std::env::set_var(ORT_DYLIB_ENV, &found);
    assert_eq!(find_onnxruntime().expect("explicit path"), found);
    std::env::remove_var(ORT_DYLIB_ENV);
}
