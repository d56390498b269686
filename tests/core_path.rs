//! The core path, end to end, against real agents on real Unix and TCP
//! sockets (and in-process): tensors come back exactly as sent for every
//! dtype and size, several tensors per request keep their bytes apart, an
//! ONNX model answers bit-identically to the same model run in-process,
//! many clients pipelining many requests each get exactly their own
//! answers, and model listings and timelines are right.

use client::{Client, ClientOptions, Response, TensorRef, Ticket};
use common::{
    check_identity, connect, digits_expected, digits_input, digits_model, pattern, request,
    run_bin, within, RawPeer, RawTensor, TestAgent,
};
use engine::{Backend, OrtBackend, OrtOptions, TensorView};
use std::time::{Duration, Instant};
use wire::{AlignedBuf, DType, Kind, Stage, TensorDesc, TensorSpec};

const LIMIT: Duration = Duration::from_secs(90);

/// Bytes for a tensor of `dtype` and `shape` (bools are 0 or 1).
fn data_for(dtype: DType, shape: &[u64], seed: u64) -> Vec<u8> {
    let n = TensorDesc::byte_len(dtype, shape).expect("size") as usize;
    let mut d = pattern(n, seed);
    if dtype == DType::Bool {
        d.iter_mut().for_each(|b| *b &= 1);
    }
    d
}

fn check_outputs(what: &str, r: &Response, inputs: &[TensorRef<'_>]) {
    assert_eq!(r.outputs.len(), inputs.len(), "{what}: output count");
    for (i, (o, t)) in r.outputs.iter().zip(inputs).enumerate() {
        assert_eq!(o.dtype, t.dtype, "{what}: tensor {i} dtype");
        assert_eq!(o.shape, t.shape, "{what}: tensor {i} shape");
        assert_eq!(o.bytes().len(), t.data.len(), "{what}: tensor {i} length");
        assert!(o.bytes() == t.data, "{what}: tensor {i} bytes differ");
        if !t.data.is_empty() {
            assert_eq!(
                o.bytes().as_ptr() as usize % 64,
                0,
                "{what}: tensor {i} not 64-byte aligned"
            );
        }
    }
}

#[test]
fn identity_round_trips_every_dtype_on_every_transport() {
    within(LIMIT, "every dtype", || {
        let agent = TestAgent::start(&[]);
        let shapes: [&[u64]; 6] = [&[], &[1], &[7], &[3, 5], &[2, 0, 4], &[1, 2, 3, 2, 1]];
        for (transport, uri) in agent.all_uris() {
            let c = connect(&uri);
            let m = c.model("identity").expect("identity");
            for (k, dtype) in DType::ALL.into_iter().enumerate() {
                for (j, shape) in shapes.iter().enumerate() {
                    let data = data_for(dtype, shape, (k * 10 + j) as u64);
                    let t = [TensorRef::new(dtype, shape, &data).expect("tensor")];
                    let r = m.infer(&t).unwrap_or_else(|e| {
                        panic!("{transport}: {dtype}{shape:?}: {e}");
                    });
                    check_outputs(&format!("{transport} {dtype}{shape:?}"), &r, &t);
                }
            }
            // All thirteen dtypes in one request.
            let datas: Vec<Vec<u8>> = DType::ALL
                .iter()
                .enumerate()
                .map(|(k, &d)| data_for(d, &[3, 3], 100 + k as u64))
                .collect();
            let ts: Vec<TensorRef<'_>> = DType::ALL
                .iter()
                .zip(&datas)
                .map(|(&d, data)| TensorRef::new(d, &[3, 3], data).expect("tensor"))
                .collect();
            let r = m.infer(&ts).expect("all dtypes at once");
            check_outputs(&format!("{transport} all dtypes"), &r, &ts);
        }
    });
}

#[test]
fn identity_round_trips_every_size_on_every_transport() {
    within(LIMIT, "every size", || {
        let agent = TestAgent::start(&[]);
        let big = pattern(64 << 20, 77);
        for (transport, uri) in agent.all_uris() {
            let c = connect(&uri);
            let m = c.model("identity").expect("identity");
            for size in [0usize, 1, 4 << 10, 1 << 20, 64 << 20] {
                let shape = [size as u64];
                let t = [TensorRef::new(DType::U8, &shape, &big[..size]).expect("tensor")];
                let start = Instant::now();
                let r = m
                    .infer(&t)
                    .unwrap_or_else(|e| panic!("{transport}: {size} bytes: {e}"));
                check_outputs(&format!("{transport} {size} bytes"), &r, &t);
                eprintln!("{transport}: {size} bytes in {:?}", start.elapsed());
            }
            // A request with no tensor at all.
            let r = m.infer(&[]).expect("no tensors");
            assert!(r.outputs.is_empty());
        }
    });
}

#[test]
fn several_odd_sized_tensors_keep_their_bytes_apart() {
    within(LIMIT, "several tensors", || {
        let agent = TestAgent::start(&[]);
        let a = data_for(DType::U8, &[3], 1);
        let b = data_for(DType::F32, &[5], 2); // 20 bytes
        let z = data_for(DType::F64, &[0, 3], 3); // empty, between two others
        let c = data_for(DType::I16, &[33], 4); // 66 bytes: crosses a 64-byte line
        let d = data_for(DType::Bool, &[1], 5);
        let inputs = [
            TensorRef::new(DType::U8, &[3], &a).expect("t"),
            TensorRef::new(DType::F32, &[5], &b).expect("t"),
            TensorRef::new(DType::F64, &[0, 3], &z).expect("t"),
            TensorRef::new(DType::I16, &[33], &c).expect("t"),
            TensorRef::new(DType::Bool, &[1], &d).expect("t"),
        ];
        for (transport, uri) in agent.all_uris() {
            let cl = connect(&uri);
            let m = cl.model("identity").expect("identity");
            let r = m.infer(&inputs).expect("infer");
            check_outputs(&format!("{transport} five tensors"), &r, &inputs);
        }

        // On the wire: the padding a sender leaves between tensors is
        // ignored by the agent (here it is 0xAA, not zero), and none of it
        // shows up in the response, whose own padding is zero.
        for (transport, uri) in agent.socket_uris() {
            let mut p = RawPeer::connect_hello(&uri);
            let identity = p.model_id("identity");
            let id = p.id();
            let specs: [RawTensor<'_>; 3] = [
                (DType::U8, &[3], &a),
                (DType::F32, &[5], &b),
                (DType::I16, &[33], &c),
            ];
            let (h, desc, payload) = request(id, identity, &specs, 0xAA);
            assert!(payload.contains(&0xAA), "the request has non-zero padding");
            p.send(&h, &desc, &payload);
            let m = p.recv();
            assert_eq!(
                m.header.kind,
                Kind::Response,
                "{transport}: {}",
                m.error_text()
            );
            assert_eq!(m.header.request_id, id);
            let s = wire::decode_tensor_section(&m.header, &m.desc).expect("descriptors");
            assert_eq!(s.tensors.len(), 3);
            let mut covered = vec![false; m.payload.len()];
            for (t, (dtype, shape, data)) in s.tensors.iter().zip(specs) {
                assert_eq!(t.dtype, dtype);
                assert_eq!(t.shape, shape);
                assert_eq!(t.offset % 64, 0, "{transport}: aligned offsets");
                let r = t.offset as usize..(t.offset + t.len) as usize;
                assert_eq!(&m.payload[r.clone()], data, "{transport}: tensor bytes");
                covered[r].iter_mut().for_each(|c| *c = true);
            }
            for (i, (&byte, &cov)) in m.payload.iter().zip(&covered).enumerate() {
                assert!(
                    cov || byte == 0,
                    "{transport}: response padding byte {i} is {byte:#04x}, not 0"
                );
            }
        }
    });
}

/// The digits model run in this process, straight through ONNX Runtime.
fn local_digits(input: &[u8], shape: &[u64]) -> (OrtBackend, Vec<u8>) {
    let path = digits_model();
    let local = OrtBackend::load("digits", &path, &OrtOptions::default())
        .unwrap_or_else(|e| panic!("loading {}: {e}\n({})", path.display(), common::SETUP_HINT));
    let buf = AlignedBuf::copy_from(input).expect("buffer");
    let views = [TensorView::new(DType::F32, shape, &buf)];
    let outs = local.run(&views).expect("local run");
    assert_eq!(outs.len(), 1);
    let bytes = outs[0].bytes(&views).to_vec();
    (local, bytes)
}

fn argmax_rows(logits: &[f32], cols: usize) -> Vec<usize> {
    logits
        .chunks_exact(cols)
        .map(|row| {
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
                .expect("non-empty row")
        })
        .collect()
}

#[test]
fn onnx_outputs_are_bit_identical_to_in_process_on_every_transport() {
    within(LIMIT, "onnx bit-identical", || {
        let input = digits_input();
        let (local, want4) = local_digits(&input, &[4, 64]);
        let (_, want1) = local_digits(&input[..64 * 4], &[1, 64]);
        // Sanity: the local run agrees with the Python reference.
        let got: Vec<f32> = want4
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(argmax_rows(&got, 10), argmax_rows(&digits_expected(), 10));

        let sig = local.signature().clone();
        assert_eq!(
            sig.inputs,
            vec![TensorSpec {
                name: "x".into(),
                dtype: DType::F32,
                shape: vec![None, Some(64)],
            }]
        );
        assert_eq!(
            sig.outputs,
            vec![TensorSpec {
                name: "logits".into(),
                dtype: DType::F32,
                shape: vec![None, Some(10)],
            }]
        );

        let path = digits_model();
        let agent = TestAgent::start(&[("digits", &path)]);
        for (transport, uri) in agent.all_uris() {
            let c = connect(&uri);
            let m = c.model("digits").expect("digits");
            assert_eq!(m.signature(), &sig, "{transport}: signature");
            for (rows, want) in [(4u64, &want4), (1, &want1)] {
                let shape = [rows, 64];
                let x = &input[..rows as usize * 64 * 4];
                let r = m
                    .infer(&[TensorRef::new(DType::F32, &shape, x).expect("tensor")])
                    .unwrap_or_else(|e| panic!("{transport}: {e}"));
                assert_eq!(r.outputs.len(), 1);
                let o = &r.outputs[0];
                assert_eq!(o.dtype, DType::F32);
                assert_eq!(o.shape, vec![rows, 10]);
                assert!(
                    o.bytes() == &want[..],
                    "{transport}: batch {rows} logits are not bit-identical to the in-process run"
                );
            }
        }
    });
}

/// The tensor request `seq` of client `client` carries: its content names
/// both, and its length varies (some requests are several KiB).
fn tagged(client: u64, seq: u64) -> Vec<u64> {
    let len = if seq.is_multiple_of(97) {
        2048
    } else {
        3 + (seq % 11) * 5
    };
    (0..len)
        .map(|i| match i {
            0 => client,
            1 => seq,
            _ => (client << 48) ^ (seq << 16) ^ i,
        })
        .collect()
}

fn check_tagged(what: &str, r: &Response, client: u64, seq: u64) {
    assert_eq!(r.outputs.len(), 1, "{what}");
    let got = r.outputs[0].as_slice::<u64>().expect("u64 output");
    let want = tagged(client, seq);
    assert!(
        got == &want[..],
        "{what}: client {client} request {seq} got the answer of client {} request {} \
         ({} elements, want {})",
        got.first().copied().unwrap_or(u64::MAX),
        got.get(1).copied().unwrap_or(u64::MAX),
        got.len(),
        want.len()
    );
}

fn pipelined_clients(uri: &str, clients: u64, per_client: u64, window: u64) {
    let threads: Vec<_> = (0..clients)
        .map(|ci| {
            let uri = uri.to_string();
            std::thread::spawn(move || {
                let c = connect(&uri);
                let m = c.model("identity").expect("identity");
                let mut seq = 0;
                while seq < per_client {
                    let end = (seq + window).min(per_client);
                    let tickets: Vec<(u64, Ticket)> = (seq..end)
                        .map(|s| {
                            let data = tagged(ci, s);
                            let shape = [data.len() as u64];
                            let t = TensorRef::from_slice(&shape, &data).expect("tensor");
                            (s, m.submit(&[t]).expect("submit"))
                        })
                        .collect();
                    for (s, t) in tickets {
                        let r = t
                            .wait()
                            .unwrap_or_else(|e| panic!("{uri}: client {ci} request {s}: {e}"));
                        check_tagged(&uri, &r, ci, s);
                    }
                    seq = end;
                }
            })
        })
        .collect();
    for t in threads {
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
}

#[test]
fn eight_clients_pipelining_a_thousand_requests_each_get_their_own_answers() {
    within(LIMIT, "8 x 1000 pipelined", || {
        let agent = TestAgent::start(&[]);
        for (transport, uri) in agent.socket_uris() {
            let start = Instant::now();
            pipelined_clients(&uri, 8, 1000, 48);
            eprintln!("{transport}: 8 x 1000 pipelined in {:?}", start.elapsed());
        }
        assert_eq!(agent.agent().stats().in_flight, 0);
    });
}

#[test]
fn threads_sharing_one_client_get_their_own_answers() {
    within(LIMIT, "shared client", || {
        let agent = TestAgent::start(&[]);
        for (transport, uri) in agent.all_uris() {
            let c = connect(&uri);
            let threads: Vec<_> = (0..4u64)
                .map(|ci| {
                    let c = c.clone();
                    let transport = transport.to_string();
                    std::thread::spawn(move || {
                        let m = c.model("identity").expect("identity");
                        for s in 0..300 {
                            let data = tagged(ci, s);
                            let shape = [data.len() as u64];
                            let t = TensorRef::from_slice(&shape, &data).expect("tensor");
                            let a = m.submit(&[t]).expect("submit");
                            let r = a.wait().unwrap_or_else(|e| panic!("{transport}: {e}"));
                            check_tagged(&transport, &r, ci, s);
                        }
                    })
                })
                .collect();
            for t in threads {
                if let Err(p) = t.join() {
                    std::panic::resume_unwind(p);
                }
            }
        }
    });
}

#[test]
fn threads_sharing_one_client_pipeline_large_requests() {
    // Requests of 1-3 MiB, eight in flight per thread, four threads on one
    // connection: senders find the socket full and must read responses
    // while they send.
    within(LIMIT, "shared client, large requests", || {
        let agent = TestAgent::start(&[]);
        for (transport, uri) in agent.socket_uris() {
            let c = connect(&uri);
            let start = Instant::now();
            let threads: Vec<_> = (0..4u64)
                .map(|ci| {
                    let c = c.clone();
                    std::thread::spawn(move || {
                        let m = c.model("identity").expect("identity");
                        for round in 0..3u64 {
                            let datas: Vec<Vec<u8>> = (0..8u64)
                                .map(|k| {
                                    let seed = ci * 1000 + round * 10 + k;
                                    pattern((1 << 20) + (seed as usize % 3) * (1 << 20) + 7, seed)
                                })
                                .collect();
                            let tickets: Vec<Ticket> = datas
                                .iter()
                                .map(|d| {
                                    let shape = [d.len() as u64];
                                    m.submit(&[TensorRef::new(DType::U8, &shape, d).expect("t")])
                                        .expect("submit")
                                })
                                .collect();
                            for (d, t) in datas.iter().zip(tickets) {
                                let r = t.wait().expect("wait");
                                assert!(r.outputs[0].bytes() == &d[..], "client {ci}: wrong bytes");
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                if let Err(p) = t.join() {
                    std::panic::resume_unwind(p);
                }
            }
            eprintln!(
                "{transport}: 96 large requests on one shared client in {:?}",
                start.elapsed()
            );
        }
    });
}

#[test]
fn responses_waited_out_of_order_are_matched_by_id() {
    within(LIMIT, "out of order", || {
        let agent = TestAgent::start(&[]);
        for (transport, uri) in agent.all_uris() {
            let c = connect(&uri);
            let m = c.model("identity").expect("identity");
            let submit = |s: u64| {
                let data = tagged(7, s);
                let shape = [data.len() as u64];
                m.submit(&[TensorRef::from_slice(&shape, &data).expect("tensor")])
                    .expect("submit")
            };
            // Reverse order.
            let mut tickets: Vec<(u64, Ticket)> = (0..40).map(|s| (s, submit(s))).collect();
            while let Some((s, t)) = tickets.pop() {
                let r = t.wait().unwrap_or_else(|e| panic!("{transport}: {e}"));
                check_tagged(transport, &r, 7, s);
            }
            // Odd ones first, then even ones; one ticket dropped unwaited.
            let tickets: Vec<(u64, Ticket)> = (100..140).map(|s| (s, submit(s))).collect();
            let (odd, even): (Vec<_>, Vec<_>) = tickets.into_iter().partition(|(s, _)| s % 2 == 1);
            for (s, t) in odd {
                if s == 111 {
                    drop(t);
                    continue;
                }
                check_tagged(transport, &t.wait().expect("odd"), 7, s);
            }
            for (s, t) in even.into_iter().rev() {
                check_tagged(transport, &t.wait().expect("even"), 7, s);
            }
            // The session is still in order afterwards.
            check_identity(&c, transport);
            let r = submit(500).wait().expect("after");
            check_tagged(transport, &r, 7, 500);
        }
    });
}

#[test]
fn models_are_listed_by_the_client_and_the_cli() {
    within(LIMIT, "models listing", || {
        let path = digits_model();
        let agent = TestAgent::start(&[("digits", &path)]);
        for (transport, uri) in agent.all_uris() {
            let c = connect(&uri);
            let list = c.models().expect("models");
            let names: Vec<&str> = list.iter().map(|m| m.signature.name.as_str()).collect();
            assert_eq!(names, ["identity", "digits"], "{transport}");
            let identity = &list[0];
            assert!(identity.signature.inputs.is_empty() && identity.signature.outputs.is_empty());
            let digits = &list[1];
            let m = c.model("digits").expect("digits");
            assert_eq!(m.id(), digits.id, "{transport}: id from list and lookup");
            assert_eq!(m.signature(), &digits.signature, "{transport}");
            assert_eq!(c.model("identity").expect("identity").id(), identity.id);
        }
        for uri in [&agent.unix, &agent.tcp] {
            let (status, out, err) =
                run_bin(&["models", "--connect", uri], Duration::from_secs(60));
            assert!(
                status.success(),
                "tensorwire models --connect {uri}: {status}\n{err}"
            );
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 2, "one line per model:\n{out}");
            assert!(lines[0].starts_with("identity"), "{out}");
            assert!(lines[1].starts_with("digits"), "{out}");
            assert!(
                lines[1].contains("x: float32[?, 64]")
                    && lines[1].contains("logits: float32[?, 10]"),
                "{out}"
            );
        }
    });
}

#[test]
fn timelines_have_six_ordered_stages_on_every_transport() {
    within(LIMIT, "timelines", || {
        let path = digits_model();
        let input = digits_input();
        let agent = TestAgent::start(&[("digits", &path)]);
        for (transport, uri) in agent.all_uris() {
            let opts = ClientOptions {
                want_timeline: true,
                ..ClientOptions::default()
            };
            let c = Client::connect_with(&uri, opts).expect("connect");
            let identity = c.model("identity").expect("identity");
            let digits = c.model("digits").expect("digits");
            let x = pattern(1000, 5);
            for _ in 0..3 {
                for (name, r) in [
                    (
                        "identity",
                        identity.infer(&[TensorRef::new(DType::U8, &[1000], &x).expect("t")]),
                    ),
                    (
                        "digits",
                        digits.infer(&[TensorRef::new(DType::F32, &[4, 64], &input).expect("t")]),
                    ),
                ] {
                    let r = r.unwrap_or_else(|e| panic!("{transport} {name}: {e}"));
                    let tl = r
                        .timeline
                        .unwrap_or_else(|| panic!("{transport} {name}: no timeline"));
                    let stamps: Vec<u64> = Stage::ALL.iter().map(|&s| tl.get(s)).collect();
                    for (s, &v) in Stage::ALL.iter().zip(&stamps) {
                        assert!(v != 0, "{transport} {name}: stage {} not stamped", s.name());
                    }
                    assert!(
                        stamps.windows(2).all(|w| w[0] <= w[1]),
                        "{transport} {name}: stages out of order: {stamps:?}"
                    );
                    assert!(
                        r.client_start_ns <= stamps[0] && stamps[5] <= r.client_done_ns,
                        "{transport} {name}: agent stamps {stamps:?} outside the client's \
                         [{}, {}]",
                        r.client_start_ns,
                        r.client_done_ns
                    );
                }
            }
            // Without asking, there is none.
            let plain = connect(&uri);
            let r = plain
                .model("identity")
                .expect("identity")
                .infer(&[TensorRef::new(DType::U8, &[1000], &x).expect("t")])
                .expect("infer");
            assert!(
                r.timeline.is_none(),
                "{transport}: timeline nobody asked for"
            );
        }
    });
}
