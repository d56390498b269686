//! What each request carries: the identity model with a tensor of a given
//! size (0 bytes = the empty RPC), or any served ONNX model with seeded
//! random inputs shaped by its signature.
//!
//! The inputs are made once per caller and re-sent on every request, as a
//! serving client would re-send a filled buffer: the benchmark measures the
//! trip, not the making of inputs.

use crate::caller::BenchError;
use std::path::PathBuf;
use wire::{AlignedBuf, DType, ModelSignature, TensorDesc};

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
    /// its signature (dynamic dimensions = 1).
    Model {
        /// The name it is served under (and shown in results).
        name: String,
        /// The ONNX file.
        path: PathBuf,
        /// The value of every dynamic dimension but the first (the batch,
        /// always 1): e.g. the sequence length of a text model.
        dyn_dim: u64,
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
            Workload::Model { dyn_dim, .. } => seeded_inputs(sig, *dyn_dim, 0x9e37_79b9_7f4a_7c15),
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

    #[test]
    fn identity_inputs_have_the_asked_size() {
        assert!(identity_inputs(0).expect("empty").is_empty());
        let i = identity_inputs(1000).expect("1000");
        assert_eq!(tensor_bytes(&i), 1000);
        assert_eq!(i[0].1, vec![1000]);
    }
}
