//! [`shm_ring`]: a hostile shared-memory client against [`ShmSession`],
//! the agent's shm session, bootstrapped for real: a Hello on a Unix
//! control socket, the sealed memfd arena the session creates and passes
//! back with `SCM_RIGHTS`, mapped by the driver as a client maps it.
//!
//! From then on the fuzz input is laid into that arena: messages published
//! through the request ring as a client publishes them (requests whose
//! tensors the driver writes into the client region at fuzzer-chosen
//! offsets, raw headers and bodies, Releases), and words written straight
//! into the rings (marks, slots, the response ring's tail), the header page
//! and the data area. Each turn of the session is the one a reactor worker
//! runs ([`Task::run`]): it consumes what the ring holds with the real
//! ring and channel code, validates it, runs the model over views of the
//! client region and publishes its answers; the driver reads them with the
//! client's ring consumer and checks them.

use super::{tensor_bytes, Fixture, ModelChoice, Sent, MAX_OPS};
use crate::conns::Conn;
use crate::reactor::{Step, Task};
use crate::shm_session::{ShmHandle, ShmSession, ShmSettings};
use arbitrary::{Arbitrary, Unstructured};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use transport::shm::fdpass::recv_with_fd;
use transport::shm::layout::{AGENT_SLEEP, CLIENT_SLEEP};
use transport::shm::ring::{Consumer, Producer};
use transport::shm::{Arena, Layout, Ring, ShmSizes, SLEEP_PARKED, SLOT_LEN};
use transport::PeerId;
use wire::{
    decode_hello, decode_tensor_section_in, encode_hello, encode_tensor_section, Header, Kind,
    Limits, Placement, TensorDesc, HEADER_LEN,
};

/// One input tensor of a shm request: where the client writes it.
#[derive(Arbitrary, Clone, Debug)]
pub struct ShmTensor {
    /// Wire dtype code.
    pub dtype: u8,
    /// Dimensions.
    pub dims: Vec<u8>,
    /// Offset in 64-byte units from the start of the data area (may fall
    /// outside the client region), or a raw offset.
    pub at: Result<u16, u64>,
    /// Seed of its bytes.
    pub fill: u8,
}

/// What the client does to the arena.
#[derive(Arbitrary, Clone, Debug)]
pub enum ShmOp {
    /// A Request published as a client does, its tensors written first.
    Request {
        /// Request id.
        id: u64,
        /// Model.
        model: ModelChoice,
        /// Tensors.
        tensors: Vec<ShmTensor>,
        /// Header flags.
        flags: u8,
        /// Overwrites `payload_len` (else the tensors' total).
        payload_len: Option<u64>,
    },
    /// A message with these header bytes (the mark word is the ring's) and
    /// body, published through the ring.
    Message {
        /// The first slot's bytes.
        header: [u8; 56],
        /// The body slots' bytes.
        body: Vec<u8>,
    },
    /// A Release of a response.
    Release(u64),
    /// A control message (Ping, ListModels, ModelQuery, ...).
    Control {
        /// Kind code.
        kind: u8,
        /// Request id.
        id: u64,
        /// Body.
        body: Vec<u8>,
    },
    /// A word of the request ring written directly (tail, marks, slots;
    /// `index` in words, modulo the ring's size).
    RequestRingWord {
        /// Word index.
        index: u16,
        /// Value.
        value: u64,
    },
    /// A word of the response ring written directly (its tail is the
    /// client's to publish).
    ResponseRingWord {
        /// Word index.
        index: u16,
        /// Value.
        value: u64,
    },
    /// A word of the header page written directly.
    HeaderWord {
        /// Word index (modulo 512).
        index: u16,
        /// Value.
        value: u64,
    },
    /// Bytes written into the data area (offset modulo its length).
    Data {
        /// Offset.
        at: u32,
        /// Bytes.
        bytes: Vec<u8>,
    },
    /// The client reads the responses, releasing them if `release`.
    Drain {
        /// Whether to Release each response read.
        release: bool,
    },
}

/// A whole fuzz input: the arena's sizes and the operations.
#[derive(Arbitrary, Debug)]
pub struct ShmInput {
    /// Ring slots: 2 << (n % 5), 2..=32.
    pub ring_slots: u8,
    /// Client region pages: 1 + n % 4.
    pub client_pages: u8,
    /// Agent region pages: 1 + n % 4.
    pub agent_pages: u8,
    /// What the client does.
    pub ops: Vec<ShmOp>,
}

/// What an answer owed is checked against.
#[derive(Debug)]
enum Expect {
    /// Any answer with the id.
    Reply,
    /// A request the agent must accept: identity outputs aliasing or
    /// copying exactly these tensors (data-area offsets).
    Identity(Vec<(u64, Sent)>),
}

/// The driver's side of one session.
struct Client {
    sock: UnixStream,
    session: Option<ShmSession>,
    arena: Arc<Arena>,
    layout: Layout,
    granted: Limits,
    tx: Producer,
    rx: Consumer,
    /// Answers owed in order (while nothing was scribbled into the rings).
    owed: VecDeque<(u64, Expect)>,
    /// No word of the request ring was written by hand: the agent sees
    /// exactly the messages published, and answers each.
    requests_clean: bool,
    /// No word of the response ring was written by hand: what the driver
    /// reads there is what the agent published.
    responses_clean: bool,
    /// The data area was not written by hand since requests were owed.
    data_clean: bool,
    /// The agent's last answer was an Error with id 0 (it closes then).
    fatal: bool,
}

impl Client {
    /// Bootstraps a session as a client does; `None` when it cannot (not
    /// an invariant: e.g. the kernel refuses the memfd).
    fn connect(fx: &Fixture, input: &ShmInput) -> Option<Client> {
        let (sock, server) = UnixStream::pair().ok()?;
        sock.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let handle = Arc::new(ShmHandle::new(server.try_clone().ok()?));
        let slot = fx
            .conns
            .admit(Conn::Shm(handle.clone()), PeerId::Uid(0))
            .ok()?;
        server.set_nonblocking(true).ok()?;
        let cfg = ShmSettings {
            sizes: ShmSizes {
                ring_capacity: 2 << (input.ring_slots % 5),
                client_len: 4096 * (1 + usize::from(input.client_pages % 4)),
                agent_len: 4096 * (1 + usize::from(input.agent_pages % 4)),
                features: 0,
            },
            spin: Duration::ZERO,
            park_after: Duration::ZERO,
            stall: Duration::from_millis(2),
        };
        let mut session = ShmSession::new(fx.core.clone(), server, cfg, handle, slot);
        let body = encode_hello(&Limits::default());
        let mut h = Header::new(Kind::Hello);
        h.request_id = 1;
        h.desc_len = body.len() as u32;
        (&sock).write_all(&[&h.encode()[..], &body].concat()).ok()?;
        let step = session.run();
        assert_eq!(
            step,
            Step::Park,
            "a fresh session waits for its first request"
        );
        let mut head = [0u8; HEADER_LEN];
        let (n, fd) = recv_with_fd(&sock, &mut head).ok()?;
        (&sock).read_exact(&mut head[n..]).ok()?;
        let ack = Header::decode(&head).expect("the HelloAck decodes");
        assert_eq!(ack.kind, Kind::HelloAck);
        let mut body = vec![0u8; ack.desc_len as usize];
        (&sock).read_exact(&mut body).ok()?;
        let granted = decode_hello(&body).expect("the HelloAck's limits decode");
        let arena = Arc::new(Arena::open(fd.expect("the HelloAck carries the arena"), None).ok()?);
        let layout = Layout::read(&arena).expect("the agent's arena header is consistent");
        let cap = layout.ring_capacity;
        let tx = Ring::new(arena.clone(), layout.request_ring, cap)
            .ok()?
            .producer();
        let rx = Ring::new(arena.clone(), layout.response_ring, cap)
            .ok()?
            .consumer();
        Some(Client {
            sock,
            session: Some(session),
            arena,
            layout,
            granted,
            tx,
            rx,
            owed: VecDeque::new(),
            requests_clean: true,
            responses_clean: true,
            data_clean: true,
            fatal: false,
        })
    }

    /// Publishes a message as the client does (and wakes a parked agent
    /// with a byte on the control socket, PROTOCOL §14.9). False when the
    /// ring has no room or is broken.
    fn publish(&mut self, first: &[u8; SLOT_LEN], body: &[u8]) -> bool {
        let ok = matches!(self.tx.push_message(first, body), Ok(true));
        let word = self.arena.atomic_u32(AGENT_SLEEP);
        if ok && word.swap(0, Ordering::SeqCst) == SLEEP_PARKED {
            let _ = (&self.sock).write_all(&[1]);
        }
        ok
    }

    /// Publishes a header and its section; `expect` is owed when published
    /// into a clean ring.
    fn send(&mut self, h: &Header, desc: &[u8], expect: Option<Expect>) {
        let mut first = [0u8; SLOT_LEN];
        first.copy_from_slice(&h.encode());
        if self.publish(&first, desc) && self.requests_clean {
            if let Some(e) = expect {
                self.owed.push_back((h.request_id, e));
            }
        }
    }

    /// One turn of the session, then the answers; false once it ended.
    fn run(&mut self) -> bool {
        let Some(s) = self.session.as_mut() else {
            return false;
        };
        let step = s.run();
        self.drain(false);
        if step == Step::Park {
            if self.requests_clean && self.responses_clean {
                assert!(
                    self.owed.is_empty(),
                    "the session parked owing answers: {:?}",
                    self.owed
                );
            }
            return true;
        }
        self.session = None;
        false
    }

    /// Reads every answer in the response ring and checks it.
    fn drain(&mut self, release: bool) {
        // Bounded: the ring holds at most its capacity of messages.
        for _ in 0..=self.layout.ring_capacity {
            let Some(first) = self.rx.peek() else {
                return;
            };
            let Ok(h) = Header::decode(&first) else {
                assert!(!self.responses_clean, "the agent published a bad header");
                return;
            };
            let len = h.desc_len as usize;
            let mut desc = Vec::new();
            if self
                .rx
                .consume(len.div_ceil(SLOT_LEN), len, &mut desc)
                .is_err()
            {
                assert!(
                    !self.responses_clean,
                    "the agent published an impossible message"
                );
                return;
            }
            self.rx.give_back();
            if self.responses_clean {
                self.check_answer(&h, &desc);
            }
            if release && h.kind == Kind::Response {
                let mut r = Header::new(Kind::Release);
                r.request_id = h.request_id;
                self.send(&r, &[], None);
            }
        }
    }

    fn check_answer(&mut self, h: &Header, desc: &[u8]) {
        assert!(!self.fatal, "an answer after the session's last: {h:?}");
        let data_len = self.layout.data_len as u64;
        let client_len = self.layout.client_len as u64;
        if h.kind == Kind::Response {
            // Whatever the request was, what the agent points at is inside
            // the data area, and an aliased input inside the client region.
            let section = decode_tensor_section_in(h, desc, Placement::Region { len: data_len })
                .expect("the agent's Response describes tensors inside the data area");
            for t in &section.tensors {
                if t.offset < client_len {
                    assert!(
                        t.offset + t.len <= client_len,
                        "an output aliases bytes outside the client region: {t:?}"
                    );
                }
            }
        }
        if !self.requests_clean {
            return;
        }
        let owed = self.owed.front().map(|(id, _)| *id);
        if owed != Some(h.request_id) {
            assert!(
                h.kind == Kind::Error && h.request_id == 0,
                "answer {h:?} is not the next one owed ({owed:?})"
            );
            self.fatal = true;
            return;
        }
        let Some((_, expect)) = self.owed.pop_front() else {
            return;
        };
        if let Expect::Identity(inputs) = expect {
            assert_eq!(
                h.kind,
                Kind::Response,
                "a valid identity request was refused: {}",
                String::from_utf8_lossy(desc)
            );
            let section = decode_tensor_section_in(h, desc, Placement::Region { len: data_len })
                .expect("checked above");
            assert_eq!(section.tensors.len(), inputs.len());
            let base = self.layout.data_off;
            for (t, (_, sent)) in section.tensors.iter().zip(&inputs) {
                assert_eq!((t.dtype, &t.shape), (sent.dtype, &sent.shape));
                if self.data_clean {
                    let start = base + t.offset as usize;
                    let got = self.arena.bytes(start..start + t.len as usize);
                    assert!(got == sent.bytes, "identity changed a tensor's bytes");
                }
            }
        }
    }

    /// Builds and publishes a request: tensors written at the fuzzer's
    /// offsets (those inside the client region), descriptors as chosen.
    fn request(&mut self, fx: &Fixture, op: &ShmOp) {
        let ShmOp::Request {
            id,
            model,
            tensors,
            flags,
            payload_len,
        } = op
        else {
            return;
        };
        let client_len = self.layout.client_len as u64;
        let units = (self.layout.data_len / 64) as u64;
        let mut descs = Vec::new();
        let mut sent = Vec::new();
        let mut total = 0u64;
        let mut encodable = true;
        for (i, t) in tensors.iter().enumerate() {
            let (Ok(dtype), true) = (
                wire::DType::from_code(t.dtype),
                t.dims.len() <= wire::MAX_DIMS,
            ) else {
                encodable = false;
                break;
            };
            let shape: Vec<u64> = t.dims.iter().map(|&d| u64::from(d)).collect();
            let Some(len) = TensorDesc::byte_len(dtype, &shape) else {
                encodable = false;
                break;
            };
            let offset = match t.at {
                Ok(u) => 64 * (u64::from(u) % units.max(1)),
                Err(raw) => raw,
            };
            total = total.wrapping_add(len);
            if offset.checked_add(len).is_some_and(|e| e <= client_len) {
                let bytes = tensor_bytes(len as usize, t.fill, i);
                let start = self.layout.data_off + offset as usize;
                // SAFETY: the driver is this arena's client: the client
                // region is its to write, and nothing in this process
                // holds a reference into it while no turn of the session
                // runs (the agent only reads it during `run`).
                let dst = unsafe { self.arena.bytes_mut(start..start + len as usize) };
                dst.copy_from_slice(&bytes);
                sent.push((
                    offset,
                    Sent {
                        dtype,
                        shape: shape.clone(),
                        bytes,
                    },
                ));
            }
            descs.push(TensorDesc {
                dtype,
                shape,
                offset,
                len,
            });
        }
        if !encodable {
            // Undefined dtypes and too many dims: a descriptor written by
            // hand, answered with an error.
            let mut h = Header::new(Kind::Request);
            h.request_id = *id;
            h.model_id = fx.model_id(*model);
            h.tensor_count = tensors.len() as u32;
            let mut desc = Vec::new();
            for t in tensors {
                desc.push(t.dtype);
                desc.push(t.dims.len() as u8);
                desc.extend_from_slice(&[0; 22]);
                for &d in &t.dims {
                    desc.extend_from_slice(&u64::from(d).to_le_bytes());
                }
            }
            h.desc_len = desc.len() as u32;
            let fits = h.check_limits(&self.granted).is_ok();
            self.send(&h, &desc, fits.then_some(Expect::Reply));
            return;
        }
        let mut desc = Vec::new();
        encode_tensor_section(&descs, None, &mut desc);
        let mut h = Header::new(Kind::Request);
        h.request_id = *id;
        h.model_id = fx.model_id(*model);
        h.tensor_count = descs.len() as u32;
        h.desc_len = desc.len() as u32;
        h.payload_len = payload_len.unwrap_or(total);
        h.flags = *flags;
        // A header over the session's limits ends the session (Error 0).
        let fits = h.check_limits(&self.granted).is_ok() && Header::decode(&h.encode()).is_ok();
        let mut ranges: Vec<(u64, u64)> = sent
            .iter()
            .map(|(o, s)| (*o, *o + s.bytes.len() as u64))
            .collect();
        ranges.sort_unstable();
        let disjoint = ranges.windows(2).all(|w| w[0].1 <= w[1].0);
        let valid = fits
            && fx.is_identity(h.model_id)
            && sent.len() == descs.len()
            && disjoint
            && descs.iter().all(|d| d.offset % wire::PAYLOAD_ALIGN == 0)
            && *flags & !wire::flags::WANT_TIMELINE == 0
            && response_fits(&h, &self.granted)
            && payload_len.is_none_or(|p| p == total);
        let expect = if !fits {
            None
        } else if valid {
            Some(Expect::Identity(sent))
        } else {
            Some(Expect::Reply)
        };
        self.send(&h, &desc, expect);
    }

    /// Writes word `index` (modulo `words`) of the region at `base`.
    fn poke(&self, base: usize, words: usize, index: u16, value: u64) {
        let at = base + 8 * (usize::from(index) % words);
        self.arena.atomic_u64(at).store(value, Ordering::Release);
    }

    fn op(&mut self, fx: &Fixture, op: &ShmOp) {
        let ring_words = Ring::bytes_needed(self.layout.ring_capacity) / 8;
        match op {
            ShmOp::Request { .. } => self.request(fx, op),
            ShmOp::Message { header, body } => {
                let mut first = [0u8; SLOT_LEN];
                first[..56].copy_from_slice(header);
                let body = &body[..body
                    .len()
                    .min(self.layout.ring_capacity as usize * SLOT_LEN)];
                // What the agent will make of it is the agent's business;
                // the driver no longer knows which answers are owed.
                if self.publish(&first, body) {
                    self.requests_clean = false;
                }
            }
            ShmOp::Release(id) => {
                let mut h = Header::new(Kind::Release);
                h.request_id = *id;
                self.send(&h, &[], None);
            }
            ShmOp::Control { kind, id, body } => {
                let mut h = Header::new(Kind::Ping);
                h.request_id = *id;
                let body = &body[..body.len().min(1024)];
                h.desc_len = body.len() as u32;
                let mut first = [0u8; SLOT_LEN];
                first.copy_from_slice(&h.encode());
                first[6] = *kind;
                let known = matches!(
                    Kind::from_code(*kind),
                    Ok(Kind::Ping | Kind::ListModels | Kind::ModelQuery)
                ) && h.check_limits(&self.granted).is_ok();
                if self.publish(&first, body) && self.requests_clean {
                    if known {
                        self.owed.push_back((*id, Expect::Reply));
                    } else {
                        self.requests_clean = false;
                    }
                }
            }
            ShmOp::RequestRingWord { index, value } => {
                self.poke(self.layout.request_ring, ring_words, *index, *value);
                self.requests_clean = false;
            }
            ShmOp::ResponseRingWord { index, value } => {
                self.poke(self.layout.response_ring, ring_words, *index, *value);
                self.responses_clean = false;
                self.requests_clean = false;
            }
            ShmOp::HeaderWord { index, value } => {
                // The agent reads its own sleep word and the client's; the
                // layout words it read once, at the bootstrap.
                let i = usize::from(*index) % 512;
                if i * 8 != AGENT_SLEEP && i * 8 != CLIENT_SLEEP {
                    self.poke(0, 512, *index, *value);
                } else {
                    self.arena
                        .atomic_u32(i * 8)
                        .store(*value as u32, Ordering::SeqCst);
                }
            }
            ShmOp::Data { at, bytes } => {
                let len = self.layout.data_len;
                let start = *at as usize % len;
                let n = bytes.len().min(len - start);
                let base = self.layout.data_off + start;
                // SAFETY: as in `request`: the session is not running, so
                // nothing in this process holds these bytes; writing the
                // agent's region is what a hostile client does.
                let dst = unsafe { self.arena.bytes_mut(base..base + n) };
                dst.copy_from_slice(&bytes[..n]);
                self.data_clean = false;
            }
            ShmOp::Drain { release } => {
                self.drain(*release);
                return;
            }
        }
        self.run();
    }

    /// Hangs up: the session must see it and end within a few turns.
    fn finish(mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let mut turns = 0;
        while self.session.is_some() {
            turns += 1;
            assert!(
                turns <= 4,
                "the session does not end after the client hung up"
            );
            self.run();
        }
    }
}

/// Whether the Response to the valid request `h` fits the session's
/// limits: its section is the request's, plus the timeline when asked for
/// (the agent refuses a request whose answer would not fit, with an Error).
pub(super) fn response_fits(h: &Header, granted: &Limits) -> bool {
    let timeline = if h.flags & wire::flags::WANT_TIMELINE != 0 {
        wire::TIMELINE_LEN as u64
    } else {
        0
    };
    u64::from(h.desc_len) + timeline <= u64::from(granted.max_desc_len)
}

/// Runs one fuzz input: [`ShmInput`] decoded from `data` with
/// [`arbitrary`] (at most [`MAX_OPS`] operations), against a fresh core.
pub fn shm_ring(data: &[u8]) {
    let Ok(input) = ShmInput::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let fx = Fixture::new();
    if let Some(mut c) = Client::connect(&fx, &input) {
        for op in input.ops.iter().take(MAX_OPS) {
            if c.session.is_none() {
                break;
            }
            c.op(&fx, op);
        }
        c.finish();
    }
    fx.assert_idle();
}
