//! Round trips through a real server on a Unix socket and on TCP.

use engine::{Backend, IdentityBackend, OrtBackend, OrtOptions, TensorView};
use peer_grpc::{Client, DType, PeerError, Reply, Request, Server};
use std::path::PathBuf;
use std::sync::Arc;

fn identity() -> Vec<(String, Arc<dyn Backend>)> {
    vec![("identity".to_string(), Arc::new(IdentityBackend::new()))]
}

/// A server on each address kind; the temp dir keeps the socket path alive.
fn servers() -> (tempfile::TempDir, Vec<Server>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("grpc.sock");
    let uris = [
        format!("unix://{}", sock.display()),
        "tcp://127.0.0.1:0".to_string(),
        "tcp://127.0.0.1:0?nodelay=0".to_string(),
    ];
    let servers = uris
        .iter()
        .map(|u| Server::start(u, identity()).unwrap_or_else(|e| panic!("{u}: {e}")))
        .collect();
    (dir, servers)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn bound_uris() {
    let (dir, servers) = servers();
    assert_eq!(
        servers[0].uri(),
        format!("unix://{}", dir.path().join("grpc.sock").display())
    );
    let tcp = servers[1].uri();
    assert!(
        tcp.starts_with("tcp://127.0.0.1:") && !tcp.ends_with(":0"),
        "{tcp}"
    );
    let slow = servers[2].uri();
    assert!(
        slow.ends_with("?nodelay=0") && !slow.contains(":0?"),
        "{slow}"
    );
    for s in servers {
        s.shutdown();
    }
    assert!(
        !dir.path().join("grpc.sock").exists(),
        "socket file removed"
    );
}

#[test]
fn identity_round_trips_on_every_transport() {
    let (_dir, servers) = servers();
    let kib: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let floats = f32_bytes(&[1.0, -2.5, 3.25, 0.0, 1e-3, 42.0]);
    for server in &servers {
        let uri = server.uri();
        let mut client = Client::connect(uri).unwrap_or_else(|e| panic!("{uri}: {e}"));

        // The empty RPC: no tensors either way.
        let empty = client.prepare("identity", &[]);
        for _ in 0..3 {
            let r = client.call(&empty).expect("empty call");
            assert_eq!(
                r,
                Reply {
                    outputs: 0,
                    output_bytes: 0
                },
                "{uri}"
            );
        }

        let inputs = [
            TensorView::new(DType::U8, &[1024], &kib),
            TensorView::new(DType::F32, &[2, 3], &floats),
        ];
        let req = client.prepare("identity", &inputs);
        assert_eq!(req.input_bytes(), 1024 + 24);
        let r = client.call(&req).expect("call");
        assert_eq!(
            r,
            Reply {
                outputs: 2,
                output_bytes: 1024 + 24
            },
            "{uri}"
        );
        let outs = client.call_outputs(&req).expect("call_outputs");
        assert_eq!(outs.len(), 2);
        assert_eq!(outs[0].name, "INPUT0");
        assert_eq!(
            (outs[0].dtype, outs[0].shape.as_slice()),
            (DType::U8, &[1024][..])
        );
        assert_eq!(&outs[0].data[..], &kib[..]);
        assert_eq!(
            (outs[1].dtype, outs[1].shape.as_slice()),
            (DType::F32, &[2, 3][..])
        );
        assert_eq!(&outs[1].data[..], &floats[..]);

        // A zero-byte tensor.
        let none = client.prepare("identity", &[TensorView::new(DType::I64, &[0, 4], &[])]);
        let outs = client.call_outputs(&none).expect("zero-size tensor");
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].shape, vec![0, 4]);
        assert!(outs[0].data.is_empty());
    }
    for s in servers {
        s.shutdown();
    }
}

#[test]
fn bad_requests_get_statuses_and_the_server_keeps_serving() {
    let (_dir, servers) = servers();
    let data = [0u8; 16];
    for server in &servers {
        let uri = server.uri();
        let mut client = Client::connect(uri).expect("connect");

        let e = client
            .call(&client.prepare("nope", &[]))
            .expect_err("unknown model");
        assert_eq!(e.code(), Some(peer_grpc::Code::NotFound), "{e}");
        assert!(e.to_string().contains("'nope'"), "{e}");

        let good = client.prepare("identity", &[TensorView::new(DType::F32, &[4], &data)]);
        let mut malformed = [
            good.proto().clone(),
            good.proto().clone(),
            good.proto().clone(),
            good.proto().clone(),
        ];
        // Contents one byte short of what FP32[4] needs.
        malformed[0].raw_input_contents[0] = bytes::Bytes::from_static(&[0u8; 15]);
        // An unknown datatype.
        malformed[1].inputs[0].datatype = "BYTES".into();
        // A negative dimension.
        malformed[2].inputs[0].shape = vec![-4];
        // Typed contents instead of raw (no raw_input_contents).
        malformed[3].raw_input_contents.clear();
        for (m, needle) in malformed.into_iter().zip([
            "needs 16 bytes",
            "datatype 'BYTES'",
            "negative dimension",
            "raw_input_contents",
        ]) {
            let e = client.call(&Request::from(m)).expect_err(needle);
            assert_eq!(e.code(), Some(peer_grpc::Code::InvalidArgument), "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        }

        // Same connection, still served.
        let r = client.call(&good).expect("server still serving");
        assert_eq!(r.output_bytes, 16);
        // And a fresh connection.
        let mut again = Client::connect(uri).expect("reconnect");
        assert_eq!(again.call(&good).expect("call").outputs, 1);
    }
    for s in servers {
        s.shutdown();
    }
}

#[test]
fn connect_and_start_errors_are_clear() {
    for (uri, needle) in [
        ("shm://agent", "unix:// and tcp:// only"),
        ("http://127.0.0.1:1", "unknown scheme"),
    ] {
        let e = Client::connect(uri).expect_err(uri);
        assert!(
            matches!(e, PeerError::BadAddress { .. }) && e.to_string().contains(needle),
            "{e}"
        );
        let e = Server::start(uri, identity()).expect_err(uri);
        assert!(matches!(e, PeerError::BadAddress { .. }), "{e}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = format!("unix://{}", dir.path().join("none.sock").display());
    let e = Client::connect(&missing).expect_err("nobody there");
    assert!(matches!(e, PeerError::Connect { .. }), "{e}");

    let e = Server::start(
        "tcp://127.0.0.1:0",
        vec![
            (
                "a".into(),
                Arc::new(IdentityBackend::new()) as Arc<dyn Backend>,
            ),
            (
                "a".into(),
                Arc::new(IdentityBackend::new()) as Arc<dyn Backend>,
            ),
        ],
    )
    .expect_err("duplicate");
    assert!(matches!(e, PeerError::DuplicateModel(_)), "{e}");

    // A live socket is not taken over; a stale one is.
    let sock = format!("unix://{}", dir.path().join("live.sock").display());
    let first = Server::start(&sock, identity()).expect("first");
    let e = Server::start(&sock, identity()).expect_err("in use");
    assert!(matches!(e, PeerError::Listen { .. }), "{e}");
    first.shutdown();
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    let s = Server::start(&format!("unix://{}", stale.display()), identity()).expect("stale");
    assert_eq!(
        Client::connect(s.uri())
            .expect("connect")
            .call(&Request::from(peer_grpc::proto::ModelInferRequest {
                model_name: "identity".into(),
                ..Default::default()
            }))
            .expect("call")
            .outputs,
        0
    );
    s.shutdown();
}

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/build")
}

#[test]
fn onnx_runtime_model() {
    let dir = models_dir();
    let path = dir.join("digits_mlp.onnx");
    if !path.exists() {
        println!(
            "skipped: {} not built (run scripts/setup.sh)",
            path.display()
        );
        return;
    }
    let backend = match OrtBackend::load("digits_mlp", &path, &OrtOptions::default()) {
        Ok(b) => b,
        Err(e) => {
            println!("skipped: cannot load {}: {e}", path.display());
            return;
        }
    };
    let input = std::fs::read(dir.join("digits_mlp_input.bin")).expect("input");
    let expected = std::fs::read(dir.join("digits_mlp_expected.bin")).expect("expected");
    assert_eq!(input.len(), 4 * 64 * 4);

    let tcp = Server::start(
        "tcp://127.0.0.1:0",
        vec![("digits".to_string(), Arc::new(backend) as Arc<dyn Backend>)],
    )
    .expect("start");
    let mut client = Client::connect(tcp.uri()).expect("connect");
    let req = client.prepare("digits", &[TensorView::new(DType::F32, &[4, 64], &input)]);
    let r = client.call(&req).expect("call");
    assert_eq!(
        r,
        Reply {
            outputs: 1,
            output_bytes: 4 * 10 * 4
        }
    );
    let outs = client.call_outputs(&req).expect("call_outputs");
    assert_eq!(outs[0].name, "logits");
    assert_eq!(
        (outs[0].dtype, outs[0].shape.as_slice()),
        (DType::F32, &[4, 10][..])
    );
    for (i, (got, want)) in outs[0]
        .data
        .chunks_exact(4)
        .zip(expected.chunks_exact(4))
        .enumerate()
    {
        let g = f32::from_le_bytes([got[0], got[1], got[2], got[3]]);
        let w = f32::from_le_bytes([want[0], want[1], want[2], want[3]]);
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "logit {i}: {g} vs {w}"
        );
    }

    // Wrong shape for the model: the engine's check, as InvalidArgument.
    let wrong = client.prepare(
        "digits",
        &[TensorView::new(DType::F32, &[4, 63], &input[..4 * 63 * 4])],
    );
    let e = client.call(&wrong).expect_err("wrong shape");
    assert_eq!(e.code(), Some(peer_grpc::Code::InvalidArgument), "{e}");
    tcp.shutdown();
}

/// Identity that takes its time, to have a call in flight at shutdown.
struct Slow(IdentityBackend);

impl Backend for Slow {
    fn signature(&self) -> &wire::ModelSignature {
        self.0.signature()
    }
    fn check_inputs(&self, inputs: &[(DType, &[u64])]) -> Result<(), engine::EngineError> {
        self.0.check_inputs(inputs)
    }
    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<engine::Output>, engine::EngineError> {
        std::thread::sleep(std::time::Duration::from_millis(300));
        self.0.run(inputs)
    }
}

#[test]
fn shutdown_finishes_calls_in_flight_and_does_not_wait_for_idle_clients() {
    let server = Server::start(
        "tcp://127.0.0.1:0",
        vec![(
            "slow".to_string(),
            Arc::new(Slow(IdentityBackend::new())) as Arc<dyn Backend>,
        )],
    )
    .expect("start");
    let uri = server.uri().to_string();
    // Connected but idle through the shutdown.
    let mut idle = Client::connect(&uri).expect("connect idle");
    let busy = std::thread::spawn(move || {
        let mut c = Client::connect(&uri).expect("connect busy");
        let req = c.prepare("slow", &[TensorView::new(DType::U8, &[3], &[1, 2, 3])]);
        c.call(&req)
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    let t = std::time::Instant::now();
    server.shutdown();
    let took = t.elapsed();
    let r = busy
        .join()
        .expect("thread")
        .expect("call in flight finished");
    assert_eq!(r.output_bytes, 3);
    assert!(
        took < std::time::Duration::from_secs(2),
        "shutdown took {took:?}"
    );
    let e = idle
        .call(&idle.prepare("slow", &[]))
        .expect_err("server is gone");
    assert!(matches!(e, PeerError::Status { .. }), "{e}");
}
