//! [`agent_session`]: a structure-aware sequence of client messages
//! against [`SocketSession`], the agent's session for Unix and TCP
//! connections, over a real Unix socket pair.
//!
//! The driver writes each operation's bytes on the client's end and, while
//! the byte stream is still framed as the driver built it ("in sync"),
//! runs the session's turn at once ([`Task::run`], as a reactor worker
//! does) and reads every answer. An operation that breaks the framing (raw
//! bytes, lengths that do not match the bytes, payloads claimed and not
//! sent) ends the checks of answers for that connection; its bytes are
//! still written, and the session runs once the client has hung up, when
//! it must end.

use super::{tensor_bytes, Fixture, ModelChoice, Sent, TensorOp, MAX_OPS, MAX_REQUEST_BYTES};
use crate::conns::Conn;
use crate::reactor::{Step, Task};
use crate::session::SocketSession;
use crate::stats::Via;
use crate::tenants::Identity;
use arbitrary::{Arbitrary, Unstructured};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;
use transport::{Credentials, PeerId, StreamConn};
use wire::{
    decode_hello, decode_tensor_section, encode_hello_as, encode_model_name, encode_tensor_section,
    flags, Header, Kind, Limits, TensorDesc, HEADER_LEN,
};

/// The limits a Hello asks for.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum AskedLimits {
    /// [`Limits::default`].
    Default,
    /// Any values (0 means "no preference" for some fields).
    Raw {
        /// Most tensors per message.
        max_tensors: u32,
        /// Most requests in flight.
        max_in_flight: u32,
        /// Most payload bytes per message.
        max_payload: u64,
        /// Most descriptor-section bytes per message.
        max_desc_len: u32,
    },
}

/// A Hello, possibly odd.
#[derive(Arbitrary, Clone, Debug)]
pub struct HelloOp {
    /// What it asks for.
    pub limits: AskedLimits,
    /// Its bearer token (none when empty; over 255 bytes is refused).
    pub token: Vec<u8>,
    /// The relay's anonymous flag.
    pub anonymous: bool,
    /// Overwrites one byte of the 32-byte fixed body (`byte % 32`).
    pub poke: Option<(u8, u8)>,
    /// Drops bytes from the end of the body.
    pub cut: u8,
}

/// How a request picks its id.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum IdChoice {
    /// One more than the last id this driver used.
    Next,
    /// The last id again (a duplicate).
    Same,
    /// Any id.
    Raw(u64),
}

/// A field of a request the fuzzer overwrites after it is built.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Tweak {
    /// A tensor's offset.
    Offset(u8, u64),
    /// A tensor's byte length.
    Len(u8, u64),
    /// A tensor's reserved bytes.
    Reserved(u8, u8),
    /// The header's tensor count.
    TensorCount(u32),
    /// The header's status.
    Status(u32),
    /// The header's payload length (the bytes sent do not change).
    PayloadLen(u64),
    /// The header's descriptor length (the bytes sent do not change).
    DescLen(u32),
    /// Only the first `n` bytes of the message are sent.
    Truncate(u16),
}

/// A Request.
#[derive(Arbitrary, Clone, Debug)]
pub struct RequestOp {
    /// Its id.
    pub id: IdChoice,
    /// Its model.
    pub model: ModelChoice,
    /// Its tensors.
    pub tensors: Vec<TensorOp>,
    /// Header flags (WANT_TIMELINE is the one a client sends).
    pub flags: u8,
    /// Queue budget in µs (0: the model's).
    pub timeout_us: u32,
    /// Priority level (0: the model's).
    pub priority: u8,
    /// A field overwritten after the message is built.
    pub tweak: Option<Tweak>,
}

/// One thing the client does.
#[derive(Arbitrary, Clone, Debug)]
pub enum SessionOp {
    /// Says Hello.
    Hello(HelloOp),
    /// Sends a request.
    Request(RequestOp),
    /// Sends several requests before the session runs (pipelined).
    Pipeline(Vec<RequestOp>),
    /// Pings.
    Ping(u64),
    /// Asks for the model list.
    ListModels(u64),
    /// Looks a model up by name.
    ModelQuery(u64, String),
    /// Sends a Release (shared-memory only: an error here).
    Release(u64),
    /// A control message of any kind code with a body.
    Control {
        /// Kind code.
        kind: u8,
        /// Request id.
        id: u64,
        /// Body.
        body: Vec<u8>,
    },
    /// Bytes as they are (the stream is out of sync after them).
    Raw(Vec<u8>),
    /// Hangs up; the next operation opens a new connection.
    Close,
}

/// A whole fuzz input: the operations, in order.
#[derive(Arbitrary, Debug)]
pub struct SessionInput {
    /// What the client does.
    pub ops: Vec<SessionOp>,
}

/// What the driver expects as the answer to a message it sent in sync.
#[derive(Debug)]
enum Expect {
    /// The HelloAck (the limits in force) or an Error.
    Hello,
    /// A valid identity request: a Response carrying exactly these tensors.
    Identity { tensors: Vec<Sent>, timeline: bool },
    /// Any answer with the id; a Response must carry `tensors` when known.
    Reply(Option<Vec<Sent>>),
}

/// One client connection and its session.
struct Connection {
    client: UnixStream,
    session: Option<SocketSession>,
    /// Answers owed, in order, by request id.
    owed: VecDeque<(u64, Expect)>,
    /// Whether the bytes sent so far are whole messages as built.
    in_sync: bool,
    /// The limits of the session's HelloAck, once received.
    granted: Option<Limits>,
    /// The first message sent (a Hello is owed an ack before anything else).
    said_anything: bool,
    /// Bytes written so far (bounded: the socket buffer holds them).
    written: usize,
    /// Answers read and not yet decoded.
    inbox: Vec<u8>,
    /// The session said its last word (an Error with id 0).
    ended: bool,
    /// The last answer was an Error (a session may end after one).
    last_was_error: bool,
}

/// Bytes one connection may be sent in all: what the socket buffers hold
/// while the session does not read.
const MAX_CONNECTION_BYTES: usize = 96 << 10;

impl Connection {
    fn open(fx: &Fixture) -> Connection {
        let (client, server) = UnixStream::pair().expect("socketpair");
        client
            .set_write_timeout(Some(Duration::from_secs(1)))
            .expect("client write timeout");
        client.set_nonblocking(false).expect("blocking client");
        let who = Identity {
            creds: Credentials::of_unix(&server).ok(),
            ..Identity::REMOTE
        };
        let conn = StreamConn::from_unix(server, "fuzz".into());
        let slot = fx
            .conns
            .admit(Conn::Stream(conn.writer().expect("writer")), PeerId::Uid(0))
            .expect("the table has room");
        // A payload read waits at most this long for bytes that are not
        // coming (the driver only runs the session mid-stream in sync).
        let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = conn.set_write_timeout(Some(Duration::from_millis(200)));
        let session = SocketSession::new(fx.core.clone(), conn, who, slot, Via::Unix);
        Connection {
            client,
            session: Some(session),
            owed: VecDeque::new(),
            in_sync: true,
            granted: None,
            said_anything: false,
            written: 0,
            inbox: Vec::new(),
            ended: false,
            last_was_error: false,
        }
    }

    /// Writes `bytes` (all, or as much as the bound allows; false when
    /// nothing more can be sent on this connection).
    fn write(&mut self, bytes: &[u8]) -> bool {
        let room = MAX_CONNECTION_BYTES.saturating_sub(self.written);
        let n = bytes.len().min(room);
        if n < bytes.len() {
            self.in_sync = false;
        }
        if self.client.write_all(&bytes[..n]).is_err() {
            self.in_sync = false;
            return false;
        }
        self.written += n;
        n == bytes.len()
    }

    /// One turn of the session; then reads and checks every answer. Returns
    /// false once the session has ended.
    fn run(&mut self) -> bool {
        let Some(s) = self.session.as_mut() else {
            return false;
        };
        let step = s.run();
        self.read_answers();
        match step {
            Step::Park => {
                if self.in_sync {
                    assert!(
                        self.owed.is_empty(),
                        "the session parked with answers owed: {:?}",
                        self.owed
                    );
                }
                true
            }
            _ => {
                self.session = None;
                false
            }
        }
    }

    /// Reads what the session wrote and checks each whole answer.
    fn read_answers(&mut self) {
        self.client.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 8192];
        loop {
            match self.client.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.client.set_nonblocking(false).expect("blocking");
        while let Some((h, desc, payload)) = take_message(&mut self.inbox) {
            self.check_answer(&h, &desc, &payload);
        }
    }

    fn check_answer(&mut self, h: &Header, desc: &[u8], payload: &[u8]) {
        assert!(!self.ended, "an answer after the session's last: {h:?}");
        self.last_was_error = h.kind == Kind::Error;
        let owed = self.owed.front().map(|(id, _)| *id);
        if owed.is_none() && !self.in_sync {
            // An answer to something sent after the stream left the
            // driver's framing: nothing is known of it.
            return;
        }
        if owed != Some(h.request_id) {
            assert!(
                h.kind == Kind::Error && h.request_id == 0,
                "answer {h:?} is not the next one owed ({owed:?})"
            );
            // The session's last word: the stream could not be trusted.
            self.ended = true;
            return;
        }
        let Some((_, expect)) = self.owed.pop_front() else {
            return;
        };
        match expect {
            Expect::Hello => match h.kind {
                Kind::HelloAck => {
                    let limits = decode_hello(desc).expect("a HelloAck decodes");
                    self.granted = Some(limits);
                }
                Kind::Error => {}
                k => panic!("a Hello answered with {k:?}"),
            },
            Expect::Identity { tensors, timeline } => {
                assert_eq!(
                    h.kind,
                    Kind::Response,
                    "a valid identity request was refused: {h:?} {}",
                    String::from_utf8_lossy(desc)
                );
                assert_eq!(h.flags & flags::HAS_TIMELINE != 0, timeline);
                check_tensors(h, desc, payload, &tensors);
            }
            Expect::Reply(tensors) => {
                if h.kind == Kind::Response {
                    if let Some(t) = tensors {
                        check_tensors(h, desc, payload, &t);
                    }
                }
            }
        }
    }

    /// Hangs up and lets the session see it: it must end within a few
    /// turns, owing nothing it was able to answer.
    fn finish(mut self) {
        let _ = self.client.shutdown(std::net::Shutdown::Write);
        let mut turns = 0;
        while self.session.is_some() {
            turns += 1;
            assert!(
                turns <= 4,
                "the session does not end after the client hung up"
            );
            if !self.run() {
                break;
            }
        }
        if self.in_sync && !self.ended && !self.last_was_error {
            assert!(
                self.owed.is_empty(),
                "the session ended owing answers: {:?}",
                self.owed
            );
        }
    }
}

/// The Response's tensors must be exactly `sent` (dtype, shape, bytes).
fn check_tensors(h: &Header, desc: &[u8], payload: &[u8], sent: &[Sent]) {
    let section = decode_tensor_section(h, desc).expect("the agent's Response decodes");
    assert_eq!(section.tensors.len(), sent.len(), "output count");
    for (t, s) in section.tensors.iter().zip(sent) {
        assert_eq!(
            (t.dtype, &t.shape),
            (s.dtype, &s.shape),
            "output dtype/shape"
        );
        let bytes = &payload[t.offset as usize..(t.offset + t.len) as usize];
        assert!(bytes == s.bytes, "identity changed a tensor's bytes");
    }
}

/// Takes one whole message (header, section, payload) off the front of
/// `inbox`, if it holds one. The agent's messages must decode.
fn take_message(inbox: &mut Vec<u8>) -> Option<(Header, Vec<u8>, Vec<u8>)> {
    if inbox.len() < HEADER_LEN {
        return None;
    }
    let h = Header::decode(&inbox[..HEADER_LEN]).expect("the agent's header decodes");
    let end = HEADER_LEN + h.desc_len as usize + h.payload_len as usize;
    if inbox.len() < end {
        return None;
    }
    let desc = inbox[HEADER_LEN..HEADER_LEN + h.desc_len as usize].to_vec();
    let payload = inbox[HEADER_LEN + h.desc_len as usize..end].to_vec();
    inbox.drain(..end);
    Some((h, desc, payload))
}

/// A request built: its bytes, what it owes, whether it keeps the stream
/// in sync.
struct Built {
    bytes: Vec<u8>,
    id: u64,
    expect: Option<Expect>,
}

/// Encodes `r`: tensors laid out in order with the fuzzer's gaps, each
/// filled with its seeded bytes; a shape too large to send is described
/// but its bytes are not sent (out of sync).
fn build_request(fx: &Fixture, r: &RequestOp, id: u64, granted: Option<&Limits>) -> Built {
    let model_id = fx.model_id(r.model);
    let mut descs = Vec::new();
    let mut sent = Vec::new();
    let mut end = 0u64;
    let mut known = true;
    let mut total = 0u64;
    for (i, t) in r.tensors.iter().enumerate() {
        let dtype = t.dtype();
        let len = t.byte_len();
        let offset = wire::align_up(end).unwrap_or(0) + 64 * u64::from(t.gap % 4);
        let len_or = len.unwrap_or(0);
        total = total.saturating_add(len_or);
        // One entry per tensor: its bytes when they are sent.
        sent.push(match (dtype, len) {
            (Some(dtype), Some(len)) if total <= MAX_REQUEST_BYTES => Some(Sent {
                dtype,
                shape: t.shape(),
                bytes: tensor_bytes(len as usize, t.fill, i),
            }),
            (Some(_), Some(_)) => None,
            _ => {
                known = false;
                None
            }
        });
        descs.push((t.dtype, t.dims.len(), offset, len_or, t.shape()));
        end = offset.saturating_add(len_or);
    }
    let oversize = total > MAX_REQUEST_BYTES;
    let payload_len = end;
    // The descriptor section, written by hand: dtype codes and dim counts
    // as the fuzzer chose them, even where they are invalid.
    let mut desc = Vec::new();
    if known && r.tensors.iter().all(|t| t.dims.len() <= wire::MAX_DIMS) {
        let ts: Vec<TensorDesc> = descs
            .iter()
            .zip(&r.tensors)
            .filter_map(|(d, t)| {
                Some(TensorDesc {
                    dtype: t.dtype()?,
                    shape: d.4.clone(),
                    offset: d.2,
                    len: d.3,
                })
            })
            .collect();
        if ts.len() == descs.len() {
            encode_tensor_section(&ts, None, &mut desc);
        }
    }
    if desc.is_empty() && !descs.is_empty() {
        for (code, ndim, offset, len, shape) in &descs {
            desc.push(*code);
            desc.push(*ndim as u8);
            desc.extend_from_slice(&[0; 6]);
            desc.extend_from_slice(&offset.to_le_bytes());
            desc.extend_from_slice(&len.to_le_bytes());
            for d in shape {
                desc.extend_from_slice(&d.to_le_bytes());
            }
        }
    }
    let mut h = Header::new(Kind::Request);
    h.request_id = id;
    h.model_id = model_id;
    h.tensor_count = r.tensors.len() as u32;
    h.desc_len = desc.len() as u32;
    h.payload_len = payload_len;
    h.flags = r.flags;
    h.timeout_us = r.timeout_us;
    h.priority = r.priority;
    let mut bytes = h.encode().to_vec();
    bytes.extend_from_slice(&desc);
    let mut in_sync = !oversize;
    if !oversize {
        let mut payload = vec![0u8; payload_len as usize];
        for (d, s) in descs.iter().zip(&sent) {
            if let Some(s) = s {
                payload[d.2 as usize..(d.2 + d.3) as usize].copy_from_slice(&s.bytes);
            }
        }
        bytes.extend_from_slice(&payload);
    }
    let mut tweaked = false;
    if let Some(t) = r.tweak {
        tweaked = true;
        let at = |i: u8| HEADER_LEN + descs_offset(&descs, i);
        let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| {
            if at + v.len() <= HEADER_LEN + desc.len() {
                b[at..at + v.len()].copy_from_slice(v);
            }
        };
        match t {
            Tweak::Offset(i, v) => put(&mut bytes, at(i) + 8, &v.to_le_bytes()),
            Tweak::Len(i, v) => put(&mut bytes, at(i) + 16, &v.to_le_bytes()),
            Tweak::Reserved(i, v) => put(&mut bytes, at(i) + 2 + usize::from(v % 6), &[v | 1]),
            Tweak::TensorCount(n) => bytes[20..24].copy_from_slice(&n.to_le_bytes()),
            Tweak::Status(s) => bytes[28..32].copy_from_slice(&s.to_le_bytes()),
            Tweak::PayloadLen(n) => {
                bytes[32..40].copy_from_slice(&n.to_le_bytes());
                in_sync &= n == payload_len;
            }
            Tweak::DescLen(n) => {
                bytes[24..28].copy_from_slice(&n.to_le_bytes());
                in_sync &= n as usize == desc.len();
            }
            Tweak::Truncate(n) => {
                let n = usize::from(n);
                if n < bytes.len() {
                    bytes.truncate(n);
                    in_sync = false;
                }
            }
        }
    }
    let sent: Option<Vec<Sent>> = sent.into_iter().collect();
    let complete = known && !oversize && sent.is_some();
    let tensors = sent.filter(|_| complete);
    let valid = complete
        && !tweaked
        && fx.is_identity(model_id)
        && r.tensors.iter().all(|t| t.dims.len() <= wire::MAX_DIMS)
        && r.flags & !flags::WANT_TIMELINE == 0
        && r.priority == 0
        && r.timeout_us == 0
        && granted.is_some_and(|g| {
            g.max_in_flight >= 1
                && h.tensor_count <= g.max_tensors
                && super::shm::response_fits(&h, g)
                && h.payload_len <= g.max_payload
        });
    let expect = if !in_sync {
        None
    } else if valid {
        Some(Expect::Identity {
            tensors: tensors.unwrap_or_default(),
            timeline: r.flags & flags::WANT_TIMELINE != 0,
        })
    } else {
        Some(Expect::Reply(tensors.filter(|_| !tweaked)))
    };
    Built { bytes, id, expect }
}

/// Where tensor `i`'s descriptor starts in the section (`i` modulo the
/// count; 0 with no tensors).
fn descs_offset(descs: &[(u8, usize, u64, u64, Vec<u64>)], i: u8) -> usize {
    if descs.is_empty() {
        return 0;
    }
    let i = usize::from(i) % descs.len();
    descs[..i].iter().map(|d| 24 + 8 * d.1).sum()
}

/// A control message of `kind` with `body`.
fn control(kind: Kind, id: u64, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(kind);
    h.request_id = id;
    h.desc_len = body.len() as u32;
    let mut b = h.encode().to_vec();
    b.extend_from_slice(body);
    b
}

/// The client side of one input: its connections and its id counter.
struct Driver<'f> {
    fx: &'f Fixture,
    conn: Option<Connection>,
    last_id: u64,
}

impl Driver<'_> {
    fn conn(&mut self) -> &mut Connection {
        self.conn.get_or_insert_with(|| Connection::open(self.fx))
    }

    fn id(&mut self, c: IdChoice) -> u64 {
        self.last_id = match c {
            IdChoice::Next => self.last_id.wrapping_add(1),
            IdChoice::Same => self.last_id,
            IdChoice::Raw(id) => id,
        };
        self.last_id
    }

    /// Sends one message; `expect` is owed if the stream stays in sync.
    fn send(&mut self, bytes: &[u8], id: u64, expect: Option<Expect>) {
        let c = self.conn();
        let whole = c.write(bytes);
        c.said_anything = true;
        match expect {
            Some(e) if whole && c.in_sync => c.owed.push_back((id, e)),
            _ => c.in_sync = false,
        }
    }

    /// Runs the session's turn if the stream is in sync; a session that
    /// ended is checked and closed.
    fn turn(&mut self) {
        let Some(c) = self.conn.as_mut() else {
            return;
        };
        if !c.in_sync {
            return;
        }
        if !c.run() {
            assert!(
                c.ended || c.last_was_error || c.owed.is_empty(),
                "the session ended without saying why, owing {:?}",
                c.owed
            );
            self.close();
        }
    }

    fn close(&mut self) {
        if let Some(c) = self.conn.take() {
            c.finish();
            self.fx.assert_idle();
        }
    }

    fn request(&mut self, r: &RequestOp) {
        let id = self.id(r.id);
        let granted = self.conn().granted;
        let b = build_request(self.fx, r, id, granted.as_ref());
        self.send(&b.bytes, b.id, b.expect);
    }

    fn op(&mut self, op: &SessionOp) {
        match op {
            SessionOp::Hello(hello) => {
                let limits = match hello.limits {
                    AskedLimits::Default => Limits::default(),
                    AskedLimits::Raw {
                        max_tensors,
                        max_in_flight,
                        max_payload,
                        max_desc_len,
                    } => Limits {
                        max_tensors,
                        max_in_flight,
                        max_payload,
                        max_desc_len,
                    },
                };
                let token = (!hello.token.is_empty()).then_some(&hello.token[..]);
                let mut body = encode_hello_as(&limits, token, hello.anonymous);
                if hello.token.len() > wire::MAX_TOKEN_LEN {
                    // encode_hello_as cuts a long token: say its real length.
                    body.truncate(32);
                    let n = hello.token.len().min(usize::from(u16::MAX)) as u16;
                    body[20..22].copy_from_slice(&n.to_le_bytes());
                    body.extend_from_slice(&hello.token[..usize::from(n)]);
                }
                if let Some((at, v)) = hello.poke {
                    body[usize::from(at % 32)] = v;
                }
                body.truncate(body.len().saturating_sub(usize::from(hello.cut)));
                let id = self.id(IdChoice::Next);
                let first = !self.conn().said_anything;
                let expect = if first {
                    Expect::Hello
                } else {
                    Expect::Reply(None)
                };
                self.send(&control(Kind::Hello, id, &body), id, Some(expect));
            }
            SessionOp::Request(r) => self.request(r),
            SessionOp::Pipeline(rs) => {
                for r in rs.iter().take(16) {
                    self.request(r);
                }
            }
            SessionOp::Ping(id) => self.send(
                &control(Kind::Ping, *id, &[]),
                *id,
                Some(Expect::Reply(None)),
            ),
            SessionOp::ListModels(id) => self.send(
                &control(Kind::ListModels, *id, &[]),
                *id,
                Some(Expect::Reply(None)),
            ),
            SessionOp::ModelQuery(id, name) => {
                let body = encode_model_name(name);
                self.send(
                    &control(Kind::ModelQuery, *id, &body),
                    *id,
                    Some(Expect::Reply(None)),
                )
            }
            SessionOp::Release(id) => self.send(
                &control(Kind::Release, *id, &[]),
                *id,
                Some(Expect::Reply(None)),
            ),
            SessionOp::Control { kind, id, body } => {
                let mut b = control(Kind::Ping, *id, body);
                b[6] = *kind;
                // A kind the agent does not know, or one that carries a
                // payload, may end the session: answers are then unknown.
                let known = matches!(
                    Kind::from_code(*kind),
                    Ok(Kind::Ping | Kind::ListModels | Kind::ModelQuery | Kind::Release)
                );
                let expect = known.then_some(Expect::Reply(None));
                self.send(&b, *id, expect)
            }
            SessionOp::Raw(bytes) => self.send(bytes, 0, None),
            SessionOp::Close => {
                self.close();
                return;
            }
        }
        self.turn();
    }
}

/// Runs one fuzz input: [`SessionInput`] decoded from `data` with
/// [`arbitrary`] (at most [`MAX_OPS`] operations), against a fresh core.
pub fn agent_session(data: &[u8]) {
    let Ok(input) = SessionInput::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let fx = Fixture::new();
    let mut d = Driver {
        fx: &fx,
        conn: None,
        last_id: 0,
    };
    for op in input.ops.iter().take(MAX_OPS) {
        d.op(op);
    }
    d.close();
    fx.assert_idle();
}
