//! The KServe v2 gRPC front door of a real `tensorwire serve` process
//! (`--listen grpc://127.0.0.1:0`), driven by the tonic client generated in
//! the frontend crate: health and metadata, digits inference against the
//! Python reference, identity round trips of every dtype, and each bad
//! request answered with the right gRPC code and a message naming the
//! problem while the agent keeps serving.

use common::{digits_expected, digits_input, digits_model, ServeProcess};
use frontend::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use frontend::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use frontend::proto::{
    InferTensorContents, ModelInferRequest, ModelInferResponse, ModelMetadataRequest,
    ModelReadyRequest, ServerLiveRequest, ServerMetadataRequest, ServerReadyRequest,
};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;
use wire::DType;

/// The largest request payload the agent under test takes.
const MAX_PAYLOAD: usize = 64 << 10;

struct Door {
    rt: tokio::runtime::Runtime,
    client: GrpcInferenceServiceClient<Channel>,
}

impl Door {
    fn connect(uri: &str) -> Door {
        let addr = uri
            .strip_prefix("grpc://")
            .unwrap_or_else(|| panic!("not a grpc uri: {uri}"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt
            .block_on(GrpcInferenceServiceClient::connect(format!(
                "http://{addr}"
            )))
            .expect("connect to the grpc front door");
        Door { rt, client }
    }

    fn infer(&mut self, req: ModelInferRequest) -> Result<ModelInferResponse, tonic::Status> {
        let fut = self.client.model_infer(req);
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), fut).await })
            .expect("ModelInfer answered within 30 s")
            .map(tonic::Response::into_inner)
    }

    fn refused(&mut self, req: ModelInferRequest, code: Code, needles: &[&str]) {
        let e = self.infer(req).expect_err("refused");
        assert_eq!(e.code(), code, "{}", e.message());
        for n in needles {
            assert!(e.message().contains(n), "'{n}' not in: {}", e.message());
        }
    }
}

fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        ..Default::default()
    }
}

fn raw_request(model: &str, inputs: Vec<(InferInputTensor, Vec<u8>)>) -> ModelInferRequest {
    let (tensors, raw): (Vec<_>, Vec<_>) = inputs
        .into_iter()
        .map(|(t, b)| (t, bytes::Bytes::from(b)))
        .unzip();
    ModelInferRequest {
        model_name: model.into(),
        inputs: tensors,
        raw_input_contents: raw,
        ..Default::default()
    }
}

fn digits_request() -> ModelInferRequest {
    raw_request(
        "digits",
        vec![(input("x", "FP32", &[4, 64]), digits_input())],
    )
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn check_digits(r: &ModelInferResponse) {
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(r.outputs[0].name, "logits");
    assert_eq!(r.outputs[0].datatype, "FP32");
    assert_eq!(r.outputs[0].shape, vec![4, 10]);
    let got = f32s(&r.raw_output_contents[0]);
    for (g, e) in got.iter().zip(digits_expected()) {
        assert!((g - e).abs() < 1e-4, "logit {g} vs reference {e}");
    }
}

#[test]
fn kserve_grpc_front_door() {
    let model = format!("digits={}", digits_model().display());
    let max_payload = MAX_PAYLOAD.to_string();
    let mut agent = ServeProcess::spawn(&[
        "--listen",
        "grpc://127.0.0.1:0",
        "--model",
        &model,
        "--max-payload",
        &max_payload,
    ]);
    let uri = agent.uris[1].clone();
    assert!(
        uri.starts_with("grpc://127.0.0.1:") && !uri.ends_with(":0"),
        "{uri}"
    );
    let mut door = Door::connect(&uri);
    let mut ok = 0u64;

    // Health and metadata.
    let c = &mut door.client;
    let live = door.rt.block_on(c.server_live(ServerLiveRequest {}));
    assert!(live.expect("ServerLive").into_inner().live);
    let ready = door.rt.block_on(c.server_ready(ServerReadyRequest {}));
    assert!(ready.expect("ServerReady").into_inner().ready);
    let meta = door
        .rt
        .block_on(c.server_metadata(ServerMetadataRequest {}))
        .expect("ServerMetadata")
        .into_inner();
    assert_eq!(meta.name, "tensorwire");
    assert_eq!(meta.version, env!("CARGO_PKG_VERSION"));
    for (name, version, want) in [
        ("digits", "", true),
        ("digits", "1", true),
        ("digits", "2", false),
        ("nope", "", false),
    ] {
        let r = door.rt.block_on(c.model_ready(ModelReadyRequest {
            name: name.into(),
            version: version.into(),
        }));
        assert_eq!(r.expect("ModelReady").into_inner().ready, want, "{name}");
    }
    let md = door
        .rt
        .block_on(c.model_metadata(ModelMetadataRequest {
            name: "digits".into(),
            version: String::new(),
        }))
        .expect("ModelMetadata")
        .into_inner();
    assert_eq!(md.name, "digits");
    assert_eq!(md.versions, vec!["1".to_string()]);
    assert_eq!(md.inputs.len(), 1);
    assert_eq!(
        (&md.inputs[0].name[..], &md.inputs[0].datatype[..]),
        ("x", "FP32")
    );
    assert_eq!(md.inputs[0].shape, vec![-1, 64]);
    assert_eq!(md.outputs[0].name, "logits");
    assert_eq!(md.outputs[0].shape, vec![-1, 10]);
    let id = door
        .rt
        .block_on(c.model_metadata(ModelMetadataRequest {
            name: "identity".into(),
            version: "1".into(),
        }))
        .expect("identity metadata")
        .into_inner();
    assert!(id.inputs.is_empty() && id.outputs.is_empty());
    for (name, version) in [("nope", ""), ("digits", "7")] {
        let e = door
            .rt
            .block_on(c.model_metadata(ModelMetadataRequest {
                name: name.into(),
                version: version.into(),
            }))
            .expect_err("not found");
        assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    }

    // Digits: raw contents, typed contents, version "1", requested output.
    let r = door.infer(digits_request()).expect("digits");
    check_digits(&r);
    ok += 1;
    let mut typed = digits_request();
    typed.raw_input_contents.clear();
    typed.inputs[0].contents = Some(InferTensorContents {
        fp32_contents: f32s(&digits_input()),
        ..Default::default()
    });
    typed.model_version = "1".into();
    typed.id = "req-7".into();
    typed.outputs = vec![InferRequestedOutputTensor {
        name: "logits".into(),
        ..Default::default()
    }];
    let r = door.infer(typed).expect("digits, typed contents");
    check_digits(&r);
    assert_eq!(r.id, "req-7");
    ok += 1;

    // Identity: every dtype round trips bit for bit, several inputs at once.
    let mut inputs = Vec::new();
    for (i, d) in DType::ALL.into_iter().enumerate() {
        let n = 3 + i;
        let bytes: Vec<u8> = (0..n * d.size())
            .map(|k| match d {
                DType::Bool => (k % 2) as u8,
                _ => (k * 7 + i) as u8,
            })
            .collect();
        let name = format!("t{i}");
        inputs.push((
            input(&name, frontend::kserve_datatype(d), &[1, n as i64]),
            bytes,
        ));
    }
    let r = door
        .infer(raw_request("identity", inputs.clone()))
        .expect("identity");
    assert_eq!(r.outputs.len(), inputs.len());
    for ((t, b), (o, raw)) in inputs
        .iter()
        .zip(r.outputs.iter().zip(&r.raw_output_contents))
    {
        assert_eq!(
            (&o.name, &o.datatype, &o.shape),
            (&t.name, &t.datatype, &t.shape)
        );
        assert_eq!(raw.as_ref(), &b[..], "{}", t.datatype);
    }
    ok += 1;
    // Typed contents of each dtype that has a typed field.
    let typed_cases: Vec<(&str, InferTensorContents, Vec<u8>)> = vec![
        (
            "BOOL",
            InferTensorContents {
                bool_contents: vec![true, false],
                ..Default::default()
            },
            vec![1, 0],
        ),
        (
            "INT8",
            InferTensorContents {
                int_contents: vec![-2, 5],
                ..Default::default()
            },
            vec![0xfe, 5],
        ),
        (
            "UINT16",
            InferTensorContents {
                uint_contents: vec![258, 1],
                ..Default::default()
            },
            vec![2, 1, 1, 0],
        ),
        (
            "INT64",
            InferTensorContents {
                int64_contents: vec![-1, 1],
                ..Default::default()
            },
            [(-1i64).to_le_bytes(), 1i64.to_le_bytes()].concat(),
        ),
        (
            "FP64",
            InferTensorContents {
                fp64_contents: vec![0.5, -2.0],
                ..Default::default()
            },
            [0.5f64.to_le_bytes(), (-2.0f64).to_le_bytes()].concat(),
        ),
    ];
    for (datatype, contents, want) in typed_cases {
        let mut t = input("v", datatype, &[2]);
        t.contents = Some(contents);
        let r = door
            .infer(ModelInferRequest {
                model_name: "identity".into(),
                inputs: vec![t],
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("{datatype}: {e}"));
        assert_eq!(r.raw_output_contents[0].as_ref(), &want[..], "{datatype}");
        ok += 1;
    }

    // Bad requests: the right code, a message naming the problem.
    let mut x = digits_request();
    x.model_name = "nope".into();
    door.refused(x, Code::NotFound, &["nope"]);
    let mut x = digits_request();
    x.model_version = "3".into();
    door.refused(x, Code::NotFound, &["version '3'"]);
    door.refused(
        raw_request("identity", vec![(input("s", "BYTES", &[1]), vec![1])]),
        Code::InvalidArgument,
        &["'s'", "BYTES"],
    );
    door.refused(
        raw_request("identity", vec![(input("q", "FLOAT32", &[1]), vec![0; 4])]),
        Code::InvalidArgument,
        &["'q'", "FLOAT32"],
    );
    door.refused(
        raw_request(
            "digits",
            vec![(input("x", "FP32", &[4, 64]), vec![0; 1000])],
        ),
        Code::InvalidArgument,
        &["'x'", "1024 bytes", "1000"],
    );
    door.refused(
        raw_request(
            "digits",
            vec![(input("x", "FP32", &[-4, 64]), vec![0; 1024])],
        ),
        Code::InvalidArgument,
        &["'x'", "negative"],
    );
    door.refused(
        raw_request(
            "digits",
            vec![(input("y", "FP32", &[4, 64]), digits_input())],
        ),
        Code::InvalidArgument,
        &["'y'", "'x'"],
    );
    door.refused(
        raw_request(
            "digits",
            vec![
                (input("x", "FP32", &[4, 64]), digits_input()),
                (input("z", "FP32", &[1]), vec![0; 4]),
            ],
        ),
        Code::InvalidArgument,
        &["'z'"],
    );
    door.refused(
        raw_request("digits", Vec::new()),
        Code::InvalidArgument,
        &["'x'"],
    );
    door.refused(
        raw_request(
            "digits",
            vec![(input("x", "FP64", &[4, 64]), vec![0; 2048])],
        ),
        Code::InvalidArgument,
        &["'x'", "float32"],
    );
    door.refused(
        raw_request(
            "digits",
            vec![(input("x", "FP32", &[4, 63]), vec![0; 1008])],
        ),
        Code::InvalidArgument,
        &["'x'"],
    );
    let mut x = digits_request();
    x.outputs = vec![InferRequestedOutputTensor {
        name: "probs".into(),
        ..Default::default()
    }];
    door.refused(x, Code::InvalidArgument, &["'probs'"]);
    let mut x = digits_request();
    x.raw_input_contents
        .push(bytes::Bytes::from_static(&[0; 4]));
    door.refused(x, Code::InvalidArgument, &["raw_input_contents"]);
    let mut t = input("h", "FP16", &[1]);
    t.contents = Some(InferTensorContents {
        fp32_contents: vec![1.0],
        ..Default::default()
    });
    door.refused(
        ModelInferRequest {
            model_name: "identity".into(),
            inputs: vec![t],
            ..Default::default()
        },
        Code::InvalidArgument,
        &["'h'", "raw_input_contents"],
    );
    let mut t = input("u", "UINT8", &[1]);
    t.contents = Some(InferTensorContents {
        uint_contents: vec![300],
        ..Default::default()
    });
    door.refused(
        ModelInferRequest {
            model_name: "identity".into(),
            inputs: vec![t],
            ..Default::default()
        },
        Code::InvalidArgument,
        &["'u'", "UINT8"],
    );
    // Over the agent's max_payload: the agent's limit, not tonic's.
    let big = MAX_PAYLOAD + 64;
    door.refused(
        raw_request(
            "identity",
            vec![(input("big", "UINT8", &[big as i64]), vec![0; big])],
        ),
        Code::ResourceExhausted,
        &["'big'", "max_payload"],
    );

    // ModelStreamInfer: answers in order; a failed request is an
    // error_message and the stream goes on.
    let mut bad = digits_request();
    bad.model_name = "nope".into();
    let reqs = tokio_stream::iter(vec![digits_request(), bad, digits_request()]);
    let answers: Vec<_> = door.rt.block_on(async {
        let mut s = door
            .client
            .model_stream_infer(reqs)
            .await
            .expect("ModelStreamInfer")
            .into_inner();
        let mut v = Vec::new();
        while let Some(a) = s.message().await.expect("stream message") {
            v.push(a);
        }
        v
    });
    assert_eq!(answers.len(), 3);
    check_digits(answers[0].infer_response.as_ref().expect("first answered"));
    assert!(
        answers[1].error_message.contains("'nope'"),
        "{:?}",
        answers[1]
    );
    check_digits(answers[2].infer_response.as_ref().expect("third answered"));
    ok += 2;

    // Still serving, over gRPC and over the native protocol.
    check_digits(
        &door
            .infer(digits_request())
            .expect("digits after bad requests"),
    );
    ok += 1;
    common::identity_roundtrip(&agent.uris[0], "native, after bad gRPC requests");

    // The same core: its response counter includes the gRPC requests.
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "serve exited with {status}");
    let log = agent.stderr();
    let responses: u64 = log
        .split("stopped (")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no response count in:\n{log}"));
    assert!(
        responses > ok,
        "{responses} responses counted, {ok} gRPC successes (+ native)"
    );
}
