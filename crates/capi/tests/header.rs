//! `include/tensorwire.h` is what cbindgen generates from this crate now:
//! the committed header cannot go stale. With `TENSORWIRE_BLESS_HEADER=1`
//! the test writes the new header instead of failing.

use std::path::Path;

#[test]
fn committed_header_matches_cbindgen() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("crates/capi/cbindgen.toml: {e}"));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed: {e}"));
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = dir.join("include/tensorwire.h");
    let committed = std::fs::read(&path).unwrap_or_default();
    if committed == generated {
        return;
    }
    if std::env::var_os("TENSORWIRE_BLESS_HEADER").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let first = committed
        .split(|&b| b == b'\n')
        .zip(generated.split(|&b| b == b'\n'))
        .position(|(a, b)| a != b)
        .map_or_else(
            || "one is a prefix of the other".to_string(),
            |i| format!("first difference on line {}", i + 1),
        );
    panic!(
        "{} is stale ({first}): regenerate it with\n  \
         TENSORWIRE_BLESS_HEADER=1 cargo test -p tensorwire-capi --test header\n\
         and commit it",
        path.display()
    );
}
