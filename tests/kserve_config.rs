//! The KServe v2 front doors asked for in the config file: `tensorwire
//! serve --config FILE` with `grpc://` and `http://` URIs in the TOML
//! `listen` list opens both doors (a `listening on` line each, real ports
//! for port 0), both answer (HTTP readiness over a std `TcpStream`, gRPC
//! readiness and a digits inference over the frontend crate's tonic
//! client), the file's doors and `--listen` flags add up, both close on
//! SIGTERM, and a bad front-door URI or an unknown scheme in the file stops
//! `serve` before it listens anywhere, with an error naming the URI.

use common::{
    digits_expected, digits_input, digits_model, http_status, tensorwire_command, ServeProcess,
};
use frontend::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use frontend::proto::model_infer_request::InferInputTensor;
use frontend::proto::{ModelInferRequest, ServerLiveRequest, ServerReadyRequest};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `HOST:PORT` of `SCHEME://HOST:PORT`.
fn addr(uri: &str) -> &str {
    uri.split_once("://").map_or(uri, |(_, a)| a)
}

/// ServerReady, and a digits inference checked against the Python
/// reference, over the gRPC door at `uri`.
fn grpc_answers(uri: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut c = rt
        .block_on(GrpcInferenceServiceClient::connect(format!(
            "http://{}",
            addr(uri)
        )))
        .expect("connect to the grpc front door");
    let live = rt
        .block_on(c.server_live(ServerLiveRequest {}))
        .expect("ServerLive")
        .into_inner();
    assert!(live.live);
    let ready = rt
        .block_on(c.server_ready(ServerReadyRequest {}))
        .expect("ServerReady")
        .into_inner();
    assert!(ready.ready);
    let req = ModelInferRequest {
        model_name: "digits".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![4, 64],
            ..Default::default()
        }],
        raw_input_contents: vec![bytes::Bytes::from(digits_input())],
        ..Default::default()
    };
    let r = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), c.model_infer(req)).await })
        .expect("ModelInfer answered within 30 s")
        .expect("ModelInfer")
        .into_inner();
    assert_eq!(r.outputs[0].name, "logits");
    assert_eq!(r.outputs[0].shape, vec![4, 10]);
    let got: Vec<f32> = r.raw_output_contents[0]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(got.len(), 40);
    for (g, e) in got.iter().zip(digits_expected()) {
        assert!((g - e).abs() < 1e-4, "logit {g} vs reference {e}");
    }
}

/// A config file serving digits, with `listen` as given.
fn config(listen: &str) -> String {
    // A TOML literal string: the path is taken as it is.
    format!(
        "listen = {listen}\n\n[[model]]\nname = \"digits\"\npath = '{}'\n",
        digits_model().display()
    )
}

#[test]
fn front_doors_from_the_config_files_listen_list() {
    let mut agent = ServeProcess::spawn_with_config(
        &config(r#"["grpc://127.0.0.1:0", "http://127.0.0.1:0"]"#),
        &["--grace", "1"],
    );
    // The unix socket of the flags, then the doors in the file's order.
    assert_eq!(agent.uris.len(), 3, "{:?}", agent.uris);
    let (grpc, http) = (agent.uris[1].clone(), agent.uris[2].clone());
    assert!(
        grpc.starts_with("grpc://127.0.0.1:") && !grpc.ends_with(":0"),
        "{grpc}"
    );
    assert!(
        http.starts_with("http://127.0.0.1:") && !http.ends_with(":0"),
        "{http}"
    );
    assert_eq!(http_status(addr(&http), "/v2/health/ready"), 200);
    assert_eq!(http_status(addr(&http), "/v2/models/digits/ready"), 200);
    grpc_answers(&grpc);
    agent.signal(libc::SIGTERM);
    let st = agent.wait_exit(Duration::from_secs(30));
    assert!(st.success(), "{st:?}; stderr:\n{}", agent.stderr());
    for uri in [&grpc, &http] {
        assert!(
            TcpStream::connect(addr(uri)).is_err(),
            "{uri} still accepts connections after serve exited"
        );
    }
}

#[test]
fn front_doors_of_the_file_and_the_flags_add_up() {
    let agent = ServeProcess::spawn_with_config(
        &config(r#"["grpc://127.0.0.1:0"]"#),
        &["--listen", "http://127.0.0.1:0"],
    );
    assert_eq!(agent.uris.len(), 3, "{:?}", agent.uris);
    assert!(agent.uris[1].starts_with("grpc://"), "{:?}", agent.uris);
    assert!(agent.uris[2].starts_with("http://"), "{:?}", agent.uris);
    assert_eq!(http_status(addr(&agent.uris[2]), "/v2/health/ready"), 200);
    grpc_answers(&agent.uris[1]);
}

/// `serve --config FILE --listen unix://<tmp>/s.sock` must fail: its exit
/// status, stdout and stderr (it is killed if still running after 30 s).
fn serve_fails(toml: &str) -> (std::process::ExitStatus, String, String) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, toml).expect("write config");
    let sock = dir.path().join("s.sock");
    let mut child = tensorwire_command()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .arg("--listen")
        .arg(format!("unix://{}", sock.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tensorwire serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tensorwire serve kept running with a bad config:\n{toml}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    assert!(!sock.exists(), "the agent's socket was left behind");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_front_doors_in_the_config_file_stop_serve_before_it_listens() {
    for (listen, needles) in [
        (
            r#"["http://127.0.0.1:0", "grpc://nohost"]"#,
            &["grpc://nohost", "port"][..],
        ),
        (r#"["http://h:1/v2"]"#, &["http://h:1/v2", "path"][..]),
        (
            r#"["ftp://127.0.0.1:1"]"#,
            &["ftp://127.0.0.1:1", "unknown scheme 'ftp'", "grpc://"][..],
        ),
    ] {
        let (status, stdout, stderr) = serve_fails(&config(listen));
        assert!(!status.success(), "{listen}: {status:?}");
        assert!(
            !stdout.contains("listening on"),
            "{listen}: listened before failing: {stdout}"
        );
        for n in needles {
            assert!(stderr.contains(n), "{listen}: '{n}' not in: {stderr}");
        }
    }
    // A door that cannot bind (its port is taken) fails after the agent
    // started: the agent is stopped again, its socket removed.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = format!("http://{}", taken.local_addr().expect("addr"));
    let (status, stdout, stderr) =
        serve_fails(&config(&format!(r#"["grpc://127.0.0.1:0", "{busy}"]"#)));
    assert!(!status.success(), "{status:?}");
    assert!(!stdout.contains("listening on"), "{stdout}");
    assert!(stderr.contains(&busy), "'{busy}' not in: {stderr}");
}

/// An embedder that hands the agent a config with front doors still in it
/// gets an error naming them, not an agent that silently serves none.
#[test]
fn the_agent_refuses_front_doors_it_would_not_serve() {
    let cfg = server::AgentConfig::from_toml(r#"listen = ["grpc://127.0.0.1:0"]"#)
        .expect("a valid config");
    let e = server::Agent::start(cfg).expect_err("front doors left in the config");
    assert!(e.to_string().contains("grpc://127.0.0.1:0"), "{e}");
}
