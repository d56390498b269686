//! The ONNX Runtime backend against the real library and real models.
//!
//! Needs `scripts/setup.sh` to have run (it installs the onnxruntime wheel
//! into `.venv` and builds `models/build/digits_mlp.onnx` plus its reference
//! input and logits). Without them these tests FAIL, saying so: they never
//! skip silently. Small single-operator models are written here, by hand, as
//! ONNX protobuf bytes (see `onnx`), to cover every dtype and the error cases.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use engine::{
    find_onnxruntime, init_onnxruntime, Backend, DType, EngineError, OrtBackend, OrtOptions,
    Output, OutputData, TensorView,
};
use wire::AlignedBuf;

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

const SETUP_HINT: &str =
    "run scripts/setup.sh (it installs ONNX Runtime into .venv and builds models/build)";

/// A file setup.sh makes; panics (never skips) if it is missing.
fn built(name: &str) -> PathBuf {
    let p = repo_root().join("models/build").join(name);
    assert!(p.is_file(), "{} is missing: {SETUP_HINT}", p.display());
    p
}

fn load(name: &str, path: &Path, opts: &OrtOptions) -> OrtBackend {
    OrtBackend::load(name, path, opts)
        .unwrap_or_else(|e| panic!("loading {}: {e}\n({SETUP_HINT})", path.display()))
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `values` as bytes in a 64-byte aligned buffer (as transports deliver them).
fn aligned_f32(values: &[f32]) -> AlignedBuf {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    AlignedBuf::copy_from(&bytes).expect("alloc")
}

fn output_f32(out: &Output, inputs: &[TensorView<'_>]) -> Vec<f32> {
    assert_eq!(out.dtype, DType::F32);
    out.bytes(inputs)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

struct Digits {
    backend: OrtBackend,
    input: Vec<f32>,
    expected: Vec<f32>,
}

fn digits(opts: &OrtOptions) -> Digits {
    let backend = load("digits", &built("digits_mlp.onnx"), opts);
    Digits {
        backend,
        input: read_f32(&built("digits_mlp_input.bin")),
        expected: read_f32(&built("digits_mlp_expected.bin")),
    }
}

#[test]
fn runtime_is_found_without_environment_variables() {
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        let path = find_onnxruntime().unwrap_or_else(|e| panic!("{e}"));
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert!(name.starts_with("libonnxruntime.so"), "{}", path.display());
        assert!(
            path.to_string_lossy().contains("/.venv/"),
            "{}",
            path.display()
        );
    }
    let info = init_onnxruntime(None).unwrap_or_else(|e| panic!("{e}\n({SETUP_HINT})"));
    assert!(info.version.starts_with("1."), "version {:?}", info.version);
    assert_eq!(
        init_onnxruntime(Some(3)).expect("second init"),
        info,
        "the first init decides"
    );
    assert_eq!(engine::onnxruntime_info(), Some(info));
}

#[test]
fn digits_mlp_matches_the_python_reference() {
    let d = digits(&OrtOptions::default());
    let sig = d.backend.signature();
    assert_eq!(sig.name, "digits");
    assert_eq!(sig.inputs.len(), 1);
    assert_eq!(sig.inputs[0].name, "x");
    assert_eq!(sig.inputs[0].describe(), "float32[?, 64]");
    assert_eq!(sig.outputs.len(), 1);
    assert_eq!(sig.outputs[0].name, "logits");
    assert_eq!(sig.outputs[0].describe(), "float32[?, 10]");
    assert!(
        d.backend.preallocates_outputs(),
        "batch is named on both sides"
    );

    let buf = aligned_f32(&d.input);
    let shape = [4u64, 64];
    let inputs = [TensorView::new(DType::F32, &shape, &buf)];
    d.backend
        .check_inputs(&[(DType::F32, &shape)])
        .expect("fits");

    for preallocate in [true, false] {
        d.backend.set_preallocate_outputs(preallocate);
        assert_eq!(d.backend.preallocates_outputs(), preallocate);
        let out = d.backend.run(&inputs).expect("run");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shape, vec![4, 10]);
        assert!(matches!(out[0].data, OutputData::Owned(_)));
        assert_eq!(
            out[0].bytes(&inputs).as_ptr() as usize % 64,
            0,
            "outputs are 64-byte aligned"
        );
        let diff = max_abs_diff(&output_f32(&out[0], &inputs), &d.expected);
        assert!(
            diff <= 1e-4,
            "preallocate={preallocate}: max abs diff {diff}"
        );
    }
}

#[test]
fn digits_mlp_other_batch_sizes() {
    let d = digits(&OrtOptions::default());
    // One row.
    let buf = aligned_f32(&d.input[..64]);
    let inputs = [TensorView::new(DType::F32, &[1, 64], &buf)];
    let out = d.backend.run(&inputs).expect("batch 1");
    assert_eq!(out[0].shape, vec![1, 10]);
    assert!(max_abs_diff(&output_f32(&out[0], &inputs), &d.expected[..10]) <= 1e-4);
    // No rows.
    let inputs = [TensorView::new(DType::F32, &[0, 64], &[])];
    let out = d.backend.run(&inputs).expect("batch 0");
    assert_eq!(out[0].shape, vec![0, 10]);
    assert!(out[0].bytes(&inputs).is_empty());
}

#[test]
fn run_into_writes_caller_buffers() {
    let d = digits(&OrtOptions::default());
    let be = &d.backend;
    assert_eq!(
        be.output_shapes(&[(DType::F32, &[4, 64])]),
        Some(vec![vec![4, 10]])
    );
    assert_eq!(
        be.output_shapes(&[(DType::F32, &[4, 63])]),
        None,
        "inputs that do not fit"
    );
    let buf = aligned_f32(&d.input);
    let inputs = [TensorView::new(DType::F32, &[4, 64], &buf)];
    let to_f32 = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };

    // Aligned destination: written in place.
    let mut dst = AlignedBuf::zeroed(160).expect("alloc");
    be.run_into(&inputs, &mut [&mut dst[..]]).expect("run_into");
    assert!(max_abs_diff(&to_f32(&dst), &d.expected) <= 1e-4);

    // Misaligned destination: copied.
    let mut shifted = AlignedBuf::zeroed(161).expect("alloc");
    be.run_into(&inputs, &mut [&mut shifted[1..]])
        .expect("run_into misaligned");
    assert!(max_abs_diff(&to_f32(&shifted[1..]), &d.expected) <= 1e-4);

    // Wrong size or count: InvalidInput.
    let mut small = AlignedBuf::zeroed(156).expect("alloc");
    assert!(matches!(
        be.run_into(&inputs, &mut [&mut small[..]]),
        Err(EngineError::InvalidInput(_))
    ));
    assert!(matches!(
        be.run_into(&inputs, &mut []),
        Err(EngineError::InvalidInput(_))
    ));

    // With in-place outputs off, shapes are not promised, but run_into still works.
    be.set_preallocate_outputs(false);
    assert_eq!(be.output_shapes(&[(DType::F32, &[4, 64])]), None);
    let mut dst = AlignedBuf::zeroed(160).expect("alloc");
    be.run_into(&inputs, &mut [&mut dst[..]])
        .expect("run_into copying");
    assert!(max_abs_diff(&to_f32(&dst), &d.expected) <= 1e-4);
}

#[test]
fn misaligned_input_is_realigned_not_rejected() {
    let d = digits(&OrtOptions::default());
    let buf = aligned_f32(&d.input);
    let mut shifted = AlignedBuf::zeroed(buf.len() + 1).expect("alloc");
    shifted[1..].copy_from_slice(&buf);
    let data = &shifted[1..];
    assert_ne!(data.as_ptr() as usize % 4, 0);
    let inputs = [TensorView::new(DType::F32, &[4, 64], data)];
    let out = d.backend.run(&inputs).expect("run");
    assert!(max_abs_diff(&output_f32(&out[0], &inputs), &d.expected) <= 1e-4);
}

#[test]
fn intra_op_spinning_on_and_off_load_and_agree() {
    // ONNX Runtime takes the session config entry either way (a key it did
    // not know would fail the load), and the results do not depend on it.
    let mut logits = Vec::new();
    for spinning in [false, true] {
        let d = digits(&OrtOptions {
            intra_threads: 2,
            intra_spinning: spinning,
            ..OrtOptions::default()
        });
        let buf = aligned_f32(&d.input);
        let inputs = [TensorView::new(DType::F32, &[4, 64], &buf)];
        let out = d.backend.run(&inputs).expect("run");
        let got = output_f32(&out[0], &inputs);
        assert!(
            max_abs_diff(&got, &d.expected) <= 1e-4,
            "spinning {spinning}"
        );
        logits.push(got);
    }
    assert_eq!(logits[0], logits[1]);
}

#[test]
fn concurrent_runs_share_a_session_pool() {
    let d = Arc::new(digits(&OrtOptions {
        intra_threads: 1,
        intra_spinning: true,
        inter_threads: 1,
        sessions: 2,
    }));
    assert_eq!(d.backend.session_count(), 2);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                let buf = aligned_f32(&d.input);
                let inputs = [TensorView::new(DType::F32, &[4, 64], &buf)];
                for _ in 0..50 {
                    let out = d.backend.run(&inputs).expect("run");
                    assert!(max_abs_diff(&output_f32(&out[0], &inputs), &d.expected) <= 1e-4);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn bad_inputs_are_invalid_input() {
    let d = digits(&OrtOptions::default());
    let be = &d.backend;
    let invalid = |r: Result<(), EngineError>, what: &str| match r {
        Err(EngineError::InvalidInput(m)) => assert!(m.contains("'x'"), "{what}: {m}"),
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    };
    invalid(be.check_inputs(&[(DType::F64, &[4, 64])]), "dtype");
    invalid(be.check_inputs(&[(DType::F32, &[4, 63])]), "shape");
    invalid(be.check_inputs(&[(DType::F32, &[256])]), "rank");
    assert!(matches!(
        be.check_inputs(&[]),
        Err(EngineError::InvalidInput(_))
    ));

    // `run` refuses them too, even if the caller did not check.
    let buf = aligned_f32(&d.input);
    let run = |t: TensorView<'_>| be.run(&[t]).map(|_| ());
    invalid(
        run(TensorView::new(DType::F64, &[2, 64], &buf)),
        "run dtype",
    );
    invalid(
        run(TensorView::new(DType::F32, &[4, 32], &buf[..512])),
        "run shape",
    );
    invalid(
        run(TensorView::new(DType::F32, &[4, 64], &buf[..1020])),
        "run short data",
    );
    assert!(matches!(be.run(&[]), Err(EngineError::InvalidInput(_))));
}

#[test]
fn missing_or_corrupt_model_is_a_load_error_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let corrupt = dir.path().join("corrupt.onnx");
    std::fs::write(&corrupt, b"this is not an ONNX model").expect("write");
    let missing = dir.path().join("missing.onnx");
    let truncated = dir.path().join("truncated.onnx");
    let model = std::fs::read(built("digits_mlp.onnx")).expect("read model");
    std::fs::write(&truncated, &model[..model.len() / 2]).expect("write");
    for path in [&corrupt, &missing, &truncated, &dir.path().to_path_buf()] {
        match OrtBackend::load("bad", path, &OrtOptions::default()) {
            Err(e @ EngineError::Load { .. }) => {
                let EngineError::Load { path: p, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(p, &path.display().to_string());
                assert!(e.to_string().contains(&path.display().to_string()), "{e}");
            }
            other => panic!("{}: expected Load, got {other:?}", path.display()),
        }
    }
}

#[test]
fn every_dtype_round_trips_through_identity_models() {
    let dir = tempfile::tempdir().expect("tempdir");
    for dtype in DType::ALL {
        let elem = onnx::elem_type(dtype);
        // Static shape; dynamic named dim (both planned: written in place);
        // dynamic anonymous dim (copied out).
        let cases: [(&str, Vec<onnx::Dim>, Vec<onnx::Dim>, bool); 3] = [
            (
                "static",
                vec![onnx::Dim::Fixed(2), onnx::Dim::Fixed(3)],
                vec![onnx::Dim::Fixed(2), onnx::Dim::Fixed(3)],
                true,
            ),
            (
                "named",
                vec![onnx::Dim::Named("n"), onnx::Dim::Fixed(3)],
                vec![onnx::Dim::Named("n"), onnx::Dim::Fixed(3)],
                true,
            ),
            (
                "anonymous",
                vec![onnx::Dim::Any, onnx::Dim::Fixed(3)],
                vec![onnx::Dim::Any, onnx::Dim::Fixed(3)],
                false,
            ),
        ];
        for (case, in_dims, out_dims, planned) in cases {
            let path = dir.path().join(format!("identity_{dtype}_{case}.onnx"));
            std::fs::write(&path, onnx::identity_model(elem, &in_dims, elem, &out_dims))
                .expect("write");
            let be = load(&format!("identity_{dtype}"), &path, &OrtOptions::default());
            assert_eq!(be.signature().inputs[0].dtype, dtype);
            assert_eq!(be.signature().outputs[0].dtype, dtype);
            assert_eq!(be.preallocates_outputs(), planned, "{dtype} {case}");
            let len = 6 * dtype.size();
            // Bytes valid for every dtype (bool needs 0/1).
            let bytes: Vec<u8> = (0..len)
                .map(|i| {
                    if dtype == DType::Bool {
                        (i % 2) as u8
                    } else {
                        (i * 7 + 1) as u8
                    }
                })
                .collect();
            let buf = AlignedBuf::copy_from(&bytes).expect("alloc");
            let inputs = [TensorView::new(dtype, &[2, 3], &buf)];
            let out = be
                .run(&inputs)
                .unwrap_or_else(|e| panic!("{dtype} {case}: {e}"));
            assert_eq!(out[0].dtype, dtype);
            assert_eq!(out[0].shape, vec![2, 3]);
            assert_eq!(out[0].bytes(&inputs), &bytes[..], "{dtype} {case}");
        }
    }
}

#[test]
fn bool_inputs_must_be_zero_or_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("identity_bool.onnx");
    let elem = onnx::elem_type(DType::Bool);
    std::fs::write(
        &path,
        onnx::identity_model(elem, &[onnx::Dim::Fixed(2)], elem, &[onnx::Dim::Fixed(2)]),
    )
    .expect("write");
    let be = load("b", &path, &OrtOptions::default());
    let inputs = [TensorView::new(DType::Bool, &[2], &[1, 2])];
    assert!(matches!(be.run(&inputs), Err(EngineError::InvalidInput(m)) if m.contains("0 and 1")));
}

#[test]
fn wrong_declared_output_shape_falls_back_to_copying() {
    // Identity of [a, b] declared to give [b, a]: the planned output buffer has
    // the wrong shape, so the first run retries without preallocation and
    // switches it off for this model.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("liar.onnx");
    let f32_ = onnx::elem_type(DType::F32);
    let a = onnx::Dim::Named("a");
    let b = onnx::Dim::Named("b");
    std::fs::write(
        &path,
        onnx::identity_model(f32_, &[a.clone(), b.clone()], f32_, &[b, a]),
    )
    .expect("write");
    let be = load("liar", &path, &OrtOptions::default());
    assert!(be.preallocates_outputs());
    let buf = aligned_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let inputs = [TensorView::new(DType::F32, &[2, 3], &buf)];
    let out = be.run(&inputs).expect("run");
    assert_eq!(out[0].shape, vec![2, 3]);
    assert_eq!(
        output_f32(&out[0], &inputs),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert!(!be.preallocates_outputs());

    // The same through run_into, on a fresh backend.
    let be = load("liar", &path, &OrtOptions::default());
    assert_eq!(
        be.output_shapes(&[(DType::F32, &[2, 3])]),
        Some(vec![vec![3, 2]])
    );
    let mut dst = AlignedBuf::zeroed(24).expect("alloc");
    be.run_into(&inputs, &mut [&mut dst[..]]).expect("run_into");
    assert_eq!(&dst[..], &buf[..]);
    assert!(!be.preallocates_outputs());
}

#[test]
fn unsupported_types_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("strings.onnx");
    let string = 8; // TensorProto.STRING
    std::fs::write(
        &path,
        onnx::identity_model(
            string,
            &[onnx::Dim::Fixed(1)],
            string,
            &[onnx::Dim::Fixed(1)],
        ),
    )
    .expect("write");
    match OrtBackend::load("strings", &path, &OrtOptions::default()) {
        Err(EngineError::Unsupported(m)) => assert!(m.contains("input 's'"), "{m}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let path = dir.path().join("sequence.onnx");
    std::fs::write(&path, onnx::sequence_model()).expect("write");
    match OrtBackend::load("sequence", &path, &OrtOptions::default()) {
        Err(EngineError::Unsupported(m)) => {
            assert!(m.contains("output 't'") && m.contains("sequence"), "{m}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn single_run_latency() {
    let d = digits(&OrtOptions::default());
    let buf = aligned_f32(&d.input[..64]);
    let inputs = [TensorView::new(DType::F32, &[1, 64], &buf)];
    for _ in 0..200 {
        d.backend.run(&inputs).expect("warm up");
    }
    for preallocate in [true, false] {
        d.backend.set_preallocate_outputs(preallocate);
        let mut times: Vec<f64> = (0..2000)
            .map(|_| {
                let t = Instant::now();
                let out = d.backend.run(&inputs).expect("run");
                let dt = t.elapsed().as_secs_f64() * 1e6;
                drop(out);
                dt
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let p99 = times[times.len() * 99 / 100];
        println!(
            "digits_mlp batch 1, preallocate={preallocate}: median {median:.1} us, p99 {p99:.1} us"
        );
        assert!(
            median < 10_000.0,
            "a 64-64-10 MLP should not take {median} us"
        );
    }
}

/// Just enough of the ONNX protobuf format to write single-node test models.
mod onnx {
    use engine::DType;

    #[derive(Clone)]
    pub enum Dim {
        Fixed(i64),
        Named(&'static str),
        Any,
    }

    /// TensorProto.DataType of a dtype.
    pub fn elem_type(d: DType) -> u64 {
        match d {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
        }
    }

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn int_field(field: u64, v: u64, out: &mut Vec<u8>) {
        varint(field << 3, out);
        varint(v, out);
    }

    fn bytes_field(field: u64, b: &[u8], out: &mut Vec<u8>) {
        varint((field << 3) | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    /// TypeProto { tensor_type: Tensor { elem_type, shape } }
    fn tensor_type(elem: u64, dims: &[Dim]) -> Vec<u8> {
        let mut shape = Vec::new();
        for d in dims {
            let mut dim = Vec::new();
            match d {
                Dim::Fixed(n) => int_field(1, *n as u64, &mut dim),
                Dim::Named(s) => bytes_field(2, s.as_bytes(), &mut dim),
                Dim::Any => {}
            }
            bytes_field(1, &dim, &mut shape);
        }
        let mut tensor = Vec::new();
        int_field(1, elem, &mut tensor);
        bytes_field(2, &shape, &mut tensor);
        let mut ty = Vec::new();
        bytes_field(1, &tensor, &mut ty);
        ty
    }

    fn value_info(name: &str, ty: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        bytes_field(1, name.as_bytes(), &mut v);
        bytes_field(2, ty, &mut v);
        v
    }

    fn model(op: &str, input_ty: &[u8], output_ty: &[u8]) -> Vec<u8> {
        let mut node = Vec::new();
        bytes_field(1, b"s", &mut node);
        bytes_field(2, b"t", &mut node);
        bytes_field(4, op.as_bytes(), &mut node);
        let mut graph = Vec::new();
        bytes_field(1, &node, &mut graph);
        bytes_field(2, b"g", &mut graph);
        bytes_field(11, &value_info("s", input_ty), &mut graph);
        bytes_field(12, &value_info("t", output_ty), &mut graph);
        let mut opset = Vec::new();
        bytes_field(1, b"", &mut opset);
        int_field(2, 17, &mut opset);
        let mut m = Vec::new();
        int_field(1, 8, &mut m); // ir_version
        bytes_field(8, &opset, &mut m);
        bytes_field(7, &graph, &mut m);
        m
    }

    /// A model `t = Identity(s)`.
    pub fn identity_model(
        in_elem: u64,
        in_dims: &[Dim],
        out_elem: u64,
        out_dims: &[Dim],
    ) -> Vec<u8> {
        model(
            "Identity",
            &tensor_type(in_elem, in_dims),
            &tensor_type(out_elem, out_dims),
        )
    }

    /// A model `t = SequenceConstruct(s)`: a float tensor in, a sequence out.
    pub fn sequence_model() -> Vec<u8> {
        let input = tensor_type(1, &[Dim::Fixed(2)]);
        let mut seq = Vec::new();
        bytes_field(1, &input, &mut seq); // Sequence { elem_type }
        let mut ty = Vec::new();
        bytes_field(4, &seq, &mut ty); // TypeProto.sequence_type
        model("SequenceConstruct", &input, &ty)
    }
}
