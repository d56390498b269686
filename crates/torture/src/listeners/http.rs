//! Hostile bytes for the KServe v2 HTTP/REST front door: noise, broken
//! request lines and headers, malformed JSON bodies, wrong datatype names,
//! shapes that disagree with their data, binary-data lengths that lie
//! (`Inference-Header-Content-Length`, `binary_data_size`), Content-Length
//! over the limit, truncated bodies, chunked encoding that lies, unknown
//! models and paths, and every byte of a valid binary request at 0x00 and
//! 0xFF. Requests go to `identity` (it takes any tensors). Also the
//! well-behaved probe a churning client sends, and the valid request a
//! slowloris trickles.

use super::{every_byte, named as s, noise, random_bytes, raw_shots, scrambled, Shot, Sock};
use std::io;

/// The path of identity's infer endpoint.
const INFER: &str = "/v2/models/identity/infer";

/// The JSON part of the valid binary request: one UINT8 `[8]` tensor as
/// binary data, asked back as binary data.
const VALID_JSON: &str = r#"{"inputs":[{"name":"t","shape":[8],"datatype":"UINT8","parameters":{"binary_data_size":8}}],"outputs":[{"name":"t","parameters":{"binary_data":true}}]}"#;

/// The binary part of the valid request.
const VALID_BINARY: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

/// `METHOD path HTTP/1.1` with a Host, `headers` and (unless a header
/// already gives it, or the body is chunked) a Content-Length for `body`.
fn request(method: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    let framed = headers.iter().any(|(n, _)| {
        n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding")
    });
    if !framed {
        head += &format!("Content-Length: {}\r\n", body.len());
    }
    for (n, v) in headers {
        head += &format!("{n}: {v}\r\n");
    }
    head += "\r\n";
    let mut b = head.into_bytes();
    b.extend_from_slice(body);
    b
}

/// A POST of `json` followed by `binary` (with its
/// Inference-Header-Content-Length when there is binary data) to `path`.
fn infer_at(path: &str, json: &str, binary: &[u8]) -> Vec<u8> {
    let mut body = json.as_bytes().to_vec();
    body.extend_from_slice(binary);
    let headers = if binary.is_empty() {
        vec![]
    } else {
        vec![("Inference-Header-Content-Length", json.len().to_string())]
    };
    request("POST", path, &headers, &body)
}

/// A JSON-only inference of one tensor `t` to identity.
fn tensor_json(shape: &str, datatype: &str, data: &str) -> Vec<u8> {
    let json = format!(
        r#"{{"inputs":[{{"name":"t","shape":{shape},"datatype":"{datatype}","data":{data}}}]}}"#
    );
    infer_at(INFER, &json, &[])
}

/// The valid binary request (identity echoes its 8 bytes).
pub fn valid_request() -> Vec<u8> {
    infer_at(INFER, VALID_JSON, &VALID_BINARY)
}

/// A well-behaved probe: `GET /v2/health/ready`, answered 200.
pub fn probe(s: &mut Sock) -> io::Result<()> {
    s.write_all(b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
    let head = s.read_until(b"\r\n\r\n", 64 << 10)?;
    if head.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "readiness answered {:?}",
            String::from_utf8_lossy(&head[..head.len().min(40)])
        )))
    }
}

/// Every fixed attack, in groups (one per kind).
pub fn shots() -> Vec<Vec<Shot>> {
    let valid = valid_request();
    let noise = noise(
        0x4777,
        &[],
        &[1, 7, 100, 1000, 16_384, 100_000],
        "random bytes",
    );
    let request_lines = vec![
        s("request line without a path", b"GET\r\n\r\n".to_vec()),
        s("HTTP/9.9", b"GET /v2 HTTP/9.9\r\n\r\n".to_vec()),
        s("request line without its end", format!("POST {INFER} HTTP/1.1").into_bytes()),
        s("request line without a version", format!("POST {INFER}\r\n\r\n").into_bytes()),
        s("control bytes as the method", b"\x00\x01\x02 / HTTP/1.1\r\n\r\n".to_vec()),
        s("70 000-byte path", {
            let mut b = b"GET /".to_vec();
            b.resize(70_005, b'a');
            b.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
            b
        }),
        s("spaces only", b"    \r\n\r\n".to_vec()),
        s("empty lines only", b"\r\n\r\n\r\n\r\n".to_vec()),
        s("lower-case version", b"get /v2 http/1.1\r\n\r\n".to_vec()),
        s("bare LF line ends", format!("POST {INFER} HTTP/1.1\nHost: x\n\n").into_bytes()),
        s("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()),
        s("CONNECT", b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        s("escaped NUL and dot-dot in the path", b"GET /v2/%ff%00/../x HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        s("absolute-form target", b"GET http://elsewhere/v2 HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        s("upgrade to h2c", b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n".to_vec()),
    ];
    let body = VALID_JSON.as_bytes();
    let with = |extra: &[(&str, String)]| request("POST", INFER, extra, body);
    let headers = vec![
        s("header without a colon", format!("POST {INFER} HTTP/1.1\r\nHost x\r\n\r\n").into_bytes()),
        s("NUL in a header value", with(&[("X-A", "a\0b".into())])),
        s("space in a header name", with(&[("Content Length", "5".into())])),
        s("100 KB header value", with(&[("X-A", "v".repeat(100_000))])),
        s("1000 headers", {
            let many: Vec<(String, String)> = (0..1000).map(|i| (format!("X-{i}"), "1".into())).collect();
            let refs: Vec<(&str, String)> = many.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
            with(&refs)
        }),
        s("obsolete line folding", format!("POST {INFER} HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\n{{}}").into_bytes()),
        s("two different Content-Lengths", format!("POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}").into_bytes()),
        s("Content-Length -1", with(&[("Content-Length", "-1".into())])),
        s("Content-Length not a number", with(&[("Content-Length", "abc".into())])),
        s("Content-Length over u64", with(&[("Content-Length", "99999999999999999999999".into())])),
        s("Content-Length list", with(&[("Content-Length", "5, 6".into())])),
        s("chunked and Content-Length", with(&[("Content-Length", "4".into()), ("Transfer-Encoding", "chunked".into())])),
        s("unknown transfer coding", with(&[("Transfer-Encoding", "gzip, chunked2".into())])),
        s("Expect 100-continue, no body", request("POST", INFER, &[("Expect", "100-continue".into()), ("Content-Length", "100".into())], b"")),
        s("non-ASCII binary header", with(&[("Inference-Header-Content-Length", "\u{00e9}".into())])),
        s("head without its end", format!("POST {INFER} HTTP/1.1\r\nHost: x\r\n").into_bytes()),
        s("bearer token of 64 KB", with(&[("Authorization", format!("Bearer {}", "t".repeat(65_536)))])),
    ];
    // The JSON-only form of the valid request, cut every few bytes.
    let json_valid = r#"{"id":"x","inputs":[{"name":"t","shape":[2,2],"datatype":"FP32","data":[[1.0,2.5],[-3e3,4]]}],"parameters":{"priority":1}}"#;
    let mut json: Vec<(String, Vec<u8>)> = (1..json_valid.len())
        .step_by(5)
        .map(|k| {
            (
                format!("JSON cut at byte {k}"),
                infer_at(INFER, &json_valid[..k], &[]),
            )
        })
        .collect();
    let deep_data = format!(
        r#"{{"inputs":[{{"name":"t","shape":[1],"datatype":"UINT8","data":{}1{}}}]}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    for (name, doc) in [
        ("empty body", String::new()),
        ("null", "null".into()),
        ("a list", "[]".into()),
        ("an empty object", "{}".into()),
        ("inputs null", r#"{"inputs":null}"#.into()),
        ("inputs [null]", r#"{"inputs":[null]}"#.into()),
        ("inputs an object", r#"{"inputs":{}}"#.into()),
        ("100 000 nested lists", "[".repeat(100_000)),
        ("50 000 nested objects", r#"{"a":"#.repeat(50_000)),
        ("data nested 10 000 deep", deep_data),
        ("number 1e999999", r#"{"inputs":[{"name":"t","shape":[1],"datatype":"FP64","data":[1e999999]}]}"#.into()),
        ("NaN", r#"{"inputs":[{"name":"t","shape":[1],"datatype":"FP32","data":[NaN]}]}"#.into()),
        ("trailing garbage", format!("{json_valid}xyz")),
        ("a lone surrogate in a name", r#"{"inputs":[{"name":"\ud800","shape":[1],"datatype":"UINT8","data":[1]}]}"#.into()),
        ("duplicate keys", r#"{"inputs":[],"inputs":[{"name":"t","shape":[1],"datatype":"UINT8","data":[1]}]}"#.into()),
        ("1 MB tensor name", format!(r#"{{"inputs":[{{"name":"{}","shape":[1],"datatype":"UINT8","data":[1]}}]}}"#, "n".repeat(1 << 20))),
        ("100 000 inputs", format!(r#"{{"inputs":[{}]}}"#, vec![r#"{"name":"t","shape":[1],"datatype":"UINT8","data":[1]}"#; 100_000].join(","))),
        ("priority -1", r#"{"inputs":[{"name":"t","shape":[1],"datatype":"UINT8","data":[1]}],"parameters":{"priority":-1}}"#.into()),
        ("timeout a string", r#"{"inputs":[{"name":"t","shape":[1],"datatype":"UINT8","data":[1]}],"parameters":{"timeout":"soon"}}"#.into()),
        ("outputs not a list", r#"{"inputs":[{"name":"t","shape":[1],"datatype":"UINT8","data":[1]}],"outputs":7}"#.into()),
        ("unknown output", r#"{"inputs":[{"name":"t","shape":[1],"datatype":"UINT8","data":[1]}],"outputs":[{"name":"nope"}]}"#.into()),
        ("shared memory region that does not exist", r#"{"inputs":[{"name":"t","shape":[1],"datatype":"UINT8","parameters":{"shared_memory_region":"nope","shared_memory_byte_size":1}}]}"#.into()),
    ] {
        json.push((name.to_string(), infer_at(INFER, &doc, &[])));
    }
    json.push(s("invalid UTF-8", {
        let mut b = b"{\"inputs\":[{\"name\":\"".to_vec();
        b.extend_from_slice(&[0xff, 0xfe, 0xc0]);
        b.extend_from_slice(b"\",\"shape\":[1],\"datatype\":\"UINT8\",\"data\":[1]}]}");
        request("POST", INFER, &[], &b)
    }));
    let datatypes = [
        "FLOAT32", "fp32", "", "INT4", "BF16", "BYTES", "FP16", "STRING", "UINT8 ", "\\u0000",
        "BOOLEAN", "UINT128",
    ]
    .iter()
    .map(|dt| {
        (
            format!("datatype '{dt}'"),
            tensor_json("[3]", dt, "[1,2,3]"),
        )
    })
    .collect();
    let shapes = [
        ("shape [4], 3 elements", "[4]", "UINT8", "[1,2,3]"),
        ("shape [2], 3 elements", "[2]", "UINT8", "[1,2,3]"),
        ("shape [-1]", "[-1]", "UINT8", "[1]"),
        ("shape []", "[]", "UINT8", "[1]"),
        ("shape [0] with data", "[0]", "UINT8", "[1]"),
        (
            "shape product over u64",
            "[4611686018427387904,4611686018427387904,4]",
            "FP32",
            "[1]",
        ),
        ("shape [2^31], no data", "[2147483648]", "UINT8", "[]"),
        ("shape i64 max", "[9223372036854775807]", "UINT8", "[1]"),
        (
            "1000 dimensions",
            &format!("[{}]", vec!["1"; 1000].join(",")),
            "UINT8",
            "[1]",
        ),
        ("ragged data", "[2,2]", "INT32", "[[1,2],[3]]"),
        ("data deeper than the shape", "[2]", "INT32", "[[1],[2]]"),
        ("strings for UINT8", "[2]", "UINT8", r#"["a","b"]"#),
        ("300 for UINT8", "[1]", "UINT8", "[300]"),
        ("-1 for UINT8", "[1]", "UINT8", "[-1]"),
        ("1.5 for INT32", "[1]", "INT32", "[1.5]"),
        ("true for FP32", "[1]", "FP32", "[true]"),
        ("numbers for BOOL", "[2]", "BOOL", "[0,7]"),
        ("numbers for BYTES", "[2]", "BYTES", "[1,2]"),
        ("a fractional dimension", "[1.5]", "UINT8", "[1]"),
        ("a string dimension", r#"["2"]"#, "UINT8", "[1,2]"),
        ("data an object", "[1]", "UINT8", r#"{"a":1}"#),
        ("data a number", "[1]", "UINT8", "1"),
    ]
    .iter()
    .map(|(name, shape, dt, data)| (name.to_string(), tensor_json(shape, dt, data)))
    .collect();
    let bin_json = |size: &str| {
        format!(
            r#"{{"inputs":[{{"name":"t","shape":[8],"datatype":"UINT8","parameters":{{"binary_data_size":{size}}}}}]}}"#
        )
    };
    let lie = |value: String| -> Vec<u8> {
        let mut body = VALID_JSON.as_bytes().to_vec();
        body.extend_from_slice(&VALID_BINARY);
        request(
            "POST",
            INFER,
            &[("Inference-Header-Content-Length", value)],
            &body,
        )
    };
    let binary = vec![
        s(
            "binary header past the body",
            lie((VALID_JSON.len() + 100).to_string()),
        ),
        s("binary header 0", lie("0".into())),
        s("binary header -1", lie("-1".into())),
        s("binary header not a number", lie("x".into())),
        s("binary header 2^63", lie("9223372036854775808".into())),
        s(
            "binary header one short of the JSON",
            lie((VALID_JSON.len() - 1).to_string()),
        ),
        s(
            "binary header one past the JSON",
            lie((VALID_JSON.len() + 1).to_string()),
        ),
        s(
            "binary_data_size past the data",
            infer_at(INFER, &bin_json("100"), &VALID_BINARY),
        ),
        s(
            "binary_data_size short of the data",
            infer_at(INFER, &bin_json("4"), &VALID_BINARY),
        ),
        s(
            "binary_data_size u64 max",
            infer_at(INFER, &bin_json("18446744073709551615"), &VALID_BINARY),
        ),
        s(
            "binary_data_size -1",
            infer_at(INFER, &bin_json("-1"), &VALID_BINARY),
        ),
        s(
            "binary_data_size a string",
            infer_at(INFER, &bin_json("\"8\""), &VALID_BINARY),
        ),
        s(
            "binary data and data",
            infer_at(
                INFER,
                r#"{"inputs":[{"name":"t","shape":[8],"datatype":"UINT8","data":[1],"parameters":{"binary_data_size":8}}]}"#,
                &VALID_BINARY,
            ),
        ),
        s(
            "binary size disagrees with FP32 shape",
            infer_at(
                INFER,
                r#"{"inputs":[{"name":"t","shape":[8],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#,
                &VALID_BINARY,
            ),
        ),
        s(
            "two inputs claim the same bytes",
            infer_at(
                INFER,
                r#"{"inputs":[{"name":"a","shape":[8],"datatype":"UINT8","parameters":{"binary_data_size":8}},{"name":"b","shape":[8],"datatype":"UINT8","parameters":{"binary_data_size":8}}]}"#,
                &VALID_BINARY,
            ),
        ),
        s(
            "FP16 binary of odd length",
            infer_at(
                INFER,
                r#"{"inputs":[{"name":"h","shape":[1],"datatype":"FP16","parameters":{"binary_data_size":3}}]}"#,
                &[0, 0x3c, 1],
            ),
        ),
    ];
    let over = |len: String| request("POST", INFER, &[("Content-Length", len)], b"{\"inputs\":[");
    let oversized = vec![
        s("Content-Length 2^40", over((1u64 << 40).to_string())),
        s("Content-Length u64 max", over(u64::MAX.to_string())),
        s(
            "Content-Length just over the limit",
            over(((256u64 << 20) + (1 << 20) + 1).to_string()),
        ),
    ];
    let total = valid.len();
    let head_len = total - VALID_JSON.len() - VALID_BINARY.len();
    let truncated = [
        0,
        1,
        10,
        VALID_JSON.len() - 1,
        VALID_JSON.len(),
        VALID_JSON.len() + 4,
        VALID_JSON.len() + 7,
    ]
    .iter()
    .map(|&k| {
        (
            format!("body cut at byte {k}"),
            valid[..head_len + k].to_vec(),
        )
    })
    .collect();
    let chunked = |chunks: &[u8]| {
        request(
            "POST",
            INFER,
            &[("Transfer-Encoding", "chunked".into())],
            chunks,
        )
    };
    let chunk_lies = vec![
        s("chunk longer than sent", chunked(b"100\r\n{\"inputs\"")),
        s("chunk size not hex", chunked(b"zz\r\n{}\r\n0\r\n\r\n")),
        s(
            "chunk size over u64",
            chunked(b"fffffffffffffffffffffffff\r\n{}\r\n0\r\n\r\n"),
        ),
        s("no last chunk", chunked(b"2\r\n{}\r\n")),
        s(
            "chunk shorter than sent",
            chunked(b"2\r\n{\"inputs\":[]}\r\n0\r\n\r\n"),
        ),
        s("negative chunk size", chunked(b"-5\r\n{}\r\n0\r\n\r\n")),
        s(
            "NUL in a chunk extension",
            chunked(b"2;\x00\r\n{}\r\n0\r\n\r\n"),
        ),
        s("a chunk of 2^40 bytes", chunked(b"10000000000\r\n{}")),
        s(
            "garbage trailers",
            chunked(b"2\r\n{}\r\n0\r\nX: \x01\x02\r\nno colon\r\n\r\n"),
        ),
        s("10 000 one-byte chunks", {
            let mut b = Vec::new();
            for i in 0..10_000 {
                b.extend_from_slice(if i == 0 { b"1\r\n[\r\n" } else { b"1\r\n1\r\n" });
            }
            b.extend_from_slice(b"0\r\n\r\n");
            chunked(&b)
        }),
    ];
    let one = r#"{"inputs":[{"name":"t","shape":[1],"datatype":"UINT8","data":[1]}]}"#;
    let paths = [
        "/v2/models/nope/infer",
        "/v2/models/identity/versions/999/infer",
        "/v2/models/%00/infer",
        "/v2/models/../../etc/passwd/infer",
        "/v2/models/identity/versions/99999999999999999999/infer",
        "/v2/models//infer",
        "/v2/models/identity/infer/extra",
        "/v2/repository/models/identity/unload",
        "/v2/systemsharedmemory/region/x/unregister",
    ];
    let mut unknown: Vec<(String, Vec<u8>)> = paths
        .iter()
        .map(|p| (format!("POST {p}"), infer_at(p, one, &[])))
        .collect();
    unknown.push(s(
        "model name of 10 KB",
        infer_at(
            &format!("/v2/models/{}/infer", "m".repeat(10_000)),
            one,
            &[],
        ),
    ));
    unknown.push(s("GET on infer", request("GET", INFER, &[], b"")));
    unknown.push(s("DELETE /v2", request("DELETE", "/v2", &[], b"")));
    unknown.push(s(
        "register /dev/mem as a region",
        request(
            "POST",
            "/v2/systemsharedmemory/region/r/register",
            &[],
            br#"{"key":"/../../dev/mem","offset":0,"byte_size":1099511627776}"#,
        ),
    ));
    unknown.push(s(
        "register a region of 2^40 bytes",
        request(
            "POST",
            "/v2/systemsharedmemory/region/r/register",
            &[],
            br#"{"key":"/nope","offset":18446744073709551615,"byte_size":1099511627776}"#,
        ),
    ));
    let bytes = every_byte(&valid, 0);
    vec![
        raw_shots(noise),
        raw_shots(request_lines),
        raw_shots(headers),
        raw_shots(json),
        raw_shots(datatypes),
        raw_shots(shapes),
        raw_shots(binary),
        raw_shots(oversized),
        raw_shots(truncated),
        raw_shots(chunk_lies),
        raw_shots(unknown),
        raw_shots(bytes),
    ]
}

/// A random attack: the valid request with bytes changed or cut short,
/// noise, or a JSON tensor of random shape, datatype and data.
pub fn random_shot(rng: &mut fastrand::Rng) -> Shot {
    thread_local! {
        static VALID: Vec<u8> = valid_request();
    }
    match rng.u8(..4) {
        0 => VALID.with(|v| {
            Shot::raw(
                "valid request with random bytes changed",
                scrambled(rng, v, 0),
            )
        }),
        1 => VALID.with(|v| {
            Shot::raw(
                "valid request cut at random",
                v[..rng.usize(1..v.len())].to_vec(),
            )
        }),
        2 => Shot::raw("random bytes", random_bytes(rng, 2048)),
        _ => {
            const TYPES: [&str; 9] = [
                "UINT8", "INT32", "FP32", "FP64", "BOOL", "BYTES", "FP16", "INT64", "X",
            ];
            let dims: Vec<String> = (0..rng.usize(0..4))
                .map(|_| rng.i64(-2..6).to_string())
                .collect();
            let data: Vec<String> = (0..rng.usize(0..10))
                .map(|_| match rng.u8(..4) {
                    0 => rng.i32(-300..300).to_string(),
                    1 => format!("{}", rng.f32() * 1e6),
                    2 => "true".into(),
                    _ => "\"s\"".into(),
                })
                .collect();
            Shot::raw(
                "random JSON tensor",
                tensor_json(
                    &format!("[{}]", dims.join(",")),
                    TYPES[rng.usize(..TYPES.len())],
                    &format!("[{}]", data.join(",")),
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_valid_request_is_framed_by_its_content_length() {
        let v = valid_request();
        let text = String::from_utf8_lossy(&v);
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(head.contains(&format!(
            "Inference-Header-Content-Length: {}",
            VALID_JSON.len()
        )));
        assert!(serde_json::from_str::<serde_json::Value>(VALID_JSON).is_ok());
    }
}
