//! Triton's per-model configuration ([`ModelConfig`], `config.pbtxt`):
//! parsed from protobuf text format, checked against the model it
//! describes, and derived from a model's signature where there is no file.
//!
//! Parsing goes through `prost-reflect` over the descriptor of
//! `proto/model_config.proto` (written by `build.rs`), then transcodes to
//! the generated [`ModelConfig`], so the text format is protobuf's own and
//! an unknown field is an error naming it. The checks refuse what
//! tensorwire cannot honour (GPU instances, another platform, more than
//! one version) instead of ignoring it.

use crate::proto::model_config::SchedulingChoice;
use crate::proto::model_instance_group::Kind;
use crate::proto::model_queue_policy::TimeoutAction;
use crate::proto::{DataType, ModelConfig, ModelInput, ModelInstanceGroup, ModelOutput};
use prost_reflect::{DescriptorPool, DynamicMessage};
use server::{BatchPolicy, QueuePolicy};
use std::sync::OnceLock;
use std::time::Duration;
use wire::{DType, ModelSignature, TensorSpec};

/// The platform name of ONNX Runtime models, as Triton reports it.
pub const ONNX_PLATFORM: &str = "onnxruntime_onnx";
/// The backend name of ONNX Runtime models, as Triton reports it.
pub const ONNX_BACKEND: &str = "onnxruntime";
/// The model file a version directory holds unless the config names
/// another.
pub const DEFAULT_MODEL_FILENAME: &str = "model.onnx";

/// The encoded descriptors of the inference protos (see `build.rs`).
static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/inference_descriptor.bin"));

fn pool() -> Result<&'static DescriptorPool, String> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(DESCRIPTORS).map_err(|e| format!("model config descriptors: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Parses `text` (the contents of a `config.pbtxt`).
pub fn parse_pbtxt(text: &str) -> Result<ModelConfig, String> {
    let desc = pool()?
        .get_message_by_name("inference.ModelConfig")
        .ok_or("model config descriptors lack inference.ModelConfig")?;
    let text = colon_before_lists(text);
    let msg = DynamicMessage::parse_text_format(desc, &text).map_err(|e| {
        format!("{e} (tensorwire reads these fields of Triton's ModelConfig: name, platform, backend, version_policy, max_batch_size, input, output, instance_group, default_model_filename, dynamic_batching, parameters)")
    })?;
    msg.transcode_to::<ModelConfig>()
        .map_err(|e| format!("model config: {e}"))
}

/// `text` with a `:` between a field name and a `[` list that follows it
/// directly (`input [ {...} ]`, as Triton's configs write lists of
/// messages). Protobuf's own text parser takes the colon as optional
/// there; `prost-reflect`'s requires it. Strings and `#` comments are left
/// alone. (No extension names `[a.b]` occur in a model config, so an
/// identifier followed by `[` is always a field name.)
fn colon_before_lists(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    // Inside a token of identifier characters, and whether it began with a
    // letter or '_' (an identifier, not a number).
    let mut in_token = false;
    // The last token before any whitespace was an identifier.
    let mut after_ident = false;
    for c in text.chars() {
        let ident_char = c.is_alphanumeric() || c == '_' || c == '.';
        if comment {
            comment = c != '\n';
        } else if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
        } else if c == '"' || c == '\'' {
            quote = Some(c);
            after_ident = false;
        } else if c == '#' {
            comment = true;
        } else if ident_char {
            if !in_token {
                after_ident = c.is_alphabetic() || c == '_';
            }
        } else if c == '[' && after_ident {
            out.push(':');
            after_ident = false;
        } else if !c.is_whitespace() {
            after_ident = false;
        }
        in_token = quote.is_none() && !comment && ident_char;
        out.push(c);
    }
    out
}

/// The config's data type for a tensorwire dtype.
pub fn data_type(d: DType) -> DataType {
    match d {
        DType::Bool => DataType::TypeBool,
        DType::U8 => DataType::TypeUint8,
        DType::U16 => DataType::TypeUint16,
        DType::U32 => DataType::TypeUint32,
        DType::U64 => DataType::TypeUint64,
        DType::I8 => DataType::TypeInt8,
        DType::I16 => DataType::TypeInt16,
        DType::I32 => DataType::TypeInt32,
        DType::I64 => DataType::TypeInt64,
        DType::F16 => DataType::TypeFp16,
        DType::F32 => DataType::TypeFp32,
        DType::F64 => DataType::TypeFp64,
        DType::BF16 => DataType::TypeBf16,
    }
}

/// Checks what can be checked before the model is loaded: its name,
/// platform, instances and batch size. Returns the number of instances
/// (engine sessions that may run at once).
pub fn check_settings(c: &ModelConfig, dir_name: &str) -> Result<usize, String> {
    if !c.name.is_empty() && c.name != dir_name {
        return Err(format!(
            "config.pbtxt names the model '{}' but its directory is '{dir_name}' (they must match)",
            c.name
        ));
    }
    if !c.platform.is_empty() && c.platform != ONNX_PLATFORM {
        return Err(format!(
            "platform '{}' is not served (tensorwire runs ONNX models: platform \
             '{ONNX_PLATFORM}')",
            c.platform
        ));
    }
    if !c.backend.is_empty() && c.backend != ONNX_BACKEND {
        return Err(format!(
            "backend '{}' is not served (tensorwire runs ONNX models: backend '{ONNX_BACKEND}')",
            c.backend
        ));
    }
    if c.max_batch_size < 0 {
        return Err(format!(
            "max_batch_size is {}, must be 0 or more",
            c.max_batch_size
        ));
    }
    let mut instances = 0usize;
    for g in &c.instance_group {
        if g.kind() == Kind::Gpu || !g.gpus.is_empty() {
            return Err(format!(
                "instance_group '{}' asks for a GPU; this agent runs models on the CPU \
                 (use kind: KIND_CPU)",
                g.name
            ));
        }
        if !(0..=64).contains(&g.count) {
            return Err(format!(
                "instance_group '{}' has count {}, must be 0..=64 (0 means 1)",
                g.name, g.count
            ));
        }
        instances += g.count.max(1) as usize;
    }
    Ok(instances.clamp(1, 64))
}

/// Checks the config's declared inputs and outputs against the loaded
/// model's signature: every declared tensor exists, with that data type
/// and compatible dims (`max_batch_size > 0` puts a batch dimension in
/// front, which the model must leave dynamic).
pub fn check_against(c: &ModelConfig, sig: &ModelSignature) -> Result<(), String> {
    let batched = c.max_batch_size > 0;
    let check = |kind: &str,
                 name: &str,
                 declared: i32,
                 dims: &[i64],
                 specs: &[TensorSpec]|
     -> Result<(), String> {
        let spec = specs.iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            format!(
                "config.pbtxt {kind} '{name}' is not an {kind} of the model ({kind}s: {})",
                names.join(", ")
            )
        })?;
        let want = data_type(spec.dtype);
        if declared != DataType::TypeInvalid as i32 && declared != want as i32 {
            let named = DataType::try_from(declared)
                .map(|d| d.as_str_name())
                .unwrap_or("an unknown data type");
            return Err(format!(
                "config.pbtxt {kind} '{name}' is {named}, the model's is {}",
                want.as_str_name()
            ));
        }
        let model_dims: &[Option<u64>] = if batched {
            match spec.shape.split_first() {
                Some((None, rest)) => rest,
                _ => {
                    return Err(format!(
                        "max_batch_size is {} but the model's {kind} '{name}' has no dynamic \
                         leading (batch) dimension: set max_batch_size: 0",
                        c.max_batch_size
                    ))
                }
            }
        } else {
            &spec.shape
        };
        let fits = dims.len() == model_dims.len()
            && dims.iter().zip(model_dims).all(|(&d, m)| match m {
                _ if d == -1 => true,
                None => d >= 0,
                Some(m) => u64::try_from(d) == Ok(*m),
            });
        if !fits && !dims.is_empty() {
            return Err(format!(
                "config.pbtxt {kind} '{name}' has dims {dims:?}, the model's are {}{}",
                show_dims(model_dims),
                if batched {
                    " (after the batch dimension)"
                } else {
                    ""
                }
            ));
        }
        Ok(())
    };
    if batched {
        // Every tensor needs the batch dimension, declared in the config
        // or not.
        for (kind, specs) in [("input", &sig.inputs), ("output", &sig.outputs)] {
            if let Some(t) = specs
                .iter()
                .find(|t| !matches!(t.shape.first(), Some(None)))
            {
                return Err(format!(
                    "max_batch_size is {} but the model's {kind} '{}' has no dynamic leading \
                     (batch) dimension: set max_batch_size: 0",
                    c.max_batch_size, t.name
                ));
            }
        }
    }
    for i in &c.input {
        check("input", &i.name, i.data_type, &i.dims, &sig.inputs)?;
    }
    for o in &c.output {
        check("output", &o.name, o.data_type, &o.dims, &sig.outputs)?;
    }
    Ok(())
}

fn show_dims(d: &[Option<u64>]) -> String {
    let parts: Vec<String> = d
        .iter()
        .map(|x| x.map_or_else(|| "-1".to_string(), |n| n.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// The configuration the agent reports for a served model: `c` (from the
/// repository; default when none) completed from the model's signature,
/// its instances and its platform, as Triton completes a config.
pub fn effective(mut c: ModelConfig, sig: &ModelSignature, instances: usize) -> ModelConfig {
    let batched = c.max_batch_size > 0;
    let dims = |s: &TensorSpec| -> Vec<i64> {
        let shape = if batched {
            s.shape.get(1..).unwrap_or(&[])
        } else {
            &s.shape[..]
        };
        shape
            .iter()
            .map(|d| d.and_then(|n| i64::try_from(n).ok()).unwrap_or(-1))
            .collect()
    };
    c.name.clone_from(&sig.name);
    c.platform = ONNX_PLATFORM.to_string();
    c.backend = ONNX_BACKEND.to_string();
    if c.default_model_filename.is_empty() {
        c.default_model_filename = DEFAULT_MODEL_FILENAME.to_string();
    }
    if c.input.is_empty() {
        c.input = sig
            .inputs
            .iter()
            .map(|s| ModelInput {
                name: s.name.clone(),
                data_type: data_type(s.dtype) as i32,
                dims: dims(s),
                optional: false,
            })
            .collect();
    }
    if c.output.is_empty() {
        c.output = sig
            .outputs
            .iter()
            .map(|s| ModelOutput {
                name: s.name.clone(),
                data_type: data_type(s.dtype) as i32,
                dims: dims(s),
            })
            .collect();
    }
    if c.instance_group.is_empty() {
        c.instance_group = vec![ModelInstanceGroup {
            name: sig.name.clone(),
            count: i32::try_from(instances).unwrap_or(i32::MAX),
            gpus: Vec::new(),
            kind: Kind::Cpu as i32,
        }];
    }
    c
}

/// The model's batching from `max_batch_size` and `dynamic_batching`
/// (as Triton: batches form only with both, `max_batch_size > 1`):
/// `max_batch_size` rows at most, `max_queue_delay_microseconds`,
/// `preferred_batch_size`. Without `dynamic_batching`, or with
/// `max_batch_size` 0 or 1, requests run one at a time.
pub fn batch_policy(c: &ModelConfig) -> Result<BatchPolicy, String> {
    let Some(SchedulingChoice::DynamicBatching(d)) = &c.scheduling_choice else {
        return Ok(BatchPolicy::default());
    };
    if c.max_batch_size <= 1 {
        return Ok(BatchPolicy::default());
    }
    let mut preferred = d
        .preferred_batch_size
        .iter()
        .map(|&n| usize::try_from(n).map_err(|_| format!("preferred_batch_size {n} is negative")))
        .collect::<Result<Vec<usize>, String>>()?;
    preferred.sort_unstable();
    preferred.dedup();
    let p = BatchPolicy {
        max_batch: usize::try_from(c.max_batch_size).unwrap_or(usize::MAX),
        max_queue_delay: Duration::from_micros(d.max_queue_delay_microseconds),
        preferred,
    };
    p.validate()
        .map_err(|e| format!("max_batch_size / dynamic_batching: {e}"))?;
    Ok(p)
}

/// The name of the `parameters` entry that sets a model's ONNX Runtime
/// intra-op threads (as Triton's ONNX Runtime backend reads it).
pub const INTRA_THREADS_PARAMETER: &str = "intra_op_thread_count";

/// The model's own ONNX Runtime intra-op threads, from `parameters {
/// key: "intra_op_thread_count" value: { string_value: "N" } }` as
/// Triton's ONNX Runtime backend takes it: `None` when absent or "0" (the
/// agent's own setting), else 1..=256.
pub fn intra_threads(c: &ModelConfig) -> Result<Option<usize>, String> {
    let Some(p) = c.parameters.get(INTRA_THREADS_PARAMETER) else {
        return Ok(None);
    };
    match p.string_value.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n @ 1..=256) => Ok(Some(n)),
        _ => Err(format!(
            "parameters {INTRA_THREADS_PARAMETER} is {:?}, must be \"0\" (the agent's) or \"1\"..=\"256\"",
            p.string_value
        )),
    }
}

/// The model's queue policy from `dynamic_batching`: `priority_levels`,
/// `default_priority_level` (0: the lowest), and `default_queue_policy`'s
/// `max_queue_size` and `default_timeout_microseconds`. A timeout action
/// other than REJECT is refused (the agent never delays a timed-out
/// request); `allow_timeout_override: false` makes the queue ignore the
/// requests' own timeouts.
pub fn queue_policy(c: &ModelConfig) -> Result<QueuePolicy, String> {
    let mut p = QueuePolicy::default();
    let Some(SchedulingChoice::DynamicBatching(d)) = &c.scheduling_choice else {
        return Ok(p);
    };
    if d.priority_levels > 0 {
        p.priority_levels = u8::try_from(d.priority_levels)
            .map_err(|_| format!("priority_levels is {}, at most 255", d.priority_levels))?;
    }
    p.default_priority = match d.default_priority_level {
        0 => p.priority_levels,
        n => u8::try_from(n).map_err(|_| {
            format!(
                "default_priority_level is {n}, must be 1..={} (the priority levels)",
                p.priority_levels
            )
        })?,
    };
    if let Some(q) = &d.default_queue_policy {
        if q.timeout_action() != TimeoutAction::Reject {
            return Err(
                "default_queue_policy.timeout_action DELAY is not served (a request whose \
                 timeout passes is refused: REJECT)"
                    .into(),
            );
        }
        p.max_queue = q.max_queue_size as usize;
        p.default_timeout = (q.default_timeout_microseconds != 0)
            .then(|| Duration::from_micros(q.default_timeout_microseconds));
        p.timeout_override = q.allow_timeout_override || q.default_timeout_microseconds == 0;
    }
    p.validate().map_err(|e| format!("dynamic_batching: {e}"))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> ModelSignature {
        ModelSignature {
            name: "digits".into(),
            inputs: vec![TensorSpec {
                name: "x".into(),
                dtype: DType::F32,
                shape: vec![None, Some(64)],
            }],
            outputs: vec![TensorSpec {
                name: "logits".into(),
                dtype: DType::F32,
                shape: vec![None, Some(10)],
            }],
        }
    }

    #[test]
    fn the_queue_policy_comes_from_dynamic_batching() {
        let p = |text: &str| queue_policy(&parse_pbtxt(text).expect("parses"));
        assert_eq!(p("").expect("no settings"), QueuePolicy::default());
        let q = p(r#"
            dynamic_batching {
              priority_levels: 3
              default_queue_policy { max_queue_size: 8, default_timeout_microseconds: 2500 }
            }"#)
        .expect("a policy");
        assert_eq!(q.priority_levels, 3);
        assert_eq!(q.default_priority, 3, "unset: the lowest level");
        assert_eq!(q.max_queue, 8);
        assert_eq!(q.default_timeout, Some(Duration::from_micros(2500)));
        assert!(
            !q.timeout_override,
            "Triton's allow_timeout_override defaults to false"
        );
        let q = p("dynamic_batching { priority_levels: 2, default_priority_level: 1 }")
            .expect("a policy");
        assert_eq!((q.priority_levels, q.default_priority), (2, 1));
        let e = p("dynamic_batching { default_queue_policy { timeout_action: DELAY } }")
            .expect_err("DELAY");
        assert!(e.contains("DELAY"), "{e}");
        let e = p("dynamic_batching { priority_levels: 2, default_priority_level: 5 }")
            .expect_err("a level out of range");
        assert!(e.contains("default_priority"), "{e}");
        let e = p("dynamic_batching { priority_levels: 300 }").expect_err("too many levels");
        assert!(e.contains("255"), "{e}");
    }

    #[test]
    fn parses_a_triton_config_and_checks_it() {
        let c = parse_pbtxt(
            r#"
            name: "digits"
            platform: "onnxruntime_onnx"
            max_batch_size: 8
            input [ { name: "x", data_type: TYPE_FP32, dims: [ 64 ] } ]
            output [ { name: "logits", data_type: TYPE_FP32, dims: [ 10 ] } ]
            instance_group [ { count: 2, kind: KIND_CPU } ]
            dynamic_batching { max_queue_delay_microseconds: 100 }
            "#,
        )
        .expect("parses");
        assert_eq!(check_settings(&c, "digits"), Ok(2));
        assert_eq!(check_against(&c, &sig()), Ok(()));
        let b = batch_policy(&c).expect("batching");
        assert_eq!(
            (b.max_batch, b.max_queue_delay),
            (8, Duration::from_micros(100))
        );
        let off = |t: &str| batch_policy(&parse_pbtxt(t).expect("parses")).expect("ok");
        assert!(!off("max_batch_size: 8").is_on(), "no dynamic_batching");
        assert!(!off("dynamic_batching { }").is_on(), "max_batch_size 0");
        let b = off("max_batch_size: 16 dynamic_batching { preferred_batch_size: [8, 4, 8] }");
        assert_eq!(b.preferred, vec![4, 8]);
        let e = batch_policy(
            &parse_pbtxt("max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }")
                .expect("parses"),
        )
        .expect_err("8 > 4");
        assert!(e.contains("preferred_batch_sizes"), "{e}");
        let e = effective(c, &sig(), 2);
        assert_eq!(e.default_model_filename, DEFAULT_MODEL_FILENAME);
        assert_eq!(e.instance_group.len(), 1);
    }

    #[test]
    fn intra_op_threads_come_from_the_parameters() {
        let threads = |t: &str| intra_threads(&parse_pbtxt(t).expect("parses"));
        assert_eq!(threads(""), Ok(None));
        let p = |v: &str| {
            format!(
                r#"parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{v}" }} }}"#
            )
        };
        assert_eq!(threads(&p("1")), Ok(Some(1)));
        assert_eq!(threads(&p("0")), Ok(None), "0: the agent's");
        for bad in ["257", "-1", "two", ""] {
            let e = threads(&p(bad)).expect_err(bad);
            assert!(e.contains("intra_op_thread_count"), "{e}");
        }
        let other = r#"parameters { key: "something_else" value: { string_value: "x" } }"#;
        assert_eq!(threads(other), Ok(None));
    }

    #[test]
    fn lists_of_messages_take_an_optional_colon() {
        assert_eq!(
            colon_before_lists("input [ { dims: [ 1 ] } ] # a [ b\nname: \"x [\""),
            "input :[ { dims: [ 1 ] } ] # a [ b\nname: \"x [\""
        );
        assert_eq!(colon_before_lists("dims: [1]"), "dims: [1]");
    }

    #[test]
    fn refuses_what_it_cannot_honour_naming_it() {
        let err = parse_pbtxt("optimization { }").expect_err("unknown field");
        assert!(err.contains("optimization"), "{err}");
        let gpu = parse_pbtxt("instance_group [ { kind: KIND_GPU } ]").expect("parses");
        assert!(check_settings(&gpu, "m").expect_err("gpu").contains("GPU"));
        let named = parse_pbtxt("name: \"other\"").expect("parses");
        assert!(check_settings(&named, "m")
            .expect_err("name")
            .contains("'other'"));
        let wrong_dims =
            parse_pbtxt("max_batch_size: 4 input [ { name: \"x\", dims: [ 63 ] } ]").expect("ok");
        let err = check_against(&wrong_dims, &sig()).expect_err("dims");
        assert!(err.contains("[63]") && err.contains("[64]"), "{err}");
        let wrong_type =
            parse_pbtxt("input [ { name: \"x\", data_type: TYPE_INT8 } ]").expect("ok");
        assert!(check_against(&wrong_type, &sig())
            .expect_err("type")
            .contains("TYPE_INT8"));
        let missing = parse_pbtxt("output [ { name: \"y\" } ]").expect("ok");
        assert!(check_against(&missing, &sig())
            .expect_err("name")
            .contains("'y'"));
        let unbatched = parse_pbtxt("input [ { name: \"x\", dims: [ -1, 64 ] } ]").expect("ok");
        assert_eq!(check_against(&unbatched, &sig()), Ok(()));
        let mut fixed = sig();
        fixed.outputs[0].shape[0] = Some(1);
        let batched = parse_pbtxt("max_batch_size: 2").expect("ok");
        assert!(check_against(&batched, &fixed)
            .expect_err("fixed leading dim")
            .contains("'logits'"));
    }
}
