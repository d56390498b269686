//! `serve_connection`: one downstream connection, from its Hello to its
//! hang-up, on one thread of its own.
//!
//! The thread reads a request from the downstream socket, checks it as the
//! agent would (header rules and limits in `recv_head`, the descriptor
//! section with the wire crate's own validation), puts its payload where
//! the upstream session sends it from, submits it, and writes the answer
//! back. On an `shm://` upstream the payload is read from the socket
//! straight into arena allocations (one per tensor), so the agent reads it
//! in place; outputs are written to the socket straight from the arena. On
//! a socket upstream the header (request id rewritten by the client
//! library), the descriptor section and the payload go out in one
//! `sendmsg` from one pooled buffer.
//!
//! Waiting: while nothing is in flight the thread polls the downstream
//! socket (`StreamConn::set_spin`) and then blocks; while requests are in
//! flight it waits for the oldest answer with the client library's own
//! polling wait, taking further requests first whenever their bytes are
//! already there (pipelining: up to the session's `max_in_flight`). Answers
//! leave in request order, which the protocol allows.
//!
//! Faults: a header the agent would refuse (bad magic, limits, ...) gets
//! the agent's answer — an Error with request id 0 — and the connection is
//! closed; a bad descriptor section gets an Error for that request and
//! the session goes on, its payload skipped. Nothing reaches the agent that
//! it would refuse as unsound on a direct connection. When the upstream
//! session is lost, every request in flight is answered `unavailable`,
//! then the session ends with an `unavailable` Error (request id 0): model
//! ids are valid for one upstream session only, so a relayed session cannot
//! outlive its upstream one; the client reconnects.

use crate::upstream::{narrow, status_of, Upstream};
use crate::GatewayOptions;
use client::{Client, ClientError, Response, Ticket};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use transport::{RecvError, StreamConn};
use wire::{
    decode_hello_request, decode_model_name, decode_tensor_section, encode_error_body,
    encode_hello, encode_model_list, encode_signature, encode_tensor_section, flags,
    layout_payload, BufPool, Header, Kind, Limits, Status, TensorDesc, TensorSection,
};

/// A request submitted upstream, waiting for its answer.
struct InFlight {
    /// The downstream client's id for it.
    id: u64,
    model_id: u32,
    ticket: Ticket,
}

/// Why a session stops.
enum End {
    /// The downstream connection closed or failed: nothing more to say.
    Downstream,
    /// The upstream session was lost: answer `unavailable` and close.
    Upstream(String),
}

/// One relayed session, after its Hello.
struct Relay<'a> {
    conn: StreamConn,
    up: Client,
    /// The session's limits (the upstream's, which the HelloAck gave).
    limits: Limits,
    /// True when the upstream is `shm://` (payloads go into the arena).
    arena: bool,
    inflight: VecDeque<InFlight>,
    pool: &'a Arc<BufPool>,
}

/// Serves one accepted downstream connection until it ends.
pub(crate) fn serve_connection(
    mut conn: StreamConn,
    upstream: &Upstream,
    opts: &GatewayOptions,
    pool: &Arc<BufPool>,
) {
    // The Hello must come within the handshake time; after it a read
    // timing out between messages is harmless (the loop waits again) and
    // one timing out mid-message ends the connection (a stalled peer).
    if conn
        .set_read_timeout(Some(opts.handshake_timeout))
        .and_then(|()| conn.set_write_timeout(Some(opts.stall_timeout)))
        .is_err()
    {
        return;
    }
    let (h, desc) = match conn.recv_head(&Limits::default()) {
        Ok(m) => m,
        Err(RecvError::Wire(e)) => {
            let _ = send_error(&conn, 0, e.status(), &e.to_string());
            return;
        }
        Err(_) => return,
    };
    if h.kind != Kind::Hello {
        let msg = format!(
            "the first message of a session must be Hello, not {:?}",
            h.kind
        );
        let _ = send_error(&conn, h.request_id, Status::UnknownKind, &msg);
        return;
    }
    let hello = match decode_hello_request(&desc) {
        Ok(hello) => hello,
        Err(e) => {
            let _ = send_error(&conn, h.request_id, e.status(), &e.to_string());
            return;
        }
    };
    let token = match hello.token.map(|t| String::from_utf8(t.to_vec())) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(_)) => {
            let msg = "the gateway relays UTF-8 tokens only";
            let _ = send_error(&conn, h.request_id, Status::PermissionDenied, msg);
            return;
        }
    };
    let up = match upstream.connect(narrow(&hello.limits, &opts.limits), token) {
        Ok(c) => c,
        Err(r) => {
            let _ = send_error(&conn, h.request_id, r.status, &r.message);
            return;
        }
    };
    // The upstream's limits in force: never more than the agent allows
    // (it narrowed the proposal), so whatever passes here fits there.
    let limits = up.limits();
    let mut ack = Header::new(Kind::HelloAck);
    ack.request_id = h.request_id;
    let body = encode_hello(&limits);
    ack.desc_len = body.len() as u32;
    if conn.send(&ack, &body, &[]).is_err()
        || conn.set_read_timeout(Some(opts.stall_timeout)).is_err()
    {
        return;
    }
    conn.set_spin(opts.spin);
    let arena = up.shm_info().is_some();
    let mut relay = Relay {
        conn,
        up,
        limits,
        arena,
        inflight: VecDeque::new(),
        pool,
    };
    let end = relay.serve();
    if let End::Upstream(why) = end {
        relay.fail_all(&why);
    }
}

impl Relay<'_> {
    fn serve(&mut self) -> End {
        // After an answer with more in flight, check (one `poll`) whether
        // the client sent more meanwhile; right after a submit, go
        // straight to waiting (a closed-loop client has sent nothing).
        let mut check = false;
        loop {
            let full = self.inflight.len() >= self.limits.max_in_flight.max(1) as usize;
            let read = !full
                && (self.inflight.is_empty()
                    || self.conn.has_buffered()
                    || (check && self.conn.wait_readable(Duration::ZERO).unwrap_or(true)));
            if !read {
                if let Err(end) = self.finish_oldest() {
                    return end;
                }
                check = true;
                continue;
            }
            check = false;
            let (h, desc) = match self.conn.recv_head(&self.limits) {
                Ok(m) => m,
                Err(RecvError::TimedOut) => continue,
                Err(RecvError::Wire(e)) => {
                    // As the agent does: the stream cannot be trusted any
                    // more. Answers to what is in flight go first.
                    if let Err(end) = self.finish_all() {
                        return end;
                    }
                    let _ = send_error(&self.conn, 0, e.status(), &e.to_string());
                    return End::Downstream;
                }
                Err(_) => return End::Downstream,
            };
            let r = match h.kind {
                Kind::Request => self.request(&h, &desc),
                Kind::Ping | Kind::ModelQuery | Kind::ListModels => self.control(&h, &desc),
                Kind::Hello => self.refuse(
                    &h,
                    Status::UnknownKind,
                    "Hello was already exchanged on this session",
                ),
                Kind::Release => self.refuse(
                    &h,
                    Status::UnknownKind,
                    "Release only applies to shared-memory sessions",
                ),
                other => self.refuse(
                    &h,
                    Status::UnknownKind,
                    &format!("{other:?} is not a message a client sends"),
                ),
            };
            if let Err(end) = r {
                return end;
            }
        }
    }

    /// Skips `h`'s payload and answers it with an Error.
    fn refuse(&mut self, h: &Header, status: Status, msg: &str) -> Result<(), End> {
        self.conn
            .skip_payload(h.payload_len)
            .map_err(|_| End::Downstream)?;
        send_error(&self.conn, h.request_id, status, msg)
    }

    /// Answers a client error: `unavailable` ones end the session.
    fn refuse_client(&mut self, id: u64, e: &ClientError) -> Result<(), End> {
        let (status, msg) = status_of(e);
        if status == Status::Unavailable {
            // This request's own answer first, then the others' and the
            // session's (`fail_all`).
            let own = format!("the gateway lost its agent: {msg}");
            send_error(&self.conn, id, status, &own)?;
            return Err(End::Upstream(msg));
        }
        send_error(&self.conn, id, status, &msg)
    }

    /// Ping, ModelQuery, ListModels: forwarded, answered when the agent answers.
    fn control(&mut self, h: &Header, body: &[u8]) -> Result<(), End> {
        if matches!(h.kind, Kind::Ping | Kind::ListModels) && !body.is_empty() {
            let msg = format!("{:?} carries no body, got {} bytes", h.kind, body.len());
            return send_error(&self.conn, h.request_id, Status::Malformed, &msg);
        }
        let (kind, model_id, out) = match h.kind {
            Kind::Ping => match self.up.ping() {
                Ok(_) => (Kind::Pong, 0, Vec::new()),
                Err(e) => return self.refuse_client(h.request_id, &e),
            },
            Kind::ModelQuery => {
                let name = match decode_model_name(body) {
                    Ok(n) => n,
                    Err(e) => {
                        return send_error(&self.conn, h.request_id, e.status(), &e.to_string())
                    }
                };
                match self.up.model(name) {
                    Ok(m) => {
                        let mut b = Vec::new();
                        encode_signature(m.signature(), &mut b);
                        (Kind::ModelInfo, m.id(), b)
                    }
                    Err(e) => return self.refuse_client(h.request_id, &e),
                }
            }
            _ => match self.up.models() {
                Ok(list) => {
                    let list: Vec<_> = list.into_iter().map(|m| (m.id, m.signature)).collect();
                    (Kind::ModelList, 0, encode_model_list(&list))
                }
                Err(e) => return self.refuse_client(h.request_id, &e),
            },
        };
        let mut r = Header::new(kind);
        r.request_id = h.request_id;
        r.model_id = model_id;
        r.desc_len = out.len() as u32;
        self.conn.send(&r, &out, &[]).map_err(|_| End::Downstream)
    }

    /// One request: validate, move the payload to the upstream, submit.
    fn request(&mut self, h: &Header, desc: &[u8]) -> Result<(), End> {
        // The agent's own check of a stream request's descriptors: what
        // fails it here would fail it there.
        let section = match decode_tensor_section(h, desc) {
            Ok(s) => s,
            Err(e) => return self.refuse(h, e.status(), &e.to_string()),
        };
        let sent = if self.arena {
            self.submit_in_arena(h, &section)?
        } else {
            self.submit_encoded(h, desc)?
        };
        match sent {
            Submitted::Sent(ticket) => {
                self.inflight.push_back(InFlight {
                    id: h.request_id,
                    model_id: h.model_id,
                    ticket,
                });
                Ok(())
            }
            Submitted::Answered => Ok(()),
            Submitted::Failed(e) => self.refuse_client(h.request_id, &e),
        }
    }

    /// Socket upstream: the payload into one pooled buffer, then header,
    /// descriptors and payload out in one write.
    fn submit_encoded(&mut self, h: &Header, desc: &[u8]) -> Result<Submitted, End> {
        let mut buf = match self.pool.take(h.payload_len as usize) {
            Ok(b) => b,
            Err(e) => {
                let msg = format!("gateway cannot allocate {} bytes: {e}", h.payload_len);
                self.refuse(h, Status::LimitExceeded, &msg)?;
                return Ok(Submitted::Answered);
            }
        };
        self.conn
            .recv_payload(&mut buf)
            .map_err(|_| End::Downstream)?;
        Ok(match self.up.submit_encoded(h, desc, &buf) {
            Ok(t) => Submitted::Sent(t),
            Err(e) => Submitted::Failed(e),
        })
    }

    /// `shm://` upstream: each tensor read from the socket straight into
    /// its arena allocation (padding between tensors skipped).
    fn submit_in_arena(&mut self, h: &Header, section: &TensorSection) -> Result<Submitted, End> {
        let mut bufs = Vec::with_capacity(section.tensors.len());
        for t in &section.tensors {
            let b = loop {
                match self.up.alloc_tensor(t.dtype, &t.shape) {
                    Ok(b) => break b,
                    // The arena is held by requests in flight: answer the
                    // oldest (its inputs are freed) and try again.
                    Err(_) if !self.inflight.is_empty() => self.finish_oldest()?,
                    Err(e) => {
                        let (status, msg) = status_of(&e);
                        self.refuse(h, status, &msg)?;
                        return Ok(Submitted::Answered);
                    }
                }
            };
            bufs.push(b);
        }
        let mut pos = 0u64;
        for (t, b) in section.tensors.iter().zip(bufs.iter_mut()) {
            self.skip(t.offset - pos)?;
            let Some(dest) = b.try_as_mut_bytes() else {
                // A fresh allocation is never shared; keep the stream in sync anyway.
                self.skip(h.payload_len - t.offset)?;
                let msg = "gateway: arena buffer unexpectedly shared";
                send_error(&self.conn, h.request_id, Status::Internal, msg)?;
                return Ok(Submitted::Answered);
            };
            self.conn.recv_payload(dest).map_err(|_| End::Downstream)?;
            pos = t.offset + t.len;
        }
        self.skip(h.payload_len - pos)?;
        let refs: Vec<_> = bufs.iter().map(|b| b.as_ref()).collect();
        let model = self
            .up
            .model_by_id(h.model_id)
            .with_priority(h.priority)
            .with_queue_timeout(Duration::from_micros(u64::from(h.timeout_us)));
        let r = if h.flags & flags::WANT_TIMELINE != 0 {
            model.submit_timed(&refs)
        } else {
            model.submit(&refs)
        };
        Ok(match r {
            Ok(t) => Submitted::Sent(t),
            Err(e) => Submitted::Failed(e),
        })
    }

    fn skip(&mut self, n: u64) -> Result<(), End> {
        if n > 0 {
            self.conn.skip_payload(n).map_err(|_| End::Downstream)?;
        }
        Ok(())
    }

    /// Waits for the oldest request in flight and writes its answer.
    fn finish_oldest(&mut self) -> Result<(), End> {
        let Some(f) = self.inflight.pop_front() else {
            return Ok(());
        };
        match f.ticket.wait() {
            Ok(r) => send_response(&self.conn, f.id, f.model_id, &r),
            Err(e) => self.refuse_client(f.id, &e),
        }
    }

    fn finish_all(&mut self) -> Result<(), End> {
        while !self.inflight.is_empty() {
            self.finish_oldest()?;
        }
        Ok(())
    }

    /// The upstream is lost: every request in flight is answered
    /// `unavailable`, then the session with request id 0, and closed.
    fn fail_all(&mut self, why: &str) {
        let msg = format!("the gateway lost its agent: {why}");
        for f in self.inflight.drain(..) {
            drop(f.ticket);
            if send_error(&self.conn, f.id, Status::Unavailable, &msg).is_err() {
                return;
            }
        }
        let _ = send_error(&self.conn, 0, Status::Unavailable, &msg);
        let _ = self.conn.shutdown();
    }
}

/// What became of a request handed to the upstream.
enum Submitted {
    /// In flight.
    Sent(Ticket),
    /// Refused by the gateway, its Error sent already.
    Answered,
    /// Refused by the client library or the agent: to be answered.
    Failed(ClientError),
}

/// Writes a response: its descriptors laid out for a stream, the agent's
/// timeline if it came, each tensor straight from where it lies (the arena
/// over `shm://`).
fn send_response(conn: &StreamConn, id: u64, model_id: u32, r: &Response) -> Result<(), End> {
    let Some((offsets, payload_len)) =
        layout_payload(r.outputs.iter().map(|t| t.bytes().len() as u64))
    else {
        return send_error(
            conn,
            id,
            Status::Internal,
            "response payload size overflows",
        );
    };
    let descs: Vec<TensorDesc> = r
        .outputs
        .iter()
        .zip(offsets)
        .map(|(t, offset)| TensorDesc {
            dtype: t.dtype,
            shape: t.shape.clone(),
            offset,
            len: t.bytes().len() as u64,
        })
        .collect();
    let mut desc = Vec::new();
    encode_tensor_section(&descs, r.timeline.as_ref(), &mut desc);
    let mut h = Header::new(Kind::Response);
    h.request_id = id;
    h.model_id = model_id;
    h.tensor_count = descs.len() as u32;
    h.desc_len = desc.len() as u32;
    h.payload_len = payload_len;
    if r.timeline.is_some() {
        h.flags |= flags::HAS_TIMELINE;
    }
    let tensors: Vec<&[u8]> = r.outputs.iter().map(|t| t.bytes()).collect();
    conn.send(&h, &desc, &tensors).map_err(|_| End::Downstream)
}

/// Sends an Error; `Err(End::Downstream)` when the client is gone.
fn send_error(conn: &StreamConn, id: u64, status: Status, msg: &str) -> Result<(), End> {
    let body = encode_error_body(msg);
    let mut h = Header::new(Kind::Error);
    h.request_id = id;
    h.status = status;
    h.desc_len = body.len() as u32;
    conn.send(&h, &body, &[]).map_err(|_| End::Downstream)
}
