//! [`serve_http`]: the HTTP/1 server under the KServe HTTP door and the
//! metrics listener — hyper's connection builder over the connections
//! [`DoorIncoming`] admits, with a deadline on every request's head.
//!
//! `axum::serve` would do the rest, but it runs hyper without a timer, so
//! a client that sends one byte and then trickles its headers kept its
//! connection for as long as it liked. Here hyper gets tokio's timer and
//! `header_read_timeout`: a request's head (request line and headers) must
//! arrive within the agent's `stall_timeout_ms` (30 s by default) or the
//! connection is closed. hyper starts that clock when it begins waiting
//! for a head, so an idle keep-alive connection is closed after the same
//! time, as a server's keep-alive timeout would (clients open a new one).

use crate::accept::DoorIncoming;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Serves `router` on every connection of `incoming` until `stop`
/// completes; then lets each connection finish the request it is on (and
/// closes it) and returns once all have ended. `head_timeout` bounds how
/// long a request's head may take to arrive (module docs).
pub(crate) async fn serve_http(
    mut incoming: DoorIncoming,
    router: Router,
    head_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let (closing_tx, closing_rx) = watch::channel(());
    let mut conns = JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (io, _peer) = tokio::select! {
            c = incoming.next() => c,
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let mut closing = closing_rx.clone();
        conns.spawn(async move {
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(head_timeout)
                .serve_connection(TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = closing.changed() => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
        // Reap the connections that ended, so the set stays as small as
        // the number open.
        while conns.try_join_next().is_some() {}
    }
    drop(incoming);
    drop(closing_tx);
    while conns.join_next().await.is_some() {}
}
