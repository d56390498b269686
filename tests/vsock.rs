//! `vsock://CID:PORT` against real agents (issue 17).
//!
//! What runs everywhere with `AF_VSOCK` (a Firecracker or QEMU guest with
//! `/dev/vsock`, a host with `vhost_vsock` or `vsock_loopback`):
//! `tensorwire serve --listen vsock://-1:-1` binds (the kernel picks the
//! port, printed in its `listening on` line), a second agent on that port
//! fails at once naming the endpoint, and clients asking for CIDs that do
//! not answer fail promptly with a sentence saying why.
//!
//! The round trip (ping, identity, the digits model, the CLI, the agent
//! vanishing) needs a vsock connection this machine can make to itself:
//! `vsock://1:PORT` (`VMADDR_CID_LOCAL`), which only the `vsock_loopback`
//! module provides. Where it does not answer, that test prints
//! `skipped: ...` and returns. On a host: `sudo modprobe vsock_loopback`,
//! then `cargo test -p tensorwire-tests --test vsock -- --nocapture`
//! (see `docs/VSOCK.md`). The framing over a vsock-typed socket is also
//! covered without loopback by `transport`'s unit tests (a socket pair).
//! With no vsock in the kernel at all every test here skips, saying so.

use client::{Client, ClientError, ClientOptions, TensorRef};
use common::{run_bin, ServeProcess};
use std::time::{Duration, Instant};
use transport::{Endpoint, Listener};
use wire::DType;

const LIMIT: Duration = Duration::from_secs(60);

/// Whether this kernel has vsock at all (a listener on any port binds);
/// prints why not.
fn vsock_here() -> bool {
    match Listener::bind(&Endpoint::parse("vsock://-1:-1").expect("uri")) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skipped: no vsock on this machine ({e})");
            false
        }
    }
}

/// An agent on its unix socket and `vsock://-1:<a port the kernel picks>`,
/// serving the digits model; and that vsock URI.
fn vsock_agent() -> (ServeProcess, String) {
    let model = format!("digits={}", common::digits_model().display());
    let agent = ServeProcess::spawn(&["--listen", "vsock://-1:-1", "--model", &model]);
    let uri = agent.uris[1].clone();
    (agent, uri)
}

fn port_of(uri: &str) -> u32 {
    match Endpoint::parse(uri).unwrap_or_else(|e| panic!("{uri}: {e}")) {
        Endpoint::Vsock { port, .. } => port,
        other => panic!("not vsock: {other}"),
    }
}

#[test]
fn an_agent_binds_vsock_and_a_second_on_its_port_is_refused() {
    if !vsock_here() {
        return;
    }
    let (mut agent, uri) = vsock_agent();
    // Listening on any CID at a real port, without --insecure: vsock
    // crosses no network.
    let port = port_of(&uri);
    assert!(uri.starts_with("vsock://-1:") && port != u32::MAX, "{uri}");
    // A second agent on the same port stops at once, naming it.
    let t0 = Instant::now();
    let (st, _, err) = run_bin(&["serve", "--listen", &uri], LIMIT);
    assert!(!st.success(), "{err}");
    assert!(
        err.contains(&format!("listen on {uri}"))
            && err.contains(&format!("vsock port {port} is in use")),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // A CID that is not this machine's is refused as such.
    let (st, _, err) = run_bin(&["serve", "--listen", "vsock://77:5000"], LIMIT);
    assert!(!st.success());
    assert!(err.contains("CID 77 is not this machine's"), "{err}");
    // Bad URIs say what is wrong.
    for (bad, needle) in [
        ("vsock://2", "missing port"),
        ("vsock://x:1", "CID 'x' is not a number"),
        ("vsock://2:1?nodelay=0", "unknown parameter 'nodelay'"),
    ] {
        let (st, _, err) = run_bin(&["serve", "--listen", bad], LIMIT);
        assert!(!st.success() && err.contains(needle), "{bad}: {err}");
    }
    // The first agent is untouched and still serves its unix socket.
    assert!(agent.running(), "{}", agent.stderr());
    common::identity_roundtrip(&format!("unix://{}", agent.sock_path.display()), "unix");
    // SIGTERM stops it cleanly: the vsock accept thread is woken too (a
    // vsock listener ignores shutdown(2)), and the port is free again.
    agent.signal(libc::SIGTERM);
    let st = agent.wait_exit(Duration::from_secs(10));
    assert!(st.success(), "{st:?}: {}", agent.stderr());
    drop(Listener::bind(&Endpoint::parse(&uri).expect("uri")).expect("the port is free again"));
}

#[test]
fn clients_asking_for_cids_that_do_not_answer_fail_promptly_and_clearly() {
    if !vsock_here() {
        return;
    }
    let opts = ClientOptions {
        connect_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    };
    // 2 (the host; from a guest with no host listener: refused at once),
    // 1 (this machine; without vsock_loopback: no answer), a CID nobody
    // has. Whatever this machine does with each, the error names the
    // endpoint and the CID, and comes within the time-out.
    for cid in [2u32, 1, 0x7fff_fff0] {
        let uri = format!("vsock://{cid}:1");
        let t0 = Instant::now();
        let r = Client::connect_with(&uri, opts.clone());
        let took = t0.elapsed();
        let e = match r {
            Ok(_) => {
                eprintln!("{uri} answered here: nothing to check");
                continue;
            }
            Err(e) => e,
        };
        assert!(matches!(e, ClientError::Connect(_)), "{uri}: {e:?}");
        let e = e.to_string();
        eprintln!("{uri}: {e} ({took:?})");
        assert!(
            took < Duration::from_millis(1500),
            "{uri}: {e} after {took:?}"
        );
        assert!(
            e.contains(&format!("connect to {uri}: ")) && e.contains(&format!("CID {cid}")),
            "{e}"
        );
    }
    // -1 is a listener's.
    match Client::connect_with("vsock://-1:5000", opts.clone()) {
        Ok(_) => panic!("vsock://-1:5000 connected"),
        Err(e) => assert!(e.to_string().contains("for listeners"), "{e}"),
    }
    // The CLI says the same.
    let (st, _, err) = run_bin(&["ping", "--connect", "vsock://2:1"], LIMIT);
    assert!(!st.success());
    assert!(err.contains("connect to vsock://2:1: "), "{err}");
}

#[test]
fn round_trip_over_vsock_loopback() {
    if !vsock_here() {
        return;
    }
    let (mut agent, uri) = vsock_agent();
    let port = port_of(&uri);
    let local = format!("vsock://1:{port}");
    let opts = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        ..ClientOptions::default()
    };
    let c = match Client::connect_with(&local, opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "skipped: no vsock loopback here ({e}); on a host, `sudo modprobe \
                 vsock_loopback` and run this test again (docs/VSOCK.md)"
            );
            return;
        }
    };
    c.ping().expect("ping over vsock");
    common::check_identity(&c, "vsock");
    // Large tensors, both ways.
    let data = common::pattern(8 << 20, 3);
    let r = c
        .model("identity")
        .expect("identity")
        .infer(&[TensorRef::new(DType::U8, &[data.len() as u64], &data).expect("tensor")])
        .expect("8 MiB over vsock");
    assert!(r.outputs[0].bytes() == data.as_slice());
    // A real model gives the reference answer.
    let input = common::digits_input();
    let r = c
        .model("digits")
        .expect("digits")
        .infer(&[TensorRef::new(DType::F32, &[4, 64], &input).expect("input")])
        .expect("digits over vsock");
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
    // The CLI over the same URI.
    let (st, out, err) = run_bin(&["ping", "--connect", &local], LIMIT);
    assert!(st.success(), "{out}{err}");
    // The agent vanishing is an error, not a hang.
    agent.signal(libc::SIGKILL);
    agent.wait_exit(Duration::from_secs(10));
    let e = common::within(LIMIT, "a call to a vanished agent", move || c.ping())
        .expect_err("the agent is gone");
    assert!(matches!(e, ClientError::AgentGone(_)), "{e:?}");
}
