//! One socket connection, served on its own thread from hello to hang-up.
//!
//! The thread that reads a request also runs it (through the model's queue)
//! and writes its response, so an uncontended request never changes thread.
//! Requests on one connection are answered in order; clients may pipeline
//! many (they are matched by id). Faults end only this connection:
//! a bad header (the stream can no longer be trusted) gets an Error and a
//! close; a bad request whose header is sound gets an Error, its payload is
//! skipped and the session goes on.

use crate::dispatch::{AgentCore, Reply};
use engine::TensorView;
use std::sync::Arc;
use transport::{RecvError, StreamConn};
use wire::{Kind, Stage, Status, Timeline};

/// Serves `conn` until the peer hangs up, breaks the protocol, or the agent
/// shuts the socket down.
pub fn serve(core: Arc<AgentCore>, mut conn: StreamConn) {
    let limits = match handshake(&core, &mut conn) {
        Some(l) => l,
        None => return,
    };
    loop {
        let (h, desc) = match conn.recv_head(&limits) {
            Ok(m) => m,
            Err(RecvError::TimedOut) if !core.is_closing() => continue,
            Err(RecvError::Wire(e)) => {
                // The stream cannot be resynchronised: say why, then close.
                let _ = send(
                    &conn,
                    &core.fail(Reply::error(0, e.status(), &e.to_string())),
                    &[],
                );
                return;
            }
            Err(_) => return,
        };
        let mut tl = Timeline::for_request(&h);
        tl.stamp(Stage::Received);
        let ok = if h.kind == Kind::Request {
            match core.prepare(&h, &desc, &limits) {
                Err(reply) => conn.skip_payload(h.payload_len).is_ok() && send(&conn, &reply, &[]),
                Ok(prep) => {
                    let mut buf = match core.pool.take(h.payload_len as usize) {
                        Ok(b) => b,
                        Err(e) => {
                            let r = Reply::error(
                                h.request_id,
                                Status::LimitExceeded,
                                &format!("agent cannot allocate {} bytes: {e}", h.payload_len),
                            );
                            let _ = conn.skip_payload(h.payload_len);
                            let _ = send(&conn, &core.fail(r), &[]);
                            continue;
                        }
                    };
                    if conn.recv_payload(&mut buf).is_err() {
                        return;
                    }
                    tl.stamp(Stage::PayloadInPlace);
                    let views = prep.views(&buf);
                    let reply = core.execute(&prep, &views, &mut tl);
                    send(&conn, &reply, &views)
                }
            }
        } else {
            // A Response sent the wrong way is the only other kind that may
            // carry a payload (header rule 7): skip it, so that the stream
            // stays in sync after the `unknown-kind` answer.
            conn.skip_payload(h.payload_len).is_ok()
                && send(&conn, &core.control(&h, &desc, &limits), &[])
        };
        if !ok {
            return;
        }
    }
}

/// Waits for the client's Hello and answers it; `None` ends the session.
fn handshake(core: &AgentCore, conn: &mut StreamConn) -> Option<wire::Limits> {
    loop {
        match conn.recv_head(&core.limits) {
            Ok((h, body)) => {
                return match core.hello(&h, &body) {
                    Ok((limits, ack)) => send(conn, &ack, &[]).then_some(limits),
                    Err(err) => {
                        let _ = send(conn, &err, &[]);
                        None
                    }
                };
            }
            Err(RecvError::TimedOut) if !core.is_closing() => continue,
            Err(RecvError::Wire(e)) => {
                let _ = send(
                    conn,
                    &core.fail(Reply::error(0, e.status(), &e.to_string())),
                    &[],
                );
                return None;
            }
            Err(_) => return None,
        }
    }
}

/// Sends `reply` (its outputs may alias `inputs`); false when the peer is gone.
fn send(conn: &StreamConn, reply: &Reply, inputs: &[TensorView<'_>]) -> bool {
    conn.send(&reply.header, &reply.desc, &reply.payload(inputs))
        .is_ok()
}
