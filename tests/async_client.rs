//! The Rust client's asynchronous modes against a real `tensorwire serve`
//! process on unix, tcp and shm: completion callbacks
//! ([`client::Ticket::on_complete`]) and futures (`ticket.await`) get
//! every response exactly once with the right outputs, synchronous calls
//! work beside them, a dropped session still completes them, a
//! panicking callback harms no other, and a stopped or killed agent ends
//! every watched request with a clear error within its bound.

use client::{Client, ClientError, ClientOptions, Response, TensorRef};
use common::{digits_expected, digits_input, digits_model, within, ServeProcess};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use wire::DType;

const LIMIT: Duration = Duration::from_secs(120);

/// An agent serving `digits` (and `identity`) on unix, tcp and shm.
fn agent(tag: &str) -> (ServeProcess, Vec<(&'static str, String)>) {
    let name = format!("tw-async-{tag}-{}", std::process::id());
    let model = format!("digits={}", digits_model().display());
    let shm = format!("shm://{name}");
    let args = [
        "--listen",
        "tcp://127.0.0.1:0",
        "--listen",
        shm.as_str(),
        "--model",
        model.as_str(),
    ];
    let p = ServeProcess::spawn(&args);
    let uris = vec![
        ("unix", p.uris[0].clone()),
        ("tcp", p.uris[1].clone()),
        ("shm", p.uris[2].clone()),
    ];
    (p, uris)
}

/// `digits` logits for the fixed input, as f32s.
fn logits(r: &Response) -> Vec<f32> {
    r.outputs[0].to_vec::<f32>().expect("f32 logits")
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-4)
}

#[test]
fn callbacks_and_futures_complete_every_request_on_every_transport() {
    let (_agent, uris) = agent("all");
    within(LIMIT, "callbacks and futures", move || {
        let input = digits_input();
        let want = digits_expected();
        for (name, uri) in uris {
            let c = Client::connect(&uri).unwrap_or_else(|e| panic!("{name}: connect: {e}"));
            let m = c.model("digits").expect("digits");
            let x = TensorRef::new(DType::F32, &[4, 64], &input).expect("tensor");

            // Callbacks: 48 in flight at once, sync calls interleaved.
            let (tx, rx) = mpsc::channel();
            let n = 48;
            for i in 0..n {
                let tx = tx.clone();
                m.submit(&[x])
                    .unwrap_or_else(|e| panic!("{name}: submit {i}: {e}"))
                    .on_complete(move |r| {
                        let _ = tx.send((i, r.map(|r| logits(&r))));
                    });
                if i % 8 == 0 {
                    let r = m.infer(&[x]).expect("a sync call beside the callbacks");
                    assert!(close(&logits(&r), &want), "{name}: sync logits");
                }
            }
            let mut seen = vec![false; n];
            for _ in 0..n {
                let (i, r) = rx
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap_or_else(|_| panic!("{name}: a callback never ran"));
                let got = r.unwrap_or_else(|e| panic!("{name}: request {i}: {e}"));
                assert!(close(&got, &want), "{name}: request {i}: wrong logits");
                assert!(!seen[i], "{name}: request {i} completed twice");
                seen[i] = true;
            }
            assert!(
                rx.recv_timeout(Duration::from_millis(200)).is_err(),
                "{name}: a callback ran twice"
            );

            // Futures, on a runtime that knows nothing of tensorwire.
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            let tickets: Vec<_> = (0..16).map(|_| m.submit(&[x]).expect("submit")).collect();
            let outs = rt.block_on(async {
                let mut outs = Vec::new();
                for t in tickets {
                    outs.push(t.await);
                }
                outs
            });
            for (i, r) in outs.into_iter().enumerate() {
                let r = r.unwrap_or_else(|e| panic!("{name}: future {i}: {e}"));
                assert!(
                    close(&logits(&r), &want),
                    "{name}: future {i}: wrong logits"
                );
            }

            // A dropped session still completes what it handed over.
            let (tx, rx) = mpsc::channel();
            let t = m.submit(&[x]).expect("submit");
            drop(m);
            drop(c);
            t.on_complete(move |r| {
                let _ = tx.send(r.map(|r| logits(&r)));
            });
            let r = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the callback of a dropped session ran");
            assert!(close(&r.expect("ok"), &want), "{name}: after drop");
        }
    });
}

#[test]
fn a_panicking_callback_harms_no_other() {
    let (_agent, uris) = agent("panic");
    within(LIMIT, "panicking callback", move || {
        let (_, uri) = &uris[0];
        let c = Client::connect(uri).expect("connect");
        let m = c.model("identity").expect("identity");
        let y = [7u8; 16];
        let t = TensorRef::new(DType::U8, &[16], &y).expect("t");
        let (tx, rx) = mpsc::channel();
        for i in 0..10 {
            let tx = tx.clone();
            m.submit(&[t]).expect("submit").on_complete(move |r| {
                if i % 2 == 0 {
                    panic!("callback {i} panics on purpose");
                }
                let _ = tx.send(r.map(|r| r.outputs[0].bytes().to_vec()));
            });
        }
        for _ in 0..5 {
            let r = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("a callback");
            assert_eq!(r.expect("ok"), y.to_vec());
        }
        // The session and its completion thread are still fine.
        assert_eq!(m.infer(&[t]).expect("sync").outputs[0].bytes(), &y);
        let (tx, rx) = mpsc::channel();
        m.submit(&[t]).expect("submit").on_complete(move |r| {
            let _ = tx.send(r.is_ok());
        });
        assert!(rx.recv_timeout(Duration::from_secs(30)).expect("after"));
    });
}

#[test]
fn a_stopped_agent_times_out_and_a_killed_one_fails_promptly() {
    let (agent, uris) = agent("fault");
    let agent = std::sync::Arc::new(agent);
    within(LIMIT, "stopped and killed agent", move || {
        let opts = ClientOptions {
            timeout: Duration::from_millis(600),
            ..ClientOptions::default()
        };
        let y = [1u8; 8];
        let t = TensorRef::new(DType::U8, &[8], &y).expect("t");
        let clients: Vec<(&str, Client)> = uris
            .iter()
            .map(|(n, u)| (*n, Client::connect_with(u, opts.clone()).expect("connect")))
            .collect();
        let models: Vec<_> = clients
            .iter()
            .map(|(n, c)| (*n, c.model("identity").expect("identity")))
            .collect();

        // Stopped: every watched request ends with Timeout near the bound.
        agent.freeze();
        let (tx, rx) = mpsc::channel();
        let started = Instant::now();
        for (name, m) in &models {
            let tx = tx.clone();
            let name = *name;
            m.submit(&[t])
                .expect("submit to a stopped agent (it fits the socket)")
                .on_complete(move |r| drop(tx.send((name, started.elapsed(), r))));
        }
        for _ in 0..models.len() {
            let (name, took, r) = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("a callback");
            assert!(
                matches!(r, Err(ClientError::Timeout(_))),
                "{name}: expected a timeout, got {:?}",
                r.map(|_| ())
            );
            assert!(
                took >= Duration::from_millis(550) && took < Duration::from_secs(3),
                "{name}: timed out after {took:?} (bound 600 ms)"
            );
        }

        // Killed while requests wait: each ends with AgentGone, promptly.
        let (tx, rx) = mpsc::channel();
        for (name, m) in &models {
            let tx = tx.clone();
            let name = *name;
            m.submit(&[t])
                .expect("submit to a stopped agent")
                .on_complete(move |r| drop(tx.send((name, r.map(|_| ())))));
        }
        agent.signal(libc::SIGKILL);
        let killed = Instant::now();
        for _ in 0..models.len() {
            let (name, r) = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("a callback");
            assert!(
                matches!(r, Err(ClientError::AgentGone(_))),
                "{name}: expected the agent gone, got {r:?}"
            );
        }
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "killed-agent errors took {:?}",
            killed.elapsed()
        );
    });
}
