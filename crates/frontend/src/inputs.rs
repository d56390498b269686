//! A `ModelInferRequest`'s input tensors, checked from the wire and
//! gathered into bytes the agent can run on: datatype, shape, byte count,
//! raw or typed contents (never both) or a place in a registered
//! shared-memory region (`shared_memory_*` parameters, whose byte size must
//! be the tensor's), the agent's payload limit, and the names against the
//! model's signature. Every refusal names the input.

use crate::datatype::{dtype_from_kserve, SUPPORTED};
use crate::proto::model_infer_request::InferInputTensor;
use crate::proto::InferTensorContents;
use crate::sysshm::{shm_ref, ShmRef};
use bytes::Bytes;
use tonic::Status;
use wire::{DType, ModelSignature, MAX_DIMS};

/// One input, checked: `data` holds exactly `product(shape) × dtype.size()`
/// little-endian bytes (once leased, for an input in shared memory).
#[derive(Debug)]
pub(crate) struct Input {
    /// The name the client gave it.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its dimensions.
    pub shape: Vec<u64>,
    /// Its bytes (the request's own buffer for raw contents, the region's
    /// memory for an input in shared memory: no copy). Empty for an input
    /// in shared memory until its region is leased.
    pub data: Bytes,
    /// Where it lies in a registered shared-memory region, if it does.
    pub shm: Option<ShmRef>,
}

/// Checks and gathers the inputs of a request (`raw` its
/// `raw_input_contents`, one per input not in shared memory, in order),
/// refusing any whose bytes would take the total over `max_payload`.
pub(crate) fn gather(
    tensors: Vec<InferInputTensor>,
    raw: Vec<Bytes>,
    max_payload: u64,
) -> Result<Vec<Input>, Status> {
    let refs = tensors
        .iter()
        .map(|t| shm_ref("input", &t.name, &t.parameters))
        .collect::<Result<Vec<_>, _>>()?;
    let inline = refs.iter().filter(|r| r.is_none()).count();
    if !raw.is_empty() && raw.len() != inline {
        let shm = tensors.len() - inline;
        let also = if shm > 0 {
            format!(" ({shm} more in shared memory take none)")
        } else {
            String::new()
        };
        return Err(Status::invalid_argument(format!(
            "{inline} inputs{also} but {} raw_input_contents: give raw contents for every \
             input not in shared memory or for none",
            raw.len()
        )));
    }
    let mut raw = raw.into_iter();
    let mut total = 0u64;
    let mut out: Vec<Input> = Vec::with_capacity(tensors.len());
    for (t, shm) in tensors.into_iter().zip(refs) {
        let name = t.name;
        if out.iter().any(|i| i.name == name) {
            return Err(Status::invalid_argument(format!(
                "input '{name}' is given twice"
            )));
        }
        let dtype = datatype(&name, &t.datatype)?;
        let shape = dims(&name, &t.shape)?;
        let elements = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| too_large(&name, &t.shape))?;
        let len = elements
            .checked_mul(dtype.size() as u64)
            .ok_or_else(|| too_large(&name, &t.shape))?;
        total = total.saturating_add(len);
        if total > max_payload {
            return Err(Status::resource_exhausted(format!(
                "input '{name}': the request's tensors need over {total} bytes, more than the \
                 agent's max_payload of {max_payload}"
            )));
        }
        let data = if let Some(at) = &shm {
            if t.contents.as_ref().is_some_and(has_values) {
                return Err(Status::invalid_argument(format!(
                    "input '{name}': has both shared memory and typed contents"
                )));
            }
            if at.byte_size != len {
                return Err(Status::invalid_argument(format!(
                    "input '{name}': {}{:?} needs {len} bytes, its shared_memory_byte_size is {}",
                    t.datatype, t.shape, at.byte_size
                )));
            }
            Bytes::new()
        } else {
            match raw.next() {
                Some(bytes) => {
                    if t.contents.as_ref().is_some_and(has_values) {
                        return Err(Status::invalid_argument(format!(
                            "input '{name}': has both raw_input_contents and typed contents"
                        )));
                    }
                    if bytes.len() as u64 != len {
                        return Err(Status::invalid_argument(format!(
                            "input '{name}': {}{:?} needs {len} bytes, its raw_input_contents \
                             has {}",
                            t.datatype,
                            t.shape,
                            bytes.len()
                        )));
                    }
                    bytes
                }
                None => {
                    let empty = InferTensorContents::default();
                    let contents = t.contents.as_ref().unwrap_or(&empty);
                    // `len` fits the payload limit, so the element count fits
                    // memory too.
                    let n = usize::try_from(elements).map_err(|_| too_large(&name, &t.shape))?;
                    Bytes::from(typed(&name, &t.datatype, dtype, n, contents)?)
                }
            }
        };
        out.push(Input {
            name,
            dtype,
            shape,
            data,
            shm,
        });
    }
    Ok(out)
}

/// Puts `inputs` in the order of the model's signature, matching them by
/// name. A model without declared inputs (`identity`) takes them as given.
pub(crate) fn order_by_signature(
    sig: &ModelSignature,
    mut inputs: Vec<Input>,
) -> Result<Vec<Input>, Status> {
    if sig.inputs.is_empty() {
        return Ok(inputs);
    }
    let expected = || {
        sig.inputs
            .iter()
            .map(|s| format!("'{}'", s.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(extra) = inputs
        .iter()
        .find(|i| !sig.inputs.iter().any(|s| s.name == i.name))
    {
        return Err(Status::invalid_argument(format!(
            "model '{}' has no input named '{}' (its inputs: {})",
            sig.name,
            extra.name,
            expected()
        )));
    }
    let mut ordered = Vec::with_capacity(sig.inputs.len());
    for spec in &sig.inputs {
        let at = inputs
            .iter()
            .position(|i| i.name == spec.name)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "model '{}' needs input '{}' ({}), which the request does not give \
                     (its inputs: {})",
                    sig.name,
                    spec.name,
                    spec.describe(),
                    expected()
                ))
            })?;
        ordered.push(inputs.swap_remove(at));
    }
    Ok(ordered)
}

fn datatype(name: &str, datatype: &str) -> Result<DType, Status> {
    if datatype == "BYTES" {
        return Err(Status::invalid_argument(format!(
            "input '{name}': datatype BYTES (variable-length strings) is not supported by \
             tensorwire; send a numeric tensor ({SUPPORTED})"
        )));
    }
    dtype_from_kserve(datatype).ok_or_else(|| {
        Status::invalid_argument(format!(
            "input '{name}': unknown datatype '{datatype}' (tensorwire takes {SUPPORTED})"
        ))
    })
}

fn dims(name: &str, shape: &[i64]) -> Result<Vec<u64>, Status> {
    if shape.len() > MAX_DIMS {
        return Err(Status::invalid_argument(format!(
            "input '{name}': shape {shape:?} has {} dimensions, at most {MAX_DIMS} allowed",
            shape.len()
        )));
    }
    shape
        .iter()
        .map(|&d| u64::try_from(d))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|_| {
            Status::invalid_argument(format!(
                "input '{name}': shape {shape:?} has a negative dimension"
            ))
        })
}

fn too_large(name: &str, shape: &[i64]) -> Status {
    Status::invalid_argument(format!("input '{name}': shape {shape:?} is too large"))
}

fn has_values(c: &InferTensorContents) -> bool {
    !(c.bool_contents.is_empty()
        && c.int_contents.is_empty()
        && c.int64_contents.is_empty()
        && c.uint_contents.is_empty()
        && c.uint64_contents.is_empty()
        && c.fp32_contents.is_empty()
        && c.fp64_contents.is_empty()
        && c.bytes_contents.is_empty())
}

/// The little-endian bytes of `n` values of typed contents, from the field
/// KServe v2 assigns to `dtype`, each checked to fit it.
fn typed(
    name: &str,
    datatype: &str,
    dtype: DType,
    n: usize,
    c: &InferTensorContents,
) -> Result<Vec<u8>, Status> {
    let conv = Convert { name, datatype, n };
    match dtype {
        DType::Bool => conv.run("bool_contents", &c.bool_contents, |v| Some([u8::from(v)])),
        DType::I8 => conv.run("int_contents", &c.int_contents, |v| {
            i8::try_from(v).ok().map(i8::to_le_bytes)
        }),
        DType::I16 => conv.run("int_contents", &c.int_contents, |v| {
            i16::try_from(v).ok().map(i16::to_le_bytes)
        }),
        DType::I32 => conv.run("int_contents", &c.int_contents, |v| Some(v.to_le_bytes())),
        DType::I64 => conv.run("int64_contents", &c.int64_contents, |v| {
            Some(v.to_le_bytes())
        }),
        DType::U8 => conv.run("uint_contents", &c.uint_contents, |v| {
            u8::try_from(v).ok().map(u8::to_le_bytes)
        }),
        DType::U16 => conv.run("uint_contents", &c.uint_contents, |v| {
            u16::try_from(v).ok().map(u16::to_le_bytes)
        }),
        DType::U32 => conv.run("uint_contents", &c.uint_contents, |v| Some(v.to_le_bytes())),
        DType::U64 => conv.run("uint64_contents", &c.uint64_contents, |v| {
            Some(v.to_le_bytes())
        }),
        DType::F32 => conv.run("fp32_contents", &c.fp32_contents, |v| Some(v.to_le_bytes())),
        DType::F64 => conv.run("fp64_contents", &c.fp64_contents, |v| Some(v.to_le_bytes())),
        DType::F16 | DType::BF16 => Err(Status::invalid_argument(format!(
            "input '{name}': {datatype} has no typed contents field in KServe v2; \
             send it in raw_input_contents"
        ))),
    }
}

/// What a typed-contents conversion needs to say what went wrong.
struct Convert<'a> {
    name: &'a str,
    datatype: &'a str,
    n: usize,
}

impl Convert<'_> {
    fn run<T: Copy, const N: usize>(
        &self,
        field: &str,
        values: &[T],
        to_bytes: impl Fn(T) -> Option<[u8; N]>,
    ) -> Result<Vec<u8>, Status> {
        let (name, datatype, n) = (self.name, self.datatype, self.n);
        if values.len() != n {
            return Err(Status::invalid_argument(format!(
                "input '{name}': its shape holds {n} {datatype} elements, but contents.{field} \
                 has {} values (and raw_input_contents is empty)",
                values.len()
            )));
        }
        let mut out = Vec::with_capacity(n * N);
        for (i, &v) in values.iter().enumerate() {
            let b = to_bytes(v).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "input '{name}': contents.{field}[{i}] does not fit {datatype}"
                ))
            })?;
            out.extend_from_slice(&b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            ..Default::default()
        }
    }

    fn refused(r: Result<Vec<Input>, Status>) -> (tonic::Code, String) {
        let e = r.expect_err("refused");
        (e.code(), e.message().to_string())
    }

    #[test]
    fn raw_and_typed_contents() {
        let raw = gather(
            vec![tensor("a", "INT16", &[2])],
            vec![Bytes::from_static(&[1, 0, 2, 0])],
            1 << 20,
        )
        .expect("raw");
        assert_eq!(raw[0].data.as_ref(), &[1, 0, 2, 0]);
        let mut t = tensor("b", "INT8", &[3]);
        t.contents = Some(InferTensorContents {
            int_contents: vec![-1, 0, 127],
            ..Default::default()
        });
        let typed = gather(vec![t], Vec::new(), 1 << 20).expect("typed");
        assert_eq!(typed[0].data.as_ref(), &[0xff, 0, 127]);
    }

    fn in_shm(name: &str, datatype: &str, shape: &[i64], byte_size: i64) -> InferInputTensor {
        use crate::proto::infer_parameter::ParameterChoice;
        use crate::proto::InferParameter;
        let mut t = tensor(name, datatype, shape);
        t.parameters.insert(
            "shared_memory_region".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam("r".into())),
            },
        );
        t.parameters.insert(
            "shared_memory_byte_size".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::Int64Param(byte_size)),
            },
        );
        t
    }

    #[test]
    fn inputs_in_shared_memory_take_no_raw_contents() {
        // Raw contents line up with the inputs not in shared memory.
        let got = gather(
            vec![
                in_shm("a", "FP32", &[2], 8),
                tensor("b", "UINT8", &[2]),
                in_shm("c", "INT16", &[3], 6),
                tensor("d", "UINT8", &[1]),
            ],
            vec![Bytes::from_static(&[1, 2]), Bytes::from_static(&[3])],
            1 << 20,
        )
        .expect("mixed");
        let shm: Vec<bool> = got.iter().map(|i| i.shm.is_some()).collect();
        assert_eq!(shm, [true, false, true, false]);
        assert_eq!(got[1].data.as_ref(), &[1, 2]);
        assert_eq!(got[3].data.as_ref(), &[3]);
        assert_eq!(got[2].shm.as_ref().map(|r| r.byte_size), Some(6));
        // Wrong counts of raw contents, a byte size that is not the
        // tensor's, and shared memory with contents are refused.
        let (code, msg) = refused(gather(
            vec![in_shm("a", "FP32", &[2], 8), tensor("b", "UINT8", &[2])],
            vec![Bytes::from_static(&[1, 2]), Bytes::from_static(&[3])],
            1 << 20,
        ));
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(msg.contains("1 inputs (1 more in shared memory"), "{msg}");
        let (_, msg) = refused(gather(
            vec![in_shm("a", "FP32", &[2, 2], 8)],
            vec![],
            1 << 20,
        ));
        assert!(
            msg.contains("'a'") && msg.contains("needs 16 bytes") && msg.contains("is 8"),
            "{msg}"
        );
        let mut t = in_shm("a", "INT32", &[1], 4);
        t.contents = Some(InferTensorContents {
            int_contents: vec![1],
            ..Default::default()
        });
        let (_, msg) = refused(gather(vec![t], vec![], 1 << 20));
        assert!(
            msg.contains("both shared memory and typed contents"),
            "{msg}"
        );
        // The payload limit counts them too (as on native shm sessions).
        let (code, _) = refused(gather(vec![in_shm("a", "UINT8", &[64], 64)], vec![], 32));
        assert_eq!(code, tonic::Code::ResourceExhausted);
    }

    #[test]
    fn bad_inputs_are_named() {
        let cases = [
            (tensor("s", "BYTES", &[1]), "BYTES"),
            (tensor("q", "FLOAT", &[1]), "unknown datatype 'FLOAT'"),
            (tensor("n", "FP32", &[-1, 2]), "negative dimension"),
            (tensor("f", "FP16", &[1]), "raw_input_contents"),
            (tensor("c", "INT32", &[2]), "has 0 values"),
        ];
        for (t, needle) in cases {
            let name = t.name.clone();
            let (code, msg) = refused(gather(vec![t], Vec::new(), 1 << 20));
            assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
            assert!(
                msg.contains(&format!("'{name}'")) && msg.contains(needle),
                "{msg}"
            );
        }
        let mut t = tensor("r", "UINT8", &[1]);
        t.contents = Some(InferTensorContents {
            uint_contents: vec![256],
            ..Default::default()
        });
        let (_, msg) = refused(gather(vec![t], Vec::new(), 1 << 20));
        assert!(msg.contains("does not fit UINT8"), "{msg}");
        let (code, msg) = refused(gather(
            vec![tensor("big", "FP64", &[1 << 20])],
            vec![Bytes::new()],
            1 << 20,
        ));
        assert_eq!(code, tonic::Code::ResourceExhausted, "{msg}");
        let (code, msg) = refused(gather(
            vec![tensor("x", "UINT8", &[3])],
            vec![Bytes::from_static(&[1, 2])],
            1 << 20,
        ));
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(
            msg.contains("'x'") && msg.contains("needs 3 bytes"),
            "{msg}"
        );
    }
}
