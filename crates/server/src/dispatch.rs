//! [`AgentCore`]: what the agent does with one message, whatever transport
//! brought it. Socket sessions and in-process callers both go through here,
//! so validation, errors and timelines are identical on every transport.
//!
//! A request is handled in two steps so that nothing is read or allocated
//! for a request that will be refused: [`AgentCore::prepare`] checks the
//! descriptors against the limits and the model's signature (the payload is
//! still unread), then [`AgentCore::execute`] runs the model on views over
//! the payload wherever it landed.
//!
//! `execute` is made of parts a transport with its own output placement
//! (shared memory) uses directly, so the checks stay shared:
//! [`AgentCore::prepare_in`] (descriptors placed in a region rather than a
//! payload), [`AgentCore::run`] / [`AgentCore::run_into`] (the model through
//! its queue, errors mapped to replies), [`AgentCore::check_outputs`] (what
//! the engine produced matches its dtypes and shapes) and
//! [`AgentCore::respond`] (the Response header and descriptor section for
//! tensors placed wherever the transport put them, timeline stamped, checked
//! against the session's limits).

use crate::registry::{ModelEntry, ModelRegistry};
use engine::{Output, OutputData, TensorView};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use wire::BufPool;
use wire::{
    decode_hello, decode_model_name, decode_tensor_section_in, encode_error_body, encode_hello,
    encode_model_list, encode_signature, encode_tensor_section, flags, layout_payload, Header,
    Kind, Limits, Placement, Stage, Status, TensorDesc, Timeline, TIMELINE_LEN,
};

/// Bytes of large payload buffers the agent keeps for reuse.
const POOL_BYTES: usize = 512 << 20;
/// Most large payload buffers the agent keeps for reuse.
const POOL_BUFS: usize = 32;

/// A message to send back: header, descriptor section (or control body),
/// and, for responses, the outputs whose bytes form the payload.
#[derive(Debug)]
pub struct Reply {
    /// The reply header (desc_len, tensor_count, payload_len filled in).
    pub header: Header,
    /// The descriptor section or control body.
    pub desc: Vec<u8>,
    /// Output tensors in payload order (empty for control replies).
    pub outputs: Vec<Output>,
}

impl Reply {
    /// A control reply of `kind` with `body`.
    pub fn control(kind: Kind, request_id: u64, model_id: u32, body: Vec<u8>) -> Reply {
        let mut header = Header::new(kind);
        header.request_id = request_id;
        header.model_id = model_id;
        header.desc_len = body.len() as u32;
        Reply {
            header,
            desc: body,
            outputs: Vec::new(),
        }
    }

    /// An Error reply.
    pub fn error(request_id: u64, status: Status, message: &str) -> Reply {
        let mut r = Reply::control(Kind::Error, request_id, 0, encode_error_body(message));
        r.header.status = status;
        r
    }

    /// The payload slices of this reply, resolving outputs that alias inputs.
    pub fn payload<'a>(&'a self, inputs: &[TensorView<'a>]) -> Vec<&'a [u8]> {
        self.outputs.iter().map(|o| o.bytes(inputs)).collect()
    }
}

/// A request that passed every check that does not need its payload.
#[derive(Debug)]
pub struct Prepared<'a> {
    /// The model it is for (held: a model unloaded meanwhile finishes
    /// this request).
    pub model: Arc<ModelEntry>,
    /// Its tensors, validated.
    pub tensors: Vec<TensorDesc>,
    /// Its id.
    pub request_id: u64,
    /// Whether the client asked for the timeline.
    pub want_timeline: bool,
    /// The session's limits (the response must fit them too).
    pub limits: Limits,
    _in_flight: InFlight<'a>,
}

impl<'a> Prepared<'a> {
    /// Views over a contiguous payload laid out as the descriptors say
    /// (bounds were checked against `payload_len` in `prepare`).
    pub fn views<'p>(&'p self, payload: &'p [u8]) -> Vec<TensorView<'p>> {
        self.tensors
            .iter()
            .map(|d| {
                let start = d.offset as usize;
                let end = start + d.len as usize;
                TensorView::new(d.dtype, &d.shape, payload.get(start..end).unwrap_or(&[]))
            })
            .collect()
    }
}

/// Counts a request as in flight, and holds its share of the payload
/// budget, until dropped (after its reply is sent).
#[derive(Debug)]
struct InFlight<'a>(&'a AgentCore, u64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.1 > 0 {
            self.0.payload_budget.fetch_add(self.1, Ordering::AcqRel);
        }
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1
            && self.0.closing.load(Ordering::Acquire)
        {
            let _g = self.0.drain_lock.lock();
            self.0.drain_cv.notify_all();
        }
    }
}

/// Agent-wide counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests that got a response.
    pub responses: AtomicU64,
    /// Messages answered with an Error.
    pub errors: AtomicU64,
    /// Output bytes the agent copied into shared-memory arenas (owned
    /// engine outputs moved into a session's output region), and into the
    /// regions of the KServe front doors' system shared-memory extension.
    pub shm_output_bytes_copied: AtomicU64,
    /// Output bytes engines were asked to write straight into arenas
    /// ([`engine::Backend::run_into`] over the output region: no copy by
    /// tensorwire; an engine that cannot write in place may still copy
    /// internally, e.g. ONNX Runtime falling back from a wrong output plan).
    /// The KServe front doors count outputs written this way into their
    /// system shared-memory regions here too.
    pub shm_output_bytes_in_place: AtomicU64,
    /// Output bytes answered by pointing at the input they alias (identity):
    /// neither written nor copied.
    pub shm_output_bytes_aliased: AtomicU64,
}

/// The agent's shared state: models, limits, shutdown flag, counters.
#[derive(Debug)]
pub struct AgentCore {
    /// Every model.
    pub registry: ModelRegistry,
    /// The most any session may use.
    pub limits: Limits,
    /// Counters.
    pub counters: Counters,
    /// Recycled payload buffers (request payloads, in-process outputs).
    pub pool: Arc<BufPool>,
    closing: AtomicBool,
    in_flight: AtomicUsize,
    /// Payload bytes that requests in flight may still hold, agent-wide.
    payload_budget: AtomicU64,
    drain_lock: Mutex<()>,
    drain_cv: Condvar,
}

impl AgentCore {
    /// A core serving `registry` under `limits`, with at most
    /// `payload_budget` payload bytes held by requests in flight at once.
    pub fn new(registry: ModelRegistry, limits: Limits, payload_budget: u64) -> AgentCore {
        AgentCore {
            registry,
            limits,
            counters: Counters::default(),
            pool: BufPool::new(POOL_BYTES, POOL_BUFS),
            closing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            payload_budget: AtomicU64::new(payload_budget),
            drain_lock: Mutex::new(()),
            drain_cv: Condvar::new(),
        }
    }

    /// True once shutdown began: new requests are refused.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Refuses new requests from now on, then waits up to `grace` (at most
    /// 100 years, so the deadline cannot overflow the clock) for those in
    /// flight to finish. Returns how many were still running at the end.
    pub fn close_and_drain(&self, grace: Duration) -> usize {
        self.closing.store(true, Ordering::Release);
        let deadline = Instant::now() + grace.min(Duration::from_secs(100 * 365 * 24 * 3600));
        let mut g = self.drain_lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let n = self.in_flight.load(Ordering::Acquire);
            let now = Instant::now();
            if n == 0 || now >= deadline {
                return n;
            }
            g = self
                .drain_cv
                .wait_timeout(g, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Requests currently between `prepare` and their reply.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Answers a Hello: the limits in force for the session and the HelloAck.
    pub fn hello(&self, h: &Header, body: &[u8]) -> Result<(Limits, Reply), Reply> {
        if h.kind != Kind::Hello {
            return Err(self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                &format!(
                    "the first message of a session must be Hello, not {:?}",
                    h.kind
                ),
            )));
        }
        let asked = decode_hello(body)
            .map_err(|e| self.fail(Reply::error(h.request_id, e.status(), &e.to_string())))?;
        let limits = self.limits.narrowed_by(&asked);
        Ok((
            limits,
            Reply::control(Kind::HelloAck, h.request_id, 0, encode_hello(&limits)),
        ))
    }

    /// Answers a control message (anything but Hello and Request) on a
    /// session with `limits`.
    pub fn control(&self, h: &Header, body: &[u8], limits: &Limits) -> Reply {
        if matches!(h.kind, Kind::Ping | Kind::ListModels) && !body.is_empty() {
            return self.fail(Reply::error(
                h.request_id,
                Status::Malformed,
                &format!("{:?} carries no body, got {} bytes", h.kind, body.len()),
            ));
        }
        match h.kind {
            Kind::Ping => Reply::control(Kind::Pong, h.request_id, 0, Vec::new()),
            Kind::ModelQuery => match decode_model_name(body) {
                Err(e) => self.fail(Reply::error(h.request_id, e.status(), &e.to_string())),
                Ok(name) => match self.registry.find(name) {
                    None => self.fail(Reply::error(
                        h.request_id,
                        Status::UnknownModel,
                        &format!("no model named '{name}' (see `tensorwire models`)"),
                    )),
                    Some(m) => {
                        let mut b = Vec::new();
                        encode_signature(m.signature(), &mut b);
                        Reply::control(Kind::ModelInfo, h.request_id, m.id, b)
                    }
                },
            },
            Kind::ListModels => {
                let list: Vec<_> = self
                    .registry
                    .models()
                    .iter()
                    .map(|m| (m.id, m.signature().clone()))
                    .collect();
                let body = encode_model_list(&list);
                if body.len() > limits.max_desc_len as usize {
                    return self.fail(Reply::error(
                        h.request_id,
                        Status::LimitExceeded,
                        &format!(
                            "the model list is {} bytes, over the session's max_desc_len {}",
                            body.len(),
                            limits.max_desc_len
                        ),
                    ));
                }
                Reply::control(Kind::ModelList, h.request_id, 0, body)
            }
            Kind::Hello => self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                "Hello was already exchanged on this session",
            )),
            Kind::Release => self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                "Release only applies to shared-memory sessions",
            )),
            other => self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                &format!("{other:?} is not a message a client sends"),
            )),
        }
    }

    /// Checks a request before its payload is read: shutdown, model id,
    /// descriptors, and the tensors against the model's signature.
    pub fn prepare(&self, h: &Header, desc: &[u8], limits: &Limits) -> Result<Prepared<'_>, Reply> {
        self.prepare_in(h, desc, limits, Placement::Payload)
    }

    /// [`prepare`](AgentCore::prepare) for tensors placed as `placement`
    /// says. With [`Placement::Region`] (shared memory) the tensors already
    /// lie in the client's region and the agent allocates nothing for them,
    /// so they take nothing from the agent-wide payload budget (which
    /// bounds memory the agent allocates for payloads; a session's region
    /// is bounded by its own size).
    pub fn prepare_in(
        &self,
        h: &Header,
        desc: &[u8],
        limits: &Limits,
        placement: Placement,
    ) -> Result<Prepared<'_>, Reply> {
        let id = h.request_id;
        if self.is_closing() {
            return Err(self.fail(Reply::error(
                id,
                Status::ShuttingDown,
                "the agent is shutting down and accepts no new requests",
            )));
        }
        let model = self.registry.get(h.model_id).ok_or_else(|| {
            self.fail(Reply::error(
                id,
                Status::UnknownModel,
                &format!(
                    "no model has id {} (resolve names with ModelQuery; a model that was \
                     unloaded or reloaded answers its old id no more)",
                    h.model_id
                ),
            ))
        })?;
        let section = decode_tensor_section_in(h, desc, placement)
            .map_err(|e| self.fail(Reply::error(id, e.status(), &e.to_string())))?;
        let metas: Vec<(wire::DType, &[u64])> = section
            .tensors
            .iter()
            .map(|t| (t.dtype, t.shape.as_slice()))
            .collect();
        model
            .backend
            .check_inputs(&metas)
            .map_err(|e| self.fail(Reply::error(id, Status::InvalidInput, &e.to_string())))?;
        // Reserve the payload's bytes before any are read: memory held by
        // requests is bounded agent-wide, not only per connection.
        let want = match placement {
            Placement::Payload => h.payload_len,
            Placement::Region { .. } => 0,
        };
        // (Nothing to reserve over shared memory: skip the atomic.)
        let reserved = if want == 0 {
            Ok(0)
        } else {
            self.payload_budget
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                    left.checked_sub(want)
                })
        };
        if reserved.is_err() {
            return Err(self.fail(Reply::error(
                id,
                Status::LimitExceeded,
                &format!(
                    "the agent is holding its maximum of request payload bytes in flight; \
                     a {want}-byte request cannot be taken now (retry later)"
                ),
            )));
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Prepared {
            model,
            tensors: section.tensors,
            request_id: id,
            want_timeline: h.flags & flags::WANT_TIMELINE != 0,
            limits: *limits,
            _in_flight: InFlight(self, want),
        })
    }

    /// Runs a prepared request on `inputs` through its model's queue and
    /// builds the response (or the error), with the outputs laid out as a
    /// payload (stream transports; in-process).
    pub fn execute(&self, p: &Prepared<'_>, inputs: &[TensorView<'_>], tl: &mut Timeline) -> Reply {
        let outputs = match self.run(p, inputs, tl) {
            Ok(o) => o,
            Err(e) => return e,
        };
        let lens = match self.check_outputs(p, &outputs, inputs) {
            Ok(l) => l,
            Err(e) => return e,
        };
        let Some((offsets, payload_len)) = layout_payload(lens.iter().copied()) else {
            return self.fail(Reply::error(
                p.request_id,
                Status::Internal,
                "output layout overflows",
            ));
        };
        let descs: Vec<TensorDesc> = outputs
            .iter()
            .zip(offsets)
            .zip(&lens)
            .map(|((o, offset), &len)| TensorDesc {
                dtype: o.dtype,
                shape: o.shape.clone(),
                offset,
                len,
            })
            .collect();
        match self.respond(p, &descs, payload_len, tl) {
            Ok(mut r) => {
                r.outputs = outputs;
                r
            }
            Err(e) => e,
        }
    }

    /// Runs the model on `inputs` through its queue (stamping the queue and
    /// compute stages). Engine errors and panics become Error replies.
    pub fn run(
        &self,
        p: &Prepared<'_>,
        inputs: &[TensorView<'_>],
        tl: &mut Timeline,
    ) -> Result<Vec<Output>, Reply> {
        let backend = &p.model.backend;
        let result = p.model.queue.run(tl, || {
            std::panic::catch_unwind(AssertUnwindSafe(|| backend.run(inputs)))
        });
        self.engine_result(p, result)
    }

    /// Like [`run`](AgentCore::run), with the engine writing output `i`
    /// into `outputs[i]` ([`engine::Backend::run_into`]; sizes from
    /// [`engine::Backend::output_shapes`]).
    pub fn run_into(
        &self,
        p: &Prepared<'_>,
        inputs: &[TensorView<'_>],
        outputs: &mut [&mut [u8]],
        tl: &mut Timeline,
    ) -> Result<(), Reply> {
        let backend = &p.model.backend;
        let result = p.model.queue.run(tl, || {
            std::panic::catch_unwind(AssertUnwindSafe(|| backend.run_into(inputs, outputs)))
        });
        self.engine_result(p, result)
    }

    fn engine_result<T>(
        &self,
        p: &Prepared<'_>,
        result: std::thread::Result<Result<T, engine::EngineError>>,
    ) -> Result<T, Reply> {
        match result {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(e)) => {
                let status = match e {
                    engine::EngineError::InvalidInput(_) => Status::InvalidInput,
                    _ => Status::EngineError,
                };
                Err(self.fail(Reply::error(p.request_id, status, &e.to_string())))
            }
            Err(_) => Err(self.fail(Reply::error(
                p.request_id,
                Status::Internal,
                &format!("model '{}' panicked", p.model.signature().name),
            ))),
        }
    }

    /// Checks what the engine produced: every output's bytes match its dtype
    /// and shape, and aliases name an input that exists. Returns each
    /// output's byte length.
    pub fn check_outputs(
        &self,
        p: &Prepared<'_>,
        outputs: &[Output],
        inputs: &[TensorView<'_>],
    ) -> Result<Vec<u64>, Reply> {
        let internal = |m: String| self.fail(Reply::error(p.request_id, Status::Internal, &m));
        let mut lens = Vec::with_capacity(outputs.len());
        for (i, o) in outputs.iter().enumerate() {
            let have = o.bytes(inputs).len() as u64;
            if let OutputData::Input(n) = o.data {
                if n >= inputs.len() {
                    return Err(internal(format!("output {i} aliases missing input {n}")));
                }
            }
            let want = TensorDesc::byte_len(o.dtype, &o.shape);
            if want != Some(have) {
                return Err(internal(format!(
                    "engine produced output {i} of {have} bytes for {}{:?}",
                    o.dtype, o.shape
                )));
            }
            lens.push(have);
        }
        Ok(lens)
    }

    /// The Response for `p` describing `descs` (placed by the caller: a
    /// payload layout, or offsets into a shared region) with `payload_len`
    /// bytes of tensors: stamps `ResponseSent` and attaches the timeline if
    /// asked, checks the session's limits, counts the response. The reply
    /// carries no outputs; a caller sending a payload attaches them.
    pub fn respond(
        &self,
        p: &Prepared<'_>,
        descs: &[TensorDesc],
        payload_len: u64,
        tl: &mut Timeline,
    ) -> Result<Reply, Reply> {
        let mut header = Header::new(Kind::Response);
        header.request_id = p.request_id;
        header.model_id = p.model.id;
        header.tensor_count = descs.len() as u32;
        header.payload_len = payload_len;
        // Sized exactly: a response with no tensors and no timeline (an
        // empty RPC) allocates nothing.
        let timeline_len = if p.want_timeline { TIMELINE_LEN } else { 0 };
        let mut desc =
            Vec::with_capacity(descs.iter().map(|d| d.encoded_len()).sum::<usize>() + timeline_len);
        if p.want_timeline {
            header.flags |= flags::HAS_TIMELINE;
            tl.stamp(Stage::ResponseSent);
            encode_tensor_section(descs, Some(tl), &mut desc);
        } else {
            encode_tensor_section(descs, None, &mut desc);
        }
        header.desc_len = desc.len() as u32;
        // A response must fit the session's limits like any message (the
        // client checks them too).
        if let Err(e) = header.check_limits(&p.limits) {
            return Err(self.fail(Reply::error(
                p.request_id,
                Status::LimitExceeded,
                &format!("the response breaks the session limits: {e}"),
            )));
        }
        self.counters.responses.fetch_add(1, Ordering::Relaxed);
        Ok(Reply {
            header,
            desc,
            outputs: Vec::new(),
        })
    }

    /// Counts an error reply and passes it through.
    pub fn fail(&self, r: Reply) -> Reply {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::DType;

    fn request(len: u64) -> (Header, Vec<u8>) {
        let t = TensorDesc {
            dtype: DType::U8,
            shape: vec![len],
            offset: 0,
            len,
        };
        let mut desc = Vec::new();
        encode_tensor_section(&[t], None, &mut desc);
        let mut h = Header::new(Kind::Request);
        h.request_id = 1;
        h.tensor_count = 1;
        h.desc_len = desc.len() as u32;
        h.payload_len = len;
        (h, desc)
    }

    #[test]
    fn payload_budget_bounds_bytes_in_flight_agent_wide() {
        let core = AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 1000);
        let (h, d) = request(600);
        let first = core.prepare(&h, &d, &core.limits).expect("fits the budget");
        let refused = core
            .prepare(&h, &d, &core.limits)
            .expect_err("over the budget");
        assert_eq!(refused.header.status, Status::LimitExceeded);
        assert_eq!(core.in_flight(), 1);
        let (small, sd) = request(400);
        let second = core
            .prepare(&small, &sd, &core.limits)
            .expect("what is left fits");
        drop((first, second));
        assert_eq!(core.in_flight(), 0);
        assert!(
            core.prepare(&h, &d, &core.limits).is_ok(),
            "budget returned on drop"
        );
    }
}
