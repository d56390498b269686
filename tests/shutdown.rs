//! Shutting down, and dying: an agent stopped in-process lets requests in
//! flight finish and refuses new ones; the `tensorwire serve` binary exits
//! cleanly on SIGTERM and SIGINT and removes its socket; clients of an agent
//! that is killed, or frozen, get an error within their timeout instead of
//! hanging.

use client::{Client, ClientError, ClientOptions, TensorRef};
use common::{
    check_identity, connect, http_status, pattern, send_signal, wait_until, within, RawPeer,
    ServeProcess, TestAgent,
};
use engine::{Backend, EngineError, Output, OutputData, TensorView};
use server::{AgentConfig, ModelRegistry};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport::TransportError;
use wire::{DType, ModelSignature};

const LIMIT: Duration = Duration::from_secs(60);

/// Identity, slowly: sleeps `delay` in every run.
struct SlowBackend {
    signature: ModelSignature,
    delay: Duration,
}

impl SlowBackend {
    fn new(name: &str, delay: Duration) -> SlowBackend {
        SlowBackend {
            signature: ModelSignature {
                name: name.into(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
            delay,
        }
    }
}

impl Backend for SlowBackend {
    fn signature(&self) -> &ModelSignature {
        &self.signature
    }

    fn check_inputs(&self, _inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        Ok(())
    }

    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        std::thread::sleep(self.delay);
        Ok(inputs
            .iter()
            .enumerate()
            .map(|(i, t)| Output {
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                data: OutputData::Input(i),
            })
            .collect())
    }
}

fn slow_agent(delay: Duration) -> TestAgent {
    let mut registry = ModelRegistry::with_identity();
    registry.add(Arc::new(SlowBackend::new("slow", delay)), 4);
    TestAgent::start_with(AgentConfig::default(), Some(registry))
}

fn client_with_timeout(uri: &str, timeout: Duration) -> Client {
    let opts = ClientOptions {
        timeout,
        ..ClientOptions::default()
    };
    Client::connect_with(uri, opts).unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

/// An identity call on `c` that must fail because the agent is going or
/// gone: `ShuttingDown` (refused) or `AgentGone` (connection closed).
fn refused(c: &Client, what: &str) -> &'static str {
    let data = pattern(16, 1);
    let r = c
        .model("identity")
        .and_then(|m| m.infer(&[TensorRef::new(DType::U8, &[16], &data).expect("t")]));
    match r {
        Err(ClientError::ShuttingDown(msg)) => {
            assert!(msg.contains("shutting down"), "{what}: {msg}");
            "shutting-down"
        }
        Err(ClientError::AgentGone(_)) => "agent-gone",
        other => panic!("{what}: expected ShuttingDown or AgentGone, got {other:?}"),
    }
}

#[test]
fn shutdown_finishes_requests_in_flight_and_refuses_new_ones() {
    within(LIMIT, "graceful shutdown", || {
        let mut ta = slow_agent(Duration::from_millis(500));
        let core = ta.agent().core().clone();
        let sock = ta.sock_path.clone();
        assert!(sock.exists());
        // Two slow requests in flight (unix and tcp), and two idle sessions
        // that will send requests once shutdown has begun.
        let a = connect(&ta.unix);
        let b = connect(&ta.tcp);
        let late: Vec<(&str, Client)> =
            vec![("unix", connect(&ta.unix)), ("tcp", connect(&ta.tcp))];
        let da = pattern(3000, 1);
        let db = pattern(5000, 2);
        let ta_ = a
            .model("slow")
            .expect("slow")
            .submit(&[TensorRef::new(DType::U8, &[3000], &da).expect("t")])
            .expect("submit");
        let tb = b
            .model("slow")
            .expect("slow")
            .submit(&[TensorRef::new(DType::U8, &[5000], &db).expect("t")])
            .expect("submit");
        wait_until(
            Duration::from_secs(5),
            "both slow requests in flight",
            || core.in_flight() == 2,
        );

        // Peers that must not hold shutdown up: one that never said Hello,
        // one stuck in the middle of a header.
        let mut silent = RawPeer::connect(&ta.unix);
        let mut half = RawPeer::connect_hello(&ta.tcp);
        half.write(&wire::Header::new(wire::Kind::Ping).encode()[..30]);

        let agent = ta.take();
        let start = Instant::now();
        let shut = std::thread::spawn(move || agent.shutdown(Duration::from_secs(10)));
        wait_until(Duration::from_secs(5), "shutdown begins", || {
            core.is_closing()
        });
        for (t, c) in &late {
            let how = refused(c, &format!("{t}: request after shutdown began"));
            eprintln!("{t}: a request sent during shutdown got {how}");
        }

        // The requests in flight complete, with their own responses.
        let ra = ta_.wait().expect("in-flight unix request completes");
        assert_eq!(ra.outputs[0].bytes(), &da[..]);
        let rb = tb.wait().expect("in-flight tcp request completes");
        assert_eq!(rb.outputs[0].bytes(), &db[..]);

        let unfinished = shut.join().expect("shutdown thread");
        assert_eq!(unfinished, 0, "requests left unfinished");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "shutdown took {:?}",
            start.elapsed()
        );
        assert!(!sock.exists(), "socket file {} left behind", sock.display());
        silent.expect_closed(Duration::from_secs(1));
        half.expect_closed(Duration::from_secs(1));

        // Afterwards: every open session is closed, nothing hangs, and
        // nothing new can connect.
        for (t, c) in late.iter().chain([("unix", a), ("tcp", b)].iter()) {
            refused(c, &format!("{t}: after shutdown"));
        }
        for uri in [&ta.unix, &ta.tcp, &ta.inproc] {
            match Client::connect(uri) {
                Err(ClientError::Connect(_)) => {}
                other => panic!("{uri}: connecting after shutdown gave {other:?}"),
            }
        }
    });
}

/// What an orchestrator sees while the agent stops, in the order
/// `tensorwire serve` stops: the front door turns not-ready first (a
/// Kubernetes readiness probe takes the pod out of rotation), liveness
/// stays up, the agent then drains, and a request in flight still gets
/// its answer.
#[test]
fn kserve_readiness_turns_false_before_the_drain_and_stays_false() {
    within(LIMIT, "readiness during shutdown", || {
        let mut ta = slow_agent(Duration::from_millis(800));
        let core = ta.agent().core().clone();
        let door = frontend::FrontDoor::new(core.clone());
        let http =
            frontend::HttpFrontend::start("http://127.0.0.1:0", door).expect("HTTP front door");
        let addr = http.uri().trim_start_matches("http://").to_string();
        assert_eq!(http_status(&addr, "/v2/health/ready"), 200);
        let a = connect(&ta.unix);
        let data = pattern(64, 3);
        let t = a
            .model("slow")
            .expect("slow")
            .submit(&[TensorRef::new(DType::U8, &[64], &data).expect("t")])
            .expect("submit");
        wait_until(Duration::from_secs(5), "the slow request in flight", || {
            core.in_flight() == 1
        });
        http.set_not_ready();
        assert_eq!(http_status(&addr, "/v2/health/ready"), 503);
        assert_eq!(http_status(&addr, "/v2/health/live"), 200);
        let agent = ta.take();
        let shut = std::thread::spawn(move || agent.shutdown(Duration::from_secs(10)));
        wait_until(Duration::from_secs(5), "shutdown begins", || {
            core.is_closing()
        });
        assert_eq!(http_status(&addr, "/v2/health/ready"), 503);
        let r = t.wait().expect("the request in flight completes");
        assert_eq!(r.outputs[0].bytes(), &data[..]);
        assert_eq!(shut.join().expect("shutdown thread"), 0);
        http.shutdown();
    });
}

/// The same, through `frontend::FrontDoors::shutdown_with`, the one
/// sequence `tensorwire serve` and the Python `Agent` stop by: while the
/// agent drains, the door already answers not-ready (and stays live); the
/// request in flight is answered; then the door closes.
#[test]
fn front_doors_stop_around_the_drain_in_order() {
    within(LIMIT, "FrontDoors::shutdown_with", || {
        let mut ta = slow_agent(Duration::from_millis(3000));
        let core = ta.agent().core().clone();
        let doors = frontend::FrontDoors::start(
            core.clone(),
            frontend::DoorsConfig {
                http: vec!["http://127.0.0.1:0".into()],
                ..frontend::DoorsConfig::default()
            },
        )
        .expect("front doors");
        let addr = doors.uris()[0].trim_start_matches("http://").to_string();
        assert_eq!(http_status(&addr, "/v2/health/ready"), 200);
        let a = connect(&ta.unix);
        let data = pattern(64, 3);
        let t = a
            .model("slow")
            .expect("slow")
            .submit(&[TensorRef::new(DType::U8, &[64], &data).expect("t")])
            .expect("submit");
        wait_until(Duration::from_secs(5), "the slow request in flight", || {
            core.in_flight() == 1
        });
        let agent = ta.take();
        let shut = std::thread::spawn(move || doors.shutdown_with(agent, Duration::from_secs(10)));
        wait_until(Duration::from_secs(5), "shutdown begins", || {
            core.is_closing()
        });
        assert_eq!(http_status(&addr, "/v2/health/ready"), 503);
        assert_eq!(http_status(&addr, "/v2/health/live"), 200);
        let r = t.wait().expect("the request in flight completes");
        assert_eq!(r.outputs[0].bytes(), &data[..]);
        assert_eq!(shut.join().expect("shutdown thread"), 0);
        assert!(
            std::net::TcpStream::connect(&addr).is_err(),
            "the door is closed after the drain"
        );
    });
}

#[test]
fn shutdown_whose_grace_runs_out_does_not_leave_clients_hanging() {
    within(LIMIT, "grace expiry", || {
        let mut ta = slow_agent(Duration::from_millis(1500));
        let core = ta.agent().core().clone();
        let c = client_with_timeout(&ta.unix, Duration::from_secs(20));
        let data = pattern(100, 3);
        let ticket = c
            .model("slow")
            .expect("slow")
            .submit(&[TensorRef::new(DType::U8, &[100], &data).expect("t")])
            .expect("submit");
        wait_until(Duration::from_secs(5), "slow request in flight", || {
            core.in_flight() == 1
        });
        let agent = ta.take();
        let shut = std::thread::spawn(move || agent.shutdown(Duration::from_millis(200)));
        let start = Instant::now();
        match ticket.wait() {
            Err(ClientError::AgentGone(_)) => {}
            other => panic!("a request cut off by shutdown gave {other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "woke after {:?}",
            start.elapsed()
        );
        assert_eq!(
            shut.join().expect("shutdown thread"),
            1,
            "one request unfinished"
        );
        assert!(!ta.sock_path.exists());
    });
}

#[test]
fn dropping_an_agent_shuts_it_down_and_removes_its_socket() {
    within(LIMIT, "drop", || {
        let mut ta = TestAgent::start(&[]);
        let c = connect(&ta.unix);
        check_identity(&c, "before drop");
        drop(ta.take());
        assert!(!ta.sock_path.exists(), "socket file left behind");
        assert!(matches!(
            c.model("identity"),
            Err(ClientError::AgentGone(_)) | Err(ClientError::ShuttingDown(_))
        ));
        assert!(matches!(
            Client::connect(&ta.inproc),
            Err(ClientError::Connect(TransportError::NoInprocAgent(_)))
        ));
        // The in-process name and the socket path can be used again.
        let again = TestAgent::start(&[]);
        check_identity(&connect(&again.unix), "a new agent");
    });
}

#[test]
fn sigterm_and_sigint_stop_the_binary_cleanly() {
    within(LIMIT, "signals", || {
        for (name, sig) in [("SIGTERM", libc::SIGTERM), ("SIGINT", libc::SIGINT)] {
            let mut p = ServeProcess::spawn(&["--listen", "tcp://127.0.0.1:0"]);
            assert_eq!(p.uris.len(), 2);
            assert!(p.uris[1].starts_with("tcp://127.0.0.1:") && !p.uris[1].ends_with(":0"));
            assert!(p.sock_path.exists());
            for uri in &p.uris {
                let c = connect(uri);
                c.ping()
                    .unwrap_or_else(|e| panic!("{name}: ping {uri}: {e}"));
                check_identity(&c, uri);
            }
            let (status, out, err) = common::run_bin(
                &["ping", "--connect", &p.uris[0], "-n", "50", "--warmup", "5"],
                Duration::from_secs(30),
            );
            assert!(status.success(), "tensorwire ping: {status}\n{out}\n{err}");
            // Ping/Pong control messages: the message path without a model.
            let (status, out, err) = common::run_bin(
                &[
                    "ping",
                    "--connect",
                    &p.uris[1],
                    "--control",
                    "-n",
                    "40",
                    "--warmup",
                    "3",
                    "--json",
                ],
                Duration::from_secs(30),
            );
            assert!(status.success(), "ping --control: {status}\n{out}\n{err}");
            let v: serde_json::Value = serde_json::from_str(out.trim())
                .unwrap_or_else(|e| panic!("ping --control --json: {e}: {out}"));
            assert_eq!(v["count"], 40, "{v}");
            assert_eq!(v["control"], true, "{v}");
            assert_eq!(v["message_bytes"], 64, "a Ping is a bare header: {v}");
            assert!(v["p50_us"].as_f64().is_some_and(|p| p > 0.0), "{v}");
            assert!(v.get("model").is_none(), "no model was called: {v}");
            // Without an agent there is nothing to answer a Ping.
            let (status, _, err) = common::run_bin(
                &["ping", "--connect", "local", "--control", "-n", "1"],
                Duration::from_secs(30),
            );
            assert!(
                !status.success() && err.contains("--control needs an agent"),
                "{err}"
            );
            // Clients that stay connected must not hold the agent up, nor
            // one that never said Hello.
            let idle = connect(&p.uris[0]);
            let _silent = RawPeer::connect(&p.uris[1]);
            let start = Instant::now();
            p.signal(sig);
            let status = p.wait_exit(Duration::from_secs(10));
            assert_eq!(
                status.code(),
                Some(0),
                "{name}: exit status {status}; stderr:\n{}",
                p.stderr()
            );
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{name}: exit took {:?}",
                start.elapsed()
            );
            assert!(!p.sock_path.exists(), "{name}: socket file left behind");
            assert!(
                p.stderr().contains("stopped"),
                "{name}: stderr:\n{}",
                p.stderr()
            );
            match idle.ping() {
                Err(ClientError::AgentGone(_)) => {}
                other => panic!("{name}: ping after exit gave {other:?}"),
            }
        }
    });
}

#[test]
fn a_killed_agent_wakes_its_waiting_clients() {
    within(LIMIT, "sigkill", || {
        let dir = tempfile::tempdir().expect("tmp");
        let mut p = ServeProcess::spawn_in(dir.path(), &[]);
        let uri = p.uris[0].clone();
        let timeout = Duration::from_secs(10);
        let c = client_with_timeout(&uri, timeout);
        check_identity(&c, "before");
        let m = c.model("identity").expect("identity");
        // Freeze the agent so the request is surely still waiting when it dies.
        p.freeze();
        let data = pattern(64, 5);
        let ticket = m
            .submit(&[TensorRef::new(DType::U8, &[64], &data).expect("t")])
            .expect("submit");
        let waiter = std::thread::spawn(move || {
            let start = Instant::now();
            (ticket.wait(), start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !waiter.is_finished(),
            "the call returned while the agent was frozen"
        );
        p.signal(libc::SIGKILL);
        let status = p.wait_exit(Duration::from_secs(5));
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        let (r, waited) = waiter.join().expect("waiter");
        match r {
            Err(ClientError::AgentGone(_)) | Err(ClientError::Timeout(_)) => {}
            other => panic!("a call waiting on a killed agent gave {other:?}"),
        }
        assert!(
            waited < timeout,
            "the call waited {waited:?}, past its {timeout:?} timeout"
        );
        assert!(
            waited < Duration::from_secs(3),
            "woke only after {waited:?}"
        );
        // Later calls fail at once; a new connection is refused.
        let start = Instant::now();
        assert!(matches!(c.ping(), Err(ClientError::AgentGone(_))));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(matches!(
            Client::connect(&uri),
            Err(ClientError::Connect(_))
        ));
        // A new agent takes over the socket path the dead one left behind.
        drop(p);
        let p2 = ServeProcess::spawn_in(dir.path(), &[]);
        check_identity(&connect(&p2.uris[0]), "the agent started after the kill");
    });
}

#[test]
fn a_frozen_agent_gives_timeouts_not_hangs() {
    within(LIMIT, "frozen agent", || {
        let p = ServeProcess::spawn(&[]);
        let uri = p.uris[0].clone();
        let timeout = Duration::from_millis(500);
        let c = client_with_timeout(&uri, timeout);
        let m = c.model("identity").expect("identity");
        check_identity(&c, "before");
        p.freeze();
        let data = pattern(256, 6);
        let start = Instant::now();
        match m.infer(&[TensorRef::new(DType::U8, &[256], &data).expect("t")]) {
            Err(ClientError::Timeout(t)) => assert_eq!(t, timeout),
            other => panic!("a call to a frozen agent gave {other:?}"),
        }
        let took = start.elapsed();
        assert!(
            took >= timeout && took < timeout * 4,
            "timed out after {took:?}"
        );
        assert!(matches!(c.ping(), Err(ClientError::Timeout(_))));
        // Connecting to it: the kernel accepts, the Hello goes unanswered.
        let start = Instant::now();
        match Client::connect_with(
            &uri,
            ClientOptions {
                timeout,
                ..ClientOptions::default()
            },
        ) {
            Err(ClientError::Timeout(_)) => {}
            other => panic!("connecting to a frozen agent gave {other:?}"),
        }
        assert!(start.elapsed() < timeout * 4);
        // Thawed, it answers again; the late answers are not mistaken for
        // the new request's.
        p.signal(libc::SIGCONT);
        let fresh = pattern(300, 7);
        let r = m
            .infer(&[TensorRef::new(DType::U8, &[300], &fresh).expect("t")])
            .expect("a call after the agent thawed");
        assert_eq!(r.outputs[0].bytes(), &fresh[..]);
        check_identity(&c, "after thaw");
        send_signal(p.pid(), libc::SIGTERM);
    });
}
