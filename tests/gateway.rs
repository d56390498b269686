//! The gateway (`tensorwire gateway`) as its users see it: a real agent
//! process on `unix://` and `shm://`, a real gateway process in front of it
//! listening on tcp, clients of the gateway over tcp. Ping, model lookups,
//! a real model, pipelining, a large tensor; the agent killed (clients get
//! `unavailable` promptly) and started again (new sessions work); malformed
//! bytes from one client end only that client's session.

use client::{Client, ClientError, DType, TensorRef};
use common::{
    digits_expected, digits_input, digits_model, pattern, request, request_from_descs, shm_dir,
    tensorwire_command, wait_until, within, RawPeer, ServeProcess,
};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use wire::{Header, Kind, Status, TensorDesc};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A `tensorwire gateway` child process listening on tcp loopback.
struct GatewayProcess {
    child: Child,
    /// `tcp://127.0.0.1:PORT`.
    uri: String,
}

impl GatewayProcess {
    fn spawn(upstream: &str) -> GatewayProcess {
        GatewayProcess::spawn_with(upstream, &["--listen", "tcp://127.0.0.1:0"])
    }

    fn spawn_with(upstream: &str, args: &[&str]) -> GatewayProcess {
        GatewayProcess::spawn_listening(upstream, args, 1).0
    }

    /// Starts the gateway and waits for its first `lines` `listening on`
    /// lines; returns their URIs too.
    fn spawn_listening(
        upstream: &str,
        args: &[&str],
        lines: usize,
    ) -> (GatewayProcess, Vec<String>) {
        let mut child = tensorwire_command()
            .arg("gateway")
            .args(args)
            .arg("--upstream")
            .arg(upstream)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tensorwire gateway");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let uris: Vec<String> = (0..lines)
            .map(|_| {
                let line = rx
                    .recv_timeout(Duration::from_secs(30))
                    .expect("the gateway prints `listening on URI`");
                line.strip_prefix("listening on ")
                    .unwrap_or_else(|| panic!("unexpected line {line:?}"))
                    .trim()
                    .to_string()
            })
            .collect();
        let uri = uris[0].clone();
        (GatewayProcess { child, uri }, uris)
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An agent serving the digits MLP on unix (always) and `shm://name`.
fn agent_in(dir: &Path, shm_name: &str) -> ServeProcess {
    let model = format!("digits={}", digits_model().display());
    let shm = format!("shm://{shm_name}");
    ServeProcess::spawn_in(dir, &["--listen", &shm, "--model", &model])
}

/// The two upstreams of one agent: (name, uri).
fn upstreams(agent: &ServeProcess) -> Vec<(&'static str, String)> {
    vec![
        ("unix", agent.uris[0].clone()),
        ("shm", agent.uris[1].clone()),
    ]
}

fn fresh_shm_name() -> String {
    format!(
        "gw-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn is_unavailable(e: &ClientError) -> bool {
    match e {
        ClientError::Remote { status, .. } => *status == Status::Unavailable,
        // The session's end (an `unavailable` Error with id 0) reached the
        // client before its own request's answer.
        ClientError::AgentGone(m) => m.contains("unavailable"),
        _ => false,
    }
}

/// Everything a client does, through the gateway.
fn exercise(c: &Client, what: &str) {
    c.ping().unwrap_or_else(|e| panic!("{what}: ping: {e}"));
    common::check_identity(c, what);
    // A real model, checked against the Python reference.
    let digits = c.model("digits").unwrap_or_else(|e| panic!("{what}: {e}"));
    let x = digits_input();
    let r = digits
        .infer(&[TensorRef::new(DType::F32, &[4, 64], &x).expect("tensor")])
        .unwrap_or_else(|e| panic!("{what}: digits: {e}"));
    let got: Vec<f32> = r.outputs[0].to_vec().expect("f32 logits");
    for (g, e) in got.iter().zip(digits_expected()) {
        assert!((g - e).abs() < 1e-4, "{what}: logits {got:?}");
    }
    // The model list and an unknown model, answered by the agent.
    let names: Vec<String> = c
        .models()
        .expect("models")
        .into_iter()
        .map(|m| m.signature.name)
        .collect();
    assert!(names.contains(&"digits".to_string()), "{what}: {names:?}");
    assert!(matches!(c.model("nope"), Err(ClientError::UnknownModel(_))));
    // Pipelined: 64 requests in flight, answers matched by id.
    let id = c.model("identity").expect("identity");
    let bufs: Vec<Vec<u8>> = (0..64).map(|i| pattern(100 + 64 * i, i as u64)).collect();
    let tickets: Vec<_> = bufs
        .iter()
        .map(|b| {
            id.submit(&[TensorRef::new(DType::U8, &[b.len() as u64], b).expect("tensor")])
                .unwrap_or_else(|e| panic!("{what}: submit: {e}"))
        })
        .collect();
    for (t, b) in tickets.into_iter().zip(&bufs).rev() {
        let r = t
            .wait()
            .unwrap_or_else(|e| panic!("{what}: pipelined: {e}"));
        assert_eq!(r.outputs[0].bytes(), &b[..], "{what}");
    }
    // A few MiB, twice (the second reuses the gateway's buffers).
    for seed in [7, 8] {
        let big = pattern(5 << 20, seed);
        let r = id
            .infer(&[TensorRef::new(DType::U8, &[big.len() as u64], &big).expect("tensor")])
            .unwrap_or_else(|e| panic!("{what}: 5 MiB: {e}"));
        assert!(r.outputs[0].bytes() == &big[..], "{what}: 5 MiB corrupted");
    }
    // A timed request gets the agent's timeline through the gateway.
    let r = id
        .infer_timed(&[TensorRef::new(DType::U8, &[3], &[1, 2, 3]).expect("tensor")])
        .expect("timed");
    assert!(r.timeline.is_some(), "{what}: no timeline");
}

#[test]
fn relays_sessions_to_unix_and_shm_agents() {
    within(Duration::from_secs(240), "gateway relays", || {
        shm_dir();
        let dir = tempfile::tempdir().expect("tmp");
        let agent = agent_in(dir.path(), &fresh_shm_name());
        for (name, up) in upstreams(&agent) {
            let gw = GatewayProcess::spawn(&up);
            let what = format!("tcp -> gateway -> {name}");
            let c = Client::connect(&gw.uri).unwrap_or_else(|e| panic!("{what}: {e}"));
            exercise(&c, &what);
            // Two clients at once, each with its own upstream session.
            let c2 = Client::connect(&gw.uri).expect("second client");
            common::check_identity(&c2, &what);
            common::check_identity(&c, &what);
        }
    });
}

#[test]
fn an_agent_lost_and_back_is_unavailable_then_relayed_again() {
    within(Duration::from_secs(240), "gateway upstream loss", || {
        shm_dir();
        for kind in ["unix", "shm"] {
            let dir = tempfile::tempdir().expect("tmp");
            let shm_name = fresh_shm_name();
            let agent = agent_in(dir.path(), &shm_name);
            let up = if kind == "unix" {
                agent.uris[0].clone()
            } else {
                agent.uris[1].clone()
            };
            let gw = GatewayProcess::spawn(&up);
            let c = Client::connect(&gw.uri).expect("client");
            let id = c.model("identity").expect("identity");
            common::check_identity(&c, kind);

            // A request waiting in the agent when it dies.
            agent.freeze();
            let t = id
                .submit(&[TensorRef::new(DType::U8, &[3], &[1, 2, 3]).expect("tensor")])
                .expect("submit");
            std::thread::sleep(Duration::from_millis(50));
            let start = Instant::now();
            drop(agent);
            match t.wait() {
                Err(e) if is_unavailable(&e) => {}
                other => panic!("{kind}: in flight when the agent died: {other:?}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{kind}: unavailable came after {:?}",
                start.elapsed()
            );
            // The session is over; a new one is refused promptly.
            assert!(c.ping().is_err(), "{kind}: session survived its upstream");
            let start = Instant::now();
            match Client::connect(&gw.uri) {
                Err(e) if is_unavailable(&e) => {}
                other => panic!("{kind}: connect with the agent down: {other:?}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{kind}: slow refusal"
            );

            // The agent comes back: new sessions are relayed again.
            let _agent = agent_in(dir.path(), &shm_name);
            wait_until(
                Duration::from_secs(10),
                "relayed again",
                || match Client::connect(&gw.uri) {
                    Ok(c) => {
                        common::check_identity(&c, kind);
                        true
                    }
                    Err(e) => {
                        assert!(is_unavailable(&e), "{kind}: while the agent starts: {e}");
                        false
                    }
                },
            );
        }
    });
}

#[test]
fn malformed_bytes_end_only_their_own_session() {
    within(Duration::from_secs(120), "gateway malformed input", || {
        shm_dir();
        let dir = tempfile::tempdir().expect("tmp");
        let agent = agent_in(dir.path(), &fresh_shm_name());
        let gw = GatewayProcess::spawn(&agent.uris[1]);
        let good = Client::connect(&gw.uri).expect("client");
        common::check_identity(&good, "before");

        // Not a Hello first: refused and closed.
        let mut p = RawPeer::connect(&gw.uri);
        let mut h = Header::new(Kind::Ping);
        h.request_id = 5;
        p.send(&h, &[], &[]);
        p.expect_error(Status::UnknownKind, 5);
        p.expect_closed(Duration::from_secs(5));

        // Bad descriptors: that request is refused, the session goes on.
        let mut p = RawPeer::connect_hello(&gw.uri);
        let identity = p.model_id("identity");
        let bad = TensorDesc {
            dtype: DType::U8,
            shape: vec![10],
            offset: 8, // not 64-byte aligned
            len: 10,
        };
        let id = p.id();
        let (h, desc) = request_from_descs(id, identity, &[bad], 18);
        p.send(&h, &desc, &[0u8; 18]);
        p.expect_error(Status::Malformed, id);
        // A length that disagrees with its shape, as the agent would refuse it.
        let bad = TensorDesc {
            dtype: DType::F32,
            shape: vec![10],
            offset: 0,
            len: 10,
        };
        let id = p.id();
        let (h, desc) = request_from_descs(id, identity, &[bad], 10);
        p.send(&h, &desc, &[0u8; 10]);
        p.expect_error(Status::Malformed, id);
        p.ping();
        p.good_identity_request(identity);
        // An unknown model id: the agent's answer, relayed.
        let id = p.id();
        let data = [1u8; 4];
        let (h, desc, payload) = request(id, 999_999, &[(DType::U8, &[4], &data)], 0);
        p.send(&h, &desc, &payload);
        p.expect_error(Status::UnknownModel, id);

        // Garbage where a header should be: Error with id 0, closed.
        p.write(&[0xAB; 64]);
        p.expect_error(Status::BadMagic, 0);
        p.expect_closed(Duration::from_secs(5));

        // A header over the limits: refused before anything is read.
        let mut p = RawPeer::connect_hello(&gw.uri);
        let mut h = Header::new(Kind::Request);
        h.request_id = p.id();
        h.payload_len = u64::MAX / 2;
        p.send(&h, &[], &[]);
        p.expect_error(Status::LimitExceeded, 0);
        p.expect_closed(Duration::from_secs(5));

        // A client that stops halfway through a message is dropped, in time.
        let mut p = RawPeer::connect_hello(&gw.uri);
        let data = pattern(1000, 3);
        let (h, desc, payload) = request(p.id(), identity, &[(DType::U8, &[1000], &data)], 0);
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&desc);
        bytes.extend_from_slice(&payload[..100]);
        p.write(&bytes);

        // The well-behaved client never noticed.
        common::check_identity(&good, "after");
        drop(p);
    });
}

/// A self-signed certificate for 127.0.0.1: (dir holding them, cert, key).
fn self_signed() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().expect("tmp");
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("params");
    let cert = params.self_signed(&key).expect("certificate");
    let c = dir.path().join("gw.pem");
    let k = dir.path().join("gw.key");
    std::fs::write(&c, cert.pem()).expect("write certificate");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    let s = |p: &Path| p.to_str().expect("UTF-8 path").to_string();
    (dir, s(&c), s(&k))
}

#[test]
fn a_tls_listener_relays_to_an_shm_agent() {
    within(Duration::from_secs(120), "gateway over tls", || {
        shm_dir();
        let dir = tempfile::tempdir().expect("tmp");
        let agent = agent_in(dir.path(), &fresh_shm_name());
        let (_certs, cert, key) = self_signed();
        let gw = GatewayProcess::spawn_with(
            &agent.uris[1],
            &[
                "--listen",
                "tls://127.0.0.1:0",
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
            ],
        );
        assert!(gw.uri.starts_with("tls://127.0.0.1:"), "{}", gw.uri);
        let uri = format!("{}?ca={cert}", gw.uri);
        let c = Client::connect(&uri).unwrap_or_else(|e| panic!("{uri}: {e}"));
        common::check_identity(&c, "tls -> gateway -> shm");
        let big = pattern(3 << 20, 11);
        let r = c
            .model("identity")
            .expect("identity")
            .infer(&[TensorRef::new(DType::U8, &[big.len() as u64], &big).expect("tensor")])
            .expect("3 MiB over tls");
        assert!(r.outputs[0].bytes() == &big[..]);
    });
}

#[test]
fn clear_text_beyond_loopback_needs_insecure() {
    let (status, _, err) = common::run_bin(
        &[
            "gateway",
            "--listen",
            "tcp://0.0.0.0:0",
            "--upstream",
            "unix:///nonexistent/agent.sock",
        ],
        Duration::from_secs(60),
    );
    assert!(!status.success());
    assert!(err.contains("--insecure"), "{err}");
}

/// A bare HTTP/1.1 request (`Connection: close`); returns the status and
/// the body.
fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the http door");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body).expect("write");
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

/// KServe v2 clients through the gateway: the agent's front doors run in
/// the gateway over its models (HTTP JSON and gRPC raw tensors, health,
/// metadata), and an agent that goes away gives 503 / UNAVAILABLE, then
/// the doors reconnect when it is back.
#[test]
fn kserve_clients_are_translated_to_native() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shm = fresh_shm_name();
    let mut agent = agent_in(dir.path(), &shm);
    let upstream = agent.uris[1].clone();
    let (_gw, uris) = GatewayProcess::spawn_listening(
        &upstream,
        &[
            "--listen",
            "http://127.0.0.1:0",
            "--listen",
            "grpc://127.0.0.1:0",
        ],
        2,
    );
    let http_addr = uris
        .iter()
        .find_map(|u| u.strip_prefix("http://"))
        .expect("an http door")
        .to_string();
    let grpc_uri = uris
        .iter()
        .find(|u| u.starts_with("grpc://"))
        .expect("a grpc door")
        .clone();
    let (status, _) = http(&http_addr, "GET", "/v2/health/ready", b"");
    assert_eq!(status, 200);
    let (status, meta) = http(&http_addr, "GET", "/v2/models/digits", b"");
    assert_eq!(status, 200, "{meta}");
    assert!(meta.contains("\"logits\""), "{meta}");
    // digits over JSON, checked against the reference.
    let x: Vec<f32> = digits_input()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let req = serde_json::json!({
        "inputs": [{"name": "x", "shape": [4, 64], "datatype": "FP32", "data": x}]
    });
    let (status, body) = http(
        &http_addr,
        "POST",
        "/v2/models/digits/infer",
        req.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let got: Vec<f64> = v["outputs"][0]["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| d.as_f64().expect("number"))
        .collect();
    for (g, e) in got.iter().zip(digits_expected()) {
        assert!((*g as f32 - e).abs() < 1e-4, "logits {got:?}");
    }
    // gRPC with raw tensors, identity: the bytes come back.
    {
        use frontend::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
        use frontend::proto::model_infer_request::InferInputTensor;
        use frontend::proto::ModelInferRequest;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let addr = grpc_uri.trim_start_matches("grpc://").to_string();
        let mut c = rt
            .block_on(GrpcInferenceServiceClient::connect(format!(
                "http://{addr}"
            )))
            .expect("connect to the grpc door");
        let bytes = pattern(4096, 3);
        let req = ModelInferRequest {
            model_name: "identity".into(),
            inputs: vec![InferInputTensor {
                name: "a".into(),
                datatype: "UINT8".into(),
                shape: vec![4096],
                ..Default::default()
            }],
            raw_input_contents: vec![bytes.clone().into()],
            ..Default::default()
        };
        let r = rt
            .block_on(c.model_infer(req))
            .expect("ModelInfer through the gateway")
            .into_inner();
        assert_eq!(r.raw_output_contents[0].as_ref(), &bytes[..]);
    }
    // The agent goes away: 503, promptly.
    agent.signal(libc::SIGKILL);
    let _ = agent.wait_exit(Duration::from_secs(10));
    let t0 = Instant::now();
    let (status, body) = http(
        &http_addr,
        "POST",
        "/v2/models/digits/infer",
        req.to_string().as_bytes(),
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("unavailable"), "{body}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    // Back on the same shm name: the doors reconnect.
    let _agent = agent_in(dir.path(), &shm);
    wait_until(
        Duration::from_secs(20),
        "the doors reach the agent again",
        || {
            http(
                &http_addr,
                "POST",
                "/v2/models/digits/infer",
                req.to_string().as_bytes(),
            )
            .0 == 200
        },
    );
}

/// A client that gives the gateway no token is not the gateway: the agent
/// knows its relayed session by its token only (the Hello's anonymous
/// flag), so it gets the `default` tenant's rights, not those of the
/// gateway's own uid.
#[test]
fn a_tokenless_client_of_the_gateway_is_not_the_gateways_uid() {
    let dir = tempfile::tempdir().expect("tempdir");
    // SAFETY: getuid has no preconditions and touches no memory.
    let uid = unsafe { libc::getuid() };
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenant]]\nname = \"local\"\nuids = [{uid}]\nmodels = [\"*\"]\n\n\
             [[tenant]]\nname = \"default\"\nmodels = [\"identity\"]\n"
        ),
    )
    .expect("write the tenants file");
    let shm = fresh_shm_name();
    let model = format!("digits={}", digits_model().display());
    let agent = ServeProcess::spawn_in(
        dir.path(),
        &[
            "--listen",
            &format!("shm://{shm}"),
            "--model",
            &model,
            "--tenants",
            tenants.to_str().expect("utf-8 path"),
        ],
    );
    within(Duration::from_secs(60), "anonymous relay", move || {
        // Directly, this uid is tenant `local`: digits is there.
        let direct = Client::connect(&agent.uris[0]).expect("direct");
        assert!(direct.model("digits").is_ok(), "local sees digits");
        for (name, up) in upstreams(&agent) {
            let gw = GatewayProcess::spawn(&up);
            let c = Client::connect(&gw.uri).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                c.model("digits").is_err(),
                "{name}: a tokenless client of the gateway got the gateway uid's tenant"
            );
            common::check_identity(&c, name);
        }
    });
}
