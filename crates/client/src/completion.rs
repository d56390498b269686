//! Completing requests nobody waits for: [`Ticket::on_complete`] callbacks
//! and [`ResponseFuture`]s (`ticket.await`).
//!
//! The client has no I/O thread: a caller waiting for its response reads
//! it ([`crate::conn`]). A callback or a future has no caller waiting, so
//! the first of them on a session starts one completion thread
//! (`tw-complete`) for it. The thread watches every request handed to it;
//! whenever no caller holds the reader role it takes it and reads what
//! comes, and it delivers each response as soon as it is filed, in the
//! order the responses come rather than the order the requests went (the
//! agent answers one session's requests in order today; the completion
//! thread would not hold a fast answer back behind a slow one). A
//! request still unanswered after the client's timeout
//! ([`ClientOptions::timeout`](crate::ClientOptions::timeout)) is given up
//! like a dropped ticket and completes with [`ClientError::Timeout`]; when
//! the session ends, every watched request completes with its error.
//!
//! The thread waits as a caller would ([`crate::service_time`]): over shm
//! it polls once for a request whose answer is expected at once, sleeps
//! while the answers it watches are not yet due (a slow model's compute,
//! which its poll would take a core from), and sleeps after a poll that
//! ran out (or instead of one that would: a kind whose polls keep
//! missing), until an answer wakes it; what it sees teaches the session's
//! estimates as a caller's waits do.
//!
//! Callbacks run on the completion thread, one at a time: a long one
//! delays the others (hand heavy work to another thread). A callback that
//! panics is caught there; the others still run. With nothing to watch,
//! the thread sleeps on its channel, and it ends with the session.
//!
//! Synchronous calls ([`Model::infer`](crate::Model::infer),
//! [`Ticket::wait`]) work beside it unchanged; the two share the reader
//! role as any two waiting callers do.

use crate::conn::{Client, Sent};
use crate::error::ClientError;
use crate::service_time::{Expect, WaitPlan};
use crate::{Response, Ticket};
use std::future::{Future, IntoFuture};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The longest the completion thread reads before it looks at its channel
/// and its requests' deadlines again. A response ends a read at once; this
/// only bounds how late a timeout is noticed.
const PUMP_SLICE: Duration = Duration::from_millis(10);

/// What a finished request is handed to.
type Callback = Box<dyn FnOnce(Result<Response, ClientError>) + Send + 'static>;

/// A session's completion thread, started by its first callback or
/// future. Dropped with the session, which ends the thread.
#[derive(Default)]
pub(crate) struct Completer {
    tx: Mutex<Option<Sender<Job>>>,
}

/// A request the completion thread watches. Dropped without being
/// finished (the thread itself failed), it completes with an error, so no
/// callback is lost and no future waits forever.
struct Job {
    /// Keeps the session alive until the request is complete.
    client: Client,
    sent: Sent,
    deadline: Instant,
    /// Where its wait stands.
    watch: Watch,
    /// Taken when the request is completed.
    deliver: Option<Deliver>,
}

/// Where a watched request's wait stands: the completion thread waits for
/// it as a caller's [`Ticket::wait`] would ([`crate::service_time`]): a
/// kind whose answers come on time is slept through until shortly before
/// it is due, then polled for; others are polled for at once; a poll that
/// ran out is not repeated, the thread sleeps until an answer wakes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watch {
    /// Not polled for yet (or only by a poll cut short).
    Fresh,
    /// The last pump polled for it.
    Polling,
    /// Polled for without its answer: later pumps sleep for it.
    Polled,
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.deliver.is_some() {
            self.complete(Err(ClientError::Protocol(
                "the completion thread stopped before this request completed".into(),
            )));
        }
    }
}

enum Deliver {
    Callback(Callback),
    Future(Arc<Slot>),
}

impl Completer {
    /// Hands `sent` to the completion thread, starting it if needed. If the
    /// thread cannot be started, `deliver` gets that error at once.
    fn watch(&self, client: Client, sent: Sent, deliver: Deliver) {
        let deadline = Instant::now() + client.inner.opts.timeout;
        let job = Job {
            client,
            sent,
            deadline,
            watch: Watch::Fresh,
            deliver: Some(deliver),
        };
        let mut tx = lock(&self.tx);
        if tx.is_none() {
            let (t, rx) = channel();
            let started = std::thread::Builder::new()
                .name("tw-complete".into())
                .spawn(move || run(rx));
            if let Err(e) = started {
                drop(tx);
                job.finish(Err(ClientError::Protocol(format!(
                    "cannot start the completion thread: {e}"
                ))));
                return;
            }
            *tx = Some(t);
        }
        if let Some(t) = tx.as_ref() {
            // The thread ends only when this sender is dropped.
            if let Err(back) = t.send(job) {
                back.0.finish(Err(ClientError::Protocol(
                    "the completion thread has ended".into(),
                )));
            }
        }
    }
}

impl Job {
    /// Completes the request with `r`: runs the callback or wakes the
    /// future. The request's arena pins are released after.
    fn finish(mut self, r: Result<Response, ClientError>) {
        self.complete(r);
    }

    fn complete(&mut self, r: Result<Response, ClientError>) {
        match self.deliver.take() {
            Some(Deliver::Callback(f)) => {
                let panicked = catch_unwind(AssertUnwindSafe(|| f(r))).is_err();
                if panicked {
                    eprintln!(
                        "tensorwire: a completion callback of request {} panicked",
                        self.sent.id
                    );
                }
            }
            Some(Deliver::Future(slot)) => slot.fill(r),
            None => {}
        }
    }
}

/// The completion thread: delivers what has come, then reads until the
/// next response, job or deadline; returns when the session is gone.
fn run(rx: Receiver<Job>) {
    let mut jobs: Vec<Job> = Vec::new();
    // Whether the last pump polled for its whole budget and nothing came.
    let mut missed = false;
    loop {
        if jobs.is_empty() {
            // Nothing watched: no session reference is held while asleep,
            // so dropping the session ends the channel and the thread.
            match rx.recv() {
                Ok(j) => jobs.push(j),
                Err(_) => return,
            }
        }
        jobs.extend(rx.try_iter());
        let now = Instant::now();
        let mut i = 0;
        while i < jobs.len() {
            let j = &jobs[i];
            let inner = &j.client.inner;
            let r = match inner.take_done(j.sent.id) {
                Some(Ok(frame)) => {
                    learn(j, true);
                    Some(inner.complete(&j.sent, frame))
                }
                Some(Err(e)) => Some(Err(e)),
                None if now >= j.deadline => Some(Err(ClientError::Timeout(inner.opts.timeout))),
                None => None,
            };
            match r {
                Some(r) => {
                    let mut j = jobs.swap_remove(i);
                    if matches!(r, Err(ClientError::Timeout(_))) {
                        // Its answer may still come: dropped then, pins kept.
                        let pins = std::mem::take(&mut j.sent.pins);
                        j.client.inner.abandon(j.sent.id, pins);
                    }
                    j.finish(r);
                }
                None => i += 1,
            }
        }
        // The requests the last pump polled for and did not get: polled
        // (when that poll ran out), or to poll for again.
        for j in jobs.iter_mut().filter(|j| j.watch == Watch::Polling) {
            j.watch = if missed {
                learn(j, false);
                Watch::Polled
            } else {
                Watch::Fresh
            };
        }
        missed = false;
        let Some(first) = jobs.first() else { continue };
        let next = jobs.iter().map(|j| j.deadline).min().unwrap_or(now);
        let mut limit = next
            .saturating_duration_since(Instant::now())
            .min(PUMP_SLICE);
        if !first.client.inner.pump_polls() {
            first.client.inner.pump(limit, false);
            continue;
        }
        let now = Instant::now();
        let mut poll = false;
        for j in jobs.iter_mut().filter(|j| j.watch == Watch::Fresh) {
            match due(j).filter(|&at| at > now) {
                Some(at) => limit = limit.min(at - now),
                // A timed kind whose polls keep missing is not polled for.
                None if j.sent.plan.as_ref().is_some_and(|p| !p.polls()) => {
                    j.watch = Watch::Polled;
                }
                None => {
                    j.watch = Watch::Polling;
                    poll = true;
                }
            }
        }
        let inner = &jobs[0].client.inner;
        if poll {
            // A pass of its own, to tell a poll that missed.
            missed = inner.pump(limit.min(inner.opts.spin), true);
        } else {
            inner.pump(limit, false);
        }
    }
}

/// When the wait for `j` should poll ([`WaitPlan::sleep_until`]); `None`:
/// at once.
fn due(j: &Job) -> Option<Instant> {
    j.sent.plan.as_ref().and_then(WaitPlan::sleep_until)
}

/// Tells the session's wait estimates how the wait for `j` went: its
/// answer came (`answered`), or a poll for it ran out.
fn learn(j: &Job, answered: bool) {
    let Some(plan) = &j.sent.plan else { return };
    let inner = &j.client.inner;
    let times = inner.service_times();
    // Only a pump that polls (shm) judges its polls.
    if inner.pump_polls() {
        let timed = matches!(plan.expect, Expect::Timed { .. });
        match (answered, j.watch) {
            // A timed kind's poll (after a sleep, or at once): caught or not.
            (true, Watch::Polling) if timed => times.polled(plan.key, true),
            (false, _) if timed => times.polled(plan.key, false),
            // A fast-mode poll that missed: time this kind from now on.
            (false, _) => times.missed(plan.key),
            _ => {}
        }
    }
    if answered {
        plan.answered(times, inner.opts.spin);
    }
}

impl Ticket {
    /// Calls `f` with this request's response (or error) when it comes, on
    /// the session's completion thread (see the `completion` module); returns
    /// at once. `f` runs exactly once, also when the request times out
    /// ([`ClientError::Timeout`], after the client's timeout) or the
    /// session ends.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// use std::sync::mpsc;
    /// # let dir = tempfile::tempdir()?;
    /// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("shm://agent")?;
    /// # cfg.models.push(server::ModelConfig::new(
    /// #     "digits",
    /// #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
    /// # ));
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("shm://agent")?;
    /// let model = c.model("digits")?;
    /// let x = vec![0f32; 64];
    /// let (tx, rx) = mpsc::channel();
    /// for i in 0..8 {
    ///     let tx = tx.clone();
    ///     model
    ///         .submit(&[TensorRef::from_slice(&[1, 64], &x)?])?
    ///         .on_complete(move |r| drop(tx.send((i, r.map(|r| r.outputs[0].shape.clone())))));
    /// }
    /// let mut done = Vec::new();
    /// for _ in 0..8 {
    ///     let (i, shape) = rx.recv()?; // every callback runs exactly once
    ///     assert_eq!(shape?, [1, 10]);
    ///     done.push(i);
    /// }
    /// done.sort();
    /// assert_eq!(done, (0..8).collect::<Vec<_>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_complete<F>(self, f: F)
    where
        F: FnOnce(Result<Response, ClientError>) + Send + 'static,
    {
        let (client, sent) = self.into_parts();
        let completer = &client.inner.completer;
        completer.watch(client.clone(), sent, Deliver::Callback(Box::new(f)));
    }
}

/// A request's response as a [`Future`], made by `ticket.await` (or
/// [`Ticket::into_future`](IntoFuture::into_future)). It needs no
/// particular runtime: the session's completion thread wakes it. Dropping
/// it before it is ready discards the response when it comes.
///
/// # Examples
///
/// Any executor drives it; here a minimal one made of `std` parts:
///
/// ```
/// use client::{Client, TensorRef};
/// # use std::future::Future;
/// # use std::sync::Arc;
/// # use std::task::{Context, Poll, Wake};
/// # struct Unpark(std::thread::Thread);
/// # impl Wake for Unpark {
/// #     fn wake(self: Arc<Self>) {
/// #         self.0.unpark();
/// #     }
/// # }
/// # /// Polls `f` on this thread, parking between polls.
/// # fn block_on<F: Future>(f: F) -> F::Output {
/// #     let waker = Arc::new(Unpark(std::thread::current())).into();
/// #     let mut cx = Context::from_waker(&waker);
/// #     let mut f = std::pin::pin!(f);
/// #     loop {
/// #         if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
/// #             return v;
/// #         }
/// #         std::thread::park();
/// #     }
/// # }
/// # let dir = tempfile::tempdir()?;
/// # let sock = dir.path().join("agent.sock");
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen(&format!("unix://{}", sock.display()))?;
/// # cfg.models.push(server::ModelConfig::new(
/// #     "digits",
/// #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
/// # ));
/// # let _agent = server::Agent::start(cfg)?;
/// # let uri = format!("unix://{}", sock.display());
/// async fn two_at_once(uri: &str) -> Result<(), client::ClientError> {
///     let c = Client::connect(uri)?;
///     let model = c.model("digits")?;
///     let x = vec![0f32; 64];
///     let a = model.submit(&[TensorRef::from_slice(&[1, 64], &x)?])?;
///     let b = model.submit(&[TensorRef::from_slice(&[1, 64], &x)?])?;
///     let (a, b) = (a.await?, b.await?);
///     assert_eq!(a.outputs[0].to_vec::<f32>()?, b.outputs[0].to_vec::<f32>()?);
///     Ok(())
/// }
/// block_on(two_at_once(&uri))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "futures do nothing unless awaited; the request is already sent"]
pub struct ResponseFuture {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

/// Where the completion thread leaves a future's result.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    result: Option<Result<Response, ClientError>>,
    /// Set once the result has been taken: polling again is a misuse.
    taken: bool,
    waker: Option<Waker>,
}

impl Slot {
    fn fill(&self, r: Result<Response, ClientError>) {
        let waker = {
            let mut st = lock(&self.state);
            st.result = Some(r);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl IntoFuture for Ticket {
    type Output = Result<Response, ClientError>;
    type IntoFuture = ResponseFuture;

    /// Hands the request to the completion thread and returns its future.
    fn into_future(self) -> ResponseFuture {
        let slot = Arc::new(Slot::default());
        let (client, sent) = self.into_parts();
        let completer = &client.inner.completer;
        completer.watch(client.clone(), sent, Deliver::Future(slot.clone()));
        ResponseFuture { slot }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response, ClientError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = lock(&self.slot.state);
        if let Some(r) = st.result.take() {
            st.taken = true;
            return Poll::Ready(r);
        }
        if st.taken {
            return Poll::Ready(Err(ClientError::Protocol(
                "ResponseFuture polled after it completed".into(),
            )));
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
