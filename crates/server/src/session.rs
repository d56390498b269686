//! [`SocketSession`]: one socket connection, from its Hello to its hang-up,
//! run by the agent's [`reactor`](crate::reactor) workers.
//!
//! The worker that reads a request also runs it (through the model's
//! queue) and writes its response, so an uncontended request never changes
//! thread. Between requests the session polls its socket for the spin
//! budget (`socket_spin_us`) and then *parks*: the connection waits in the
//! reactor's epoll set with no thread, and the next request wakes a worker
//! that carries on here. The Hello is read the same way, so a connection
//! that never sends one holds no thread either (the agent's reaper closes
//! it at `handshake_timeout`). What was read of a message that has not
//! fully arrived stays in the connection's buffer across parks, and the
//! reaper closes a connection parked that way for `stall_timeout`; a
//! payload is read blocking (bounded by the same `stall_timeout`).
//!
//! Requests on one connection are answered in order; clients may pipeline
//! many (they are matched by id). Faults end only this connection: a bad
//! header (the stream can no longer be trusted) gets an Error and a close;
//! a bad request whose header is sound gets an Error, its payload is
//! skipped and the session goes on.

use crate::conns::{Phase, Slot};
use crate::dispatch::{AgentCore, Grant, Reply, RESERVE_STEP};
use crate::reactor::{Step, Task};
use crate::stats::Via;
use crate::tenants::{CpuMeter, Identity};
use engine::TensorView;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use transport::{RecvError, StreamConn};
use wire::{Kind, Stage, Status};

/// One socket connection's state between its turns on a worker.
pub struct SocketSession {
    core: Arc<AgentCore>,
    conn: StreamConn,
    /// Who connected (matched to a tenant at the Hello).
    who: Identity,
    /// The limits in force and the tenant, once the Hello is answered.
    grant: Option<Grant>,
    slot: Slot,
    /// Parked with part of a message read ([`Phase::Stalled`]).
    stalled: bool,
    /// Its transport (unix or tcp), for the models' statistics.
    via: Via,
    /// A shared handle on the socket, named for each turn so that a
    /// request that waits in a model's queue is dropped if the client
    /// hangs up meanwhile ([`crate::queue::watch_caller`]).
    caller: Option<crate::queue::Caller>,
}

impl SocketSession {
    /// A session for a freshly accepted `conn` (put in parking mode here)
    /// from `who` that came `via` unix or tcp, holding `slot` in the
    /// agent's connection table until it ends.
    pub fn new(
        core: Arc<AgentCore>,
        mut conn: StreamConn,
        who: Identity,
        slot: Slot,
        via: Via,
    ) -> SocketSession {
        conn.set_parking(true);
        let caller = conn
            .writer()
            .ok()
            .map(|w| Arc::new(w) as crate::queue::Caller);
        SocketSession {
            core,
            conn,
            who,
            grant: None,
            slot,
            stalled: false,
            via,
            caller,
        }
    }

    /// Serves messages until none is ready (`Park`) or the connection ends;
    /// a tenant's session charges its tenant the turn's CPU time (`meter`).
    fn serve(&mut self, meter: &mut Option<CpuMeter>) -> Step {
        // One count per turn on a worker, not per request: `self` must stay
        // free to borrow mutably below.
        let core = self.core.clone();
        let _watch = self.caller.clone().map(crate::queue::watch_caller);
        loop {
            let limits = self.grant.as_ref().map_or(&core.limits, |g| &g.limits);
            let (h, desc) = match self.conn.recv_head(limits) {
                Ok(m) => m,
                Err(RecvError::WouldBlock) if !core.is_closing() => return Step::Park,
                Err(RecvError::Wire(e)) => {
                    // The stream cannot be resynchronised: say why, then close.
                    let r = core.fail(Reply::error(0, e.status(), &e.to_string()));
                    let _ = send(&self.conn, &r, &[]);
                    return Step::Done;
                }
                Err(_) => return Step::Done,
            };
            if self.stalled {
                // The message the peer stalled in is whole now.
                self.stalled = false;
                self.slot.set(Phase::Busy);
            }
            let Some(grant) = self.grant.take() else {
                // The first message: it must be a Hello. Over TLS the
                // handshake is done by now: the client's certificate
                // names are part of who it is.
                if let Some(names) = self.conn.tls_peer_names() {
                    self.who.cert_names = Some(names.into());
                }
                match core.hello(&h, &desc, &self.who) {
                    Ok((grant, ack)) if send(&self.conn, &ack, &[]) => {
                        if let (Some(seat), None) = (&grant.seat, &meter) {
                            *meter = Some(CpuMeter::start(seat));
                        }
                        self.grant = Some(grant);
                        self.slot.set(Phase::Busy);
                        continue;
                    }
                    Ok(_) => return Step::Done,
                    Err(err) => {
                        let _ = send(&self.conn, &err, &[]);
                        return Step::Done;
                    }
                }
            };
            let ok = if h.kind == Kind::Request {
                if let (Some(m), Some(seat)) = (meter.as_mut(), &grant.seat) {
                    m.tick(seat);
                }
                self.request(&h, &desc, &grant)
            } else {
                // A Response sent the wrong way is the only other kind that
                // may carry a payload (header rule 7): skip it, so that the
                // stream stays in sync after the `unknown-kind` answer.
                self.conn.skip_payload(h.payload_len).is_ok()
                    && send(&self.conn, &core.control(&h, &desc, &grant), &[])
            };
            self.grant = Some(grant);
            if !ok {
                return Step::Done;
            }
        }
    }

    /// One request: validate, read its payload in place, run, answer.
    /// False when the connection must end.
    fn request(&mut self, h: &wire::Header, desc: &[u8], grant: &Grant) -> bool {
        let core = &*self.core;
        let conn = &mut self.conn;
        let mut tl = core.timeline(h);
        tl.stamp(Stage::Received);
        let prep = match core.prepare_streamed(self.via, h, desc, grant, &tl) {
            Ok(p) => p,
            Err(reply) => {
                return conn.skip_payload(h.payload_len).is_ok() && send(conn, &reply, &[])
            }
        };
        let mut buf = match core.pool.take(h.payload_len as usize) {
            Ok(b) => b,
            Err(e) => {
                let r = Reply::error(
                    h.request_id,
                    Status::LimitExceeded,
                    &format!("agent cannot allocate {} bytes: {e}", h.payload_len),
                );
                return conn.skip_payload(h.payload_len).is_ok() && send(conn, &core.fail(r), &[]);
            }
        };
        // The payload comes a budget step at a time: each step's bytes are
        // taken from the agent-wide budget before they are read.
        let len = buf.len();
        let mut at = 0;
        while at < len {
            let end = (at + RESERVE_STEP as usize).min(len);
            if !prep.reserve_through(end as u64) {
                // The budget and the bytes it counted go back together,
                // before the rest is skipped (a peer may take long to
                // send it): a buffer kept meanwhile would hold pages the
                // budget no longer counts.
                drop(buf);
                drop(prep);
                let r = core.fail(core.over_budget(h.request_id, h.payload_len));
                return conn.skip_payload((len - at) as u64).is_ok() && send(conn, &r, &[]);
            }
            if conn.recv_payload(&mut buf[at..end]).is_err() {
                return false;
            }
            at = end;
        }
        tl.stamp(Stage::PayloadInPlace);
        let views = prep.views(&buf);
        let reply = core.execute(&prep, &views, &mut tl);
        // The tenant's in-flight quota is given back before the answer
        // leaves: a client that has it may send again at once.
        if let Some(t) = &prep.ticket {
            t.release();
        }
        send(conn, &reply, &views)
    }
}

impl Task for SocketSession {
    fn fd(&self) -> BorrowedFd<'_> {
        self.conn.as_fd()
    }

    fn run(&mut self) -> Step {
        if self.grant.is_some() && !self.stalled {
            self.slot.set(Phase::Busy);
        }
        let mut meter = self
            .grant
            .as_ref()
            .and_then(|g| g.seat.as_ref())
            .map(CpuMeter::start);
        let step = self.serve(&mut meter);
        if let (Some(mut m), Some(seat)) =
            (meter, self.grant.as_ref().and_then(|g| g.seat.as_ref()))
        {
            m.charge(seat);
        }
        if step == Step::Park && self.grant.is_some() {
            // Sockets answer in order: parked means nothing in flight,
            // unless part of the next message came and the rest did not
            // (its clock keeps running while more bytes trickle in).
            if self.conn.has_buffered() {
                self.stalled = true;
                self.slot.set(Phase::Stalled);
            } else {
                self.slot.set(Phase::Idle);
                // An idle session keeps no read buffer (8 KiB of its ~9).
                self.conn.release_staging();
            }
        }
        step
    }
}

/// Sends `reply` (its outputs may alias `inputs`); false when the peer is gone.
fn send(conn: &StreamConn, reply: &Reply, inputs: &[TensorView<'_>]) -> bool {
    conn.send(&reply.header, &reply.desc, &reply.payload(inputs))
        .is_ok()
}
