//! TLS on the native protocol (`tls://`, issue 16) against real agents:
//! round trips small and large through `tensorwire serve`, the CLI and the
//! Rust client over TLS; untrusted, expired, misnamed and absent
//! certificates refused with a reason while other clients keep being
//! served; mutual TLS choosing the tenant by the client certificate's
//! name; start-up errors that name what is missing.

use client::{Client, ClientError, ClientOptions, TensorRef};
use common::{run_bin, ServeProcess};
use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wire::DType;

const LIMIT: Duration = Duration::from_secs(60);

/// A CA, an agent certificate for `localhost`, and client certificates,
/// as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(ca_name: &str) -> Pki {
        let dir = tempfile::tempdir().expect("temporary directory");
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, ca_name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).expect("CA certificate");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write CA");
        Pki {
            dir,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate for `name` signed by this CA (expired when
    /// `expired`): `(cert.pem, key.pem)`. The agent's (`localhost`) also
    /// carries the address 127.0.0.1, which clients connect to here.
    fn issue(&self, name: &str, expired: bool) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut names = vec![name.to_string()];
        if name == "localhost" {
            names.push("127.0.0.1".into());
        }
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let tag = format!("{name}{}", if expired { "-expired" } else { "" });
        let (c, k) = (
            self.dir.path().join(format!("{tag}.pem")),
            self.dir.path().join(format!("{tag}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("write certificate");
        std::fs::write(&k, key.serialize_pem()).expect("write key");
        (c, k)
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// An agent serving `identity` and the digits model over tls:// (and its
/// unix socket), with `extra` arguments.
fn tls_agent(pki: &Pki, extra: &[&str]) -> (ServeProcess, String) {
    let (cert, key) = pki.issue("localhost", false);
    let model = format!("digits={}", s(&common::digits_model()));
    let mut args = vec![
        "--listen",
        "tls://127.0.0.1:0",
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
        "--model",
        &model,
    ];
    args.extend_from_slice(extra);
    let agent = ServeProcess::spawn(&args);
    let uri = agent.uris[1].clone();
    assert!(uri.starts_with("tls://127.0.0.1:"), "{uri}");
    (agent, uri)
}

/// `uri` with the client's TLS parameters.
fn with_params(uri: &str, params: &[(&str, &str)]) -> String {
    let q: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{uri}?{}", q.join("&"))
}

fn identity_call(c: &Client, len: usize) -> Result<(), ClientError> {
    let data = common::pattern(len, len as u64);
    let r = c
        .model("identity")?
        .infer(&[TensorRef::new(DType::U8, &[len as u64], &data).expect("tensor")])?;
    assert!(r.outputs[0].bytes() == data.as_slice(), "{len} bytes back");
    Ok(())
}

#[test]
fn requests_small_and_large_cross_tls_from_the_client_and_the_cli() {
    let pki = Pki::new("tls test CA");
    let (agent, uri) = tls_agent(&pki, &[]);
    let good = with_params(&uri, &[("ca", s(&pki.ca()))]);
    let c = Client::connect(&good).expect("connect over TLS");
    for len in [0, 1, 4096, 64 << 10, 1 << 20, 16 << 20] {
        identity_call(&c, len).expect("identity over TLS");
    }
    // A real model over TLS gives the reference answer.
    let digits = c.model("digits").expect("digits");
    let input = common::digits_input();
    let r = digits
        .infer(&[TensorRef::new(DType::F32, &[4, 64], &input).expect("input")])
        .expect("digits over TLS");
    let got: Vec<f32> = r.outputs[0]
        .bytes()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let want = common::digits_expected();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
    }
    // Pipelined calls (the client writes while responses come back).
    let id = c.model("identity").expect("identity");
    let data = common::pattern(256 << 10, 9);
    let shape = [data.len() as u64];
    let t = [TensorRef::new(DType::U8, &shape, &data).expect("tensor")];
    let pending: Vec<_> = (0..16).map(|_| id.submit(&t).expect("send")).collect();
    for p in pending {
        assert!(p.wait().expect("answer").outputs[0].bytes() == data.as_slice());
    }
    // The CLI over the same URI.
    let (st, out, err) = run_bin(&["ping", "--connect", &good, "-n", "300"], LIMIT);
    assert!(st.success(), "ping over TLS: {out}{err}");
    drop(agent);
}

#[test]
fn bad_certificates_and_clear_text_are_refused_while_others_are_served() {
    let pki = Pki::new("tls test CA");
    let (agent, uri) = tls_agent(&pki, &[]);
    let good = Client::connect(&with_params(&uri, &[("ca", s(&pki.ca()))])).expect("good client");
    // A connection that never starts its handshake does not hold anyone up.
    let addr = uri.trim_start_matches("tls://");
    let silent = TcpStream::connect(addr).expect("tcp connect");
    // A client that trusts another CA.
    let stranger = Pki::new("another CA");
    let e = Client::connect(&with_params(&uri, &[("ca", s(&stranger.ca()))]))
        .expect_err("untrusted agent certificate refused")
        .to_string();
    assert!(e.contains("invalid peer certificate"), "{e}");
    // The wrong name.
    let e = Client::connect(&with_params(
        &uri,
        &[("ca", s(&pki.ca())), ("name", "elsewhere.example")],
    ))
    .expect_err("wrong name refused")
    .to_string();
    assert!(e.contains("not valid for name"), "{e}");
    // Clear text to a TLS listener: the agent's handshake fails, the
    // client hears it (no hang).
    let opts = ClientOptions {
        connect_timeout: Duration::from_secs(5),
        timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    assert!(Client::connect_with(&format!("tcp://{addr}"), opts).is_err());
    // Garbage bytes then EOF.
    {
        use std::io::Write;
        let mut g = TcpStream::connect(addr).expect("tcp connect");
        let _ = g.write_all(&[0x16, 3, 1, 0xff, 0xff, 1, 2, 3]);
        g.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut b = [0u8; 64];
        let _ = g.read(&mut b); // an alert, or the close
    }
    identity_call(&good, 100_000).expect("the good client is still served");
    // An expired agent certificate is refused by the client.
    let (cert, key) = pki.issue("localhost", true);
    let expired_agent = ServeProcess::spawn(&[
        "--listen",
        "tls://127.0.0.1:0",
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
    ]);
    let e = Client::connect(&with_params(
        &expired_agent.uris[1],
        &[("ca", s(&pki.ca()))],
    ))
    .expect_err("expired agent certificate refused")
    .to_string();
    assert!(e.contains("expired"), "{e}");
    drop(silent);
    drop(agent);
}

#[test]
fn mutual_tls_requires_a_client_certificate_and_its_name_picks_the_tenant() {
    let pki = Pki::new("tls test CA");
    let dir = tempfile::tempdir().expect("dir");
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nname = \"alpha\"\ncert_names = [\"alpha.client\"]\nmodels = [\"identity\"]\n",
    )
    .expect("tenants file");
    let (agent, uri) = tls_agent(
        &pki,
        &["--tls-client-ca", s(&pki.ca()), "--tenants", s(&tenants)],
    );
    let ca = pki.ca();
    let (alpha_cert, alpha_key) = pki.issue("alpha.client", false);
    let alpha = Client::connect(&with_params(
        &uri,
        &[
            ("ca", s(&ca)),
            ("cert", s(&alpha_cert)),
            ("key", s(&alpha_key)),
        ],
    ))
    .expect("alpha connects");
    let names: Vec<String> = alpha
        .models()
        .expect("list")
        .into_iter()
        .map(|m| m.signature.name)
        .collect();
    assert_eq!(names, ["identity"], "alpha sees its models only");
    identity_call(&alpha, 1000).expect("alpha calls identity");
    assert!(matches!(
        alpha.model("digits"),
        Err(ClientError::PermissionDenied(_)) | Err(ClientError::UnknownModel(_))
    ));
    // No certificate: the handshake fails.
    let e = Client::connect(&with_params(&uri, &[("ca", s(&ca))]))
        .expect_err("no client certificate refused")
        .to_string();
    assert!(e.contains("CertificateRequired"), "{e}");
    // A certificate from another CA: refused.
    let stranger = Pki::new("another CA");
    let (sc, sk) = stranger.issue("alpha.client", false);
    assert!(Client::connect(&with_params(
        &uri,
        &[("ca", s(&ca)), ("cert", s(&sc)), ("key", s(&sk))]
    ))
    .is_err());
    // An expired certificate from the right CA: refused.
    let (ec, ek) = pki.issue("alpha.client", true);
    assert!(Client::connect(&with_params(
        &uri,
        &[("ca", s(&ca)), ("cert", s(&ec)), ("key", s(&ek))]
    ))
    .is_err());
    // A valid certificate no tenant names: the default tenant, which has
    // no rights here.
    let (bc, bk) = pki.issue("beta.client", false);
    let beta = Client::connect(&with_params(
        &uri,
        &[("ca", s(&ca)), ("cert", s(&bc)), ("key", s(&bk))],
    ))
    .expect("beta connects");
    assert!(beta.models().expect("list").is_empty());
    match identity_call(&beta, 10) {
        Err(ClientError::PermissionDenied(m)) => assert!(m.contains("default"), "{m}"),
        other => panic!("beta must be refused: {other:?}"),
    }
    identity_call(&alpha, 1000).expect("alpha still served");
    drop(agent);
}

#[test]
fn start_up_errors_name_what_is_missing() {
    common::tensorwire_bin();
    let pki = Pki::new("tls test CA");
    let (cert, key) = pki.issue("localhost", false);
    let cases: [(&[&str], &str); 4] = [
        (&["--listen", "tls://127.0.0.1:0"], "--tls-cert"),
        (
            &["--listen", "tls://127.0.0.1:0", "--tls-cert", s(&cert)],
            "--tls-key",
        ),
        (
            &[
                "--listen",
                "tls://127.0.0.1:0",
                "--tls-cert",
                s(&cert),
                "--tls-key",
                "/nonexistent/agent.key",
            ],
            "/nonexistent/agent.key",
        ),
        (
            &[
                "--listen",
                "tls://127.0.0.1:0?ca=/x.pem",
                "--tls-cert",
                s(&cert),
                "--tls-key",
                s(&key),
            ],
            "client settings",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec!["serve"];
        all.extend_from_slice(args);
        let (st, _, err) = run_bin(&all, LIMIT);
        assert!(!st.success(), "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // TLS beyond loopback needs no --insecure.
    let mut agent = ServeProcess::spawn(&[
        "--listen",
        "tls://0.0.0.0:0",
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
    ]);
    assert!(
        agent.uris[1].starts_with("tls://0.0.0.0:"),
        "{:?}",
        agent.uris
    );
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_exit(LIMIT).success());
}
