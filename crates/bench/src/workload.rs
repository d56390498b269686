//! What each request carries: the identity model with a tensor of a given
//! size (0 bytes = the empty RPC), or any served ONNX model with seeded
//! random inputs shaped by its signature, or with real inputs read from
//! NumPy `.npy` files (checked against the signature first, see
//! [`file_inputs`]).
//!
//! The inputs are made once per caller and re-sent on every request, as a
//! serving client would re-send a filled buffer: the benchmark measures the
//! trip, not the making of inputs.

use crate::caller::BenchError;
use std::path::{Path, PathBuf};
use wire::{AlignedBuf, DType, ModelSignature, TensorDesc};

/// The most tensor bytes one request may carry from `.npy` files, per file
/// and in total: the agent's default payload limit
/// (`wire::Limits::default().max_payload`, 256 MiB). A larger file is
/// refused before it is read.
pub const MAX_FILE_INPUT_BYTES: u64 = 256 << 20;

/// Room for a `.npy` file's own framing (magic, version, header length and
/// the header itself) on top of its data, when a file's size is checked
/// before reading it.
const NPY_FRAMING_MAX: u64 = 12 + npy::MAX_HEADER_LEN as u64;

/// The model a run calls, and how its inputs are made.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// The built-in identity model (outputs alias inputs) with one `u8`
    /// tensor of `bytes` bytes, or no tensor at all for 0.
    Identity {
        /// Tensor bytes per request.
        bytes: u64,
    },
    /// An ONNX model, served under `name`, with seeded random inputs from
    /// its signature (dynamic dimensions = 1), or with inputs read from
    /// `.npy` files when `files` is not empty.
    Model {
        /// The name it is served under (and shown in results).
        name: String,
        /// The ONNX file.
        path: PathBuf,
        /// The value of every dynamic dimension but the first (the batch,
        /// always 1) of seeded inputs: e.g. the sequence length of a text
        /// model. Unused when `files` is given: the files decide the shapes.
        dyn_dim: u64,
        /// Inputs from `.npy` files, `(input name, file)`; empty = seeded
        /// random inputs. When given, every input of the model needs exactly
        /// one file; see [`file_inputs`] for the checks.
        files: Vec<(String, PathBuf)>,
    },
}

/// One input tensor: dtype, shape, 64-byte aligned bytes.
pub type Input = (DType, Vec<u64>, AlignedBuf);

impl Workload {
    /// The model's name on the agent (`identity` for the identity model).
    pub fn model_name(&self) -> &str {
        match self {
            Workload::Identity { .. } => engine::IdentityBackend::NAME,
            Workload::Model { name, .. } => name,
        }
    }

    /// The model's name in results: `identity` or the served name.
    pub fn label(&self) -> String {
        self.model_name().to_string()
    }

    /// The ONNX file to load, if any.
    pub fn model_path(&self) -> Option<&std::path::Path> {
        match self {
            Workload::Identity { .. } => None,
            Workload::Model { path, .. } => Some(path),
        }
    }

    /// Loads the engine a server (or the in-process baseline) runs.
    pub fn load_backend(
        &self,
        intra_threads: usize,
    ) -> Result<std::sync::Arc<dyn engine::Backend>, BenchError> {
        match self {
            Workload::Identity { .. } => Ok(std::sync::Arc::new(engine::IdentityBackend::new())),
            Workload::Model { name, path, .. } => {
                let opts = engine::OrtOptions {
                    intra_threads,
                    ..engine::OrtOptions::default()
                };
                let b = engine::OrtBackend::load(name, path, &opts)
                    .map_err(|e| BenchError::new(format!("{}: {e}", path.display())))?;
                Ok(std::sync::Arc::new(b))
            }
        }
    }

    /// The inputs of one request for a model with signature `sig`.
    pub fn inputs(&self, sig: &ModelSignature) -> Result<Vec<Input>, BenchError> {
        match self {
            Workload::Identity { bytes } => identity_inputs(*bytes),
            Workload::Model { dyn_dim, files, .. } if files.is_empty() => {
                seeded_inputs(sig, *dyn_dim, 0x9e37_79b9_7f4a_7c15)
            }
            Workload::Model { files, .. } => file_inputs(sig, files, MAX_FILE_INPUT_BYTES),
        }
    }
}

/// Sum of the inputs' bytes.
pub fn tensor_bytes(inputs: &[Input]) -> u64 {
    inputs.iter().map(|(_, _, b)| b.len() as u64).sum()
}

/// One `u8` tensor of `bytes` bytes counting up, or none for 0.
pub fn identity_inputs(bytes: u64) -> Result<Vec<Input>, BenchError> {
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let len = usize::try_from(bytes).map_err(|_| BenchError::new("tensor size too large"))?;
    let mut data = AlignedBuf::zeroed(len).map_err(|e| BenchError::new(e.to_string()))?;
    for (i, b) in data.iter_mut().enumerate() {
        *b = i as u8;
    }
    Ok(vec![(DType::U8, vec![bytes], data)])
}

/// Seeded random inputs from `sig`: a dynamic first dimension (the batch)
/// is 1, other dynamic dimensions `dyn_dim`; floats in [-1, 1), integers 1
/// (a valid token id, and an attention mask that attends).
pub fn seeded_inputs(
    sig: &ModelSignature,
    dyn_dim: u64,
    mut seed: u64,
) -> Result<Vec<Input>, BenchError> {
    let mut out = Vec::with_capacity(sig.inputs.len());
    for spec in &sig.inputs {
        let shape: Vec<u64> = spec
            .shape
            .iter()
            .enumerate()
            .map(|(i, d)| d.unwrap_or(if i == 0 { 1 } else { dyn_dim.max(1) }))
            .collect();
        let len = TensorDesc::byte_len(spec.dtype, &shape)
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| BenchError::new(format!("input '{}' is too large", spec.name)))?;
        let mut data = AlignedBuf::zeroed(len).map_err(|e| BenchError::new(e.to_string()))?;
        if spec.dtype == DType::F32 {
            for c in data.chunks_exact_mut(4) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let v = (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                c.copy_from_slice(&v.to_le_bytes());
            }
        } else if spec.dtype == DType::I64 {
            for c in data.chunks_exact_mut(8) {
                c.copy_from_slice(&1i64.to_le_bytes());
            }
        } else if spec.dtype == DType::I32 {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&1i32.to_le_bytes());
            }
        }
        out.push((spec.dtype, shape, data));
    }
    Ok(out)
}

/// Inputs read from `.npy` files, `(input name, file)`, in the order of
/// `sig.inputs`, each checked against `sig` before it is used.
///
/// Refused, with an error naming the input and the file: a name given twice,
/// a name the model has no input for, an input of the model with no file
/// (every input needs one; all missing ones are named), a file larger than
/// `max_bytes` of data (checked from its size before it is read), a file
/// that is not a valid `.npy` file, a dtype other than the input's, a
/// different number of dimensions, a fixed dimension of another size
/// (dynamic dimensions take any size), and inputs that together exceed
/// `max_bytes`. The data stays in the 64-byte aligned buffer it was read
/// into.
pub fn file_inputs(
    sig: &ModelSignature,
    files: &[(String, PathBuf)],
    max_bytes: u64,
) -> Result<Vec<Input>, BenchError> {
    // Names first: nothing is read until every name is known to fit.
    for (i, (name, path)) in files.iter().enumerate() {
        if let Some((_, first)) = files[..i].iter().find(|(n, _)| n == name) {
            return Err(BenchError::new(format!(
                "input '{name}' is given twice ({} and {})",
                first.display(),
                path.display()
            )));
        }
        if !sig.inputs.iter().any(|s| &s.name == name) {
            return Err(BenchError::new(format!(
                "input '{name}' ({}): model '{}' has no input named '{name}'; its inputs: {}",
                path.display(),
                sig.name,
                describe_inputs(sig)
            )));
        }
    }
    // Then each input of the model with its file, in the model's order.
    let mut ordered = Vec::with_capacity(sig.inputs.len());
    let mut missing = Vec::new();
    for spec in &sig.inputs {
        match files.iter().find(|(n, _)| n == &spec.name) {
            Some((_, path)) => ordered.push((spec, path)),
            None => missing.push(format!("'{}' ({})", spec.name, spec.describe())),
        }
    }
    if !missing.is_empty() {
        return Err(BenchError::new(format!(
            "model '{}': no .npy file for input {}; once one input is read from a file, \
             every input needs one (NAME=FILE.npy)",
            sig.name,
            missing.join(", ")
        )));
    }

    let mut out = Vec::with_capacity(ordered.len());
    let mut total: u64 = 0;
    for (spec, path) in ordered {
        let fail = |why: String| {
            BenchError::new(format!("input '{}' ({}): {why}", spec.name, path.display()))
        };
        check_file_size(path, max_bytes).map_err(fail)?;
        let arr = npy::read_npy(path)
            .map_err(|e| BenchError::new(format!("input '{}': {e}", spec.name)))?;
        if arr.dtype != spec.dtype {
            return Err(fail(format!(
                "the model takes {}, the file holds {}{:?}",
                spec.describe(),
                arr.dtype,
                arr.shape
            )));
        }
        if arr.shape.len() != spec.shape.len() {
            return Err(fail(format!(
                "the model takes {} ({} dimensions), the file's shape {:?} has {}",
                spec.describe(),
                spec.shape.len(),
                arr.shape,
                arr.shape.len()
            )));
        }
        for (axis, (&got, want)) in arr.shape.iter().zip(&spec.shape).enumerate() {
            if let Some(want) = *want {
                if got != want {
                    return Err(fail(format!(
                        "the model takes {}: dimension {axis} must be {want}, \
                         the file's shape {:?} has {got}",
                        spec.describe(),
                        arr.shape
                    )));
                }
            }
        }
        let len = arr.data.len() as u64;
        if len > max_bytes {
            return Err(fail(format!(
                "{len} data bytes, more than the {max_bytes}-byte limit on a request's tensors"
            )));
        }
        total = total.saturating_add(len);
        if total > max_bytes {
            return Err(fail(format!(
                "the inputs together take {total} bytes or more, more than the \
                 {max_bytes}-byte limit on a request's tensors"
            )));
        }
        out.push((arr.dtype, arr.shape, arr.data));
    }
    Ok(out)
}

/// Refuses a regular file too large to hold at most `max_bytes` of data,
/// before it is read (pipes and other streams are checked after reading).
fn check_file_size(path: &Path, max_bytes: u64) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.is_file() && meta.len() > max_bytes.saturating_add(NPY_FRAMING_MAX) {
        return Err(format!(
            "the file is {} bytes: its data would exceed the {max_bytes}-byte limit \
             on a request's tensors",
            meta.len()
        ));
    }
    Ok(())
}

/// `x float32[?, 1, 8, 8], mask int64[?, ?]`, or `none`.
fn describe_inputs(sig: &ModelSignature) -> String {
    if sig.inputs.is_empty() {
        return "none".to_string();
    }
    sig.inputs
        .iter()
        .map(|s| format!("{} {}", s.name, s.describe()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a size such as `0`, `588K`, `1M`, `64MiB`, `4096` (K/M/G are
/// powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, BenchError> {
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &t[digits.len()..];
    let n: u64 = digits
        .parse()
        .map_err(|_| BenchError::new(format!("'{s}' is not a size (e.g. 0, 1024, 588K, 16M)")))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => {
            return Err(BenchError::new(format!(
                "'{s}': unknown size unit '{unit}'"
            )))
        }
    };
    n.checked_mul(mult)
        .filter(|&v| v <= 1 << 32)
        .ok_or_else(|| BenchError::new(format!("'{s}' is too large (at most 4 GiB)")))
}

/// Formats a byte count compactly (`0`, `1K`, `588K`, `16M`).
pub fn format_size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("588K"), Ok(588 << 10));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999G").is_err());
        assert_eq!(format_size(588 << 10), "588K");
        assert_eq!(format_size(1000), "1000");
    }

    /// A model taking `x: float32[?, 2, 3]` and `ids: int64[?, ?]`.
    fn sig() -> ModelSignature {
        ModelSignature {
            name: "m".into(),
            inputs: vec![
                wire::TensorSpec {
                    name: "x".into(),
                    dtype: DType::F32,
                    shape: vec![None, Some(2), Some(3)],
                },
                wire::TensorSpec {
                    name: "ids".into(),
                    dtype: DType::I64,
                    shape: vec![None, None],
                },
            ],
            outputs: Vec::new(),
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Writes `name` in `dir` holding `dtype` zeros (or `data`) of `shape`.
    fn npy_file(
        dir: &tempfile::TempDir,
        name: &str,
        dtype: DType,
        shape: &[u64],
        data: Option<&[u8]>,
    ) -> PathBuf {
        let p = dir.path().join(name);
        let n = TensorDesc::byte_len(dtype, shape).expect("size") as usize;
        let zeros = vec![0u8; n];
        npy::write_npy(&p, dtype, shape, data.unwrap_or(&zeros)).expect("write .npy");
        p
    }

    /// Good files for both inputs: x f32[4, 2, 3] counting up, ids i64[1, 5].
    fn good_files(dir: &tempfile::TempDir) -> (PathBuf, PathBuf, Vec<u8>, Vec<u8>) {
        let xs: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
        let x_bytes = f32_bytes(&xs);
        let ids_bytes: Vec<u8> = [7i64, 8, 9, 10, 11]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let x = npy_file(dir, "x.npy", DType::F32, &[4, 2, 3], Some(&x_bytes));
        let ids = npy_file(dir, "ids.npy", DType::I64, &[1, 5], Some(&ids_bytes));
        (x, ids, x_bytes, ids_bytes)
    }

    fn files(pairs: &[(&str, &Path)]) -> Vec<(String, PathBuf)> {
        pairs
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_path_buf()))
            .collect()
    }

    /// The error for `pairs` against [`sig`], checked to name `needles`.
    fn refused(pairs: &[(&str, &Path)], max: u64, needles: &[&str]) -> String {
        let e = file_inputs(&sig(), &files(pairs), max).expect_err("must be refused");
        for n in needles {
            assert!(e.0.contains(n), "expected '{n}' in: {e}");
        }
        e.0
    }

    #[test]
    fn file_inputs_are_read_in_signature_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (x, ids, x_bytes, ids_bytes) = good_files(&dir);
        // Given in the other order: returned in the model's.
        let w = Workload::Model {
            name: "m".into(),
            path: PathBuf::from("m.onnx"),
            dyn_dim: 7,
            files: files(&[("ids", &ids), ("x", &x)]),
        };
        let got = w.inputs(&sig()).expect("accepted");
        assert_eq!(got.len(), 2);
        let (dtype, shape, data) = &got[0];
        assert_eq!((*dtype, shape.as_slice()), (DType::F32, &[4u64, 2, 3][..]));
        assert_eq!(&data[..], &x_bytes[..]);
        assert_eq!(data.as_ptr() as usize % 64, 0, "64-byte aligned");
        let (dtype, shape, data) = &got[1];
        assert_eq!((*dtype, shape.as_slice()), (DType::I64, &[1u64, 5][..]));
        assert_eq!(&data[..], &ids_bytes[..]);
        assert_eq!(data.as_ptr() as usize % 64, 0, "64-byte aligned");
        assert_eq!(tensor_bytes(&got), 96 + 40);
    }

    #[test]
    fn no_files_means_seeded_inputs() {
        let w = Workload::Model {
            name: "m".into(),
            path: PathBuf::from("m.onnx"),
            dyn_dim: 7,
            files: Vec::new(),
        };
        let got = w.inputs(&sig()).expect("seeded");
        assert_eq!(got[0].1, vec![1, 2, 3]);
        assert_eq!(got[1].1, vec![1, 7]);
    }

    #[test]
    fn file_inputs_refuse_wrong_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (x, ids, _, _) = good_files(&dir);
        let max = MAX_FILE_INPUT_BYTES;
        refused(
            &[("x", &x), ("ids", &ids), ("mask", &ids)],
            max,
            &["'mask'", "ids.npy", "no input named", "x float32[?, 2, 3]"],
        );
        refused(
            &[("x", &x), ("ids", &ids), ("x", &ids)],
            max,
            &["'x' is given twice", "x.npy", "ids.npy"],
        );
        refused(
            &[("x", &x)],
            max,
            &["no .npy file for input 'ids'", "int64[?, ?]"],
        );
        let e = refused(&[], max, &["'x'", "'ids'"]);
        assert!(e.contains("no .npy file"), "{e}");
        // Names are checked before anything is read.
        let nowhere = dir.path().join("nowhere.npy");
        refused(&[("x", &nowhere), ("y", &ids)], max, &["'y'"]);
    }

    #[test]
    fn file_inputs_refuse_wrong_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (x, ids, _, _) = good_files(&dir);
        let max = MAX_FILE_INPUT_BYTES;
        let cases: Vec<(PathBuf, Vec<&str>)> = vec![
            (
                npy_file(&dir, "f64.npy", DType::F64, &[1, 2, 3], None),
                vec!["float64", "float32[?, 2, 3]"],
            ),
            (
                npy_file(&dir, "rank.npy", DType::F32, &[6], None),
                vec!["3 dimensions", "[6] has 1"],
            ),
            (
                npy_file(&dir, "dim.npy", DType::F32, &[1, 3, 3], None),
                vec!["dimension 1 must be 2", "[1, 3, 3] has 3"],
            ),
            (dir.path().join("absent.npy"), vec!["absent.npy"]),
        ];
        for (file, needles) in cases {
            let name = file.file_name().and_then(|n| n.to_str()).expect("name");
            let mut n = needles.clone();
            n.extend(["input 'x'", name]);
            refused(&[("x", &file), ("ids", &ids)], max, &n);
        }
        let junk = dir.path().join("junk.npy");
        std::fs::write(&junk, b"not a npy file").expect("write");
        refused(
            &[("x", &x), ("ids", &junk)],
            max,
            &["input 'ids'", "junk.npy", "invalid .npy"],
        );
        // Dynamic dimensions take any size.
        let wide = npy_file(&dir, "wide.npy", DType::I64, &[3, 1000], None);
        let got = file_inputs(&sig(), &files(&[("x", &x), ("ids", &wide)]), max).expect("ok");
        assert_eq!(got[1].1, vec![3, 1000]);
    }

    #[test]
    fn file_inputs_refuse_over_large_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (x, ids, _, _) = good_files(&dir);
        // Refused from its size alone, before reading: 80 KiB of data
        // cannot fit a 1 KiB limit whatever its header.
        let big = npy_file(&dir, "big.npy", DType::I64, &[1, 10 << 10], None);
        refused(
            &[("x", &x), ("ids", &big)],
            1024,
            &["input 'ids'", "big.npy", "1024-byte limit"],
        );
        // x holds 96 bytes of data, ids 40: each fits 100, both do not.
        refused(
            &[("x", &x), ("ids", &ids)],
            64,
            &["input 'x'", "x.npy", "96 data bytes", "64-byte limit"],
        );
        refused(
            &[("x", &x), ("ids", &ids)],
            100,
            &["input 'ids'", "together take 136", "100-byte limit"],
        );
        assert!(file_inputs(&sig(), &files(&[("x", &x), ("ids", &ids)]), 136).is_ok());
        assert_eq!(
            MAX_FILE_INPUT_BYTES,
            wire::Limits::default().max_payload,
            "the agent's default payload limit"
        );
    }

    #[test]
    fn identity_inputs_have_the_asked_size() {
        assert!(identity_inputs(0).expect("empty").is_empty());
        let i = identity_inputs(1000).expect("1000");
        assert_eq!(tensor_bytes(&i), 1000);
        assert_eq!(i[0].1, vec![1000]);
    }
}
