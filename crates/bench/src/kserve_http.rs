//! A blocking KServe v2 HTTP/REST client for the bench: one HTTP/1.1
//! keep-alive connection (hyper's connection-level client on a
//! current-thread tokio runtime, as [`peer_grpc::Client`] is for gRPC) that
//! sends one prepared `POST /v2/models/NAME/infer` over and over.
//!
//! Requests use the binary tensor data extension both ways (what
//! `tritonclient.http` does with `binary_data=True`): a JSON header of
//! `Inference-Header-Content-Length` bytes followed by the raw tensors, and
//! `binary_data_output` so the answer carries raw bytes, not JSON numbers.

use crate::caller::BenchError;
use crate::workload::Input;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;

/// The binary tensor data extension's header: how many leading body bytes
/// are the JSON part.
const HEADER_LEN: &str = "Inference-Header-Content-Length";

/// A connection to a KServe v2 HTTP server and the request it sends.
pub struct HttpClient {
    runtime: tokio::runtime::Runtime,
    sender: SendRequest<Full<Bytes>>,
    host: String,
    path: String,
    json_len: usize,
    body: Bytes,
    /// Output bytes the answer must carry after its JSON header (the
    /// request's own for identity; `None`: any).
    expect_output_bytes: Option<u64>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("host", &self.host)
            .field("path", &self.path)
            .finish()
    }
}

/// The JSON header and body of an infer request carrying `inputs` named
/// `names` as binary data, asking for every output as binary data.
fn infer_body(names: &[String], inputs: &[Input]) -> (usize, Bytes) {
    let tensors: Vec<serde_json::Value> = names
        .iter()
        .zip(inputs)
        .map(|(name, (d, shape, data))| {
            serde_json::json!({
                "name": name,
                "datatype": peer_grpc::kserve_datatype(*d),
                "shape": shape,
                "parameters": { "binary_data_size": data.len() },
            })
        })
        .collect();
    let json = serde_json::json!({
        "inputs": tensors,
        "parameters": { "binary_data_output": true },
    })
    .to_string();
    let mut body = Vec::with_capacity(json.len() + crate::workload::tensor_bytes(inputs) as usize);
    body.extend_from_slice(json.as_bytes());
    for (_, _, data) in inputs {
        body.extend_from_slice(data);
    }
    (json.len(), Bytes::from(body))
}

impl HttpClient {
    /// Connects to `uri` (`http://HOST:PORT`) and prepares a request for
    /// `model` with `inputs` named `names`. `expect_output_bytes`: what the
    /// answer's binary part must hold (checked on every call).
    pub fn connect(
        uri: &str,
        model: &str,
        names: &[String],
        inputs: &[Input],
        expect_output_bytes: Option<u64>,
    ) -> Result<HttpClient, BenchError> {
        let err =
            |what: &str, e: &dyn std::fmt::Display| BenchError::new(format!("{uri}: {what}: {e}"));
        let host = uri
            .strip_prefix("http://")
            .map(|h| h.trim_end_matches('/'))
            .filter(|h| !h.is_empty() && !h.contains('/'))
            .ok_or_else(|| BenchError::new(format!("{uri}: not an http://HOST:PORT address")))?
            .to_string();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err("tokio runtime", &e))?;
        let stream = runtime
            .block_on(tokio::net::TcpStream::connect(&host))
            .map_err(|e| err("connect", &e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| err("TCP_NODELAY", &e))?;
        let (sender, conn) = runtime
            .block_on(hyper::client::conn::http1::handshake(TokioIo::new(stream)))
            .map_err(|e| err("HTTP/1.1 handshake", &e))?;
        // The connection task runs whenever a call blocks on the runtime.
        // Its own error is not kept: a call on a connection that ended
        // fails with hyper's "connection closed", and the client does not
        // reconnect (the agent keeps connections open; a bench row that
        // loses one fails, as it should).
        runtime.spawn(conn);
        let (json_len, body) = infer_body(names, inputs);
        Ok(HttpClient {
            runtime,
            sender,
            path: format!("/v2/models/{model}/infer"),
            host,
            json_len,
            body,
            expect_output_bytes,
        })
    }

    /// One round trip: sends the request, reads the whole answer, checks
    /// its status and the size of its binary part.
    pub fn call(&mut self) -> Result<(), BenchError> {
        let req = hyper::Request::post(self.path.as_str())
            .header(HOST, self.host.as_str())
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, self.body.len())
            .header(HEADER_LEN, self.json_len)
            .body(Full::new(self.body.clone()))
            .map_err(|e| BenchError::new(format!("building the request: {e}")))?;
        let sender = &mut self.sender;
        let (status, header_len, body) = self.runtime.block_on(async {
            sender
                .ready()
                .await
                .map_err(|e| BenchError::new(format!("http connection: {e}")))?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| BenchError::new(format!("http request: {e}")))?;
            let status = resp.status();
            let header_len = resp
                .headers()
                .get(HEADER_LEN)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.parse::<usize>().ok());
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::new(format!("http response body: {e}")))?
                .to_bytes();
            Ok::<_, BenchError>((status, header_len, body))
        })?;
        if !status.is_success() {
            return Err(BenchError::new(format!(
                "http {status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let json_len = header_len.unwrap_or(body.len()).min(body.len());
        let binary = (body.len() - json_len) as u64;
        match self.expect_output_bytes {
            Some(want) if want != binary => Err(BenchError::new(format!(
                "http answer carries {binary} output bytes, expected {want}"
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_the_json_header_then_the_tensors() {
        let inputs: Vec<Input> = vec![(
            wire::DType::F32,
            vec![1, 2],
            wire::AlignedBuf::copy_from(&[1, 2, 3, 4, 5, 6, 7, 8]).expect("buf"),
        )];
        let (n, body) = infer_body(&["x".to_string()], &inputs);
        let head: serde_json::Value = serde_json::from_slice(&body[..n]).expect("json");
        assert_eq!(head["inputs"][0]["datatype"], "FP32");
        assert_eq!(head["inputs"][0]["shape"], serde_json::json!([1, 2]));
        assert_eq!(head["inputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(head["parameters"]["binary_data_output"], true);
        assert_eq!(&body[n..], &[1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
