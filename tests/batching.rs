//! Dynamic batching against a real agent and a real model (the digits
//! MLP under ONNX Runtime), over every transport: requests that wait
//! together run as one batch and each gets its own rows, equal to what the
//! same model computes for it unbatched; a client killed while its request
//! waits in a batch costs the others nothing.
//!
//! Batches are made deterministic with a long queue delay: the first
//! request of a batch waits (up to 10 s) until `max_batch` rows are there,
//! so a batch forms exactly when the test has sent them.

use client::{Client, TensorRef};
use common::{built, digits_expected, digits_input, shm_dir, tensorwire_command, within};
use server::{Agent, AgentConfig, ModelConfig};
use std::process::Stdio;
use std::time::Duration;
use transport::Endpoint;
use wire::DType;

const LIMIT: Duration = Duration::from_secs(120);

/// An agent serving the digits MLP as `digits` (one request per run) and
/// as `batched` (`max_batch` rows, waiting up to 10 s for them), on shared
/// memory, a Unix socket, TCP and in-process.
fn agent(max_batch: usize) -> (Agent, Vec<(&'static str, String)>, tempfile::TempDir) {
    shm_dir();
    let dir = tempfile::tempdir().expect("temporary directory");
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("tw-batch-{}-{seq}", std::process::id());
    let batched = ModelConfig {
        max_batch,
        max_queue_delay_us: 10_000_000,
        ..ModelConfig::new("batched", built("digits_mlp.onnx"))
    };
    let cfg = AgentConfig {
        listen: vec![
            Endpoint::Shm(name.clone()),
            Endpoint::Unix(dir.path().join("a.sock")),
            Endpoint::parse("tcp://127.0.0.1:0").expect("tcp"),
            Endpoint::Inproc(name),
        ],
        models: vec![
            ModelConfig::new("digits", built("digits_mlp.onnx")),
            batched,
        ],
        ..AgentConfig::default()
    };
    let agent = Agent::start(cfg).expect("agent starts");
    let uris = ["shm", "unix", "tcp", "inproc"]
        .into_iter()
        .zip(agent.endpoints())
        .map(|(n, ep)| (n, ep.to_string()))
        .collect();
    (agent, uris, dir)
}

/// Rows `rows` of the digits input (f32 `[4, 64]`) as little-endian bytes.
fn rows(r: std::ops::Range<usize>) -> Vec<u8> {
    digits_input()[r.start * 256..r.end * 256].to_vec()
}

fn logits(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs `model` on `x` (`[n, 64]`) over a new connection to `uri`.
fn infer(uri: &str, model: &str, x: &[u8]) -> Result<Vec<u8>, client::ClientError> {
    let c = Client::connect(uri)?;
    let m = c.model(model)?;
    let n = (x.len() / 256) as u64;
    let r = m.infer(&[TensorRef::new(DType::F32, &[n, 64], x)?])?;
    Ok(r.outputs[0].bytes().to_vec())
}

type Call = std::thread::JoinHandle<Result<Vec<u8>, client::ClientError>>;

/// Sends each part's rows to `batched` over `uri` at once, each on its
/// own connection and thread.
fn send_batched(uri: &str, parts: &[std::ops::Range<usize>]) -> Vec<Call> {
    parts
        .iter()
        .map(|r| {
            let (uri, x) = (uri.to_string(), rows(r.clone()));
            std::thread::spawn(move || infer(&uri, "batched", &x))
        })
        .collect()
}

fn stats(agent: &Agent) -> server::StatsSnapshot {
    agent
        .core()
        .registry
        .find("batched")
        .expect("batched")
        .stats
        .snapshot()
}

#[test]
fn batched_results_equal_unbatched_ones_on_every_transport() {
    within(LIMIT, "batched results", || {
        let (agent, uris, _dir) = agent(4);
        let expected = digits_expected();
        for (round, (what, uri)) in (1u64..).zip(&uris) {
            // Three requests of 1, 1 and 2 rows: one batch of 4.
            let parts = [0..1, 1..2, 2..4];
            let calls = send_batched(uri, &parts);
            for (r, h) in parts.iter().zip(calls) {
                let got = h.join().expect("caller").expect("batched call");
                let alone = infer(uri, "digits", &rows(r.clone())).expect("unbatched call");
                // ONNX Runtime's MLP kernels compute a row the same in a
                // batch of 4 as alone here; the stated tolerance allows
                // for an engine whose kernels depend on the batch size.
                for (i, ((g, a), e)) in logits(&got)
                    .iter()
                    .zip(logits(&alone))
                    .zip(&expected[r.start * 10..r.end * 10])
                    .enumerate()
                {
                    assert!(
                        (g - a).abs() <= 1e-5 * a.abs().max(1.0),
                        "{what}: logit {i} of rows {r:?}: batched {g}, alone {a}"
                    );
                    assert!((g - e).abs() <= 1e-3, "{what}: {g} vs Python's {e}");
                }
            }
            let s = stats(&agent);
            assert_eq!(
                (s.batches, s.batched_requests),
                (round, 3 * round),
                "{what}: one batch of the three requests"
            );
        }
        let s = stats(&agent);
        assert_eq!(s.inference_count, 12);
        assert_eq!(s.execution_count, 4, "four batches, one engine run each");
        assert_eq!(s.batch_staged_bytes, 4 * 4 * 256, "each input copied once");
        agent.shutdown(Duration::from_secs(5));
    });
}

/// A `tensorwire infer` process sending one row of the digits input to
/// `batched` over `uri`.
fn client_process(uri: &str, sample: &std::path::Path) -> std::process::Child {
    tensorwire_command()
        .args(["infer", "--connect", uri, "--model", "batched", "--input"])
        .arg(format!("x={}", sample.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a tensorwire client")
}

/// Joins `calls` (rows `parts` of the digits input) and checks each got its
/// own rows' logits.
fn check_answers(what: &str, parts: &[std::ops::Range<usize>], calls: Vec<Call>) {
    let expected = digits_expected();
    for (r, h) in parts.iter().zip(calls) {
        let got = logits(&h.join().expect("caller").expect("a live member"));
        assert_eq!(got.len(), r.len() * 10, "{what}");
        for (g, e) in got.iter().zip(&expected[r.start * 10..r.end * 10]) {
            assert!((g - e).abs() <= 1e-3, "{what}: {g} vs {e}");
        }
    }
}

/// Between `before` and `after`: one batch, run for two requests (the
/// killed client's third was left out).
fn one_batch_of_two(what: &str, before: &server::StatsSnapshot, after: &server::StatsSnapshot) {
    assert_eq!(after.batches, before.batches + 1, "{what}");
    assert_eq!(
        after.batched_requests,
        before.batched_requests + 2,
        "{what}: the killed client's request was not run"
    );
    assert_eq!(after.inference_count, before.inference_count + 2, "{what}");
}

#[test]
fn a_client_killed_while_its_request_waits_in_a_batch_is_left_out_of_the_run() {
    within(LIMIT, "killed batch member", || {
        let (agent, uris, dir) = agent(4);
        let model = agent.core().registry.find("batched").expect("batched");
        // The client process's input: row 3 of the digits input.
        let sample = dir.path().join("x.npy");
        npy::write_npy(&sample, DType::F32, &[1, 64], &rows(3..4)).expect("write x.npy");
        let kill = |mut kid: std::process::Child| {
            kid.kill().expect("SIGKILL the client");
            kid.wait().expect("reap the client");
        };
        for (what, uri) in uris.iter().filter(|(w, _)| *w != "inproc") {
            // 1. The killed client's request leads a batch and waits for
            // three more rows; the others' three rows fill it. It is left
            // out of the run; they get their own answers.
            let failed = stats(&agent).fail.count;
            let before = stats(&agent);
            let kid = client_process(uri, &sample);
            common::wait_until(Duration::from_secs(30), "the leader waits", || {
                model.queue.stats().running == 1
            });
            kill(kid);
            let parts = [0..1, 1..3];
            check_answers(what, &parts, send_batched(uri, &parts));
            one_batch_of_two(&format!("{what}, killed leader"), &before, &stats(&agent));
            // 2. A live request leads; the killed client's request joins
            // the line behind it; two more rows fill the batch. The leader
            // leaves the killed one out.
            let before = stats(&agent);
            let (first, second) = (std::slice::from_ref(&(0..1)), std::slice::from_ref(&(1..3)));
            let leader = send_batched(uri, first);
            common::wait_until(Duration::from_secs(30), "the leader waits", || {
                model.queue.stats().running == 1
            });
            let kid = client_process(uri, &sample);
            common::wait_until(Duration::from_secs(30), "the member waits", || {
                model.queue.stats().waiting == 1
            });
            kill(kid);
            let rest = send_batched(uri, second);
            check_answers(what, first, leader);
            check_answers(what, second, rest);
            one_batch_of_two(&format!("{what}, killed member"), &before, &stats(&agent));
            common::wait_until(Duration::from_secs(10), "both counted as failed", || {
                stats(&agent).fail.count == failed + 2
            });
            // And the agent goes on serving.
            let two = rows(0..2);
            let a = infer(uri, "digits", &two).expect("served after the kills");
            assert_eq!(a.len(), 2 * 10 * 4, "{what}");
            assert_eq!(
                model.queue.stats().running,
                0,
                "{what}: nothing left running"
            );
        }
        agent.shutdown(Duration::from_secs(5));
    });
}

#[test]
fn batch_settings_are_checked() {
    for (setting, want) in [
        ("max_batch=0", "max_batch"),
        (
            "max_batch=8;preferred_batch_sizes=[16]",
            "preferred_batch_sizes",
        ),
        ("max_queue_delay_us=60000000", "max_queue_delay_us"),
        ("max_batch", "KEY=VALUE"),
        ("max_batch=eight", "max_batch"),
        ("bogus=1", "bogus"),
    ] {
        let flag = format!("m={};{setting}", built("digits_mlp.onnx").display());
        let e = ModelConfig::parse_flag(&flag)
            .and_then(|m| {
                AgentConfig {
                    models: vec![m],
                    ..AgentConfig::default()
                }
                .validate()
            })
            .expect_err(setting);
        assert!(e.to_string().contains(want), "{setting}: {e}");
    }
    let m = ModelConfig::parse_flag(&format!(
        "m={};max_batch=8;max_queue_delay_us=250;preferred_batch_sizes=[4, 8]",
        built("digits_mlp.onnx").display()
    ))
    .expect("a batching model");
    let p = m.batch_policy();
    assert_eq!(
        (p.max_batch, p.max_queue_delay, p.preferred),
        (8, Duration::from_micros(250), vec![4, 8])
    );
}
