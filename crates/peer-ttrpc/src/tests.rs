//! Server and client together over unix://, tcp:// and tcp://?nodelay=0.

use crate::protocols::inference::{InferRequest, Tensor};
use crate::{Client, PeerError, Request, Server};
use engine::{
    Backend, DType, EngineError, IdentityBackend, ModelSignature, OrtBackend, OrtOptions, Output,
    OutputData, TensorView,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use ttrpc::Code;
use wire::AlignedBuf;

/// Returns input 0 twice (exercises the second-alias copy) plus an owned
/// output, and an out-of-range alias when given no inputs.
struct Twice {
    signature: ModelSignature,
}

impl Backend for Twice {
    fn signature(&self) -> &ModelSignature {
        &self.signature
    }
    fn check_inputs(&self, _inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        Ok(())
    }
    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        let Some(first) = inputs.first() else {
            return Ok(vec![Output {
                dtype: DType::U8,
                shape: vec![1],
                data: OutputData::Input(7),
            }]);
        };
        let owned = AlignedBuf::copy_from(&[42, 43])
            .map_err(|e| EngineError::OutOfMemory(e.to_string()))?;
        Ok(vec![
            Output {
                dtype: first.dtype,
                shape: first.shape.to_vec(),
                data: OutputData::Input(0),
            },
            Output {
                dtype: first.dtype,
                shape: first.shape.to_vec(),
                data: OutputData::Input(0),
            },
            Output {
                dtype: DType::U8,
                shape: vec![2],
                data: OutputData::Owned(owned),
            },
        ])
    }
}

fn models() -> Vec<(String, Arc<dyn Backend>)> {
    let twice = Twice {
        signature: ModelSignature {
            name: "twice".into(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        },
    };
    vec![
        ("identity".into(), Arc::new(IdentityBackend::new())),
        ("twice".into(), Arc::new(twice)),
    ]
}

/// A server on each transport. The temp dir keeps the unix socket alive.
fn servers() -> Vec<(Server, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("ttrpc.sock");
    let unix = Server::start(&format!("unix://{}", sock.display()), models()).expect("unix");
    let tcp = Server::start("tcp://127.0.0.1:0", models()).expect("tcp");
    let nagle = Server::start("tcp://127.0.0.1:0?nodelay=0", models()).expect("tcp nodelay=0");
    vec![(unix, Some(dir)), (tcp, None), (nagle, None)]
}

/// One call, retried once on a lost response. ttrpc 0.10 now and then
/// loses a response under CPU load (see [`Client::connect`]; it happened
/// here after a successful probe, while the rest of the suite compiled,
/// and again in CI on a plain `call`): a call that timed out is made once
/// more on a fresh connection, so these tests check this crate's server
/// rather than that flaw. Any other error is returned as it is.
fn retried<T>(
    client: &mut Client,
    mut call: impl FnMut(&mut Client) -> Result<T, PeerError>,
) -> Result<T, PeerError> {
    match call(client) {
        Err(PeerError::Call(ttrpc::Error::Others(m))) if m.contains("timeout") => {
            eprintln!("ttrpc lost a response ({m}); calling again on a new connection");
            *client = Client::connect(client.uri())?;
            call(client)
        }
        r => r,
    }
}

/// [`Client::infer`] through [`retried`]: the output tensors.
fn call_tensors(client: &mut Client, req: &Request) -> Result<Vec<Tensor>, PeerError> {
    retried(client, |c| Ok(c.infer(req)?.outputs))
}

/// [`Client::call`] through [`retried`].
fn call(client: &mut Client, req: &Request) -> Result<crate::Reply, PeerError> {
    retried(client, |c| c.call(req))
}

fn status_code(r: Result<impl std::fmt::Debug, PeerError>) -> (Code, String) {
    match r {
        Err(PeerError::Status { code, message }) => (code, message),
        other => panic!("expected an error status, got {other:?}"),
    }
}

#[test]
fn uris_are_real_and_keep_nodelay() {
    for (server, _dir) in servers() {
        let uri = server.uri().to_string();
        if uri.starts_with("tcp://") {
            let ep = transport::Endpoint::parse(&uri).expect("uri parses");
            let transport::Endpoint::Tcp { addr, .. } = ep else {
                panic!("{uri}")
            };
            assert!(!addr.ends_with(":0"), "port 0 resolved: {uri}");
        }
        server.shutdown();
    }
    let servers = servers();
    assert!(servers[0].0.uri().starts_with("unix://"));
    assert!(!servers[1].0.uri().contains("nodelay"));
    assert!(servers[2].0.uri().ends_with("?nodelay=0"));
}

#[test]
fn identity_round_trips_on_every_transport() {
    for (server, _dir) in servers() {
        let uri = server.uri().to_string();
        let mut client = Client::connect(&uri).expect("connect");

        // The empty RPC.
        let empty = client.prepare("identity", &[]);
        for _ in 0..3 {
            let reply = call(&mut client, &empty).expect("empty call");
            assert_eq!((reply.outputs, reply.output_bytes), (0, 0), "{uri}");
        }

        // 1 KiB of U8.
        let kib: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
        let req = client.prepare("identity", &[TensorView::new(DType::U8, &[1024], &kib)]);
        assert_eq!(req.input_bytes(), 1024);
        let reply = call(&mut client, &req).expect("1 KiB call");
        assert_eq!((reply.outputs, reply.output_bytes), (1, 1024), "{uri}");
        let out = call_tensors(&mut client, &req).expect("1 KiB call");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].dtype, "uint8");
        assert_eq!(out[0].shape, vec![1024]);
        assert_eq!(out[0].data, kib, "{uri}: 1 KiB echoed");

        // F32 [2, 3].
        let values = [1.5f32, -2.0, 3.25, 0.0, f32::MAX, -0.125];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let req = client.prepare("identity", &[TensorView::new(DType::F32, &[2, 3], &bytes)]);
        let out = call_tensors(&mut client, &req).expect("f32 call");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].dtype, "float32");
        assert_eq!(out[0].shape, vec![2, 3]);
        let echoed: Vec<f32> = out[0]
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(echoed, values, "{uri}: f32 echoed");

        // Several tensors, including an empty one, in order.
        let a = [9u8; 8];
        let req = client.prepare(
            "identity",
            &[
                TensorView::new(DType::I64, &[1], &a),
                TensorView::new(DType::F16, &[0, 4], &[]),
                TensorView::new(DType::Bool, &[2, 1], &[1, 0]),
            ],
        );
        let out = call_tensors(&mut client, &req).expect("three tensors");
        let got: Vec<(&str, &[u64], &[u8])> = out
            .iter()
            .map(|t| (t.dtype.as_str(), t.shape.as_slice(), t.data.as_slice()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("int64", &[1u64][..], &a[..]),
                ("float16", &[0, 4][..], &[][..]),
                ("bool", &[2, 1][..], &[1, 0][..]),
            ]
        );
        server.shutdown();
    }
}

#[test]
fn repeated_aliases_and_owned_outputs() {
    for (server, _dir) in servers() {
        let mut client = Client::connect(server.uri()).expect("connect");
        let data = [1u8, 2, 3, 4];
        let req = client.prepare("twice", &[TensorView::new(DType::U16, &[2], &data)]);
        let out = call_tensors(&mut client, &req).expect("twice");
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].data, data);
        assert_eq!(out[1].data, data);
        assert_eq!(out[2].data, [42, 43]);
        assert_eq!(out[2].dtype, "uint8");
        assert_eq!(
            call(&mut client, &req).expect("twice"),
            crate::Reply {
                outputs: 3,
                output_bytes: 10
            }
        );
        // An engine output naming a missing input is INTERNAL, not a panic.
        let missing = client.prepare("twice", &[]);
        let (code, message) = status_code(call(&mut client, &missing));
        assert_eq!(code, Code::INTERNAL, "{message}");
        assert!(call(&mut client, &req).is_ok(), "still serving");
    }
}

#[test]
fn bad_requests_are_errors_and_the_server_keeps_serving() {
    for (server, _dir) in servers() {
        let uri = server.uri().to_string();
        let mut client = Client::connect(&uri).expect("connect");
        let ok = client.prepare("identity", &[TensorView::new(DType::U8, &[3], &[1, 2, 3])]);

        let nope = client.prepare("nope", &[]);
        let (code, message) = status_code(call(&mut client, &nope));
        assert_eq!(code, Code::NOT_FOUND, "{uri}: {message}");
        assert!(
            message.contains("'nope'") && message.contains("identity"),
            "{message}"
        );
        assert!(
            call(&mut client, &ok).is_ok(),
            "{uri}: serving after unknown model"
        );

        // Shape says 4 float32 (16 bytes); 12 bytes are sent.
        let data = [0u8; 12];
        let bad = client.prepare("identity", &[TensorView::new(DType::F32, &[4], &data)]);
        let (code, message) = status_code(call(&mut client, &bad));
        assert_eq!(code, Code::INVALID_ARGUMENT, "{uri}: {message}");
        assert!(
            message.contains("16 bytes") && message.contains("12"),
            "{message}"
        );
        assert!(
            call(&mut client, &ok).is_ok(),
            "{uri}: serving after bad length"
        );

        // Hand-made malformed messages: unknown dtype, overflowing shape.
        let mut raw = InferRequest::new();
        raw.model = "identity".into();
        let mut t = Tensor::new();
        t.dtype = "complex128".into();
        t.shape = vec![1];
        t.data = vec![0; 16];
        raw.inputs.push(t);
        let (code, message) = status_code(call(&mut client, &Request { msg: raw.clone() }));
        assert_eq!(code, Code::INVALID_ARGUMENT, "{message}");
        assert!(message.contains("complex128"), "{message}");

        raw.inputs[0].dtype = "float64".into();
        raw.inputs[0].shape = vec![u64::MAX, 2];
        let (code, message) = status_code(call(&mut client, &Request { msg: raw }));
        assert_eq!(code, Code::INVALID_ARGUMENT, "{message}");
        assert!(message.contains("too large"), "{message}");

        // A second client is served too.
        let mut other = Client::connect(&uri).expect("second client");
        assert!(other.call(&ok).is_ok());
        assert!(
            call(&mut client, &ok).is_ok(),
            "{uri}: serving after malformed"
        );
        server.shutdown();
    }
}

#[test]
fn bad_uris_and_models_are_rejected_clearly() {
    for uri in ["shm://agent", "inproc://x", "vsock://3:1024"] {
        let e = Server::start(uri, models()).expect_err(uri).to_string();
        assert!(e.contains("unix:// and tcp:// only"), "{e}");
        let e = Client::connect(uri).expect_err(uri).to_string();
        assert!(e.contains("unix:// and tcp:// only"), "{e}");
    }
    for uri in ["http://x:1", "vsock://3", "127.0.0.1:80"] {
        assert!(
            matches!(Server::start(uri, models()), Err(PeerError::BadUri(_))),
            "{uri}"
        );
        assert!(
            matches!(Client::connect(uri), Err(PeerError::BadUri(_))),
            "{uri}"
        );
    }
    let mut twice = models();
    twice.push(("identity".into(), Arc::new(IdentityBackend::new())));
    let e = Server::start("tcp://127.0.0.1:0", twice).expect_err("duplicate");
    assert!(
        matches!(e, PeerError::DuplicateModel(ref n) if n == "identity"),
        "{e}"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let missing = format!("unix://{}", dir.path().join("none.sock").display());
    assert!(matches!(
        Client::connect(&missing),
        Err(PeerError::Io { .. })
    ));
}

#[test]
fn unix_socket_files_are_managed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("s.sock");
    let uri = format!("unix://{}", path.display());
    // A stale socket file (nobody listening) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale"));
    assert!(path.exists());
    let server = Server::start(&uri, models()).expect("replaces a stale socket");
    // A live one is not.
    let e = Server::start(&uri, models()).expect_err("live socket");
    assert!(e.to_string().contains("another process"), "{e}");
    server.shutdown();
    assert!(!path.exists(), "socket file removed on shutdown");
}

#[test]
fn shutdown_with_connected_clients_finishes() {
    for (server, _dir) in servers() {
        let uri = server.uri().to_string();
        let mut client = Client::connect(&uri).expect("connect");
        let req = client.prepare("identity", &[]);
        call(&mut client, &req).expect("call");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            server.shutdown();
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{uri}: shutdown hung"));
        assert!(
            matches!(Client::connect(&uri), Err(PeerError::Io { .. })),
            "{uri}: nobody listens after shutdown"
        );
        // The old connection is closed. Over unix the next call fails at
        // once (EPIPE). Over tcp the first write after the server's FIN
        // still succeeds and ttrpc's sync client, whose receiver thread has
        // exited, waits out the call timeout, so it is not tried here.
        if uri.starts_with("unix://") {
            assert!(client.call(&req).is_err(), "{uri}: connection closed");
        }
        // Dropping a server also stops it.
        drop(Server::start(&uri, models()).expect("restart on the same address"));
    }
}

#[test]
fn tcp_nodelay_is_set_on_accepted_connections() {
    // Linux copies TCP_NODELAY from the listening socket to accepted ones;
    // that is how the server side gets it (ttrpc accepts the connections).
    for (uri, want) in [
        ("tcp://127.0.0.1:0", true),
        ("tcp://127.0.0.1:0?nodelay=0", false),
    ] {
        let ep = transport::Endpoint::parse(uri).expect("uri");
        let (listening, bound) = crate::server::bind(&ep).expect("bind");
        let crate::server::Listening::Tcp(listener) = &listening else {
            panic!("tcp")
        };
        let addr = bound
            .trim_start_matches("tcp://")
            .trim_end_matches("?nodelay=0")
            .to_string();
        let _peer = std::net::TcpStream::connect(&addr).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        assert_eq!(accepted.nodelay().expect("nodelay"), want, "{uri}");
    }
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn ort_model_over_ttrpc() {
    let model = repo_file("models/build/digits_mlp.onnx");
    if !model.is_file() {
        println!(
            "SKIPPED ort_model_over_ttrpc: {} not built (run scripts/setup.sh)",
            model.display()
        );
        return;
    }
    let backend = OrtBackend::load("digits_mlp", &model, &OrtOptions::default())
        .unwrap_or_else(|e| panic!("loading {}: {e}", model.display()));
    let models: Vec<(String, Arc<dyn Backend>)> = vec![("digits_mlp".into(), Arc::new(backend))];
    let server = Server::start("tcp://127.0.0.1:0", models).expect("server");
    let mut client = Client::connect(server.uri()).expect("connect");

    let input_file = repo_file("models/build/digits_mlp_input.bin");
    let expected_file = repo_file("models/build/digits_mlp_expected.bin");
    let input = std::fs::read(&input_file).unwrap_or_else(|_| vec![0u8; 4 * 64 * 4]);
    assert_eq!(input.len(), 4 * 64 * 4);
    let req = client.prepare(
        "digits_mlp",
        &[TensorView::new(DType::F32, &[4, 64], &input)],
    );
    let out = call_tensors(&mut client, &req).expect("ort call");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].dtype, "float32");
    assert_eq!(out[0].shape, vec![4, 10]);
    assert_eq!(out[0].data.len(), 4 * 10 * 4);
    if let Ok(expected) = std::fs::read(&expected_file) {
        let (got, want) = (f32s(&out[0].data), f32s(&expected));
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-4, "logits differ by {diff}");
    }
    let reply = call(&mut client, &req).expect("ort call");
    assert_eq!((reply.outputs, reply.output_bytes), (1, 160));

    // The signature is enforced: wrong width is INVALID_ARGUMENT.
    let narrow = vec![0u8; 4 * 63 * 4];
    let bad = client.prepare(
        "digits_mlp",
        &[TensorView::new(DType::F32, &[4, 63], &narrow)],
    );
    let (code, message) = status_code(call(&mut client, &bad));
    assert_eq!(code, Code::INVALID_ARGUMENT, "{message}");
    assert!(call(&mut client, &req).is_ok());
    server.shutdown();
}
