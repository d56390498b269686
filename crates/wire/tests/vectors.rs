//! The byte-level test vectors of `docs/PROTOCOL.md`, checked against the
//! `wire` crate in both directions.
//!
//! Every fenced block tagged `hex vector=NAME` in the document is parsed; for
//! each, the message this file builds with the `wire` API must encode to
//! exactly those bytes, and those bytes must decode to exactly that message.
//! The set of vector names is fixed here: a vector missing from the document,
//! an unexpected one, a duplicate, or a byte that differs fails the test.
//! Each vector must also be in the fuzz seed corpus
//! (`fuzz/corpus/decode/ok-vector-NAME.bin`), byte for byte.

use std::collections::BTreeMap;
use std::path::PathBuf;

use wire::{
    decode_error_body, decode_hello, decode_hello_request, decode_model_list, decode_model_name,
    decode_signature, decode_tensor_section, encode_error_body, encode_hello,
    encode_hello_with_token, encode_model_list, encode_model_name, encode_signature,
    encode_tensor_section, flags, fuzz_decode, layout_payload, DType, Header, Hello, Kind, Limits,
    ModelSignature, Stage, Status, TensorDesc, TensorSection, TensorSpec, Timeline, HEADER_LEN,
};

/// Every vector the document must contain, in document order.
const EXPECTED: [&str; 16] = [
    "hello",
    "hello-ack",
    "hello-token",
    "model-query-identity",
    "model-info-identity",
    "model-info-dynamic",
    "list-models",
    "model-list",
    "request-two-tensors",
    "response-with-timeline",
    "request-priority",
    "error-unknown-model",
    "error-permission-denied",
    "error-fatal",
    "ping",
    "pong",
];

fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

// ---------------------------------------------------------------------------
// Parsing the document
// ---------------------------------------------------------------------------

/// Extracts every `hex vector=NAME` block: name → bytes, in document order.
fn parse_vectors(doc: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut current: Option<(String, Vec<u8>)> = None;
    for (lineno, line) in doc.lines().enumerate() {
        let lineno = lineno + 1;
        let trimmed = line.trim();
        if let Some((name, bytes)) = current.as_mut() {
            if trimmed == "```" {
                out.push(current.take().unwrap());
                continue;
            }
            let data = trimmed.split('#').next().unwrap().trim();
            if data.is_empty() {
                continue;
            }
            let (offset, hex) = data
                .split_once(':')
                .unwrap_or_else(|| panic!("line {lineno}: vector {name}: no `OFFSET:`"));
            let offset = usize::from_str_radix(offset.trim(), 16)
                .unwrap_or_else(|_| panic!("line {lineno}: bad offset {offset:?}"));
            assert_eq!(
                offset,
                bytes.len(),
                "line {lineno}: vector {name}: offset {offset:#x} but {:#x} bytes so far",
                bytes.len()
            );
            for tok in hex.split_whitespace() {
                assert!(
                    tok.len() == 2 && tok.chars().all(|c| c.is_ascii_hexdigit()),
                    "line {lineno}: vector {name}: {tok:?} is not a two-digit hex byte"
                );
                bytes.push(u8::from_str_radix(tok, 16).unwrap());
            }
        } else if let Some(rest) = trimmed.strip_prefix("```hex") {
            let name = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("vector="))
                .unwrap_or_else(|| panic!("line {lineno}: hex block without vector=NAME"));
            current = Some((name.to_string(), Vec::new()));
        }
    }
    assert!(current.is_none(), "unterminated hex block");
    out
}

fn doc_vectors() -> BTreeMap<String, Vec<u8>> {
    let path = repo_path("docs/PROTOCOL.md");
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let list = parse_vectors(&doc);
    let names: Vec<&str> = list.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names, EXPECTED,
        "the document's vectors (in order) differ from the expected list"
    );
    let map: BTreeMap<String, Vec<u8>> = list.into_iter().collect();
    assert_eq!(map.len(), EXPECTED.len(), "duplicate vector names");
    map
}

// ---------------------------------------------------------------------------
// Messages built with the wire API
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
enum Body {
    Empty,
    Limits(Limits),
    /// A Hello carrying a bearer token.
    HelloToken(Limits, Vec<u8>),
    ModelName(String),
    Signature(ModelSignature),
    ModelList(Vec<(u32, ModelSignature)>),
    ErrorMessage(String),
    Tensors(TensorSection),
}

#[derive(Debug, PartialEq)]
struct Message {
    header: Header,
    body: Body,
    payload: Vec<u8>,
}

fn encode_body(body: &Body) -> Vec<u8> {
    match body {
        Body::Empty => Vec::new(),
        Body::Limits(l) => encode_hello(l),
        Body::HelloToken(l, t) => encode_hello_with_token(l, Some(t)),
        Body::ModelName(n) => encode_model_name(n),
        Body::Signature(s) => {
            let mut b = Vec::new();
            encode_signature(s, &mut b);
            b
        }
        Body::ModelList(l) => encode_model_list(l),
        Body::ErrorMessage(m) => encode_error_body(m),
        Body::Tensors(s) => {
            let mut b = Vec::new();
            encode_tensor_section(&s.tensors, s.timeline.as_ref(), &mut b);
            b
        }
    }
}

/// A message of `kind`: fills `desc_len` and `payload_len` from what it carries.
fn message(mut header: Header, body: Body, payload: Vec<u8>) -> Message {
    header.desc_len = encode_body(&body).len() as u32;
    header.payload_len = payload.len() as u64;
    if let Body::Tensors(s) = &body {
        header.tensor_count = s.tensors.len() as u32;
    }
    Message {
        header,
        body,
        payload,
    }
}

fn header(kind: Kind, request_id: u64) -> Header {
    Header {
        request_id,
        ..Header::new(kind)
    }
}

fn encode(m: &Message) -> Vec<u8> {
    let mut out = m.header.encode().to_vec();
    out.extend_from_slice(&encode_body(&m.body));
    out.extend_from_slice(&m.payload);
    out
}

/// Decodes one whole message as a receiver does, checking it against the
/// default limits first.
fn decode(bytes: &[u8]) -> Message {
    let header = Header::decode(bytes).expect("header decodes");
    header
        .check_limits(&Limits::default())
        .expect("header within default limits");
    let desc_end = HEADER_LEN + header.desc_len as usize;
    let desc = &bytes[HEADER_LEN..desc_end];
    let payload = bytes[desc_end..].to_vec();
    assert_eq!(payload.len() as u64, header.payload_len, "payload length");
    let body = match header.kind {
        Kind::Request | Kind::Response => {
            Body::Tensors(decode_tensor_section(&header, desc).expect("tensor section decodes"))
        }
        Kind::Hello => match decode_hello_request(desc).expect("hello decodes") {
            Hello {
                limits,
                token: Some(t),
                ..
            } => Body::HelloToken(limits, t.to_vec()),
            Hello { limits, .. } => Body::Limits(limits),
        },
        Kind::HelloAck => Body::Limits(decode_hello(desc).expect("limits decode")),
        Kind::ModelQuery => {
            Body::ModelName(decode_model_name(desc).expect("name decodes").to_string())
        }
        Kind::ModelInfo => Body::Signature(decode_signature(desc).expect("signature decodes")),
        Kind::ModelList => Body::ModelList(decode_model_list(desc).expect("list decodes")),
        Kind::Error => Body::ErrorMessage(decode_error_body(desc).expect("message decodes")),
        Kind::Ping | Kind::Pong | Kind::ListModels | Kind::Release => {
            assert!(desc.is_empty(), "{:?} has a body", header.kind);
            Body::Empty
        }
    };
    Message {
        header,
        body,
        payload,
    }
}

fn hello_limits() -> Limits {
    Limits {
        max_tensors: 16,
        max_in_flight: 0,
        max_payload: 16 << 20,
        max_desc_len: 0,
    }
}

fn identity_sig() -> ModelSignature {
    ModelSignature {
        name: "identity".into(),
        inputs: vec![],
        outputs: vec![],
    }
}

fn mlp_sig() -> ModelSignature {
    ModelSignature {
        name: "mlp".into(),
        inputs: vec![TensorSpec {
            name: "x".into(),
            dtype: DType::F32,
            shape: vec![None, Some(4)],
        }],
        outputs: vec![TensorSpec {
            name: "y".into(),
            dtype: DType::F32,
            shape: vec![None, Some(2)],
        }],
    }
}

/// The two tensors of the request and response vectors, laid out with
/// `layout_payload`, and their payload.
fn two_tensors(timeline: Option<Timeline>) -> (TensorSection, Vec<u8>) {
    let x: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let n = 1000i64.to_le_bytes().to_vec();
    let specs = [(DType::F32, vec![2u64, 3], x), (DType::I64, vec![1u64], n)];
    let (offsets, payload_len) =
        layout_payload(specs.iter().map(|(_, _, b)| b.len() as u64)).unwrap();
    assert_eq!(offsets, [0, 64]);
    let mut payload = vec![0u8; payload_len as usize];
    let mut tensors = Vec::new();
    for ((dtype, shape, bytes), off) in specs.into_iter().zip(offsets) {
        let len = TensorDesc::byte_len(dtype, &shape).unwrap();
        assert_eq!(len, bytes.len() as u64);
        payload[off as usize..(off + len) as usize].copy_from_slice(&bytes);
        tensors.push(TensorDesc {
            dtype,
            shape,
            offset: off,
            len,
        });
    }
    (TensorSection { tensors, timeline }, payload)
}

/// The message each vector holds, built with the wire API.
fn expected(name: &str) -> Message {
    match name {
        "hello" => message(header(Kind::Hello, 1), Body::Limits(hello_limits()), vec![]),
        "hello-ack" => {
            let in_force = Limits::default().narrowed_by(&hello_limits());
            message(header(Kind::HelloAck, 1), Body::Limits(in_force), vec![])
        }
        "hello-token" => message(
            header(Kind::Hello, 1),
            Body::HelloToken(hello_limits(), b"s3cret".to_vec()),
            vec![],
        ),
        "model-query-identity" => message(
            header(Kind::ModelQuery, 2),
            Body::ModelName("identity".into()),
            vec![],
        ),
        "model-info-identity" => message(
            Header {
                model_id: 1,
                ..header(Kind::ModelInfo, 2)
            },
            Body::Signature(identity_sig()),
            vec![],
        ),
        "model-info-dynamic" => message(
            Header {
                model_id: 2,
                ..header(Kind::ModelInfo, 3)
            },
            Body::Signature(mlp_sig()),
            vec![],
        ),
        "list-models" => message(header(Kind::ListModels, 7), Body::Empty, vec![]),
        "model-list" => message(
            header(Kind::ModelList, 7),
            Body::ModelList(vec![(1, identity_sig()), (2, mlp_sig())]),
            vec![],
        ),
        "request-two-tensors" => {
            let (section, payload) = two_tensors(None);
            message(
                Header {
                    flags: flags::WANT_TIMELINE,
                    model_id: 1,
                    ..header(Kind::Request, 4)
                },
                Body::Tensors(section),
                payload,
            )
        }
        "response-with-timeline" => {
            let mut tl = Timeline::default();
            let base = 1_000_000_000u64;
            for (stage, after) in Stage::ALL.into_iter().zip([0, 850, 1200, 1500, 1900, 2300]) {
                tl.stamps[stage as usize] = base + after;
            }
            let (section, payload) = two_tensors(Some(tl));
            message(
                Header {
                    flags: flags::HAS_TIMELINE,
                    model_id: 1,
                    ..header(Kind::Response, 4)
                },
                Body::Tensors(section),
                payload,
            )
        }
        "request-priority" => {
            let x: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let section = TensorSection {
                tensors: vec![TensorDesc {
                    dtype: DType::F32,
                    shape: vec![1, 4],
                    offset: 0,
                    len: x.len() as u64,
                }],
                timeline: None,
            };
            message(
                Header {
                    model_id: 2,
                    timeout_us: 2500,
                    priority: 2,
                    ..header(Kind::Request, 8)
                },
                Body::Tensors(section),
                x,
            )
        }
        "error-unknown-model" => message(
            Header {
                status: Status::UnknownModel,
                ..header(Kind::Error, 5)
            },
            Body::ErrorMessage("no model named 'resnet50'".into()),
            vec![],
        ),
        "error-permission-denied" => message(
            Header {
                status: Status::PermissionDenied,
                ..header(Kind::Error, 7)
            },
            Body::ErrorMessage("tenant 'analytics' may not call model 'resnet50'".into()),
            vec![],
        ),
        "error-fatal" => message(
            Header {
                status: Status::BadMagic,
                ..header(Kind::Error, 0)
            },
            Body::ErrorMessage("bad magic: not a tensorwire v1 stream".into()),
            vec![],
        ),
        "ping" => message(header(Kind::Ping, 6), Body::Empty, vec![]),
        "pong" => message(header(Kind::Pong, 6), Body::Empty, vec![]),
        other => panic!("no expected message for vector {other}"),
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn every_vector_encodes_and_decodes_exactly() {
    let vectors = doc_vectors();
    let mut failures = Vec::new();
    for name in EXPECTED {
        let bytes = &vectors[name];
        let want = expected(name);
        let encoded = encode(&want);
        if &encoded != bytes {
            let at = encoded.iter().zip(bytes).position(|(a, b)| a != b);
            failures.push(format!(
                "{name}: encoding differs from the document (first difference at byte {at:?}; \
                 encoded {} bytes, document {} bytes)",
                encoded.len(),
                bytes.len()
            ));
            continue;
        }
        let decoded = decode(bytes);
        if decoded != want {
            failures.push(format!("{name}: decodes to {decoded:?}, expected {want:?}"));
        }
        if let Err(e) = fuzz_decode(bytes) {
            failures.push(format!("{name}: fuzz_decode rejects it: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn vectors_follow_the_session_rules() {
    let v = doc_vectors();
    // The HelloAck answers the Hello: same id, element-wise minimum of limits.
    let hello = decode(&v["hello"]);
    let ack = decode(&v["hello-ack"]);
    assert_eq!(ack.header.request_id, hello.header.request_id);
    let (Body::Limits(asked), Body::Limits(in_force)) = (&hello.body, &ack.body) else {
        panic!("hello bodies");
    };
    assert_eq!(*in_force, Limits::default().narrowed_by(asked));
    // The response answers the request: same id and model, same tensors
    // (identity), a timeline because it was asked for.
    let req = decode(&v["request-two-tensors"]);
    let resp = decode(&v["response-with-timeline"]);
    assert_eq!(resp.header.request_id, req.header.request_id);
    assert_eq!(resp.header.model_id, req.header.model_id);
    assert_ne!(req.header.flags & flags::WANT_TIMELINE, 0);
    assert_ne!(resp.header.flags & flags::HAS_TIMELINE, 0);
    assert_eq!(resp.payload, req.payload);
    let (Body::Tensors(a), Body::Tensors(b)) = (&req.body, &resp.body) else {
        panic!("tensor bodies");
    };
    assert_eq!(a.tensors, b.tensors);
    let tl = b.timeline.expect("timeline");
    assert!(
        tl.stamps.windows(2).all(|w| w[0] <= w[1]),
        "stages in time order"
    );
    // The padding between the two tensors is zero.
    assert!(req.payload[24..64].iter().all(|&x| x == 0));
    // The scheduling fields are where §3.1 puts them, and only requests
    // carry them: the same header on a Response is malformed.
    let prio = &v["request-priority"];
    assert_eq!(prio[40..44], 2500u32.to_le_bytes());
    assert_eq!(prio[44], 2);
    assert!(prio[45..64].iter().all(|&x| x == 0));
    let m = decode(prio);
    assert_eq!((m.header.timeout_us, m.header.priority), (2500, 2));
    let mut as_response = prio.clone();
    as_response[6] = Kind::Response as u8;
    assert!(matches!(
        Header::decode(&as_response),
        Err(wire::WireError::Malformed(_))
    ));
    // A fatal error carries request id 0.
    assert_eq!(decode(&v["error-fatal"]).header.request_id, 0);
    assert_eq!(
        decode(&v["pong"]).header.request_id,
        decode(&v["ping"]).header.request_id
    );
}

#[test]
fn vectors_are_in_the_fuzz_corpus() {
    let vectors = doc_vectors();
    for name in EXPECTED {
        let path = repo_path(&format!("fuzz/corpus/decode/ok-vector-{name}.bin"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "vector {name} missing from the corpus ({}): {e}",
                path.display()
            )
        });
        assert_eq!(
            &bytes,
            &vectors[name],
            "{} differs from the document",
            path.display()
        );
    }
}

#[test]
fn parser_refuses_bad_blocks() {
    let ok = "```hex vector=a\n0000: 01 02  # x\n0002: 03\n```\n";
    assert_eq!(parse_vectors(ok), vec![("a".to_string(), vec![1, 2, 3])]);
    for bad in [
        "```hex vector=a\n0001: 01\n```\n",
        "```hex vector=a\n0000: 1\n```\n",
        "```hex vector=a\n0000: zz\n```\n",
        "```hex vector=a\n01 02\n```\n",
        "```hex vector=a\n0000: 01\n",
    ] {
        assert!(
            std::panic::catch_unwind(|| parse_vectors(bad)).is_err(),
            "accepted {bad:?}"
        );
    }
}
