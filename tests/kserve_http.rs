//! The KServe v2 HTTP/REST front door of a real `tensorwire serve` process
//! (`--listen http://127.0.0.1:0`), driven by hand-written HTTP/1.1 over a
//! std `TcpStream`: health and metadata, digits inference against the
//! Python reference as JSON and as binary tensor data, identity round trips
//! of several dtypes, and each bad request answered with the right status
//! and a KServe error body while the agent keeps serving.

use common::{digits_expected, digits_input, digits_model, ServeProcess};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The largest request payload the agent under test takes.
const MAX_PAYLOAD: usize = 64 << 10;

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        let end = self
            .header("inference-header-content-length")
            .map_or(self.body.len(), |n| n.parse().expect("header length"));
        serde_json::from_slice(&self.body[..end]).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&self.body));
        })
    }

    fn binary(&self) -> &[u8] {
        let n: usize = self
            .header("inference-header-content-length")
            .expect("binary reply")
            .parse()
            .expect("number");
        &self.body[n..]
    }
}

/// One request on its own connection (`Connection: close`).
fn request(addr: &str, method: &str, path: &str, extra: &[(&str, String)], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if !extra
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        head += &format!("Content-Length: {}\r\n", body.len());
    }
    for (n, v) in extra {
        head += &format!("{n}: {v}\r\n");
    }
    head += "\r\n";
    s.write_all(head.as_bytes()).expect("write head");
    // The server may answer (413) without reading the body.
    let _ = s.write_all(body);
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&all)));
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = all[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).expect("hex").trim(), 16)
            .expect("chunk size");
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 4 + n..];
    }
}

fn get(addr: &str, path: &str) -> Reply {
    request(addr, "GET", path, &[], b"")
}

fn post_json(addr: &str, path: &str, v: &Value) -> Reply {
    request(addr, "POST", path, &[], v.to_string().as_bytes())
}

fn post_binary(addr: &str, path: &str, v: &Value, binary: &[u8]) -> Reply {
    let text = v.to_string();
    let mut body = text.clone().into_bytes();
    body.extend_from_slice(binary);
    request(
        addr,
        "POST",
        path,
        &[("Inference-Header-Content-Length", text.len().to_string())],
        &body,
    )
}

fn refused(r: &Reply, status: u16, needle: &str) {
    let v = r.json();
    let msg = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {v}"));
    assert_eq!(r.status, status, "{msg}");
    assert!(msg.contains(needle), "'{needle}' not in: {msg}");
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn assert_logits(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn kserve_http_front_door() {
    let model = format!("digits={}", digits_model().display());
    let max_payload = MAX_PAYLOAD.to_string();
    let mut agent = ServeProcess::spawn(&[
        "--listen",
        "http://127.0.0.1:0",
        "--model",
        &model,
        "--max-payload",
        &max_payload,
    ]);
    let uri = agent.uris[1].clone();
    assert!(
        uri.starts_with("http://127.0.0.1:") && !uri.ends_with(":0"),
        "{uri}"
    );
    let addr = uri.trim_start_matches("http://").to_string();
    let a = addr.as_str();

    // Health and metadata.
    assert_eq!(get(a, "/v2/health/live").status, 200);
    assert_eq!(get(a, "/v2/health/ready").status, 200);
    let meta = get(a, "/v2");
    assert_eq!(meta.status, 200);
    assert_eq!(meta.json()["name"], "tensorwire");
    for path in ["/v2/models/digits", "/v2/models/digits/versions/1"] {
        let m = get(a, path);
        assert_eq!(m.status, 200);
        assert_eq!(
            m.json(),
            json!({
                "name": "digits", "versions": ["1"], "platform": "onnxruntime_onnx",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}],
                "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
            })
        );
    }
    assert_eq!(get(a, "/v2/models/digits/ready").status, 200);
    assert_eq!(get(a, "/v2/models/identity/versions/1/ready").status, 200);
    refused(&get(a, "/v2/models/nope"), 404, "unknown model 'nope'");
    refused(
        &get(a, "/v2/models/digits/versions/2"),
        404,
        "no version '2'",
    );
    assert_eq!(get(a, "/v2/models/nope/ready").status, 404);

    // Digits as JSON: flat data, and nested lists.
    let input = digits_input();
    let want = digits_expected();
    let xs = f32s(&input);
    let nested: Vec<Vec<f32>> = xs.chunks(64).map(<[f32]>::to_vec).collect();
    for data in [json!(xs), json!(nested)] {
        let r = post_json(
            a,
            "/v2/models/digits/infer",
            &json!({"id": "q1", "inputs": [{"name": "x", "shape": [4, 64], "datatype": "FP32", "data": data}]}),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["id"], "q1");
        assert_eq!(v["outputs"][0]["name"], "logits");
        assert_eq!(v["outputs"][0]["shape"], json!([4, 10]));
        let got: Vec<f32> = v["outputs"][0]["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect();
        assert_logits(&got, &want);
    }

    // Digits as binary tensor data, binary output asked per output and for
    // the whole request.
    for outputs in [
        json!({"outputs": [{"name": "logits", "parameters": {"binary_data": true}}]}),
        json!({"parameters": {"binary_data_output": true}}),
    ] {
        let mut req = json!({"inputs": [{"name": "x", "shape": [4, 64], "datatype": "FP32",
                             "parameters": {"binary_data_size": input.len()}}]});
        for (k, v) in outputs.as_object().expect("object") {
            req[k] = v.clone();
        }
        let r = post_binary(a, "/v2/models/digits/versions/1/infer", &req, &input);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["outputs"][0]["parameters"]["binary_data_size"], 160);
        assert_logits(&f32s(r.binary()), &want);
    }

    // Identity round trips: JSON in and out, and binary in and out.
    let cases: [(&str, Value, Vec<u8>); 6] = [
        ("BOOL", json!([true, false, true]), vec![1, 0, 1]),
        ("INT8", json!([-1, 0, 127]), vec![0xff, 0, 127]),
        ("UINT16", json!([1, 2, 65535]), vec![1, 0, 2, 0, 0xff, 0xff]),
        (
            "INT64",
            json!([-2, 0, 5]),
            [-2i64, 0, 5].iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        (
            "FP32",
            json!([0.5, -1.25, 3.0]),
            [0.5f32, -1.25, 3.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        ),
        (
            "FP64",
            json!([0.1, -2.5, 1e300]),
            [0.1f64, -2.5, 1e300]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        ),
    ];
    for (dt, data, bytes) in &cases {
        let r = post_json(
            a,
            "/v2/models/identity/infer",
            &json!({"inputs": [{"name": "t", "shape": [3], "datatype": dt, "data": data}]}),
        );
        assert_eq!(r.status, 200, "{dt}: {}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["outputs"][0]["datatype"], *dt);
        assert_eq!(v["outputs"][0]["data"], *data, "{dt}");
        let r = post_binary(
            a,
            "/v2/models/identity/infer",
            &json!({"inputs": [{"name": "t", "shape": [3], "datatype": dt,
                    "parameters": {"binary_data_size": bytes.len()}}],
                    "parameters": {"binary_data_output": true}}),
            bytes,
        );
        assert_eq!(r.status, 200, "{dt}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.binary(), bytes.as_slice(), "{dt}");
    }
    // FP16 only as binary data.
    let r = post_binary(
        a,
        "/v2/models/identity/infer",
        &json!({"inputs": [{"name": "h", "shape": [2], "datatype": "FP16",
                "parameters": {"binary_data_size": 4}}],
                "outputs": [{"name": "h", "parameters": {"binary_data": true}}]}),
        &[0x00, 0x3c, 0x00, 0xc0],
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.binary(), &[0x00, 0x3c, 0x00, 0xc0]);

    // Bad requests, each refused with its status; the agent keeps serving.
    let infer = "/v2/models/digits/infer";
    let x = |shape: Value, dt: &str, data: Value| json!({"inputs": [{"name": "x", "shape": shape, "datatype": dt, "data": data}]});
    refused(
        &request(a, "POST", infer, &[], b"{\"inputs\": ["),
        400,
        "not valid JSON",
    );
    refused(&post_json(a, infer, &json!([1, 2])), 400, "JSON object");
    refused(
        &post_json(a, infer, &x(json!([1, 64]), "FLOAT", json!([0.0]))),
        400,
        "unknown datatype 'FLOAT'",
    );
    refused(
        &post_json(a, infer, &x(json!([1, 64]), "FP32", json!([0.0, 1.0]))),
        400,
        "has 2 values",
    );
    refused(
        &post_json(a, infer, &x(json!([1, 2]), "FP32", json!([0.0, 1.0]))),
        400,
        "'x'",
    );
    refused(
        &post_json(a, infer, &x(json!([1, 64]), "FP16", json!(vec![0.0; 64]))),
        400,
        "binary data",
    );
    refused(
        &post_json(a, infer, &x(json!([-1, 64]), "FP32", json!([]))),
        400,
        "negative dimension",
    );
    refused(
        &post_json(a, infer, &x(json!([1]), "INT8", json!(["a"]))),
        400,
        "does not fit INT8",
    );
    let bin = |n: usize| {
        json!({"inputs": [{"name": "x", "shape": [4, 64], "datatype": "FP32",
                                 "parameters": {"binary_data_size": n}}]})
    };
    refused(
        &post_binary(a, infer, &bin(input.len() + 4), &input),
        400,
        "more than",
    );
    refused(
        &post_binary(a, infer, &bin(input.len() - 4), &input),
        400,
        "claimed by no input",
    );
    refused(
        &post_binary(a, infer, &bin(input.len() - 4), &input[4..]),
        400,
        "needs 1024 bytes",
    );
    refused(
        &request(
            a,
            "POST",
            infer,
            &[("Inference-Header-Content-Length", "99999".into())],
            b"{}",
        ),
        400,
        "Inference-Header-Content-Length",
    );
    refused(
        &post_json(
            a,
            "/v2/models/nope/infer",
            &x(json!([1]), "FP32", json!([0.0])),
        ),
        404,
        "unknown model",
    );
    refused(
        &post_json(a, "/v2/models/digits/versions/7/infer", &json!({})),
        404,
        "no version '7'",
    );
    let big = (MAX_PAYLOAD + (1 << 20) + 1).to_string();
    refused(
        &request(a, "POST", infer, &[("Content-Length", big)], b"{}"),
        413,
        "over the limit",
    );
    let over = MAX_PAYLOAD / 4 + 1;
    refused(
        &post_binary(
            a,
            "/v2/models/identity/infer",
            &json!({"inputs": [{"name": "t", "shape": [over], "datatype": "FP32",
                    "parameters": {"binary_data_size": over * 4}}]}),
            &vec![0u8; over * 4],
        ),
        413,
        "max_payload",
    );
    assert_eq!(get(a, "/v2/nothing").status, 404);

    // Still serving.
    let r = post_binary(a, infer, &bin(input.len()), &input);
    assert_eq!(r.status, 200);
    assert_logits(
        &r.json()["outputs"][0]["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect::<Vec<_>>(),
        &want,
    );
    assert!(agent.running(), "{}", agent.stderr());
    agent.signal(libc::SIGTERM);
    let st = agent.wait_exit(Duration::from_secs(20));
    assert!(st.success(), "{}", agent.stderr());
}
