//! The agent as an in-process service (`inproc://name`): the caller's
//! thread runs the request through the same [`AgentCore`] code as a socket
//! session, reading the caller's tensors in place. Only outputs that alias
//! inputs (the identity model's) are copied, because the reply must own its
//! bytes after the caller's borrow ends. In-process callers are the
//! agent's own program: they hold no tenant seat (every model, the
//! agent's limits).

use crate::dispatch::{AgentCore, Grant, Reply};
use crate::stats::Via;
use crate::tenants::Identity;
use engine::{OutputData, TensorView};
use std::sync::Arc;
use transport::inproc::{InprocReply, InprocRequest, InprocService};
use wire::{Kind, Placement, Stage, Status};

/// Adapts an [`AgentCore`] to the in-process transport.
pub struct InprocAgent(pub Arc<AgentCore>);

impl InprocService for InprocAgent {
    fn call(&self, req: InprocRequest<'_>) -> InprocReply {
        let core = &self.0;
        let h = req.header;
        let reply = match h.kind {
            Kind::Hello => match core.hello(&h, req.desc, &Identity::IN_PROCESS) {
                Ok((_, ack)) => ack,
                Err(e) => e,
            },
            Kind::Request => {
                if let Err(e) = h.check_limits(&core.limits) {
                    return owned(
                        core,
                        core.fail(Reply::error(h.request_id, e.status(), &e.to_string())),
                        &[],
                    );
                }
                let mut tl = core.timeline(&h);
                tl.stamp(Stage::Received);
                match core.prepare_via(
                    Via::Inproc,
                    &h,
                    req.desc,
                    &Grant::open(core.limits),
                    Placement::Payload,
                    &tl,
                ) {
                    Err(r) => r,
                    Ok(prep) => {
                        if prep.tensors.len() != req.tensors.len()
                            || prep
                                .tensors
                                .iter()
                                .zip(req.tensors)
                                .any(|(d, t)| d.len != t.len() as u64)
                        {
                            return owned(
                                core,
                                core.fail(Reply::error(
                                    h.request_id,
                                    Status::Malformed,
                                    "tensor buffers do not match their descriptors",
                                )),
                                &[],
                            );
                        }
                        tl.stamp(Stage::PayloadInPlace);
                        let views: Vec<TensorView<'_>> = prep
                            .tensors
                            .iter()
                            .zip(req.tensors)
                            .map(|(d, t)| TensorView::new(d.dtype, &d.shape, t))
                            .collect();
                        let r = core.execute(&prep, &views, &mut tl);
                        return owned(core, r, &views);
                    }
                }
            }
            _ => core.control(&h, req.desc, &Grant::open(core.limits)),
        };
        owned(core, reply, &[])
    }
}

/// Converts a reply into one that owns its output bytes.
fn owned(core: &AgentCore, reply: Reply, inputs: &[TensorView<'_>]) -> InprocReply {
    let mut tensors = Vec::with_capacity(reply.outputs.len());
    for o in reply.outputs {
        tensors.push(match o.data {
            OutputData::Owned(b) => b.into(),
            OutputData::Input(i) => {
                let src = inputs.get(i).map_or(&[][..], |t| t.data);
                match core.pool.take(src.len()) {
                    Ok(mut b) => {
                        crate::movers().move_bytes(&mut b, src);
                        b
                    }
                    Err(e) => {
                        return owned(
                            core,
                            Reply::error(
                                reply.header.request_id,
                                Status::Internal,
                                &format!("cannot allocate output: {e}"),
                            ),
                            &[],
                        )
                    }
                }
            }
        });
    }
    InprocReply {
        header: reply.header,
        desc: reply.desc,
        tensors,
    }
}
