//! Running the lines of a text file through a classifier, one request per
//! line (batch 1), timing each on the client as the original experiment
//! did: tokenize + request + response.
//!
//! A [`Target`] is where the model runs: [`LocalTarget`] calls the ONNX
//! Runtime engine directly in this process (no agent, no transport: the
//! `local` baseline), [`RemoteTarget`] calls a model served by an agent over
//! any tensorwire transport (`inproc://`, `unix://`, `tcp://`).

use crate::labels::{argmax, Labels};
use crate::tokenize::{Encoded, TextTokenizer};
use crate::{ClassifierError, WARMUP_LINES};
use client::{ClientOptions, TensorRef};
use engine::{Backend, DType, ModelSignature, OrtBackend, OrtOptions, TensorView};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// One non-blank line of the input file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputLine {
    /// Its line number in the file (1-based; blank lines count).
    pub number: usize,
    /// The text, as in the file (without the line ending).
    pub text: String,
}

/// Reads `path` (UTF-8 text, `\n` or `\r\n` line endings) and returns its
/// non-blank lines; lines of only whitespace are skipped. Errors name the
/// file.
pub fn read_lines(path: &Path) -> Result<Vec<InputLine>, ClassifierError> {
    let text = std::fs::read_to_string(path).map_err(|e| ClassifierError::Input {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    Ok(split_lines(&text))
}

/// The non-blank lines of `text`, numbered from 1.
pub fn split_lines(text: &str) -> Vec<InputLine> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| InputLine {
            number: i + 1,
            text: l.to_string(),
        })
        .collect()
}

/// Where the time of one request went, in nanoseconds, from the client's
/// stamps and the agent's timeline (`CLOCK_MONOTONIC` on one machine).
/// For [`LocalTarget`] only `compute` is measured (the engine call); the
/// others are 0, as there is no transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stages {
    /// Client start of the request → the agent read its header (encode,
    /// send, wake-up, header read).
    pub request_ns: u64,
    /// Header read → tensor bytes in place.
    pub payload_ns: u64,
    /// Tensors in place → engine started (checks, queue wait).
    pub queue_ns: u64,
    /// The engine run.
    pub compute_ns: u64,
    /// Engine done → the client has the outputs (response build, send,
    /// wake-up, read, decode).
    pub response_ns: u64,
}

impl Stages {
    /// From the client's start and done stamps and the agent's timeline;
    /// `None` when a stamp is missing.
    pub fn from_timeline(start_ns: u64, tl: &wire::Timeline, done_ns: u64) -> Option<Stages> {
        use wire::Stage::*;
        let points = [
            start_ns,
            tl.get(Received),
            tl.get(PayloadInPlace),
            tl.get(ComputeStart),
            tl.get(ComputeEnd),
            done_ns,
        ];
        if points.contains(&0) {
            return None;
        }
        let d = |i: usize| points[i + 1].saturating_sub(points[i]);
        Some(Stages {
            request_ns: d(0),
            payload_ns: d(1),
            queue_ns: d(2),
            compute_ns: d(3),
            response_ns: d(4),
        })
    }

    /// The stages as `(name, ns)` pairs, in order.
    pub fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("request", self.request_ns),
            ("payload", self.payload_ns),
            ("queue", self.queue_ns),
            ("compute", self.compute_ns),
            ("response", self.response_ns),
        ]
    }

    /// The element-wise mean of `all` (`None` if empty).
    pub fn mean(all: &[Stages]) -> Option<Stages> {
        let n = all.len() as u64;
        if n == 0 {
            return None;
        }
        let sum = |f: fn(&Stages) -> u64| all.iter().map(f).sum::<u64>() / n;
        Some(Stages {
            request_ns: sum(|s| s.request_ns),
            payload_ns: sum(|s| s.payload_ns),
            queue_ns: sum(|s| s.queue_ns),
            compute_ns: sum(|s| s.compute_ns),
            response_ns: sum(|s| s.response_ns),
        })
    }
}

/// What one model call returned.
#[derive(Clone, Debug, PartialEq)]
pub struct Inference {
    /// The logits of the line (one per label).
    pub logits: Vec<f32>,
    /// Where the time went, when known.
    pub stages: Option<Stages>,
}

/// Where a line is classified.
pub trait Target {
    /// The model's signature.
    fn signature(&self) -> &ModelSignature;
    /// Runs the model on one tokenized line.
    fn infer(&mut self, enc: &Encoded) -> Result<Inference, ClassifierError>;
}

/// How a model's inputs and outputs map onto a tokenized line.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Plan {
    /// For each model input, in order: `input_ids`, `attention_mask` or
    /// `token_type_ids`.
    inputs: Vec<String>,
    /// Which output holds the logits.
    output: usize,
}

impl Plan {
    /// Checks the signature: every input one of the three int64 `[batch,
    /// seq]` tensors a tokenizer makes; an output named `logits` (or a
    /// single output) of float32 `[batch, labels]`.
    fn new(sig: &ModelSignature) -> Result<Plan, ClassifierError> {
        let bad = |reason: String| ClassifierError::Model {
            model: sig.name.clone(),
            reason,
        };
        if sig.inputs.is_empty() {
            return Err(bad(
                "takes any tensors (is this the identity model?), not token ids".into(),
            ));
        }
        let mut inputs = Vec::new();
        for spec in &sig.inputs {
            if Encoded::input(&EMPTY, &spec.name).is_none() {
                return Err(bad(format!(
                    "input '{}' is not one a tokenizer makes (input_ids, attention_mask, token_type_ids)",
                    spec.name
                )));
            }
            if spec.dtype != DType::I64 || spec.shape.len() != 2 {
                return Err(bad(format!(
                    "input '{}' is {}, not int64[batch, seq]",
                    spec.name,
                    spec.describe()
                )));
            }
            inputs.push(spec.name.clone());
        }
        let output = match sig.outputs.iter().position(|o| o.name == "logits") {
            Some(i) => i,
            None if sig.outputs.len() == 1 => 0,
            None => {
                return Err(bad(format!(
                    "has {} outputs and none is named 'logits'",
                    sig.outputs.len()
                )))
            }
        };
        let out = &sig.outputs[output];
        if out.dtype != DType::F32 || out.shape.len() != 2 {
            return Err(bad(format!(
                "output '{}' is {}, not float32[batch, labels]",
                out.name,
                out.describe()
            )));
        }
        Ok(Plan { inputs, output })
    }

    /// Checks the declared number of logits against the labels.
    fn check_labels(&self, sig: &ModelSignature, labels: &Labels) -> Result<(), ClassifierError> {
        let out = &sig.outputs[self.output];
        match out.shape.get(1).copied().flatten() {
            Some(n) if n != labels.len() as u64 => Err(ClassifierError::Model {
                model: sig.name.clone(),
                reason: format!(
                    "output '{}' has {n} logits but {} names {} labels",
                    out.name,
                    labels.path().display(),
                    labels.len()
                ),
            }),
            _ => Ok(()),
        }
    }
}

const EMPTY: Encoded = Encoded {
    input_ids: Vec::new(),
    attention_mask: Vec::new(),
    token_type_ids: Vec::new(),
    truncated_from: None,
};

/// The engine called directly in this process: no agent, no transport, no
/// copies (the `local` baseline of the RPC tax).
#[derive(Debug)]
pub struct LocalTarget {
    backend: OrtBackend,
    plan: Plan,
}

impl LocalTarget {
    /// Loads the model at `path` into ONNX Runtime with `opts`: for a fair
    /// baseline, the options an agent would load it with
    /// ([`AgentSpec::ort_options`](crate::agents::AgentSpec::ort_options)).
    /// Errors name the file.
    pub fn load(path: &Path, opts: &OrtOptions) -> Result<LocalTarget, ClassifierError> {
        let backend = OrtBackend::load("local", path, opts)?;
        let plan = Plan::new(backend.signature()).map_err(|e| match e {
            ClassifierError::Model { reason, .. } => ClassifierError::Model {
                model: path.display().to_string(),
                reason,
            },
            other => other,
        })?;
        Ok(LocalTarget { backend, plan })
    }
}

impl Target for LocalTarget {
    fn signature(&self) -> &ModelSignature {
        self.backend.signature()
    }

    fn infer(&mut self, enc: &Encoded) -> Result<Inference, ClassifierError> {
        let shape = enc.shape();
        let views: Vec<TensorView<'_>> = self
            .plan
            .inputs
            .iter()
            .map(|name| {
                let data = enc.input(name).unwrap_or(&[]);
                TensorView::new(DType::I64, &shape, bytemuck::cast_slice(data))
            })
            .collect();
        let t = wire::monotonic_ns();
        let outputs = self.backend.run(&views)?;
        let compute_ns = wire::monotonic_ns().saturating_sub(t);
        let out = outputs
            .get(self.plan.output)
            .ok_or_else(|| ClassifierError::Model {
                model: self.backend.path().display().to_string(),
                reason: format!("returned {} outputs", outputs.len()),
            })?;
        if out.dtype != DType::F32 {
            return Err(ClassifierError::Model {
                model: self.backend.path().display().to_string(),
                reason: format!("returned logits of {}, not float32", out.dtype),
            });
        }
        let logits = out
            .bytes(&views)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Inference {
            logits,
            stages: Some(Stages {
                compute_ns,
                ..Stages::default()
            }),
        })
    }
}

/// A model served by an agent, called through tensorwire.
#[derive(Debug)]
pub struct RemoteTarget {
    model: client::Model,
    plan: Plan,
}

impl RemoteTarget {
    /// Drives `model` (resolved on a session already).
    pub fn new(model: client::Model) -> Result<RemoteTarget, ClassifierError> {
        let plan = Plan::new(model.signature())?;
        Ok(RemoteTarget { model, plan })
    }

    /// Connects to the agent at `uri` and resolves the model `name`.
    pub fn connect(
        uri: &str,
        name: &str,
        opts: ClientOptions,
    ) -> Result<RemoteTarget, ClassifierError> {
        let client = client::Client::connect_with(uri, opts)?;
        RemoteTarget::new(client.model(name)?)
    }

    /// The model handle.
    pub fn model(&self) -> &client::Model {
        &self.model
    }
}

impl Target for RemoteTarget {
    fn signature(&self) -> &ModelSignature {
        self.model.signature()
    }

    fn infer(&mut self, enc: &Encoded) -> Result<Inference, ClassifierError> {
        let shape = enc.shape();
        let tensors: Vec<TensorRef<'_>> = self
            .plan
            .inputs
            .iter()
            .map(|name| TensorRef::from_slice(&shape, enc.input(name).unwrap_or(&[])))
            .collect::<Result<_, _>>()?;
        let r = self.model.infer(&tensors)?;
        let out = r
            .outputs
            .get(self.plan.output)
            .ok_or_else(|| ClassifierError::Model {
                model: self.model.signature().name.clone(),
                reason: format!("returned {} outputs", r.outputs.len()),
            })?;
        let logits = out.to_vec::<f32>()?;
        let stages = r
            .timeline
            .as_ref()
            .and_then(|tl| Stages::from_timeline(r.client_start_ns, tl, r.client_done_ns));
        Ok(Inference { logits, stages })
    }
}

/// One classified line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LineResult {
    /// Its line number in the file (1-based).
    pub line: usize,
    /// Tokens sent (after truncation).
    pub tokens: usize,
    /// `Some(n)`: the line had `n` tokens and was truncated.
    pub truncated_from: Option<usize>,
    /// Client time to tokenize it.
    pub tokenize_ns: u64,
    /// Client time for all of it: tokenize + request + response.
    pub total_ns: u64,
    /// The index of the largest logit.
    pub prediction: usize,
    /// The logits.
    pub logits: Vec<f32>,
    /// Where the request's time went, if the target reported it.
    pub stages: Option<Stages>,
}

impl LineResult {
    /// [`total_ns`](LineResult::total_ns) in milliseconds.
    pub fn total_ms(&self) -> f64 {
        self.total_ns as f64 / 1e6
    }
}

/// Every line of one run through one configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct RunReport {
    /// The configuration's name (`local`, `inproc`, `unix`, ...).
    pub config: String,
    /// The lines, in file order.
    pub lines: Vec<LineResult>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl RunReport {
    /// The first line's time (ms): the cold start of a freshly loaded model.
    pub fn first_ms(&self) -> Option<f64> {
        self.lines.first().map(LineResult::total_ms)
    }

    /// The mean time (ms) of the lines after the first [`WARMUP_LINES`];
    /// `None` when there are no such lines.
    pub fn avg_ms(&self) -> Option<f64> {
        self.avg_ms_after(WARMUP_LINES)
    }

    /// The mean time (ms) of the lines after the first `skip`.
    pub fn avg_ms_after(&self, skip: usize) -> Option<f64> {
        let rest = self.lines.get(skip..).filter(|r| !r.is_empty())?;
        Some(ms(rest.iter().map(|l| l.total_ns).sum::<u64>()) / rest.len() as f64)
    }

    /// The median time (ms) of the lines after the first [`WARMUP_LINES`]:
    /// less moved by a few slow lines than the mean on a noisy machine.
    pub fn median_ms(&self) -> Option<f64> {
        let rest = self.lines.get(WARMUP_LINES..).filter(|r| !r.is_empty())?;
        let mut v: Vec<u64> = rest.iter().map(|l| l.total_ns).collect();
        v.sort_unstable();
        Some(ms(v[v.len() / 2]))
    }

    /// The mean tokenize time (ms) of the lines after the first [`WARMUP_LINES`].
    pub fn avg_tokenize_ms(&self) -> Option<f64> {
        let rest = self.lines.get(WARMUP_LINES..).filter(|r| !r.is_empty())?;
        Some(ms(rest.iter().map(|l| l.tokenize_ns).sum::<u64>()) / rest.len() as f64)
    }

    /// The mean stages of the lines after the first [`WARMUP_LINES`] that
    /// have them.
    pub fn mean_stages(&self) -> Option<Stages> {
        let all: Vec<Stages> = self
            .lines
            .get(WARMUP_LINES..)
            .unwrap_or(&[])
            .iter()
            .filter_map(|l| l.stages)
            .collect();
        Stages::mean(&all)
    }
}

/// Checks that `target`'s model takes tokenized lines and gives one logit
/// per label (done once before its first [`run_line`]).
pub fn check_target(target: &dyn Target, labels: &Labels) -> Result<(), ClassifierError> {
    let plan = Plan::new(target.signature())?;
    plan.check_labels(target.signature(), labels)
}

/// Classifies one line through `target` (checked with [`check_target`]).
/// The time is measured on this thread around tokenize + request +
/// response.
pub fn run_line(
    target: &mut dyn Target,
    tok: &TextTokenizer,
    labels: &Labels,
    l: &InputLine,
) -> Result<LineResult, ClassifierError> {
    let t0 = Instant::now();
    let enc = tok.encode(&l.text, l.number)?;
    let t1 = Instant::now();
    let inf = target.infer(&enc)?;
    let total = t0.elapsed();
    if inf.logits.len() != labels.len() {
        return Err(ClassifierError::Model {
            model: target.signature().name.clone(),
            reason: format!(
                "gave {} logits for line {}, but {} names {} labels",
                inf.logits.len(),
                l.number,
                labels.path().display(),
                labels.len()
            ),
        });
    }
    Ok(LineResult {
        line: l.number,
        tokens: enc.len(),
        truncated_from: enc.truncated_from,
        tokenize_ns: (t1 - t0).as_nanos() as u64,
        total_ns: total.as_nanos() as u64,
        prediction: argmax(&inf.logits).unwrap_or(0),
        logits: inf.logits,
        stages: inf.stages,
    })
}

/// Classifies every line through `target`, one request per line, calling
/// `on_line` after each (to print it as it comes). The time of a line is
/// measured on this thread around tokenize + request + response. Fails on
/// the first error, or if the model's logits do not match `labels`.
pub fn run_lines(
    config: &str,
    target: &mut dyn Target,
    tok: &TextTokenizer,
    labels: &Labels,
    lines: &[InputLine],
    on_line: &mut dyn FnMut(&LineResult),
) -> Result<RunReport, ClassifierError> {
    check_target(target, labels)?;
    let mut out = Vec::with_capacity(lines.len());
    for l in lines {
        let r = run_line(target, tok, labels, l)?;
        on_line(&r);
        out.push(r);
    }
    Ok(RunReport {
        config: config.to_string(),
        lines: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::TensorSpec;

    fn spec(name: &str, dtype: DType, shape: Vec<Option<u64>>) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            shape,
        }
    }

    fn sig(inputs: Vec<TensorSpec>, outputs: Vec<TensorSpec>) -> ModelSignature {
        ModelSignature {
            name: "m".into(),
            inputs,
            outputs,
        }
    }

    fn ids(name: &str) -> TensorSpec {
        spec(name, DType::I64, vec![None, None])
    }

    #[test]
    fn lines_skip_blanks_and_keep_numbers() {
        let l = split_lines("a\n\n  \r\nb c\r\n\t\nd");
        let got: Vec<(usize, &str)> = l.iter().map(|l| (l.number, l.text.as_str())).collect();
        assert_eq!(got, vec![(1, "a"), (4, "b c"), (6, "d")]);
        assert!(split_lines("").is_empty());
        assert!(split_lines("\n \n").is_empty());
        let e = read_lines(Path::new("/no/such/tweets.txt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/no/such/tweets.txt"), "{e}");
    }

    #[test]
    fn plans_follow_the_signature() {
        let logits = spec("logits", DType::F32, vec![None, Some(3)]);
        let s = sig(
            vec![ids("attention_mask"), ids("input_ids")],
            vec![
                spec("pooled", DType::F32, vec![None, Some(8)]),
                logits.clone(),
            ],
        );
        let p = Plan::new(&s).expect("plan");
        assert_eq!(p.inputs, vec!["attention_mask", "input_ids"]);
        assert_eq!(p.output, 1);
        let dir = tempfile::tempdir().expect("tempdir");
        let three = Labels::new(vec!["a".into(), "b".into(), "c".into()], dir.path().into())
            .expect("labels");
        let two = Labels::new(vec!["a".into(), "b".into()], "two.json".into()).expect("labels");
        assert!(p.check_labels(&s, &three).is_ok());
        let e = p.check_labels(&s, &two).unwrap_err().to_string();
        assert!(e.contains("3 logits") && e.contains("two.json"), "{e}");

        for (s, needle) in [
            (sig(vec![], vec![]), "identity"),
            (
                sig(vec![ids("pixel_values")], vec![logits.clone()]),
                "'pixel_values'",
            ),
            (
                sig(
                    vec![spec("input_ids", DType::I32, vec![None, None])],
                    vec![logits.clone()],
                ),
                "not int64",
            ),
            (
                sig(
                    vec![ids("input_ids")],
                    vec![spec("a", DType::F32, vec![None, Some(3)]); 2],
                ),
                "none is named 'logits'",
            ),
            (
                sig(
                    vec![ids("input_ids")],
                    vec![spec("logits", DType::F16, vec![None, Some(3)])],
                ),
                "not float32",
            ),
        ] {
            let e = Plan::new(&s).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn stages_from_stamps() {
        let mut tl = wire::Timeline::from_stamps([110, 120, 125, 130, 180, 185]);
        let s = Stages::from_timeline(100, &tl, 200).expect("stages");
        assert_eq!(
            s.named().map(|(_, v)| v),
            [10, 10, 10, 50, 20],
            "request, payload, queue, compute, response"
        );
        tl.stamps[3] = 0;
        assert_eq!(Stages::from_timeline(100, &tl, 200), None);
        assert_eq!(Stages::mean(&[]), None);
        let m = Stages::mean(&[s, Stages::default()]).expect("mean");
        assert_eq!(m.compute_ns, 25);
    }

    /// A target that returns fixed logits per line length.
    struct Fake(ModelSignature);
    impl Target for Fake {
        fn signature(&self) -> &ModelSignature {
            &self.0
        }
        fn infer(&mut self, enc: &Encoded) -> Result<Inference, ClassifierError> {
            let n = enc.len() as f32;
            Ok(Inference {
                logits: vec![n, 5.0, 0.0],
                stages: None,
            })
        }
    }

    #[test]
    fn run_lines_times_and_predicts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tok = TextTokenizer::load(&crate::tokenize::tests::tiny_tokenizer(dir.path()))
            .expect("tokenizer");
        let labels =
            Labels::new(vec!["x".into(), "y".into(), "z".into()], "l.json".into()).expect("labels");
        let mut fake = Fake(sig(
            vec![ids("input_ids")],
            vec![spec("logits", DType::F32, vec![None, Some(3)])],
        ));
        // 2 + 1, 2 + 4, 2 + 6 tokens.
        let lines = split_lines("hello\n\nthe cat the cat\nthe cat the cat the cat\n");
        let mut seen = Vec::new();
        let r = run_lines("fake", &mut fake, &tok, &labels, &lines, &mut |l| {
            seen.push(l.line)
        })
        .expect("run");
        assert_eq!(seen, vec![1, 3, 4]);
        assert_eq!(r.config, "fake");
        let preds: Vec<usize> = r.lines.iter().map(|l| l.prediction).collect();
        assert_eq!(preds, vec![1, 0, 0]);
        assert_eq!(r.lines[1].tokens, 6);
        assert!(r.lines.iter().all(|l| l.total_ns >= l.tokenize_ns));
        assert!(r.first_ms().is_some());
        assert_eq!(r.avg_ms(), None, "only 3 lines: nothing after the 4th");
        assert!(r.avg_ms_after(1).is_some());

        let two = Labels::new(vec!["x".into(), "y".into()], "two.json".into()).expect("labels");
        let mut fake = Fake(sig(
            vec![ids("input_ids")],
            vec![spec("logits", DType::F32, vec![None, None])],
        ));
        let e = run_lines("fake", &mut fake, &tok, &two, &lines, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("3 logits for line 1") && e.contains("two.json"),
            "{e}"
        );
    }
}
