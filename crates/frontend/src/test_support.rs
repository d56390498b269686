//! Helpers the crate's unit tests share: an agent core serving identity,
//! and a bare HTTP/1.1 GET for the status of a front door's route.

use server::dispatch::AgentCore;
use server::ModelRegistry;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use wire::Limits;

/// A core serving the identity model, default limits, a 1 MiB budget.
pub(crate) fn identity_core() -> Arc<AgentCore> {
    Arc::new(AgentCore::new(
        ModelRegistry::with_identity(),
        Limits::default(),
        1 << 20,
    ))
}

/// The status code of `GET path` on `uri` (`http://HOST:PORT`).
pub(crate) fn http_status(uri: &str, path: &str) -> u16 {
    let addr = uri.trim_start_matches(crate::HTTP_SCHEME);
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {reply:?}"))
}
