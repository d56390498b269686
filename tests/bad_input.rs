//! Bad input, against a real agent on real Unix and TCP sockets: malformed
//! bytes written by hand on raw sockets, requests that do not fit the model
//! or the limits, peers that vanish or stall, bad URIs. Each case gets a
//! clear error (its status or variant, and a message naming the problem),
//! or, where the stream cannot be resynchronised, the close of that one
//! connection. After every case a well-behaved client that was connected
//! all along still works, fresh clients work, and the agent's bookkeeping
//! (open connections, requests in flight) is back where it was.

use client::{Client, ClientError, ClientOptions, TensorRef};
use common::{
    check_identity, connect, digits_input, digits_model, identity_roundtrip, pattern, request,
    request_from_descs, vm_rss_kib, wait_until, within, RawPeer, RawTensor, TestAgent,
};
use server::AgentConfig;
use std::io::Write;
use std::time::{Duration, Instant};
use transport::TransportError;
use wire::{
    encode_error_body, encode_hello, encode_model_list, encode_signature, flags, DType, Header,
    Kind, Limits, Status, TensorDesc, HEADER_LEN,
};

const LIMIT: Duration = Duration::from_secs(60);
const CLOSE_WITHIN: Duration = Duration::from_secs(3);

/// An agent serving identity and digits, with one well-behaved client per
/// socket transport connected before anything bad happens.
struct Fixture {
    agent: TestAgent,
    bystanders: Vec<(String, Client)>,
    baseline: usize,
}

impl Fixture {
    fn new() -> Fixture {
        let path = digits_model();
        Fixture::with_agent(TestAgent::start(&[("digits", &path)]))
    }

    fn with_agent(agent: TestAgent) -> Fixture {
        let bystanders: Vec<(String, Client)> = agent
            .socket_uris()
            .into_iter()
            .map(|(t, uri)| (t.to_string(), connect(&uri)))
            .collect();
        for (t, c) in &bystanders {
            check_identity(c, t);
        }
        let baseline = bystanders.len();
        assert_eq!(agent.connections(), baseline);
        Fixture {
            agent,
            bystanders,
            baseline,
        }
    }

    /// After a bad case: the bystanders and fresh clients still work, the
    /// bad connection is gone from the agent, nothing is left in flight.
    fn healthy(&self, what: &str) {
        self.healthy_with(what, 0);
    }

    /// Like [`Fixture::healthy`], with `open` more connections of the test
    /// itself still legitimately open (a raw peer that goes on).
    fn healthy_with(&self, what: &str, open: usize) {
        for (t, c) in &self.bystanders {
            check_identity(c, &format!("{what}: bystander on {t}"));
        }
        for (t, uri) in self.agent.all_uris() {
            identity_roundtrip(&uri, &format!("{what}: fresh client on {t}"));
        }
        self.agent.wait_connections(
            self.baseline + open,
            &format!("{what}: the agent still holds the bad connection"),
        );
        // A request counts as in flight until its reply is published, so a
        // client can hold its answer a moment before the count drops.
        wait_until(
            Duration::from_secs(2),
            &format!("{what}: requests left in flight"),
            || self.agent.agent().stats().in_flight == 0,
        );
    }
}

/// A well-formed identity Request header with one `u8[8]` tensor.
fn good_request_header(identity: u32) -> Header {
    let data = [1u8; 8];
    request(77, identity, &[(DType::U8, &[8], &data)], 0).0
}

#[test]
fn bad_headers_get_an_error_and_close_only_that_connection() {
    within(LIMIT, "bad headers", || {
        let f = Fixture::new();
        let identity = f.agent.model_id("identity");
        type Mutate = fn(&mut [u8; HEADER_LEN]);
        let cases: [(&str, Mutate, Status, &str); 9] = [
            (
                "wrong magic",
                |b| b[0..4].copy_from_slice(b"HTTP"),
                Status::BadMagic,
                "bad magic",
            ),
            (
                "wrong version",
                |b| b[4] = 2,
                Status::UnsupportedVersion,
                "version 2",
            ),
            (
                "unknown kind",
                |b| b[6] = 99,
                Status::UnknownKind,
                "kind 99",
            ),
            (
                "unknown flag bit",
                |b| b[7] = 0x80,
                Status::Malformed,
                "flag",
            ),
            (
                "HAS_TIMELINE on a request",
                |b| b[7] = flags::HAS_TIMELINE,
                Status::Malformed,
                "not valid on Request",
            ),
            (
                "reserved bytes set",
                |b| b[50] = 1,
                Status::Malformed,
                "reserved",
            ),
            (
                "unknown status code",
                |b| b[28] = 99,
                Status::Malformed,
                "status code 99",
            ),
            (
                "status on a request",
                |b| b[28] = 6,
                Status::Malformed,
                "non-zero status",
            ),
            (
                "payload on a ping",
                |b| {
                    b[6] = Kind::Ping as u8;
                    b[20..24].copy_from_slice(&[0; 4]);
                    b[24..28].copy_from_slice(&[0; 4]);
                },
                Status::Malformed,
                "carries no tensors",
            ),
        ];
        for (t, uri) in f.agent.socket_uris() {
            for (name, mutate, status, needle) in cases {
                for after_hello in [false, true] {
                    let what = format!(
                        "{t}: {name} ({} hello)",
                        if after_hello { "after" } else { "before" }
                    );
                    let mut p = if after_hello {
                        RawPeer::connect_hello(&uri)
                    } else {
                        RawPeer::connect(&uri)
                    };
                    let mut b = good_request_header(identity).encode();
                    mutate(&mut b);
                    // Only the 64 header bytes: nothing the agent leaves
                    // unread, so its close is a clean one (no TCP reset).
                    p.write(&b);
                    let msg = p.expect_error(status, 0);
                    assert!(
                        msg.contains(needle),
                        "{what}: message {msg:?} does not say {needle:?}"
                    );
                    p.expect_closed(CLOSE_WITHIN);
                    f.healthy(&what);
                }
            }
        }
    });
}

#[test]
fn truncated_header_then_close_leaves_the_agent_unaffected() {
    within(LIMIT, "truncated header", || {
        let f = Fixture::new();
        for (t, uri) in f.agent.socket_uris() {
            for after_hello in [false, true] {
                for cut in [1usize, 20, 63] {
                    let what = format!("{t}: {cut} header bytes then close (hello: {after_hello})");
                    let mut p = if after_hello {
                        RawPeer::connect_hello(&uri)
                    } else {
                        RawPeer::connect(&uri)
                    };
                    let mut h = Header::new(Kind::Ping);
                    h.request_id = 5;
                    p.write(&h.encode()[..cut]);
                    p.shutdown_write();
                    p.expect_closed(CLOSE_WITHIN);
                    drop(p);
                    f.healthy(&what);
                }
            }
        }
    });
}

#[test]
fn stalled_peers_are_dropped_but_idle_ones_are_not() {
    within(LIMIT, "stalls", || {
        let cfg = AgentConfig {
            stall_timeout: Duration::from_millis(300),
            ..AgentConfig::default()
        };
        let f = Fixture::with_agent(TestAgent::start_with(cfg, None));
        let identity = f.agent.model_id("identity");
        for (t, uri) in f.agent.socket_uris() {
            // Half a header, then silence.
            let mut p = RawPeer::connect_hello(&uri);
            p.write(&Header::new(Kind::Ping).encode()[..30]);
            let start = Instant::now();
            p.expect_closed(Duration::from_secs(5));
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "{t}: stalled header dropped late"
            );
            f.healthy(&format!("{t}: stalled in a header"));

            // A whole header announcing 1000 payload bytes, 10 of them sent.
            let mut p = RawPeer::connect_hello(&uri);
            let data = pattern(1000, 1);
            let (h, desc, payload) = request(p.id(), identity, &[(DType::U8, &[1000], &data)], 0);
            let mut b = h.encode().to_vec();
            b.extend_from_slice(&desc);
            b.extend_from_slice(&payload[..10]);
            p.write(&b);
            let start = Instant::now();
            p.expect_closed(Duration::from_secs(5));
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "{t}: stalled payload dropped late"
            );
            f.healthy(&format!("{t}: stalled in a payload"));

            // Silent between messages for longer than the stall timeout: fine.
            let mut p = RawPeer::connect_hello(&uri);
            let c = connect(&uri);
            std::thread::sleep(Duration::from_millis(800));
            p.ping();
            p.good_identity_request(identity);
            check_identity(&c, &format!("{t}: idle client"));
        }
    });
}

#[test]
fn garbage_forever_is_cut_off_quickly_while_others_are_served() {
    within(LIMIT, "garbage", || {
        let f = Fixture::new();
        // Plain garbage; and garbage that starts like a tensorwire v1 header
        // (magic and version right), so that the later header checks are
        // what must catch it.
        let cases: [(&str, &[u8]); 2] = [("garbage", b"GARB"), ("TWIR garbage", b"TWIR\x01\x00")];
        for ((t, uri), (kind, prefix)) in f
            .agent
            .socket_uris()
            .into_iter()
            .flat_map(|u| cases.iter().map(move |c| (u.clone(), *c)))
        {
            let t = format!("{t}: {kind}");
            let mut p = RawPeer::connect(&uri);
            let writer = std::thread::spawn(move || {
                let start = Instant::now();
                let mut seed = 43;
                while start.elapsed() < Duration::from_secs(2) {
                    let mut chunk = pattern(4096, seed);
                    chunk[..prefix.len()].copy_from_slice(prefix);
                    if p.s.write_all(&chunk).is_err() {
                        return Some(start.elapsed());
                    }
                    seed += 1;
                }
                None
            });
            // Others are served while the garbage flows.
            for (bt, c) in &f.bystanders {
                check_identity(c, &format!("{t}: bystander on {bt} during garbage"));
            }
            let cut = writer.join().expect("writer thread");
            let cut = cut.unwrap_or_else(|| {
                panic!("{t}: the agent kept reading garbage for 2 s without closing")
            });
            assert!(
                cut < Duration::from_secs(1),
                "{t}: garbage cut off only after {cut:?}"
            );
            f.healthy(&format!("{t}: garbage"));
        }
    });
}

#[test]
fn over_limit_lengths_are_refused_without_allocating() {
    within(LIMIT, "over limits", || {
        let f = Fixture::new();
        let identity = f.agent.model_id("identity");
        let rss_before = vm_rss_kib();
        let base = || {
            let data = [0u8; 8];
            request(9, identity, &[(DType::U8, &[8], &data)], 0).0
        };
        let cases: Vec<(&str, Header, &str)> = vec![
            (
                "payload_len 2^40",
                Header {
                    payload_len: 1 << 40,
                    ..base()
                },
                "payload length is 1099511627776",
            ),
            (
                "payload_len u64::MAX",
                Header {
                    payload_len: u64::MAX,
                    ..base()
                },
                "payload length",
            ),
            (
                "payload_len 256 MiB + 1",
                Header {
                    payload_len: (256 << 20) + 1,
                    ..base()
                },
                "payload length",
            ),
            (
                "desc_len 1 MiB",
                Header {
                    desc_len: 1 << 20,
                    ..base()
                },
                "descriptor section length is 1048576",
            ),
            (
                "desc_len u32::MAX",
                Header {
                    desc_len: u32::MAX,
                    ..base()
                },
                "descriptor section length",
            ),
            (
                "tensor_count 65",
                Header {
                    tensor_count: 65,
                    ..base()
                },
                "tensor count is 65",
            ),
            (
                "tensor_count u32::MAX",
                Header {
                    tensor_count: u32::MAX,
                    ..base()
                },
                "tensor count",
            ),
        ];
        for (t, uri) in f.agent.socket_uris() {
            for (name, h, needle) in &cases {
                for after_hello in [false, true] {
                    let what = format!("{t}: {name} (hello: {after_hello})");
                    let mut p = if after_hello {
                        RawPeer::connect_hello(&uri)
                    } else {
                        RawPeer::connect(&uri)
                    };
                    p.write(&h.encode());
                    let msg = p.expect_error(Status::LimitExceeded, 0);
                    assert!(
                        msg.contains(needle),
                        "{what}: message {msg:?} does not say {needle:?}"
                    );
                    p.expect_closed(CLOSE_WITHIN);
                    f.healthy(&what);
                }
            }
        }
        let rss_after = vm_rss_kib();
        assert!(
            rss_after < rss_before + 256 * 1024,
            "RSS grew from {rss_before} KiB to {rss_after} KiB on over-limit headers"
        );
    });
}

/// A tensor with an owned shape: dtype, shape, bytes.
type OwnedShape<'a> = (DType, Vec<u64>, &'a [u8]);

/// A message sent to the agent: name, header, body, payload, the status of
/// the expected Error, and what its message must say.
type WrongWay<'a> = (&'a str, Header, Vec<u8>, Vec<u8>, Status, &'a str);

/// Descriptor bytes for one tensor, with every field given.
fn raw_desc(dtype: u8, ndim: u8, reserved: u8, offset: u64, len: u64, dims: &[u64]) -> Vec<u8> {
    let mut b = vec![dtype, ndim, reserved, 0, 0, 0, 0, 0];
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b
}

fn u8_desc(n: u64, offset: u64) -> TensorDesc {
    TensorDesc {
        dtype: DType::U8,
        shape: vec![n],
        offset,
        len: n,
    }
}

#[test]
fn bad_descriptors_get_an_error_and_the_same_connection_goes_on() {
    within(LIMIT, "bad descriptors", || {
        let f = Fixture::new();
        let identity = f.agent.model_id("identity");
        // (name, tensor_count, descriptor bytes, payload_len, needle)
        let enc = |descs: &[TensorDesc]| request_from_descs(0, 0, descs, 0).1;
        let f32x4 = |len| TensorDesc {
            dtype: DType::F32,
            shape: vec![4],
            offset: 0,
            len,
        };
        let cases: Vec<(&str, u32, Vec<u8>, u64, &str)> = vec![
            (
                "tensor past the payload end",
                1,
                enc(&[u8_desc(100, 0)]),
                99,
                "outside the 99-byte payload",
            ),
            (
                "offset past the payload",
                1,
                enc(&[u8_desc(10, 128)]),
                100,
                "outside",
            ),
            (
                "offset overflows",
                1,
                enc(&[u8_desc(10, u64::MAX - 63)]),
                100,
                "outside",
            ),
            (
                "misaligned offset",
                1,
                enc(&[u8_desc(10, 8)]),
                18,
                "offset 8 is not a multiple of 64",
            ),
            (
                "length short of the shape",
                1,
                enc(&[f32x4(15)]),
                16,
                "length 15 but float32[4] needs 16 bytes",
            ),
            (
                "length past the shape",
                1,
                enc(&[f32x4(17)]),
                17,
                "length 17 but float32[4] needs 16 bytes",
            ),
            (
                "overlapping tensors",
                2,
                enc(&[u8_desc(100, 0), u8_desc(1, 64)]),
                200,
                "overlaps",
            ),
            (
                "unknown dtype",
                1,
                raw_desc(0, 1, 0, 0, 1, &[1]),
                1,
                "unknown dtype code 0",
            ),
            (
                "dtype past the last",
                1,
                raw_desc(14, 1, 0, 0, 1, &[1]),
                1,
                "unknown dtype code 14",
            ),
            (
                "nine dims",
                1,
                raw_desc(9, 9, 0, 0, 1, &[1; 9]),
                1,
                "9 dims",
            ),
            (
                "reserved bytes set",
                1,
                raw_desc(9, 1, 7, 0, 1, &[1]),
                1,
                "reserved",
            ),
            (
                "shape overflows",
                1,
                raw_desc(9, 2, 0, 0, 2, &[u64::MAX, 2]),
                2,
                "overflows",
            ),
            (
                "count over the descriptors",
                2,
                enc(&[u8_desc(1, 0)]),
                1,
                "2 tensors cannot fit",
            ),
            (
                "dims cut short",
                1,
                raw_desc(9, 2, 0, 0, 1, &[1]),
                1,
                "truncated tensor dims",
            ),
            (
                "trailing bytes",
                1,
                [enc(&[u8_desc(1, 0)]), vec![0; 8]].concat(),
                1,
                "8 trailing bytes",
            ),
            (
                "descriptors for no tensor",
                0,
                enc(&[u8_desc(1, 0)]),
                1,
                "trailing bytes",
            ),
        ];
        for (t, uri) in f.agent.socket_uris() {
            let mut p = RawPeer::connect_hello(&uri);
            for (name, count, desc, payload_len, needle) in &cases {
                let what = format!("{t}: {name}");
                let mut h = Header::new(Kind::Request);
                h.request_id = p.id();
                h.model_id = identity;
                h.tensor_count = *count;
                h.desc_len = desc.len() as u32;
                h.payload_len = *payload_len;
                // The whole payload follows: the agent skips it and stays in sync.
                p.send(&h, desc, &pattern(*payload_len as usize, 3));
                let msg = p.expect_error(Status::Malformed, h.request_id);
                assert!(
                    msg.contains(needle),
                    "{what}: message {msg:?} does not say {needle:?}"
                );
                // The same connection still works.
                p.good_identity_request(identity);
                f.healthy_with(&what, 1);
            }
            p.ping();
        }
    });
}

#[test]
fn unknown_models_are_named_in_the_error() {
    within(LIMIT, "unknown models", || {
        let f = Fixture::new();
        for (t, uri) in f.agent.all_uris() {
            let c = connect(&uri);
            match c.model("nope") {
                Err(ClientError::UnknownModel(m)) => assert!(m.contains("'nope'"), "{t}: {m}"),
                other => panic!("{t}: model(\"nope\") gave {other:?}"),
            }
            for bad in [String::new(), "n".repeat(300)] {
                assert!(
                    matches!(c.model(&bad), Err(ClientError::UnknownModel(_))),
                    "{t}: model name of {} bytes",
                    bad.len()
                );
            }
            check_identity(&c, t);
        }
        let identity = f.agent.model_id("identity");
        for (t, uri) in f.agent.socket_uris() {
            let mut p = RawPeer::connect_hello(&uri);
            // A Request for a model id nobody has.
            let data = [1u8; 4];
            let id = p.id();
            let (h, desc, payload) = request(id, 999, &[(DType::U8, &[4], &data)], 0);
            p.send(&h, &desc, &payload);
            let msg = p.expect_error(Status::UnknownModel, id);
            assert!(msg.contains("999"), "{t}: {msg}");
            p.good_identity_request(identity);

            // ModelQuery for a name nobody serves, and malformed names.
            let queries: [(&[u8], Status, &str); 4] = [
                (b"nope", Status::UnknownModel, "'nope'"),
                (b"", Status::Malformed, "0 bytes"),
                (&[b'n'; 300], Status::Malformed, "300 bytes"),
                (&[0xff, 0xfe], Status::Malformed, "not UTF-8"),
            ];
            for (name, status, needle) in queries {
                let mut h = Header::new(Kind::ModelQuery);
                h.request_id = p.id();
                h.desc_len = name.len() as u32;
                p.send(&h, name, &[]);
                let msg = p.expect_error(status, h.request_id);
                assert!(msg.contains(needle), "{t}: {msg:?} does not say {needle:?}");
                p.good_identity_request(identity);
            }
            f.healthy_with(&format!("{t}: unknown models"), 1);
        }
    });
}

#[test]
fn onnx_inputs_that_do_not_fit_are_invalid_input() {
    within(LIMIT, "onnx invalid input", || {
        let f = Fixture::new();
        let x = digits_input();
        // The same values as float64.
        let x64: Vec<u8> = x
            .chunks_exact(4)
            .flat_map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
            .collect();
        let x64b = &x64[..];
        let short = &x[..4 * 63 * 4];
        // (what, tensors, needle)
        let cases: Vec<(&str, Vec<OwnedShape<'_>>, &str)> = vec![
            (
                "wrong dtype",
                vec![(DType::F64, vec![4, 64], x64b)],
                "float64",
            ),
            (
                "wrong shape",
                vec![(DType::F32, vec![4, 63], short)],
                "[4, 63]",
            ),
            ("wrong rank", vec![(DType::F32, vec![256], &x[..])], "[256]"),
            ("no tensors", vec![], "takes 1 inputs, got 0"),
            (
                "two tensors",
                vec![
                    (DType::F32, vec![4, 64], &x[..]),
                    (DType::F32, vec![4, 64], &x[..]),
                ],
                "takes 1 inputs, got 2",
            ),
        ];
        let mut want = None;
        for (t, uri) in f.agent.all_uris() {
            let c = connect(&uri);
            let m = c.model("digits").expect("digits");
            for (name, tensors, needle) in &cases {
                let refs: Vec<TensorRef<'_>> = tensors
                    .iter()
                    .map(|(d, s, b)| TensorRef::new(*d, s, b).expect("tensor"))
                    .collect();
                match m.infer(&refs) {
                    Err(ClientError::InvalidInput(msg)) => {
                        assert!(
                            msg.contains(needle),
                            "{t}: {name}: {msg:?} does not say {needle:?}"
                        );
                        if tensors.len() == 1 {
                            assert!(
                                msg.contains("'x'") && msg.contains("float32[?, 64]"),
                                "{t}: {name}: {msg}"
                            );
                        }
                    }
                    other => panic!("{t}: {name}: expected InvalidInput, got {other:?}"),
                }
            }
            let r = m
                .infer(&[TensorRef::new(DType::F32, &[4, 64], &x).expect("tensor")])
                .expect("a good request after bad ones");
            want = Some(r.outputs[0].bytes().to_vec());
        }
        let want = want.expect("ran");
        let digits = f.agent.model_id("digits");
        for (t, uri) in f.agent.socket_uris() {
            let mut p = RawPeer::connect_hello(&uri);
            for (name, tensors, needle) in &cases {
                let id = p.id();
                let specs: Vec<RawTensor<'_>> =
                    tensors.iter().map(|(d, s, b)| (*d, &s[..], *b)).collect();
                let (h, desc, payload) = request(id, digits, &specs, 0);
                p.send(&h, &desc, &payload);
                let msg = p.expect_error(Status::InvalidInput, id);
                assert!(
                    msg.contains(needle),
                    "{t}: raw {name}: {msg:?} does not say {needle:?}"
                );
                // A correct request on the same connection.
                let id = p.id();
                let (h, desc, payload) = request(id, digits, &[(DType::F32, &[4, 64], &x)], 0);
                p.send(&h, &desc, &payload);
                let m = p.recv();
                assert_eq!(m.header.kind, Kind::Response, "{t}: {}", m.error_text());
                assert_eq!(m.header.request_id, id);
                assert_eq!(m.payload, want, "{t}: logits after a bad request");
            }
            f.healthy_with(&format!("{t}: onnx invalid input"), 1);
        }
    });
}

#[test]
fn messages_before_hello_are_refused_and_the_connection_closed() {
    within(LIMIT, "before hello", || {
        let f = Fixture::new();
        let identity = f.agent.model_id("identity");
        for (t, uri) in f.agent.socket_uris() {
            let first: Vec<(&str, Header, Vec<u8>, Status)> = vec![
                (
                    "a request",
                    Header {
                        request_id: 31,
                        model_id: identity,
                        ..Header::new(Kind::Request)
                    },
                    vec![],
                    Status::UnknownKind,
                ),
                (
                    "a ping",
                    Header {
                        request_id: 32,
                        ..Header::new(Kind::Ping)
                    },
                    vec![],
                    Status::UnknownKind,
                ),
                (
                    "a model list query",
                    Header {
                        request_id: 33,
                        ..Header::new(Kind::ListModels)
                    },
                    vec![],
                    Status::UnknownKind,
                ),
                (
                    "a hello with a 31-byte body",
                    Header {
                        request_id: 34,
                        desc_len: 31,
                        ..Header::new(Kind::Hello)
                    },
                    vec![0; 31],
                    Status::Malformed,
                ),
                (
                    "a hello with reserved bytes set",
                    Header {
                        request_id: 35,
                        desc_len: 32,
                        ..Header::new(Kind::Hello)
                    },
                    {
                        let mut b = encode_hello(&Limits::default());
                        b[31] = 1;
                        b
                    },
                    Status::Malformed,
                ),
            ];
            for (name, h, body, status) in first {
                let what = format!("{t}: {name} first");
                let mut p = RawPeer::connect(&uri);
                p.send(&h, &body, &[]);
                let msg = p.expect_error(status, h.request_id);
                if status == Status::UnknownKind {
                    assert!(msg.contains("must be Hello"), "{what}: {msg}");
                }
                p.expect_closed(CLOSE_WITHIN);
                f.healthy(&what);
            }
        }
    });
}

#[test]
fn second_hello_and_messages_only_an_agent_sends_are_skipped() {
    within(LIMIT, "wrong direction", || {
        let f = Fixture::new();
        let identity = f.agent.model_id("identity");
        let mut sig = Vec::new();
        encode_signature(
            f.agent
                .agent()
                .core()
                .registry
                .find("identity")
                .expect("identity")
                .signature(),
            &mut sig,
        );
        let list = encode_model_list(&[]);
        let resp_data = pattern(100, 8);
        let (resp_h, resp_desc, resp_payload) = {
            let (mut h, d, p) = request(0, identity, &[(DType::U8, &[100], &resp_data)], 0);
            h.kind = Kind::Response;
            (h, d, p)
        };
        for (t, uri) in f.agent.socket_uris() {
            let mut p = RawPeer::connect_hello(&uri);
            let cases: Vec<WrongWay<'_>> = vec![
                (
                    "a second hello",
                    Header {
                        desc_len: 32,
                        ..Header::new(Kind::Hello)
                    },
                    encode_hello(&Limits::default()),
                    vec![],
                    Status::UnknownKind,
                    "already",
                ),
                (
                    "a hello ack",
                    Header {
                        desc_len: 32,
                        ..Header::new(Kind::HelloAck)
                    },
                    encode_hello(&Limits::default()),
                    vec![],
                    Status::UnknownKind,
                    "not a message a client sends",
                ),
                (
                    "an error",
                    Header {
                        status: Status::Internal,
                        desc_len: 4,
                        ..Header::new(Kind::Error)
                    },
                    encode_error_body("oops"),
                    vec![],
                    Status::UnknownKind,
                    "not a message a client sends",
                ),
                (
                    "a model info",
                    Header {
                        desc_len: sig.len() as u32,
                        ..Header::new(Kind::ModelInfo)
                    },
                    sig.clone(),
                    vec![],
                    Status::UnknownKind,
                    "not a message a client sends",
                ),
                (
                    "a model list",
                    Header {
                        desc_len: list.len() as u32,
                        ..Header::new(Kind::ModelList)
                    },
                    list.clone(),
                    vec![],
                    Status::UnknownKind,
                    "not a message a client sends",
                ),
                (
                    "a response with a payload",
                    resp_h,
                    resp_desc.clone(),
                    resp_payload.clone(),
                    Status::UnknownKind,
                    "not a message a client sends",
                ),
                (
                    "a ping with a body",
                    Header {
                        desc_len: 5,
                        ..Header::new(Kind::Ping)
                    },
                    b"hello".to_vec(),
                    vec![],
                    Status::Malformed,
                    "",
                ),
                (
                    "a list query with a body",
                    Header {
                        desc_len: 3,
                        ..Header::new(Kind::ListModels)
                    },
                    b"abc".to_vec(),
                    vec![],
                    Status::Malformed,
                    "",
                ),
            ];
            for (name, mut h, body, payload, status, needle) in cases {
                let what = format!("{t}: {name}");
                h.request_id = p.id();
                p.send(&h, &body, &payload);
                let m = p.recv();
                assert_eq!(
                    (m.header.kind, m.header.status, m.header.request_id),
                    (Kind::Error, status, h.request_id),
                    "{what}: answered with {:?} {:?}",
                    m.header,
                    m.error_text()
                );
                assert!(
                    m.error_text().contains(needle),
                    "{what}: {}",
                    m.error_text()
                );
                // The session goes on, in sync.
                p.ping();
                p.good_identity_request(identity);
                f.healthy_with(&what, 1);
            }
        }
    });
}

#[test]
fn a_client_vanishing_mid_payload_leaves_the_agent_unaffected() {
    within(LIMIT, "vanish mid payload", || {
        let f = Fixture::new();
        let identity = f.agent.model_id("identity");
        let digits = f.agent.model_id("digits");
        let mib = pattern(1 << 20, 4);
        let x = digits_input();
        for (t, uri) in f.agent.socket_uris() {
            for round in 0..10 {
                let mut p = RawPeer::connect_hello(&uri);
                let (model, specs): (u32, Vec<RawTensor<'_>>) = if round % 2 == 0 {
                    (identity, vec![(DType::U8, &[1 << 20], &mib)])
                } else {
                    (digits, vec![(DType::F32, &[4, 64], &x)])
                };
                let (h, desc, payload) = request(p.id(), model, &specs, 0);
                let mut b = h.encode().to_vec();
                b.extend_from_slice(&desc);
                b.extend_from_slice(&payload[..1024]);
                p.write(&b);
                drop(p);
            }
            f.healthy(&format!("{t}: clients vanished mid-payload"));
        }
    });
}

#[test]
fn bad_uris_and_unreachable_agents_are_clear_errors() {
    within(LIMIT, "bad uris", || {
        for (uri, needle) in [
            ("http://x", "unknown scheme 'http'"),
            ("unix://", "missing socket path"),
            ("tcp://h", "missing port"),
            ("tcp://127.0.0.1:99999", "port '99999'"),
            ("localhost:7070", "SCHEME://"),
            ("tcp://127.0.0.1:1?speed=9", "unknown parameter 'speed'"),
        ] {
            match Client::connect(uri) {
                Err(ClientError::Connect(e @ TransportError::BadUri { .. })) => {
                    let s = e.to_string();
                    assert!(s.contains(needle) && s.contains(uri), "{uri}: {s}");
                }
                other => panic!("{uri}: expected a bad-URI error, got {other:?}"),
            }
        }
        let dir = tempfile::tempdir().expect("tmp");
        // Nothing there at all.
        let missing = format!("unix://{}/nobody.sock", dir.path().display());
        // A socket file nobody listens on any more.
        let stale_path = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale_path).expect("bind"));
        assert!(stale_path.exists());
        let stale = format!("unix://{}", stale_path.display());
        // A TCP port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let closed = format!("tcp://127.0.0.1:{port}");
        for uri in [&missing, &stale, &closed] {
            let start = Instant::now();
            match Client::connect(uri) {
                Err(ClientError::Connect(e @ TransportError::Io { .. })) => {
                    let s = e.to_string();
                    assert!(
                        s.contains("connect to") && s.contains(uri.as_str()),
                        "{uri}: {s}"
                    );
                }
                other => panic!("{uri}: expected a connect error, got {other:?}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{uri}: slow failure"
            );
        }
        match Client::connect("inproc://nobody-here") {
            Err(ClientError::Connect(TransportError::NoInprocAgent(n))) => {
                assert_eq!(n, "nobody-here")
            }
            other => panic!("inproc://nobody-here: {other:?}"),
        }
    });
}

/// A client pointed at a port where another protocol answers (here an
/// HTTP server, as a KServe door would) gets a protocol error naming what
/// answered, at connect, not "agent gone".
#[test]
fn a_server_speaking_another_protocol_is_named_as_such() {
    within(LIMIT, "another protocol", || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let uri = format!("tcp://{}", l.local_addr().expect("addr"));
        let server = std::thread::spawn(move || {
            // As an HTTP server does: read what came (the Hello), answer
            // 400, close.
            let (mut s, _) = l.accept().expect("accept");
            let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
            let mut got = [0u8; 4096];
            let _ = std::io::Read::read(&mut s, &mut got);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        });
        match Client::connect(&uri) {
            Err(ClientError::Protocol(msg)) => assert!(
                msg.contains(&uri)
                    && msg.contains("does not speak tensorwire")
                    && msg.contains("(\"HTTP\")"),
                "{msg}"
            ),
            other => panic!("{uri}: expected a protocol error, got {other:?}"),
        }
        server.join().expect("server");
    });
}

#[test]
fn small_limits_are_enforced_by_client_and_agent() {
    within(LIMIT, "small limits", || {
        let cfg = AgentConfig {
            limits: Limits {
                max_tensors: 4,
                max_in_flight: 4,
                max_payload: 1024,
                max_desc_len: 256,
            },
            ..AgentConfig::default()
        };
        let f = Fixture::with_agent(TestAgent::start_with(cfg.clone(), None));
        let errors_before = f.agent.agent().stats().errors;
        let ok = pattern(1024, 1);
        let big = pattern(2048, 2);
        for (t, uri) in f.agent.all_uris() {
            let c = connect(&uri);
            assert_eq!(c.limits(), cfg.limits, "{t}: limits in force");
            let m = c.model("identity").expect("identity");
            m.infer(&[TensorRef::new(DType::U8, &[1024], &ok).expect("t")])
                .unwrap_or_else(|e| panic!("{t}: exactly max_payload: {e}"));
            match m.infer(&[TensorRef::new(DType::U8, &[2048], &big).expect("t")]) {
                Err(ClientError::LimitExceeded(msg)) => {
                    assert!(msg.contains("2048") && msg.contains("1024"), "{t}: {msg}")
                }
                other => panic!("{t}: 2048-byte payload: {other:?}"),
            }
            let one = [1u8];
            let five: Vec<TensorRef<'_>> = (0..5)
                .map(|_| TensorRef::new(DType::U8, &[1], &one).expect("t"))
                .collect();
            match m.infer(&five) {
                Err(ClientError::LimitExceeded(msg)) => {
                    assert!(msg.contains("5 tensors"), "{t}: {msg}")
                }
                other => panic!("{t}: five tensors: {other:?}"),
            }
            let many_dims = [1u64; 8];
            let four: Vec<TensorRef<'_>> = (0..4)
                .map(|_| TensorRef::new(DType::U8, &many_dims, &one).expect("t"))
                .collect();
            match m.infer(&four) {
                Err(ClientError::LimitExceeded(msg)) => {
                    assert!(msg.contains("descriptor section"), "{t}: {msg}")
                }
                other => panic!("{t}: 352-byte descriptor section: {other:?}"),
            }
            check_identity(&c, t);
        }
        assert_eq!(
            f.agent.agent().stats().errors,
            errors_before,
            "over-limit requests were sent to the agent instead of being refused by the client"
        );

        // The client keeps to max_in_flight itself.
        for (t, uri) in f.agent.socket_uris() {
            let c = connect(&uri);
            let m = c.model("identity").expect("identity");
            let one = [1u8];
            let submit = || m.submit(&[TensorRef::new(DType::U8, &[1], &one).expect("t")]);
            let tickets: Vec<_> = (0..4).map(|_| submit().expect("submit")).collect();
            match submit() {
                Err(ClientError::TooManyInFlight(4)) => {}
                other => panic!("{t}: a fifth request in flight gave {other:?}"),
            }
            for tk in tickets {
                tk.wait().unwrap_or_else(|e| panic!("{t}: {e}"));
            }
            submit().expect("room again").wait().expect("answered");
        }

        // A response that would break the limits in force is refused by
        // the agent (here the timeline pushes its descriptor section from
        // exactly 256 to 320 bytes), and the session goes on.
        for (t, uri) in f.agent.all_uris() {
            let opts = ClientOptions {
                want_timeline: true,
                ..ClientOptions::default()
            };
            let c = Client::connect_with(&uri, opts).expect("connect");
            let m = c.model("identity").expect("identity");
            let one = [1u8];
            let (d8, d7) = ([1u64; 8], [1u64; 7]);
            let full = [
                TensorRef::new(DType::U8, &d8, &one).expect("t"),
                TensorRef::new(DType::U8, &d8, &one).expect("t"),
                TensorRef::new(DType::U8, &d7, &one).expect("t"),
            ];
            match m.infer(&full) {
                Err(ClientError::LimitExceeded(msg)) => {
                    assert!(msg.contains("response"), "{t}: {msg}")
                }
                other => panic!("{t}: a response over max_desc_len gave {other:?}"),
            }
            let r = m
                .infer(&full[..2])
                .unwrap_or_else(|e| panic!("{t}: after: {e}"));
            assert!(r.timeline.is_some());
        }

        // A client may ask for less than the agent allows.
        let opts = ClientOptions {
            limits: Limits {
                max_tensors: 0,
                max_in_flight: 0,
                max_payload: 512,
                max_desc_len: 0,
            },
            ..ClientOptions::default()
        };
        let c = Client::connect_with(&f.agent.unix, opts).expect("connect");
        assert_eq!(c.limits().max_payload, 512);
        assert!(matches!(
            c.model("identity")
                .expect("identity")
                .infer(&[TensorRef::new(DType::U8, &[1000], &ok[..1000]).expect("t")]),
            Err(ClientError::LimitExceeded(_))
        ));
        drop(c);

        // Raw over-limit requests get an agent error and a close.
        let identity = f.agent.model_id("identity");
        for (t, uri) in f.agent.socket_uris() {
            for (asked, len, limit) in [(0u64, 2048u64, 1024u64), (512, 1000, 512)] {
                let what = format!("{t}: {len}-byte payload, limit {limit}");
                let mut p = RawPeer::connect(&uri);
                let limits = p.hello(&Limits {
                    max_tensors: 0,
                    max_in_flight: 0,
                    max_payload: asked,
                    max_desc_len: 0,
                });
                assert_eq!(limits.max_payload, limit, "{what}");
                let data = pattern(len as usize, 5);
                let (h, _, _) = request(p.id(), identity, &[(DType::U8, &[len], &data)], 0);
                p.write(&h.encode());
                let msg = p.expect_error(Status::LimitExceeded, 0);
                assert!(
                    msg.contains(&format!(
                        "payload length is {len}, over the session limit of {limit}"
                    )),
                    "{what}: {msg}"
                );
                p.expect_closed(CLOSE_WITHIN);
                f.healthy(&what);
            }
        }
    });
}
