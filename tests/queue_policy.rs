//! The model queue's policy against a real agent, over every transport:
//! a full queue refuses at once (`overloaded`), a request whose queue
//! timeout passes is answered `timeout` and never computed, higher
//! priority is served first, a priority the model does not have is
//! refused, a waiting request whose client hangs up is never computed,
//! and (with `preempt`) a high-priority request stops a real ONNX Runtime
//! run in progress, which then runs again. The model is mostly a gate: its
//! first request holds the only run until the test opens it, so who waits,
//! and in which order the waiters run, is decided by the queue alone.

use client::{Client, ClientError, TensorRef};
use common::{built, shm_dir, wait_until, within};
use engine::{Backend, EngineError, Output, OutputData, TensorView};
use server::{Agent, AgentConfig, ModelConfig, ModelRegistry, NewModel, QueuePolicy};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use transport::Endpoint;
use wire::{DType, ModelSignature};

const LIMIT: Duration = Duration::from_secs(60);

/// Runs record the first byte of their input; a run whose byte is 0 waits
/// until the gate opens.
struct GateBackend {
    signature: ModelSignature,
    ran: Mutex<Vec<u8>>,
    open: Mutex<bool>,
    cv: Condvar,
}

impl GateBackend {
    fn new() -> Arc<GateBackend> {
        Arc::new(GateBackend {
            signature: ModelSignature {
                name: "gate".into(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
            ran: Mutex::new(Vec::new()),
            open: Mutex::new(false),
            cv: Condvar::new(),
        })
    }

    fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.cv.notify_all();
    }

    fn ran(&self) -> Vec<u8> {
        self.ran.lock().expect("ran").clone()
    }
}

impl Backend for GateBackend {
    fn signature(&self) -> &ModelSignature {
        &self.signature
    }

    fn check_inputs(&self, _inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        Ok(())
    }

    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        let tag = inputs
            .first()
            .and_then(|t| t.data.first())
            .copied()
            .unwrap_or(0);
        self.ran.lock().expect("ran").push(tag);
        if tag == 0 {
            let mut open = self.open.lock().expect("gate");
            while !*open {
                open = self.cv.wait(open).expect("gate");
            }
        }
        Ok(vec![Output {
            dtype: DType::U8,
            shape: vec![1],
            data: OutputData::Input(0),
        }])
    }
}

/// An agent serving the gate (one run at a time) under `policy` on every
/// transport: shared memory, a Unix socket, TCP and in-process.
struct GateAgent {
    agent: Agent,
    uris: Vec<(&'static str, String)>,
    _dir: tempfile::TempDir,
}

impl GateAgent {
    fn all_uris(&self) -> Vec<(&'static str, String)> {
        self.uris.clone()
    }
}

fn gate_agent(policy: QueuePolicy) -> (GateAgent, Arc<GateBackend>) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let gate = GateBackend::new();
    let registry = ModelRegistry::with_identity();
    registry.install(NewModel {
        backend: gate.clone(),
        concurrency: 1,
        version: 1,
        outputs_in_place: false,
        policy,
        batching: server::BatchPolicy::default(),
    });
    let dir = tempfile::tempdir().expect("temporary directory");
    let name = format!(
        "tw-queue-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let cfg = AgentConfig {
        listen: vec![
            Endpoint::Shm(name.clone()),
            Endpoint::Unix(dir.path().join("a.sock")),
            Endpoint::parse("tcp://127.0.0.1:0").expect("tcp"),
            Endpoint::Inproc(name.clone()),
        ],
        ..AgentConfig::default()
    };
    let agent = Agent::with_registry(cfg, registry).expect("agent");
    let names = ["shm", "unix", "tcp", "inproc"];
    let uris = names
        .into_iter()
        .zip(agent.endpoints())
        .map(|(n, ep)| (n, ep.to_string()))
        .collect::<Vec<_>>();
    assert!(uris[0].1.starts_with("shm://"), "{uris:?}");
    (
        GateAgent {
            agent,
            uris,
            _dir: dir,
        },
        gate,
    )
}

fn runs_done(ta: &GateAgent) -> u64 {
    let m = ta.agent.core().registry.find("gate").expect("gate");
    m.queue.stats().completed
}

fn waiting(ta: &GateAgent) -> usize {
    let m = ta.agent.core().registry.find("gate").expect("gate");
    m.queue.stats().waiting
}

/// Submits a request tagged `tag` on its own connection (so a refusal is
/// that request's alone) and returns the thread that waits for it.
fn send(
    uri: &str,
    tag: u8,
    priority: u8,
    timeout: Option<Duration>,
) -> std::thread::JoinHandle<Result<u8, ClientError>> {
    let c = Client::connect(uri).unwrap_or_else(|e| panic!("connect {uri}: {e}"));
    std::thread::spawn(move || {
        let mut m = c.model("gate")?.with_priority(priority);
        if let Some(t) = timeout {
            m = m.with_queue_timeout(t);
        }
        let data = [tag];
        let r = m.infer(&[TensorRef::new(DType::U8, &[1], &data).expect("tensor")])?;
        Ok(r.outputs[0].bytes()[0])
    })
}

/// The holder (tag 0) takes the run; returns once it is running.
fn hold(
    ta: &GateAgent,
    gate: &GateBackend,
    uri: &str,
) -> std::thread::JoinHandle<Result<u8, ClientError>> {
    *gate.open.lock().expect("gate") = false;
    gate.ran.lock().expect("ran").clear();
    let h = send(uri, 0, 0, None);
    wait_until(Duration::from_secs(10), "the holder runs", || {
        gate.ran() == [0]
    });
    assert_eq!(waiting(ta), 0);
    h
}

#[test]
fn higher_priority_runs_first_on_every_transport() {
    within(LIMIT, "priority order", || {
        // Aging an hour: no waiter ages during the test.
        let (ta, gate) = gate_agent(QueuePolicy {
            priority_levels: 3,
            default_priority: 3,
            aging: Duration::from_secs(3600),
            ..QueuePolicy::default()
        });
        for (round, (what, uri)) in (0u8..).zip(ta.all_uris()) {
            let holder = hold(&ta, &gate, &uri);
            // Arrival order: default (3), low (3), high (1), middle (2).
            let base = round * 10;
            let mut waiters = Vec::new();
            for (i, level) in [0u8, 3, 1, 2].into_iter().enumerate() {
                let tag = base + i as u8 + 1;
                waiters.push((tag, send(&uri, tag, level, None)));
                wait_until(Duration::from_secs(10), "in line", || waiting(&ta) == i + 1);
            }
            gate.open();
            assert_eq!(holder.join().expect("holder").expect("holder's answer"), 0);
            for (tag, w) in waiters {
                assert_eq!(w.join().expect("waiter").expect("answer"), tag, "{what}");
            }
            assert_eq!(
                gate.ran(),
                [0, base + 3, base + 4, base + 1, base + 2],
                "{what}: high, middle, then the two lowest in arrival order"
            );
        }
    });
}

#[test]
fn a_full_queue_refuses_at_once_and_a_queue_timeout_never_computes() {
    within(LIMIT, "overloaded and timeout", || {
        let (ta, gate) = gate_agent(QueuePolicy {
            max_queue: 1,
            ..QueuePolicy::default()
        });
        for (what, uri) in ta.all_uris() {
            // The one place in line taken: one more is refused at once.
            let holder = hold(&ta, &gate, &uri);
            let queued = send(&uri, 7, 0, None);
            wait_until(Duration::from_secs(10), "in line", || waiting(&ta) == 1);
            match send(&uri, 8, 0, None).join().expect("thread") {
                Err(ClientError::Overloaded(msg)) => {
                    assert!(msg.contains("queue is full"), "{what}: {msg}")
                }
                other => panic!("{what}: expected overloaded, got {other:?}"),
            }
            gate.open();
            assert_eq!(holder.join().expect("holder").expect("answer"), 0);
            assert_eq!(queued.join().expect("thread").expect("answer"), 7);
            assert_eq!(gate.ran(), [0, 7], "{what}: 8 was not computed");

            // A request whose queue timeout passes is answered and dropped.
            let holder = hold(&ta, &gate, &uri);
            let t0 = Instant::now();
            match send(&uri, 9, 0, Some(Duration::from_secs(1)))
                .join()
                .expect("thread")
            {
                Err(ClientError::QueueTimeout(msg)) => {
                    assert!(t0.elapsed() >= Duration::from_secs(1), "{what}");
                    assert!(msg.contains("not computed"), "{what}: {msg}");
                }
                other => panic!("{what}: expected a queue timeout, got {other:?}"),
            }
            gate.open();
            assert_eq!(holder.join().expect("holder").expect("answer"), 0);
            assert_eq!(gate.ran(), [0], "{what}: 9 was not computed");
        }
        let stats = ta
            .agent
            .core()
            .registry
            .find("gate")
            .expect("gate")
            .queue
            .stats();
        let n = ta.all_uris().len() as u64;
        assert_eq!((stats.overloaded, stats.timed_out), (n, n));
    });
}

#[test]
fn a_priority_the_model_does_not_have_is_refused() {
    within(LIMIT, "bad priority", || {
        let (ta, _gate) = gate_agent(QueuePolicy {
            priority_levels: 2,
            default_priority: 2,
            ..QueuePolicy::default()
        });
        for (what, uri) in ta.all_uris() {
            match send(&uri, 1, 3, None).join().expect("thread") {
                Err(ClientError::InvalidInput(msg)) => {
                    assert!(msg.contains("priority 3"), "{what}: {msg}")
                }
                other => panic!("{what}: expected invalid input, got {other:?}"),
            }
            // The session goes on.
            assert_eq!(
                send(&uri, 1, 2, None).join().expect("thread").expect("ok"),
                1
            );
        }
    });
}

/// The KServe HTTP door carries Triton's `priority` and `timeout` request
/// parameters to the same queue: a full line answers 503, a timeout 504; a
/// priority the model does not have runs at its default level, as Triton
/// does; one out of the parameter's range is 400.
#[test]
fn the_http_door_carries_priority_and_timeout() {
    within(LIMIT, "http door", || {
        let (ta, gate) = gate_agent(QueuePolicy {
            max_queue: 1,
            priority_levels: 2,
            default_priority: 2,
            ..QueuePolicy::default()
        });
        let doors = frontend::FrontDoors::start(
            ta.agent.core().clone(),
            frontend::DoorsConfig {
                http: vec!["http://127.0.0.1:0".into()],
                ..frontend::DoorsConfig::default()
            },
        )
        .expect("http door");
        let addr = doors.uris()[0].trim_start_matches("http://").to_string();
        let post = move |params: &str| -> (u16, String) {
            use std::io::{Read, Write};
            let body = format!(
                r#"{{"inputs":[{{"name":"x","datatype":"UINT8","shape":[1],"data":[5]}}],"parameters":{{{params}}}}}"#
            );
            let mut s = std::net::TcpStream::connect(&addr).expect("connect");
            write!(
                s,
                "POST /v2/models/gate/infer HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .expect("write");
            let mut reply = String::new();
            let _ = s.read_to_string(&mut reply);
            let code = reply
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            (code, reply)
        };
        let (code, reply) = post(r#""priority": 300"#);
        assert_eq!(code, 400, "{reply}");
        assert!(reply.contains("0..=255"), "{reply}");
        for p in ["1", "3"] {
            let (code, reply) = post(&format!(r#""priority": {p}"#));
            assert_eq!(code, 200, "priority {p}: {reply}");
        }

        let uri = ta.all_uris()[1].1.clone();
        let holder = hold(&ta, &gate, &uri);
        let queued = std::thread::spawn({
            let post = post.clone();
            move || post("")
        });
        wait_until(Duration::from_secs(10), "in line", || waiting(&ta) == 1);
        let (code, reply) = post("");
        assert_eq!(code, 503, "a full line: {reply}");
        assert!(reply.contains("queue is full"), "{reply}");
        gate.open();
        assert_eq!(holder.join().expect("holder").expect("answer"), 0);
        assert_eq!(queued.join().expect("thread").0, 200);

        let holder = hold(&ta, &gate, &uri);
        let (code, reply) = post(r#""timeout": 1000000"#);
        assert_eq!(code, 504, "a queue timeout: {reply}");
        assert!(reply.contains("not computed"), "{reply}");
        gate.open();
        assert_eq!(holder.join().expect("holder").expect("answer"), 0);
        doors.shutdown();
    });
}

#[test]
fn a_queued_request_whose_client_hangs_up_is_never_computed() {
    within(LIMIT, "a client gone while its request waits", || {
        let (ta, gate) = gate_agent(QueuePolicy::default());
        let failures = || {
            let m = ta.agent.core().registry.find("gate").expect("gate");
            m.stats.snapshot().fail.count
        };
        // In-process callers wait on their own thread: no connection.
        for (what, uri) in ta.all_uris().into_iter().filter(|(w, _)| *w != "inproc") {
            let holder = hold(&ta, &gate, &uri);
            let failed = failures();
            let runs = runs_done(&ta);
            // The victim's request waits in line, then its client goes
            // (a killed process closes its connection the same way).
            let victim = Client::connect(&uri).unwrap_or_else(|e| panic!("{what}: {e}"));
            let ticket = victim
                .model("gate")
                .expect("gate")
                .submit(&[TensorRef::new(DType::U8, &[1], &[7]).expect("tensor")])
                .expect("submit");
            wait_until(Duration::from_secs(10), "the victim in line", || {
                waiting(&ta) == 1
            });
            drop(ticket);
            drop(victim);
            // A live client behind it is served.
            let live = send(&uri, 8, 0, None);
            wait_until(Duration::from_secs(10), "the live client in line", || {
                waiting(&ta) == 2
            });
            gate.open();
            assert_eq!(holder.join().expect("holder").expect("answer"), 0);
            assert_eq!(live.join().expect("thread").expect("answer"), 8, "{what}");
            assert_eq!(
                gate.ran(),
                [0, 8],
                "{what}: the victim's 7 was not computed"
            );
            assert_eq!(
                runs_done(&ta),
                runs + 2,
                "{what}: two runs, the holder's and 8's"
            );
            wait_until(
                Duration::from_secs(10),
                "the victim counted as failed",
                || failures() == failed + 1,
            );
            assert_eq!(waiting(&ta), 0, "{what}");
        }
    });
}

/// `slow_echo` (about 100–300 ms of ONNX Runtime work per run) with two
/// levels and `preempt`: a level-1 request sent while a level-2 run is in
/// progress stops it and is answered first; the stopped request runs again
/// and is answered its own echo. Without the stop (run options not passed
/// to ONNX Runtime, or the queue not stopping) the low one would finish
/// first: it started first and holds the only run.
#[test]
fn a_high_priority_request_stops_a_slow_onnx_run_which_then_runs_again() {
    within(LIMIT, "preemption", || {
        shm_dir();
        let dir = tempfile::tempdir().expect("temporary directory");
        let name = format!("tw-preempt-{}", std::process::id());
        let cfg = AgentConfig {
            listen: vec![
                Endpoint::Shm(name),
                Endpoint::Unix(dir.path().join("a.sock")),
                Endpoint::parse("tcp://127.0.0.1:0").expect("tcp"),
            ],
            models: vec![ModelConfig {
                priority_levels: 2,
                preempt: true,
                priority_aging_ms: 3_600_000, // no aging during the test
                ..ModelConfig::new("slow_echo", built("slow_echo.onnx"))
            }],
            ..AgentConfig::default()
        };
        let agent = Agent::start(cfg).expect("agent starts");
        let model = agent.core().registry.find("slow_echo").expect("served");
        for (round, ep) in agent.endpoints().iter().enumerate() {
            let uri = ep.to_string();
            let (tx, rx) = std::sync::mpsc::channel();
            let send = |priority: u8, x: Vec<f32>| {
                let c = Client::connect(&uri).unwrap_or_else(|e| panic!("connect {uri}: {e}"));
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let m = c.model("slow_echo").expect("model").with_priority(priority);
                    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let r = m
                        .infer(&[TensorRef::new(DType::F32, &[x.len() as u64], &bytes).expect("x")])
                        .expect("answered");
                    let y: Vec<f32> = r.outputs[0]
                        .bytes()
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    tx.send(priority).expect("test waits");
                    y
                })
            };
            let before = model.queue.stats();
            let low = send(2, vec![1.0, 2.0, 3.0, 4.0]);
            wait_until(Duration::from_secs(10), "the low run starts", || {
                model.queue.stats().running == 1
            });
            std::thread::sleep(Duration::from_millis(20));
            let high = send(1, vec![5.0]);
            let first = rx.recv().expect("an answer");
            assert_eq!(high.join().expect("high"), [5.0], "{uri}");
            assert_eq!(low.join().expect("low"), [1.0, 2.0, 3.0, 4.0], "{uri}");
            assert_eq!(
                first, 1,
                "{uri}: the high-priority request is answered first"
            );
            let after = model.queue.stats();
            assert_eq!(
                after.preempted - before.preempted,
                1,
                "{uri} (round {round})"
            );
            assert_eq!(after.completed - before.completed, 2, "{uri}");
        }
    });
}
