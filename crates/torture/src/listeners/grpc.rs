//! Hostile bytes for the KServe v2 gRPC front door, written frame by
//! frame (no HTTP/2 library: the point is to send what a library would
//! refuse to): noise after the HTTP/2 preface, broken prefaces, malformed
//! frames (lengths over the frame limit, frames on the wrong stream, bad
//! SETTINGS, floods of SETTINGS, PINGs, CONTINUATIONs and reset streams),
//! HPACK blocks that lie, and valid HTTP/2 + gRPC framing around
//! malformed protobuf, gRPC length prefixes that lie, oversize messages,
//! `raw_input_contents` that do not match their shapes, unknown models
//! and methods; and every byte after the preface of a valid request at
//! 0x00 and 0xFF. Also the well-behaved probe a churning client sends and
//! the valid request a slowloris trickles.

use super::{every_byte, named as s, noise, random_bytes, raw_shots, scrambled, Shot, Sock};
use std::io;

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PRIORITY: u8 = 2;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PUSH_PROMISE: u8 = 5;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

const INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// One HTTP/2 frame (the length is the payload's, cut to 24 bits).
fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    frame_claiming(payload.len() as u32, ty, flags, stream, payload)
}

/// One HTTP/2 frame whose header claims `len` bytes, whatever follows.
fn frame_claiming(len: u32, ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.push(ty);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `high`.
fn hpack_int(high: u8, n: u32, mut v: u64, out: &mut Vec<u8>) {
    let max = (1u64 << n) - 1;
    if v < max {
        out.push(high | v as u8);
        return;
    }
    out.push(high | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK header block of literal fields, never indexed, no Huffman.
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_int(0, 7, name.len() as u64, &mut out);
        out.extend_from_slice(name.as_bytes());
        hpack_int(0, 7, value.len() as u64, &mut out);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// The request headers of a gRPC call to `path`.
fn call_headers(path: &str) -> Vec<u8> {
    hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited protobuf field.
fn field_bytes(field: u32, b: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(field) << 3 | 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// An `InferInputTensor`: name, datatype, packed shape.
fn input(name: &str, datatype: &str, shape: &[i64]) -> Vec<u8> {
    let mut t = Vec::new();
    field_bytes(1, name.as_bytes(), &mut t);
    field_bytes(2, datatype.as_bytes(), &mut t);
    let mut dims = Vec::new();
    for d in shape {
        varint(*d as u64, &mut dims);
    }
    field_bytes(3, &dims, &mut t);
    t
}

/// A `ModelInferRequest` for `model` with `inputs` and
/// `raw_input_contents`.
fn infer_message(model: &str, inputs: &[Vec<u8>], raw: &[&[u8]]) -> Vec<u8> {
    let mut m = Vec::new();
    field_bytes(1, model.as_bytes(), &mut m);
    for i in inputs {
        field_bytes(5, i, &mut m);
    }
    for r in raw {
        field_bytes(7, r, &mut m);
    }
    m
}

/// The valid message: identity, one UINT8 `[8]` tensor.
fn valid_message() -> Vec<u8> {
    infer_message(
        "identity",
        &[input("t", "UINT8", &[8])],
        &[&[1, 2, 3, 4, 5, 6, 7, 8]],
    )
}

/// A gRPC length-prefixed message with its flag and a claimed length.
fn grpc_claiming(flag: u8, len: u32, msg: &[u8]) -> Vec<u8> {
    let mut b = vec![flag];
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(msg);
    b
}

fn grpc_message(msg: &[u8]) -> Vec<u8> {
    grpc_claiming(0, msg.len() as u32, msg)
}

/// Preface, an empty SETTINGS, then `frames`.
fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut b = PREFACE.to_vec();
    b.extend(frame(SETTINGS, 0, 0, &[]));
    for f in frames {
        b.extend_from_slice(f);
    }
    b
}

/// A whole unary call to `path` on stream 1 whose DATA frame carries
/// `body` (a gRPC message, or whatever lies in its place).
fn call(path: &str, body: &[u8]) -> Vec<u8> {
    connection(&[
        frame(HEADERS, END_HEADERS, 1, &call_headers(path)),
        frame(DATA, END_STREAM, 1, body),
    ])
}

/// A ModelInfer call carrying `msg` as its one message.
fn infer_call(msg: &[u8]) -> Vec<u8> {
    call(INFER, &grpc_message(msg))
}

/// The valid request: a whole ModelInfer call to identity.
pub fn valid_request() -> Vec<u8> {
    infer_call(&valid_message())
}

/// A well-behaved probe: the preface and SETTINGS, answered by the
/// agent's SETTINGS.
pub fn probe(s: &mut Sock) -> io::Result<()> {
    s.write_all(&connection(&[]))?;
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    if head[3] == SETTINGS {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "the preface was answered by a frame of type {}",
            head[3]
        )))
    }
}

fn setting(id: u16, value: u32) -> Vec<u8> {
    let mut b = id.to_be_bytes().to_vec();
    b.extend_from_slice(&value.to_be_bytes());
    b
}

/// Every fixed attack, in groups (one per kind).
pub fn shots() -> Vec<Vec<Shot>> {
    let valid = valid_request();
    let msg = valid_message();
    let headers = call_headers(INFER);
    let open = |stream: u32| frame(HEADERS, END_HEADERS, stream, &headers);
    let after_preface = noise(
        0x6e9c,
        PREFACE,
        &[1, 9, 100, 1000, 16_384, 100_000],
        "random bytes after the preface",
    );
    let mut prefaces: Vec<(String, Vec<u8>)> = (1..PREFACE.len())
        .map(|k| (format!("preface cut at byte {k}"), PREFACE[..k].to_vec()))
        .collect();
    for i in 0..PREFACE.len() {
        let mut b = connection(&[]);
        b[i] ^= 0x20;
        prefaces.push((format!("preface byte {i} changed"), b));
    }
    let c = |frames: &[Vec<u8>]| connection(frames);
    let frames = vec![
        s(
            "frame of 2^24-1 bytes",
            c(&[frame_claiming(0xff_ffff, HEADERS, END_HEADERS, 1, &headers)]),
        ),
        s(
            "frame over the frame size",
            c(&[frame(DATA, 0, 1, &vec![0; 20_000])]),
        ),
        s("unknown frame type", c(&[frame(0xfa, 0xff, 0, &[1, 2, 3])])),
        s(
            "SETTINGS of 5 bytes",
            c(&[frame(SETTINGS, 0, 0, &[0, 1, 0, 0, 0])]),
        ),
        s(
            "SETTINGS on stream 1",
            c(&[frame(SETTINGS, 0, 1, &setting(1, 0))]),
        ),
        s(
            "SETTINGS ENABLE_PUSH=2",
            c(&[frame(SETTINGS, 0, 0, &setting(2, 2))]),
        ),
        s(
            "SETTINGS window 2^31",
            c(&[frame(SETTINGS, 0, 0, &setting(4, 1 << 31))]),
        ),
        s(
            "SETTINGS frame size 1",
            c(&[frame(SETTINGS, 0, 0, &setting(5, 1))]),
        ),
        s(
            "SETTINGS table size u32 max",
            c(&[frame(SETTINGS, 0, 0, &setting(1, u32::MAX))]),
        ),
        s(
            "SETTINGS ACK with a payload",
            c(&[frame(SETTINGS, 1, 0, &setting(3, 1))]),
        ),
        s(
            "10 000 SETTINGS",
            c(&vec![frame(SETTINGS, 0, 0, &setting(3, 100)); 10_000]),
        ),
        s("PING of 7 bytes", c(&[frame(PING, 0, 0, &[0; 7])])),
        s("PING on stream 1", c(&[frame(PING, 0, 1, &[0; 8])])),
        s("10 000 PINGs", c(&vec![frame(PING, 0, 0, &[1; 8]); 10_000])),
        s(
            "WINDOW_UPDATE of 0",
            c(&[frame(WINDOW_UPDATE, 0, 0, &0u32.to_be_bytes())]),
        ),
        s(
            "window over 2^31-1",
            c(&[
                frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()),
                frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()),
            ]),
        ),
        s("HEADERS on stream 0", c(&[open(0)])),
        s("HEADERS on an even stream", c(&[open(2)])),
        s("stream ids going down", c(&[open(5), open(3)])),
        s(
            "padding longer than the frame",
            c(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 0, 0])]),
        ),
        s(
            "stream depending on itself",
            c(&[frame(
                HEADERS,
                END_HEADERS | PRIORITY_FLAG,
                1,
                &[&[0, 0, 0, 1, 16][..], &headers].concat(),
            )]),
        ),
        s("PRIORITY of 4 bytes", c(&[frame(PRIORITY, 0, 1, &[0; 4])])),
        s(
            "CONTINUATION without HEADERS",
            c(&[frame(CONTINUATION, END_HEADERS, 1, &headers)]),
        ),
        s("10 000 CONTINUATIONs", {
            let mut f = vec![frame(HEADERS, 0, 1, &headers)];
            f.extend((0..10_000).map(|_| {
                frame(
                    CONTINUATION,
                    0,
                    1,
                    &hpack(&[("x-flood", "0123456789abcdef")]),
                )
            }));
            c(&f)
        }),
        s(
            "DATA on an idle stream",
            c(&[frame(DATA, END_STREAM, 1, &grpc_message(&msg))]),
        ),
        s("DATA on stream 0", c(&[frame(DATA, 0, 0, &[0; 8])])),
        s(
            "RST_STREAM on stream 0",
            c(&[frame(RST_STREAM, 0, 0, &[0, 0, 0, 8])]),
        ),
        s(
            "RST_STREAM on an idle stream",
            c(&[frame(RST_STREAM, 0, 7, &[0, 0, 0, 8])]),
        ),
        s(
            "GOAWAY with 64 KB of debug data",
            c(&[frame(
                GOAWAY,
                0,
                0,
                &[&[0u8; 8][..], &vec![b'g'; 16_000]].concat(),
            )]),
        ),
        s(
            "PUSH_PROMISE from a client",
            c(&[open(1), frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2])]),
        ),
        s(
            "1000 streams opened and reset",
            c(&(0..1000u32)
                .flat_map(|i| {
                    [
                        open(2 * i + 1),
                        frame(RST_STREAM, 0, 2 * i + 1, &[0, 0, 0, 8]),
                    ]
                })
                .collect::<Vec<_>>()),
        ),
        s(
            "1000 streams left open",
            c(&(0..1000u32).map(|i| open(2 * i + 1)).collect::<Vec<_>>()),
        ),
        s(
            "DATA past the stream window",
            c(&[
                open(1),
                frame(DATA, 0, 1, &vec![0; 16_000]),
                frame(DATA, 0, 1, &vec![0; 16_000]),
                frame(DATA, 0, 1, &vec![0; 16_000]),
                frame(DATA, 0, 1, &vec![0; 16_000]),
                frame(DATA, 0, 1, &vec![0; 16_000]),
            ]),
        ),
    ];
    let block = |b: &[u8]| c(&[frame(HEADERS, END_HEADERS | END_STREAM, 1, b)]);
    let mut table_update = Vec::new();
    hpack_int(0x20, 5, 1 << 32, &mut table_update);
    let hpack_lies = vec![
        s("indexed field 0", block(&[0x80])),
        s("indexed field past the table", block(&[0xff, 0xff, 0x7f])),
        s(
            "HPACK integer overflow",
            block(&[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ]),
        ),
        s("table size update to 2^32", block(&table_update)),
        s(
            "string length past the block",
            block(&[0x00, 0x7f, 0x80, 0x01, b'a']),
        ),
        s(
            "bad Huffman string",
            block(&[0x00, 0x83, 0xff, 0xff, 0xff, 0x01, b'a']),
        ),
        s(
            "no :path",
            block(&hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                ("content-type", "application/grpc"),
            ])),
        ),
        s(
            "no :method",
            block(&hpack(&[(":path", INFER), (":scheme", "http")])),
        ),
        s(
            "upper-case header name",
            block(&hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", INFER),
                ("Content-Type", "application/grpc"),
            ])),
        ),
        s(
            "connection header",
            block(&hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", INFER),
                ("connection", "keep-alive"),
            ])),
        ),
        s(
            "two :paths",
            block(&hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", INFER),
                (":path", "/x"),
            ])),
        ),
        s(
            "pseudo-header after a field",
            block(&hpack(&[
                (":method", "POST"),
                ("te", "trailers"),
                (":path", INFER),
            ])),
        ),
        s("header list of 1 MB", {
            let big = "v".repeat(4000);
            let fields: Vec<(&str, &str)> = (0..250).map(|_| ("x-big", big.as_str())).collect();
            let mut f = vec![frame(HEADERS, 0, 1, &hpack(&fields[..1]))];
            f.extend(
                fields[1..]
                    .chunks(3)
                    .map(|ch| frame(CONTINUATION, 0, 1, &hpack(ch))),
            );
            f.push(frame(CONTINUATION, END_HEADERS, 1, &[]));
            c(&f)
        }),
        s(
            "content-type text/plain",
            block(&hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", INFER),
                ("content-type", "text/plain"),
            ])),
        ),
        s(
            "GET on a method",
            block(&hpack(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", INFER),
                ("content-type", "application/grpc"),
            ])),
        ),
        s(
            "grpc-timeout garbage",
            block(&hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", INFER),
                ("content-type", "application/grpc"),
                ("grpc-timeout", "99999999999H"),
            ])),
        ),
        s(
            "grpc-encoding unknown",
            c(&[
                frame(
                    HEADERS,
                    END_HEADERS,
                    1,
                    &hpack(&[
                        (":method", "POST"),
                        (":scheme", "http"),
                        (":path", INFER),
                        ("content-type", "application/grpc"),
                        ("grpc-encoding", "zstd9"),
                    ]),
                ),
                frame(
                    DATA,
                    END_STREAM,
                    1,
                    &grpc_claiming(1, msg.len() as u32, &msg),
                ),
            ]),
        ),
    ];
    let framing = vec![
        s(
            "gRPC length past the data",
            call(INFER, &grpc_claiming(0, 1000, &msg)),
        ),
        s(
            "gRPC length short of the data",
            call(INFER, &grpc_claiming(0, 5, &msg)),
        ),
        s(
            "gRPC length u32 max",
            call(INFER, &grpc_claiming(0, u32::MAX, &msg)),
        ),
        s(
            "compressed flag without an encoding",
            call(INFER, &grpc_claiming(1, msg.len() as u32, &msg)),
        ),
        s(
            "gRPC flag 7",
            call(INFER, &grpc_claiming(7, msg.len() as u32, &msg)),
        ),
        s(
            "oversize message",
            call(INFER, &grpc_claiming(0, (257 << 20) + 1, &vec![0; 1024])),
        ),
        s("gRPC prefix cut at 4 bytes", call(INFER, &[0, 0, 0, 0])),
        s(
            "two messages in a unary call",
            call(INFER, &[grpc_message(&msg), grpc_message(&msg)].concat()),
        ),
        s("no message at all", call(INFER, &[])),
        s(
            "stream infer of 100 messages, some broken",
            call(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                &(0..100)
                    .flat_map(|i| {
                        if i % 3 == 0 {
                            grpc_message(&[0xff; 7])
                        } else {
                            grpc_message(&msg)
                        }
                    })
                    .collect::<Vec<u8>>(),
            ),
        ),
    ];
    let mut protobuf: Vec<(String, Vec<u8>)> = noise(
        0x6e9d,
        &[],
        &[3, 17, 100, 1000, 65_536],
        "random bytes as the message",
    )
    .into_iter()
    .map(|(name, b)| (name, infer_call(&b)))
    .collect();
    for (name, m) in [
        (
            "varint of 11 bytes",
            vec![
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
        ),
        (
            "field length past the end",
            vec![0x0a, 0xe8, 0x07, b'a', b'b', b'c'],
        ),
        ("wire type 7", vec![0x0f, 1]),
        ("a group", vec![0x0b, 0x0c]),
        ("field 0", vec![0x02, 0x01, 0x00]),
        (
            "10 000 nested groups",
            [vec![0x43u8; 10_000], vec![0x44u8; 10_000]].concat(),
        ),
        ("input length past the message", {
            let mut m = Vec::new();
            field_bytes(1, b"identity", &mut m);
            m.extend_from_slice(&[0x2a, 0xff, 0x01, 0x0a, 0x01, b't']);
            m
        }),
        ("shape varint cut", {
            let mut t = Vec::new();
            field_bytes(1, b"t", &mut t);
            field_bytes(2, b"UINT8", &mut t);
            t.extend_from_slice(&[0x1a, 0x02, 0xff, 0xff]);
            let mut m = Vec::new();
            field_bytes(1, b"identity", &mut m);
            field_bytes(5, &t, &mut m);
            m
        }),
        ("model name not UTF-8", {
            let mut m = Vec::new();
            field_bytes(1, &[0xff, 0xfe, 0xc0], &mut m);
            m
        }),
    ] {
        protobuf.push((name.to_string(), infer_call(&m)));
    }
    let bytes8: &[u8] = &[1, 2, 3, 4, 5, 6, 7, 8];
    let shapes = vec![
        s(
            "FP32 [4] with 3 bytes",
            infer_call(&infer_message(
                "identity",
                &[input("t", "FP32", &[4])],
                &[&[1, 2, 3]],
            )),
        ),
        s(
            "one input, two raw contents",
            infer_call(&infer_message(
                "identity",
                &[input("t", "UINT8", &[8])],
                &[bytes8, bytes8],
            )),
        ),
        s(
            "two inputs, one raw content",
            infer_call(&infer_message(
                "identity",
                &[input("a", "UINT8", &[8]), input("b", "UINT8", &[8])],
                &[bytes8],
            )),
        ),
        s(
            "shape [-1]",
            infer_call(&infer_message(
                "identity",
                &[input("t", "UINT8", &[-1])],
                &[bytes8],
            )),
        ),
        s(
            "shape [2^40]",
            infer_call(&infer_message(
                "identity",
                &[input("t", "UINT8", &[1 << 40])],
                &[bytes8],
            )),
        ),
        s(
            "shape product over u64",
            infer_call(&infer_message(
                "identity",
                &[input("t", "FP32", &[1 << 62, 1 << 62, 4])],
                &[bytes8],
            )),
        ),
        s(
            "1000 dimensions",
            infer_call(&infer_message(
                "identity",
                &[input("t", "UINT8", &[1; 1000])],
                &[&[1]],
            )),
        ),
        s(
            "datatype FLOAT",
            infer_call(&infer_message(
                "identity",
                &[input("t", "FLOAT", &[2])],
                &[bytes8],
            )),
        ),
        s(
            "empty datatype",
            infer_call(&infer_message(
                "identity",
                &[input("t", "", &[8])],
                &[bytes8],
            )),
        ),
        s(
            "no inputs",
            infer_call(&infer_message("identity", &[], &[bytes8])),
        ),
        s(
            "10 000 inputs",
            infer_call(&infer_message(
                "identity",
                &vec![input("t", "UINT8", &[1]); 10_000],
                &vec![&[1u8][..]; 10_000],
            )),
        ),
        s(
            "BYTES without length prefixes",
            infer_call(&infer_message(
                "identity",
                &[input("t", "BYTES", &[2])],
                &[bytes8],
            )),
        ),
        s(
            "FP16 of odd length",
            infer_call(&infer_message(
                "identity",
                &[input("t", "FP16", &[1])],
                &[&[1, 2, 3]],
            )),
        ),
        s(
            "digits with the wrong shape",
            infer_call(&infer_message(
                "digits",
                &[input("x", "FP32", &[1, 63])],
                &[&[0; 252]],
            )),
        ),
    ];
    let mut unknown = vec![
        s(
            "unknown model",
            infer_call(&infer_message(
                "nope",
                &[input("t", "UINT8", &[8])],
                &[bytes8],
            )),
        ),
        s(
            "empty model name",
            infer_call(&infer_message("", &[input("t", "UINT8", &[8])], &[bytes8])),
        ),
        s(
            "model name of 10 KB",
            infer_call(&infer_message(
                &"m".repeat(10_000),
                &[input("t", "UINT8", &[8])],
                &[bytes8],
            )),
        ),
        s(
            "version 999",
            infer_call(&{
                let mut m = valid_message();
                field_bytes(2, b"999", &mut m);
                m
            }),
        ),
    ];
    for path in [
        "/inference.GRPCInferenceService/Nope",
        "/x",
        "/inference.GRPCInferenceService/RepositoryModelUnload",
        "/inference.GRPCInferenceService/SystemSharedMemoryRegister",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ] {
        unknown.push((format!("call {path}"), call(path, &grpc_message(&msg))));
    }
    // Every byte after the preface at 0x00 and 0xFF.
    let bytes = every_byte(&valid, PREFACE.len());
    vec![
        raw_shots(after_preface),
        raw_shots(prefaces),
        raw_shots(frames),
        raw_shots(hpack_lies),
        raw_shots(framing),
        raw_shots(protobuf),
        raw_shots(shapes),
        raw_shots(unknown),
        raw_shots(bytes),
    ]
}

/// A random attack: the valid request with bytes after the preface
/// changed, noise after the preface, or random frames.
pub fn random_shot(rng: &mut fastrand::Rng) -> Shot {
    thread_local! {
        static VALID: Vec<u8> = valid_request();
    }
    match rng.u8(..3) {
        0 => VALID.with(|v| {
            Shot::raw(
                "valid request with random bytes changed",
                scrambled(rng, v, PREFACE.len()),
            )
        }),
        1 => Shot::raw(
            "random bytes after the preface",
            [PREFACE, &random_bytes(rng, 2048)].concat(),
        ),
        _ => {
            let frames: Vec<Vec<u8>> = (0..rng.usize(1..=16))
                .map(|_| {
                    let payload: Vec<u8> = (0..rng.usize(0..=64)).map(|_| rng.u8(..)).collect();
                    frame(rng.u8(..12), rng.u8(..), rng.u32(..8), &payload)
                })
                .collect();
            Shot::raw("random frames", connection(&frames))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_follow_rfc_7541() {
        // C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        hpack_int(0, 5, 1337, &mut out);
        assert_eq!(out, [31, 154, 10]);
        let mut out = Vec::new();
        hpack_int(0, 5, 10, &mut out);
        assert_eq!(out, [10]);
    }

    #[test]
    fn the_valid_request_frames_one_grpc_message() {
        let v = valid_request();
        assert!(v.starts_with(PREFACE));
        let msg = valid_message();
        assert!(v.ends_with(&grpc_message(&msg)));
        // The message: model_name "identity" first.
        assert_eq!(&msg[..2], &[0x0a, 8]);
        assert_eq!(&msg[2..10], b"identity");
    }
}
