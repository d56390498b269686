//! The tonic client: blocking KServe v2 `ModelInfer` round trips.

use crate::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use crate::proto::model_infer_request::InferInputTensor;
use crate::proto::ModelInferRequest;
use crate::{dtype_from_kserve, kserve_datatype, parse_address, PeerError, MAX_MESSAGE_BYTES};
use bytes::Bytes;
use engine::TensorView;
use std::collections::HashMap;
use tonic::transport::{Channel, Endpoint as ChannelEndpoint, Uri};
use transport::Endpoint;
use wire::DType;

/// A connection to a KServe v2 gRPC server: a tonic [`Channel`] client and
/// the current-thread tokio runtime each call is `block_on`'d in.
pub struct Client {
    uri: String,
    runtime: tokio::runtime::Runtime,
    inner: GrpcInferenceServiceClient<Channel>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("uri", &self.uri).finish()
    }
}

/// A `ModelInfer` request built once by [`Client::prepare`] and sent as many
/// times as wanted by [`Client::call`]: its tensors are `Bytes`, so each send
/// clones a few pointers, not the payload.
#[derive(Clone)]
pub struct Request {
    inner: ModelInferRequest,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("model", &self.inner.model_name)
            .field("inputs", &self.inner.inputs.len())
            .field("input_bytes", &self.input_bytes())
            .finish()
    }
}

impl Request {
    /// The protocol message as it goes on the wire.
    pub fn proto(&self) -> &ModelInferRequest {
        &self.inner
    }

    /// Total bytes of tensor data the request carries.
    pub fn input_bytes(&self) -> u64 {
        self.inner
            .raw_input_contents
            .iter()
            .map(|b| b.len() as u64)
            .sum()
    }
}

impl From<ModelInferRequest> for Request {
    /// Wraps a hand-built message (any names, parameters, or a deliberately
    /// malformed one), sent as it is.
    fn from(inner: ModelInferRequest) -> Request {
        Request { inner }
    }
}

/// What a call brought back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Number of output tensors.
    pub outputs: usize,
    /// Total bytes of output tensor data.
    pub output_bytes: u64,
}

/// One output tensor of a response, as [`Client::call_outputs`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputTensor {
    /// The name the server gave it.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// The raw bytes, row-major.
    pub data: Bytes,
}

impl Client {
    /// Connects to a server at `uri` (`unix://PATH` or
    /// `tcp://HOST:PORT[?nodelay=0]`): the HTTP/2 connection is made here,
    /// so a server that is not there is an error now, not on the first call.
    pub fn connect(uri: &str) -> Result<Client, PeerError> {
        let ep = parse_address(uri)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(PeerError::Runtime)?;
        let connect_err = |e: tonic::transport::Error| PeerError::Connect {
            uri: uri.to_string(),
            reason: error_chain(&e),
        };
        let bad = |e: tonic::transport::Error| PeerError::BadAddress {
            uri: uri.to_string(),
            reason: error_chain(&e),
        };
        let channel = match ep {
            Endpoint::Tcp { addr, nodelay } => {
                let endpoint = ChannelEndpoint::from_shared(format!("http://{addr}"))
                    .map_err(bad)?
                    .tcp_nodelay(nodelay);
                runtime.block_on(endpoint.connect()).map_err(connect_err)?
            }
            Endpoint::Unix(path) => {
                // As tonic's uds example: the URI is a placeholder, the
                // connector dials the socket.
                let endpoint = ChannelEndpoint::from_static("http://[::]:50051");
                let connector = tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                });
                runtime
                    .block_on(endpoint.connect_with_connector(connector))
                    .map_err(connect_err)?
            }
            other => {
                return Err(PeerError::BadAddress {
                    uri: other.to_string(),
                    reason: "the grpc peer speaks unix:// and tcp:// only".into(),
                })
            }
        };
        let inner = GrpcInferenceServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Client {
            uri: uri.to_string(),
            runtime,
            inner,
        })
    }

    /// Builds a request for `model` with `inputs` in order (named `INPUT0`,
    /// `INPUT1`, ...; the server takes them by position). Each tensor is
    /// copied into a `Bytes` once, here.
    pub fn prepare(&self, model: &str, inputs: &[TensorView<'_>]) -> Request {
        let names: Vec<String> = (0..inputs.len()).map(|i| format!("INPUT{i}")).collect();
        self.prepare_named(model, &names, inputs)
    }

    /// [`prepare`](Client::prepare) with the inputs named `names` (in
    /// order), for servers that match inputs by name, as KServe servers
    /// with real models do. `names` must name every input (panics
    /// otherwise: a caller's bug, not input).
    pub fn prepare_named(
        &self,
        model: &str,
        names: &[String],
        inputs: &[TensorView<'_>],
    ) -> Request {
        assert_eq!(names.len(), inputs.len(), "one name per input");
        let tensors = inputs
            .iter()
            .zip(names)
            .map(|(t, name)| InferInputTensor {
                name: name.clone(),
                datatype: kserve_datatype(t.dtype).to_string(),
                shape: t
                    .shape
                    .iter()
                    .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
                    .collect(),
                parameters: HashMap::new(),
                contents: None,
            })
            .collect();
        Request {
            inner: ModelInferRequest {
                model_name: model.to_string(),
                model_version: String::new(),
                id: String::new(),
                parameters: HashMap::new(),
                inputs: tensors,
                outputs: Vec::new(),
                raw_input_contents: inputs
                    .iter()
                    .map(|t| Bytes::copy_from_slice(t.data))
                    .collect(),
            },
        }
    }

    /// One `ModelInfer` round trip with a clone of `req` (cheap: the tensors
    /// are shared `Bytes`). Returns how many outputs and bytes came back.
    pub fn call(&mut self, req: &Request) -> Result<Reply, PeerError> {
        let resp = self
            .runtime
            .block_on(self.inner.model_infer(req.inner.clone()))?
            .into_inner();
        if resp.raw_output_contents.len() != resp.outputs.len() {
            return Err(PeerError::BadReply(format!(
                "{} outputs but {} raw_output_contents",
                resp.outputs.len(),
                resp.raw_output_contents.len()
            )));
        }
        Ok(Reply {
            outputs: resp.outputs.len(),
            output_bytes: resp
                .raw_output_contents
                .iter()
                .map(|b| b.len() as u64)
                .sum(),
        })
    }

    /// Like [`call`](Client::call), but returns the output tensors
    /// themselves, checked: known datatypes, no negative dimensions, and
    /// contents of the size their shape says.
    pub fn call_outputs(&mut self, req: &Request) -> Result<Vec<OutputTensor>, PeerError> {
        let resp = self
            .runtime
            .block_on(self.inner.model_infer(req.inner.clone()))?
            .into_inner();
        if resp.raw_output_contents.len() != resp.outputs.len() {
            return Err(PeerError::BadReply(format!(
                "{} outputs but {} raw_output_contents",
                resp.outputs.len(),
                resp.raw_output_contents.len()
            )));
        }
        resp.outputs
            .into_iter()
            .zip(resp.raw_output_contents)
            .map(|(t, data)| {
                let bad = |why: String| PeerError::BadReply(format!("output '{}': {why}", t.name));
                let dtype = dtype_from_kserve(&t.datatype)
                    .ok_or_else(|| bad(format!("unknown datatype '{}'", t.datatype)))?;
                let shape = t
                    .shape
                    .iter()
                    .map(|&d| u64::try_from(d))
                    .collect::<Result<Vec<u64>, _>>()
                    .map_err(|_| bad(format!("negative dimension in {:?}", t.shape)))?;
                let expected = shape
                    .iter()
                    .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d));
                if expected != Some(data.len() as u64) {
                    return Err(bad(format!(
                        "{}{:?} does not match {} bytes of contents",
                        t.datatype,
                        t.shape,
                        data.len()
                    )));
                }
                Ok(OutputTensor {
                    name: t.name,
                    dtype,
                    shape,
                    data,
                })
            })
            .collect()
    }

    /// The URI this client connected to.
    pub fn uri(&self) -> &str {
        &self.uri
    }
}

/// An error and its sources, `: `-separated (tonic's transport errors say
/// little at the top level).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}
