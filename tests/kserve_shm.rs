//! Triton's system shared-memory extension on the KServe gRPC front door,
//! with the agent's core in this process so its copy counters can be read:
//! an ONNX Runtime output in shared memory is written there by the engine
//! (counted in place, nothing copied), an identity output is copied there
//! once (counted, by the agent's data mover, within the model's
//! `compute_output` stage), inputs are read where they are, and an output
//! that stays inline moves nothing into shared memory.

use common::{digits_expected, digits_input, digits_model};
use frontend::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use frontend::proto::infer_parameter::ParameterChoice;
use frontend::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use frontend::proto::{
    InferParameter, ModelInferRequest, ModelInferResponse, SystemSharedMemoryRegisterRequest,
};
use frontend::{FrontDoor, GrpcFrontend};
use server::dispatch::AgentCore;
use server::ModelRegistry;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;
use transport::mover::Mover;
use wire::Limits;

/// A POSIX shared-memory object (`/dev/shm/<name>`), removed when dropped.
struct Object {
    key: String,
    file: File,
}

impl Object {
    fn new(tag: &str, len: u64) -> Object {
        let key = format!("/tw-kserve-shm-{}-{tag}", std::process::id());
        let path = format!("/dev/shm{key}");
        let _ = std::fs::remove_file(&path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        file.set_len(len).expect("size the object");
        Object { key, file }
    }

    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, offset).expect("read");
        b
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/dev/shm{}", self.key));
    }
}

fn shm_params(region: &str, byte_size: u64, offset: u64) -> HashMap<String, InferParameter> {
    let p = |c| InferParameter {
        parameter_choice: Some(c),
    };
    HashMap::from([
        (
            "shared_memory_region".to_string(),
            p(ParameterChoice::StringParam(region.into())),
        ),
        (
            "shared_memory_byte_size".to_string(),
            p(ParameterChoice::Int64Param(byte_size as i64)),
        ),
        (
            "shared_memory_offset".to_string(),
            p(ParameterChoice::Int64Param(offset as i64)),
        ),
    ])
}

fn input(name: &str, datatype: &str, shape: &[i64], shm: Option<(&str, u64)>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        parameters: shm.map_or_else(HashMap::new, |(r, n)| shm_params(r, n, 0)),
        contents: None,
    }
}

fn output(name: &str, shm: Option<(&str, u64, u64)>) -> InferRequestedOutputTensor {
    InferRequestedOutputTensor {
        name: name.into(),
        parameters: shm.map_or_else(HashMap::new, |(r, n, o)| shm_params(r, n, o)),
    }
}

#[test]
fn outputs_are_written_in_place_or_copied_once_and_counted() {
    let mut registry = ModelRegistry::with_identity();
    let digits = engine::OrtBackend::load("digits", &digits_model(), &Default::default())
        .expect("load digits");
    registry.add_in_place(Arc::new(digits), 1);
    let core = Arc::new(AgentCore::new(registry, Limits::default(), 1 << 30));
    let door = FrontDoor::new(core.clone());
    let front = GrpcFrontend::start("grpc://127.0.0.1:0", door).expect("start");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let addr = front.uri().replace("grpc://", "http://");
    let mut client: GrpcInferenceServiceClient<Channel> = rt
        .block_on(GrpcInferenceServiceClient::connect(addr))
        .expect("connect");
    let mut infer = |req: ModelInferRequest| -> Result<ModelInferResponse, tonic::Status> {
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), client.model_infer(req)).await
        })
        .expect("answered within 30 s")
        .map(tonic::Response::into_inner)
    };
    let counters = &core.counters;
    let snapshot = || {
        (
            counters.shm_output_bytes_in_place.load(Ordering::Relaxed),
            counters.shm_output_bytes_copied.load(Ordering::Relaxed),
        )
    };

    // One object: region "lo" its first 2 MiB, "hi" the MiB after.
    let mib = 1u64 << 20;
    let obj = Object::new("io", 3 * mib);
    obj.file.write_all_at(&digits_input(), 0).expect("write x");
    let pattern: Vec<u8> = (0..mib).map(|i| (i * 7 % 251) as u8).collect();
    obj.file.write_all_at(&pattern, 2 * mib).expect("write t");
    rt.block_on(async {
        let mut c = GrpcInferenceServiceClient::connect(front.uri().replace("grpc://", "http://"))
            .await
            .expect("connect");
        for (name, offset, byte_size) in [("lo", 0, 2 * mib), ("hi", 2 * mib, mib)] {
            c.system_shared_memory_register(SystemSharedMemoryRegisterRequest {
                name: name.into(),
                key: obj.key.clone(),
                offset,
                byte_size,
            })
            .await
            .expect("register");
        }
    });
    let logits = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let close = |got: &[f32]| {
        let want = digits_expected();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    };

    // digits: x read from "lo", logits written into "lo" by ONNX Runtime.
    let before = snapshot();
    let r = infer(ModelInferRequest {
        model_name: "digits".into(),
        inputs: vec![input("x", "FP32", &[4, 64], Some(("lo", 1024)))],
        outputs: vec![output("logits", Some(("lo", 160, 4096)))],
        ..Default::default()
    })
    .expect("digits in shared memory");
    assert_eq!(r.raw_output_contents.len(), 1);
    assert!(r.raw_output_contents[0].is_empty(), "no logits inline");
    close(&logits(&obj.read(4096, 160)));
    assert_eq!(snapshot(), (before.0 + 160, before.1), "written in place");

    // The same with the logits inline: nothing moves into shared memory.
    let before = snapshot();
    let r = infer(ModelInferRequest {
        model_name: "digits".into(),
        inputs: vec![input("x", "FP32", &[4, 64], Some(("lo", 1024)))],
        outputs: vec![output("logits", None)],
        ..Default::default()
    })
    .expect("digits, logits inline");
    close(&logits(&r.raw_output_contents[0]));
    assert_eq!(snapshot(), before);

    // identity: 1 MiB read from "hi", copied once into "lo" at 1 MiB, by
    // the data mover, before the response (inside compute_output).
    let moved = || {
        let s = server::movers().stats();
        Mover::ALL.iter().map(|&m| s.bytes_of(m)).sum::<u64>()
    };
    let moved_before = moved();
    let before = snapshot();
    infer(ModelInferRequest {
        model_name: "identity".into(),
        inputs: vec![input("t", "UINT8", &[mib as i64], Some(("hi", mib)))],
        outputs: vec![output("t", Some(("lo", mib, mib)))],
        ..Default::default()
    })
    .expect("identity in shared memory");
    assert!(obj.read(mib, mib as usize) == pattern, "the output's bytes");
    assert_eq!(snapshot(), (before.0, before.1 + mib), "copied once");
    assert!(moved() >= moved_before + mib, "by the data mover");

    // An output that does not fit its place is refused before the run,
    // and moves nothing.
    let before = snapshot();
    let e = infer(ModelInferRequest {
        model_name: "identity".into(),
        inputs: vec![input("t", "UINT8", &[mib as i64], Some(("hi", mib)))],
        outputs: vec![output("t", Some(("lo", mib - 1, 0)))],
        ..Default::default()
    })
    .expect_err("too small");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("output 't'"), "{}", e.message());
    assert_eq!(snapshot(), before);
    front.shutdown();
}
