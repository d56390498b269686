//! Prometheus metrics: [`Metrics`] renders the agent's per-model statistics
//! and the process's CPU and memory in the text exposition format (served
//! as `GET /metrics` on every HTTP front door), and [`MetricsListener`] is
//! the metrics-only listener (`serve --metrics-listen http://HOST:PORT`,
//! as Triton serves its metrics on a port of their own).
//!
//! With a tenants file, the `tensorwire_tenant_*` families add each
//! tenant's counters (`server::tenants::Tenants::snapshot`, label
//! `tenant`: requests admitted, refused for rights, refused by quotas, in
//! flight, queued, sessions open, agent CPU seconds); without one they are
//! not exported.
//!
//! Values are read from each model's `server::ModelStats` when scraped, by
//! a custom collector that walks the registry at every scrape (so models
//! loaded later appear): the request path never touches this module or the
//! metrics library, only the core's relaxed atomic counters.
//!
//! The crate is `prometheus` (tikv/rust-prometheus), not
//! `prometheus-client`: its text encoder writes the classic 0.0.4 format
//! Triton serves, with counter names exactly as given (the OpenMetrics
//! encoder of `prometheus-client` appends `_total` to every counter, which
//! would rename Triton's `nv_inference_request_success` and break
//! dashboards written for Triton); its `Collector` trait lets the families
//! be built at scrape time; it escapes label values (model names) and
//! checks metric names. Its own lock-free histograms are not used: the
//! core keeps integer buckets itself (one relaxed add per observation,
//! where `prometheus::Histogram::observe` also updates an f64 sum by
//! compare-and-swap). Nor is its process collector: in 0.14 it truncates
//! `process_cpu_seconds_total` to whole seconds, useless for `rate()` on an
//! agent that uses a fraction of a core, so [`ProcessCollector`] reads the
//! standard `process_*` metrics here (CPU time from
//! `CLOCK_PROCESS_CPUTIME_ID`, memory, fds, threads and start time from
//! `/proc/self`).

use crate::server::{parse_host_port, FrontendError, Running};
use crate::service::Shared;
use crate::HTTP_SCHEME;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use prometheus::{Encoder, Registry, TextEncoder};
use server::dispatch::AgentCore;
use server::queue::QueueStats;
use server::stats::{DURATION_BOUNDS_NS, DURATION_BUCKETS};
use server::tenants::TenantSnapshot;
use server::{StatsSnapshot, Via};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One metric family: name, help, type and label names (`model` and
/// `version`, plus `transport` for one; none: agent-wide).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
}

const MODEL: &[&str] = &["model", "version"];
const MODEL_TRANSPORT: &[&str] = &["model", "version", "transport"];
const MODEL_COPY: &[&str] = &["model", "version", "kind"];
const TENANT: &[&str] = &["tenant"];
/// The `kind` values of `tensorwire_batch_copy_bytes_total`, in
/// [`model_metrics`]' order.
const COPY_KINDS: [&str; 3] = ["staged", "gathered", "output"];

const fn family(
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
) -> Family {
    Family {
        name,
        help,
        kind,
        labels,
    }
}

use MetricType::{COUNTER, GAUGE, HISTOGRAM};

/// Every family the collector exports, in the order of [`CoreCollector::collect`].
const FAMILIES: &[Family] = &[
    family(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_count",
        "Number of inferences performed (no batching: one per successful request)",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_exec_count",
        "Number of model executions performed (no batching: one per successful request)",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (successful requests, arrival at the agent's core to response)",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (descriptors checked, payload in place, views built)",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (the engine's run)",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_compute_output_duration_us",
        "Cumulative compute output duration in microseconds (outputs checked and placed, response encoded)",
        COUNTER,
        MODEL,
    ),
    family(
        "nv_inference_pending_request_count",
        "Instantaneous number of requests waiting in the model's queue for their turn to run",
        GAUGE,
        MODEL,
    ),
    family(
        "tensorwire_queue_running",
        "Instantaneous number of engine runs of the model in progress (a batch is one run)",
        GAUGE,
        MODEL,
    ),
    family(
        "tensorwire_queue_runs_total",
        "Engine runs of the model completed (successful or not; a batch is one run)",
        COUNTER,
        MODEL,
    ),
    family(
        "tensorwire_queue_overloaded_total",
        "Requests refused at once because the model's queue was full (max_queue)",
        COUNTER,
        MODEL,
    ),
    family(
        "tensorwire_queue_timeouts_total",
        "Requests that waited their whole queue timeout and were not computed",
        COUNTER,
        MODEL,
    ),
    family(
        "tensorwire_queue_preempted_total",
        "Runs stopped for a request whose turn came first (preempt = true); each stopped request ran again",
        COUNTER,
        MODEL,
    ),
    family(
        "tensorwire_batches_total",
        "Engine runs that served more than one request (dynamic batching)",
        COUNTER,
        MODEL,
    ),
    family(
        "tensorwire_batched_requests_total",
        "Requests served in those runs (mean batch = this / tensorwire_batches_total)",
        COUNTER,
        MODEL,
    ),
    family(
        "tensorwire_batch_copy_bytes_total",
        "Bytes the batcher copied: inputs staged into tensor queues (staged), batches gathered \
         because their members were not back to back (gathered), output rows copied out of a \
         batch (output)",
        COUNTER,
        MODEL_COPY,
    ),
    family(
        "tensorwire_request_duration_seconds",
        "Successful requests' durations, arrival at the agent's core to response",
        HISTOGRAM,
        MODEL,
    ),
    family(
        "tensorwire_queue_duration_seconds",
        "Successful requests' waits in the model's queue",
        HISTOGRAM,
        MODEL,
    ),
    family(
        "tensorwire_compute_duration_seconds",
        "Successful requests' engine runs",
        HISTOGRAM,
        MODEL,
    ),
    family(
        "tensorwire_requests_total",
        "Requests for the model per transport or front door (inproc, unix, tcp, shm, grpc, http, other), whatever their outcome",
        COUNTER,
        MODEL_TRANSPORT,
    ),
    family(
        "tensorwire_inflight_requests",
        "Requests of the model admitted by the agent and not yet answered",
        GAUGE,
        MODEL,
    ),
    family(
        "tensorwire_tenant_requests_total",
        "Requests of the tenant the agent admitted (every transport and front door)",
        COUNTER,
        TENANT,
    ),
    family(
        "tensorwire_tenant_denied_total",
        "Requests and sessions of the tenant refused for lack of rights (a model it may not use, \
         an operator action, a token no tenant lists: counted in default)",
        COUNTER,
        TENANT,
    ),
    family(
        "tensorwire_tenant_over_quota_total",
        "Requests and sessions of the tenant refused by one of its quotas (in flight, queued, \
         request bytes, rate, connections)",
        COUNTER,
        TENANT,
    ),
    family(
        "tensorwire_tenant_in_flight",
        "Requests of the tenant admitted and not yet answered",
        GAUGE,
        TENANT,
    ),
    family(
        "tensorwire_tenant_queued",
        "Requests of the tenant waiting in model queues",
        GAUGE,
        TENANT,
    ),
    family(
        "tensorwire_tenant_connections",
        "Native sessions of the tenant open (front-door calls hold none)",
        GAUGE,
        TENANT,
    ),
    family(
        "tensorwire_tenant_cpu_seconds_total",
        "Agent CPU time spent on the tenant's requests, in seconds",
        COUNTER,
        TENANT,
    ),
    family(
        "tensorwire_responses_total",
        "Requests the agent answered with a response, all models and transports",
        COUNTER,
        &[],
    ),
    family(
        "tensorwire_errors_total",
        "Messages the agent answered with an error, all models and transports (also those for no known model)",
        COUNTER,
        &[],
    ),
];

/// The collector over an agent core: every family, built from the
/// registry and each model's statistics at each scrape.
struct CoreCollector {
    core: Arc<AgentCore>,
    descs: Vec<Desc>,
}

impl CoreCollector {
    fn new(core: Arc<AgentCore>) -> prometheus::Result<CoreCollector> {
        let descs = FAMILIES
            .iter()
            .map(|f| {
                Desc::new(
                    f.name.to_string(),
                    f.help.to_string(),
                    f.labels.iter().map(|l| l.to_string()).collect(),
                    HashMap::new(),
                )
            })
            .collect::<prometheus::Result<Vec<Desc>>>()?;
        Ok(CoreCollector { core, descs })
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).to_string());
            l.set_value((*v).to_string());
            l
        })
        .collect()
}

fn counter(v: f64) -> Metric {
    let mut c = Counter::default();
    c.set_value(v);
    let mut m = Metric::default();
    m.set_counter(c);
    m
}

fn gauge(v: f64) -> Metric {
    Metric::from_gauge({
        let mut g = Gauge::default();
        g.set_value(v);
        g
    })
}

/// A histogram in seconds from per-bucket counts over
/// [`DURATION_BOUNDS_NS`] (the last count is `+Inf`) and their sum in ns.
fn histogram(counts: &[u64; DURATION_BUCKETS], sum_ns: u64) -> Metric {
    let mut cumulative = 0;
    let buckets = DURATION_BOUNDS_NS
        .iter()
        .zip(counts)
        .map(|(&bound, &n)| {
            cumulative += n;
            let mut b = Bucket::default();
            b.set_upper_bound(bound as f64 / 1e9);
            b.set_cumulative_count(cumulative);
            b
        })
        .collect();
    let mut h = Histogram::default();
    h.set_bucket(buckets);
    // The count is the buckets' total (+Inf included), so it agrees with
    // them even when requests finish during the scrape.
    h.set_sample_count(counts.iter().sum());
    h.set_sample_sum(sum_ns as f64 / 1e9);
    let mut m = Metric::default();
    m.set_histogram(h);
    m
}

/// Microseconds of a ns total, as Triton reports its duration counters.
fn us(ns: u64) -> f64 {
    (ns / 1000) as f64
}

/// The metrics of family `i` for one model.
fn model_metrics(i: usize, s: &StatsSnapshot, q: &QueueStats) -> Vec<Metric> {
    let one = |m: Metric| vec![m];
    match FAMILIES[i].name {
        "nv_inference_request_success" => one(counter(s.success.count as f64)),
        "nv_inference_request_failure" => one(counter(s.fail.count as f64)),
        "nv_inference_count" => one(counter(s.inference_count as f64)),
        "nv_inference_exec_count" => one(counter(s.execution_count as f64)),
        "nv_inference_request_duration_us" => one(counter(us(s.success.ns))),
        "nv_inference_queue_duration_us" => one(counter(us(s.queue.ns))),
        "nv_inference_compute_input_duration_us" => one(counter(us(s.compute_input.ns))),
        "nv_inference_compute_infer_duration_us" => one(counter(us(s.compute_infer.ns))),
        "nv_inference_compute_output_duration_us" => one(counter(us(s.compute_output.ns))),
        "nv_inference_pending_request_count" => one(gauge(q.waiting as f64)),
        "tensorwire_queue_running" => one(gauge(q.running as f64)),
        "tensorwire_queue_runs_total" => one(counter(q.completed as f64)),
        "tensorwire_queue_overloaded_total" => one(counter(q.overloaded as f64)),
        "tensorwire_queue_timeouts_total" => one(counter(q.timed_out as f64)),
        "tensorwire_queue_preempted_total" => one(counter(q.preempted as f64)),
        "tensorwire_batches_total" => one(counter(s.batches as f64)),
        "tensorwire_batched_requests_total" => one(counter(s.batched_requests as f64)),
        "tensorwire_batch_copy_bytes_total" => [
            s.batch_staged_bytes,
            s.batch_gathered_bytes,
            s.batch_output_bytes,
        ]
        .iter()
        .map(|&b| counter(b as f64))
        .collect(),
        "tensorwire_request_duration_seconds" => one(histogram(&s.request_hist, s.success.ns)),
        "tensorwire_queue_duration_seconds" => one(histogram(&s.queue_hist, s.queue.ns)),
        "tensorwire_compute_duration_seconds" => {
            one(histogram(&s.compute_hist, s.compute_infer.ns))
        }
        "tensorwire_requests_total" => Via::ALL
            .iter()
            .map(|v| counter(s.by_via[*v as usize] as f64))
            .collect(),
        "tensorwire_inflight_requests" => one(gauge(s.in_flight as f64)),
        _ => Vec::new(),
    }
}

/// The metric of family `name` for one tenant (none for the families
/// that are not the tenants').
fn tenant_metric(name: &str, t: &TenantSnapshot) -> Option<Metric> {
    Some(match name {
        "tensorwire_tenant_requests_total" => counter(t.requests as f64),
        "tensorwire_tenant_denied_total" => counter(t.denied as f64),
        "tensorwire_tenant_over_quota_total" => counter(t.over_quota as f64),
        "tensorwire_tenant_in_flight" => gauge(f64::from(t.in_flight)),
        "tensorwire_tenant_queued" => gauge(f64::from(t.queued)),
        "tensorwire_tenant_connections" => gauge(f64::from(t.connections)),
        "tensorwire_tenant_cpu_seconds_total" => counter(t.cpu_ns as f64 / 1e9),
        _ => return None,
    })
}

impl Collector for CoreCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families: Vec<MetricFamily> = FAMILIES
            .iter()
            .map(|f| {
                let mut mf = MetricFamily::default();
                mf.set_name(f.name.to_string());
                mf.set_help(f.help.to_string());
                mf.set_field_type(f.kind);
                mf
            })
            .collect();
        for model in self.core.registry.models() {
            let name = model.signature().name.as_str();
            let version = model.version.to_string();
            let s = model.stats.snapshot();
            let q = model.queue.stats();
            for (i, mf) in families.iter_mut().enumerate() {
                let with_transport = FAMILIES[i].labels == MODEL_TRANSPORT;
                for (j, mut m) in model_metrics(i, &s, &q).into_iter().enumerate() {
                    let mut pairs = vec![("model", name), ("version", version.as_str())];
                    if with_transport {
                        pairs.push(("transport", Via::ALL[j].name()));
                    } else if FAMILIES[i].labels == MODEL_COPY {
                        pairs.push(("kind", COPY_KINDS[j]));
                    }
                    m.set_label(labels(&pairs));
                    mf.mut_metric().push(m);
                }
            }
        }
        if let Some(tenants) = self.core.tenants() {
            for t in tenants.snapshot() {
                for (i, mf) in families.iter_mut().enumerate() {
                    if let Some(mut m) = tenant_metric(FAMILIES[i].name, &t) {
                        m.set_label(labels(&[("tenant", t.name.as_str())]));
                        mf.mut_metric().push(m);
                    }
                }
            }
        }
        let c = &self.core.counters;
        for mf in &mut families {
            let v = match mf.name() {
                "tensorwire_responses_total" => c.responses.load(Ordering::Relaxed),
                "tensorwire_errors_total" => c.errors.load(Ordering::Relaxed),
                _ => continue,
            };
            mf.mut_metric().push(counter(v as f64));
        }
        families
    }
}

/// The standard `process_*` metrics of this process, read at each scrape.
struct ProcessCollector {
    descs: Vec<Desc>,
}

/// The process families: name, help, type.
const PROCESS: &[(&str, &str, MetricType)] = &[
    (
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        COUNTER,
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        GAUGE,
    ),
    (
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        GAUGE,
    ),
    (
        "process_open_fds",
        "Number of open file descriptors.",
        GAUGE,
    ),
    (
        "process_threads",
        "Number of OS threads in the process.",
        GAUGE,
    ),
    (
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        GAUGE,
    ),
];

impl ProcessCollector {
    fn new() -> prometheus::Result<ProcessCollector> {
        let descs = PROCESS
            .iter()
            .map(|(name, help, _)| {
                Desc::new(
                    name.to_string(),
                    help.to_string(),
                    Vec::new(),
                    HashMap::new(),
                )
            })
            .collect::<prometheus::Result<Vec<Desc>>>()?;
        Ok(ProcessCollector { descs })
    }

    /// The value of family `name` now, if it can be read.
    fn read(name: &str) -> Option<f64> {
        let page = rustix::param::page_size() as f64;
        let entries = |dir: &str| std::fs::read_dir(dir).ok().map(|d| d.count() as f64);
        // /proc/self/statm: size resident shared text lib data dt (pages).
        let statm = |field: usize| -> Option<f64> {
            let s = std::fs::read_to_string("/proc/self/statm").ok()?;
            let pages: f64 = s.split_whitespace().nth(field)?.parse().ok()?;
            Some(pages * page)
        };
        match name {
            "process_cpu_seconds_total" => {
                let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
                Some(t.tv_sec as f64 + t.tv_nsec as f64 / 1e9)
            }
            "process_resident_memory_bytes" => statm(1),
            "process_virtual_memory_bytes" => statm(0),
            "process_open_fds" => entries("/proc/self/fd"),
            "process_threads" => entries("/proc/self/task"),
            "process_start_time_seconds" => start_time_seconds(),
            _ => None,
        }
    }
}

/// When this process started, in seconds since the epoch: its start in
/// clock ticks after boot (`/proc/self/stat` field 22) plus the boot time
/// (`btime` in `/proc/stat`).
fn start_time_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces and parens):
    // field 3 (state) is the first after the last ')'.
    let after = stat.rsplit_once(')')?.1;
    let ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(boot + ticks / rustix::param::clock_ticks_per_second() as f64)
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        PROCESS
            .iter()
            .filter_map(|&(name, help, kind)| {
                let v = ProcessCollector::read(name)?;
                let mut mf = MetricFamily::default();
                mf.set_name(name.to_string());
                mf.set_help(help.to_string());
                mf.set_field_type(kind);
                mf.set_metric(vec![if kind == COUNTER {
                    counter(v)
                } else {
                    gauge(v)
                }]);
                Some(mf)
            })
            .collect()
    }
}

/// An agent's metrics, rendered on demand.
pub struct Metrics {
    registry: Registry,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// The metrics of the agent `core` and of this process.
    pub fn new(core: Arc<AgentCore>) -> Result<Metrics, FrontendError> {
        let err = |e: prometheus::Error| FrontendError::Metrics(e.to_string());
        let registry = Registry::new();
        registry
            .register(Box::new(CoreCollector::new(core).map_err(err)?))
            .map_err(err)?;
        registry
            .register(Box::new(ProcessCollector::new().map_err(err)?))
            .map_err(err)?;
        Ok(Metrics { registry })
    }

    /// Every metric now, in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> Result<String, String> {
        let mut out = Vec::with_capacity(16 << 10);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| format!("cannot encode the metrics: {e}"))?;
        String::from_utf8(out).map_err(|e| format!("the metrics are not UTF-8: {e}"))
    }

    /// `GET /metrics`: the text format, or 500 saying why not.
    pub(crate) fn response(&self) -> Response {
        match self.render() {
            Ok(body) => {
                let mut r = (StatusCode::OK, body).into_response();
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(prometheus::TEXT_FORMAT),
                );
                r
            }
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    }
}

/// A running metrics-only listener: `GET /metrics` on `http://HOST:PORT`,
/// nothing else.
///
/// Dropping it without [`shutdown`](MetricsListener::shutdown) stops it the
/// same way. Either must happen outside any tokio runtime.
#[derive(Debug)]
pub struct MetricsListener(Running);

impl MetricsListener {
    /// Starts serving the metrics of `core` on `listen` (`http://HOST:PORT`,
    /// port 0 picks a free one). Returns once the socket is listening.
    pub fn start(listen: &str, core: Arc<AgentCore>) -> Result<MetricsListener, FrontendError> {
        let addr = parse_metrics_uri(listen)?;
        let metrics = Arc::new(Metrics::new(core.clone())?);
        let router = Router::new()
            .route(
                "/metrics",
                get(move || {
                    let m = metrics.clone();
                    async move { m.response() }
                }),
            )
            .fallback(|| async {
                (
                    StatusCode::NOT_FOUND,
                    "this listener serves GET /metrics only",
                )
            });
        Running::start(
            listen,
            addr,
            HTTP_SCHEME,
            "tw-metrics",
            Arc::new(Shared::default()),
            // Admitted and deadlined as the KServe doors' connections are.
            |listener, stopped| async move {
                let incoming = crate::accept::DoorIncoming::start(listener, &core, None, false);
                let head_timeout = core.stall_timeout();
                crate::serve_http::serve_http(incoming, router, head_timeout, async move {
                    let _ = stopped.await;
                })
                .await;
            },
        )
        .map(MetricsListener)
    }

    /// The URI it listens on, with the port it was given for port 0.
    pub fn uri(&self) -> &str {
        self.0.uri()
    }

    /// Stops serving.
    pub fn shutdown(self) {
        self.0.shutdown();
    }
}

/// The `HOST:PORT` of a metrics listener's `http://HOST:PORT`.
pub fn parse_metrics_uri(uri: &str) -> Result<&str, FrontendError> {
    parse_host_port(uri, &[HTTP_SCHEME], "metrics").map(|(_, addr)| addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::identity_core as core;
    use wire::Timeline;

    /// The value of the sample `line_start` (name and labels) in `text`.
    fn sample(text: &str, line_start: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("no {line_start} in\n{text}"));
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("bad sample {line}"))
    }

    #[test]
    fn the_queue_refusals_are_counted() {
        use server::{Ask, ModelRegistry, NewModel, QueuePolicy};
        use std::time::Duration;
        let registry = ModelRegistry::with_identity();
        registry.install(NewModel {
            backend: Arc::new(engine::IdentityBackend::named("q")),
            concurrency: 1,
            version: 1,
            outputs_in_place: false,
            policy: QueuePolicy {
                max_queue: 1,
                ..QueuePolicy::default()
            },
            batching: server::BatchPolicy::default(),
        });
        let core = Arc::new(AgentCore::new(registry, wire::Limits::default(), 1 << 20));
        let m = Metrics::new(core.clone()).expect("metrics");
        let model = core.registry.find("q").expect("q");
        // Holds the model's one run until the returned sender sends.
        let hold = || {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let model = model.clone();
            let h = std::thread::spawn(move || {
                let _ = model
                    .queue
                    .run(Ask::default(), &mut Timeline::default(), || {
                        let _ = rx.recv();
                    });
            });
            (tx, h)
        };
        let wait = |cond: &dyn Fn(server::queue::QueueStats) -> bool| {
            while !cond(model.queue.stats()) {
                std::thread::yield_now();
            }
        };
        // The line's one place taken: one more is refused at once.
        let (tx, holder) = hold();
        wait(&|s| s.running == 1);
        let waiter = {
            let model = model.clone();
            std::thread::spawn(move || {
                model
                    .queue
                    .run(Ask::default(), &mut Timeline::default(), || ())
            })
        };
        wait(&|s| s.waiting == 1);
        let q = r#"{model="q",version="1"}"#;
        let held = m.render().expect("render");
        assert_eq!(sample(&held, &format!("tensorwire_queue_running{q}")), 1.0);
        assert_eq!(
            sample(&held, &format!("nv_inference_pending_request_count{q}")),
            1.0
        );
        assert_eq!(
            sample(&held, &format!("tensorwire_queue_runs_total{q}")),
            0.0
        );
        assert!(model
            .queue
            .run(Ask::default(), &mut Timeline::default(), || ())
            .is_err());
        let _ = tx.send(());
        holder.join().expect("holder");
        assert!(waiter.join().expect("waiter").is_ok());
        // A request whose 20 ms in line run out.
        let (tx, holder) = hold();
        wait(&|s| s.running == 1);
        let timeout = Ask {
            priority: 0,
            timeout: Some(Duration::from_millis(20)),
        };
        assert!(model
            .queue
            .run(timeout, &mut Timeline::default(), || ())
            .is_err());
        let _ = tx.send(());
        holder.join().expect("holder");
        let text = m.render().expect("render");
        assert_eq!(
            sample(&text, &format!("tensorwire_queue_runs_total{q}")),
            3.0,
            "the holder, the waiter and the second holder ran"
        );
        assert_eq!(sample(&text, &format!("tensorwire_queue_running{q}")), 0.0);
        assert_eq!(
            sample(&text, &format!("tensorwire_queue_overloaded_total{q}")),
            1.0
        );
        assert_eq!(
            sample(&text, &format!("tensorwire_queue_timeouts_total{q}")),
            1.0
        );
        assert!(text.contains("# TYPE tensorwire_queue_overloaded_total counter"));
        assert_eq!(
            sample(&text, &format!("tensorwire_queue_preempted_total{q}")),
            0.0
        );
        // No batching on this model: the batch families are there, at 0.
        assert_eq!(sample(&text, &format!("tensorwire_batches_total{q}")), 0.0);
        let staged = r#"{model="q",version="1",kind="staged"}"#;
        assert_eq!(
            sample(&text, &format!("tensorwire_batch_copy_bytes_total{staged}")),
            0.0
        );
    }

    #[test]
    fn renders_the_models_statistics_at_scrape_time() {
        let core = core();
        let m = Metrics::new(core.clone()).expect("metrics");
        let before = m.render().expect("render");
        let id = r#"{model="identity",version="1"}"#;
        assert_eq!(
            sample(&before, &format!("nv_inference_request_success{id}")),
            0.0
        );
        let stats = &core.registry.find("identity").expect("identity").stats;
        stats.arrived(Via::Shm);
        // 3 µs from arrival to response, 2 µs of it in the engine.
        stats.record_success(
            &Timeline::from_stamps([1000, 1000, 1500, 1500, 3500, 4000]),
            true,
        );
        stats.record_failure(0);
        let after = m.render().expect("render");
        assert_eq!(
            sample(&after, &format!("nv_inference_request_success{id}")),
            1.0
        );
        assert_eq!(
            sample(&after, &format!("nv_inference_request_failure{id}")),
            1.0
        );
        assert_eq!(
            sample(&after, &format!("nv_inference_request_duration_us{id}")),
            3.0
        );
        assert_eq!(
            sample(
                &after,
                &format!("nv_inference_compute_infer_duration_us{id}")
            ),
            2.0
        );
        assert!(after.contains("# TYPE nv_inference_request_success counter"));
        assert!(after.contains("# TYPE tensorwire_request_duration_seconds histogram"));
        assert_eq!(
            sample(
                &after,
                r#"tensorwire_request_duration_seconds_bucket{model="identity",version="1",le="0.0000025"}"#
            ),
            0.0
        );
        assert_eq!(
            sample(
                &after,
                r#"tensorwire_request_duration_seconds_bucket{model="identity",version="1",le="0.000005"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(
                &after,
                &format!("tensorwire_request_duration_seconds_count{id}")
            ),
            1.0
        );
        assert_eq!(
            sample(
                &after,
                r#"tensorwire_requests_total{model="identity",version="1",transport="shm"}"#
            ),
            1.0
        );
        assert!(sample(&after, "process_resident_memory_bytes ") > 1e6);
        assert!(sample(&after, "process_cpu_seconds_total ") > 0.0);
        assert!(sample(&after, "process_open_fds ") >= 3.0);
        assert!(sample(&after, "process_threads ") >= 1.0);
        let started = sample(&after, "process_start_time_seconds ");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        assert!(
            started > now - 86_400.0 && started <= now + 1.0,
            "{started} vs {now}"
        );
    }

    #[test]
    fn tenants_counters_only_with_tenants() {
        use server::tenants::{file, Identity, Tenants};
        // Without tenants: no tenant families.
        let open = Metrics::new(core())
            .expect("metrics")
            .render()
            .expect("render");
        assert!(!open.contains("tensorwire_tenant_"), "{open}");
        let digest: String = server::tenants::digest(b"tok")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let text = format!(
            "[[tenant]]\nname = \"a\"\ntokens_sha256 = [\"{digest}\"]\nmodels = [\"identity\"]\n\
             max_in_flight = 1\n"
        );
        let tenants = Arc::new(Tenants::from_specs(
            file::parse(&text, "t.toml").expect("file"),
        ));
        let core = Arc::new(
            AgentCore::new(
                server::ModelRegistry::with_identity(),
                wire::Limits::default(),
                1 << 20,
            )
            .with_tenants(Some(tenants.clone())),
        );
        let m = Metrics::new(core.clone()).expect("metrics");
        let before = m.render().expect("render");
        let a = r#"{tenant="a"}"#;
        let d = r#"{tenant="default"}"#;
        assert_eq!(
            sample(&before, &format!("tensorwire_tenant_requests_total{a}")),
            0.0
        );
        assert_eq!(
            sample(&before, &format!("tensorwire_tenant_denied_total{d}")),
            0.0
        );
        assert!(before.contains("# TYPE tensorwire_tenant_in_flight gauge"));
        assert!(before.contains("# TYPE tensorwire_tenant_cpu_seconds_total counter"));
        // One admitted request held in flight, one over the quota, one
        // refused model, one unknown token (counted in default).
        let model = core.registry.find("identity").expect("identity");
        let seat = tenants
            .request_seat(&Identity::REMOTE, Some(b"tok"))
            .expect("seat");
        let ticket = seat.admit(&model, 0).expect("admitted");
        assert!(seat.admit(&model, 0).is_err(), "max_in_flight 1");
        assert!(crate::access::check_model(Some(&seat), "other").is_err());
        assert!(tenants
            .request_seat(&Identity::REMOTE, Some(b"bad"))
            .is_err());
        ticket
            .tenant
            .usage
            .cpu_ns
            .fetch_add(1_500_000_000, Ordering::Relaxed);
        let during = m.render().expect("render");
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_requests_total{a}")),
            1.0
        );
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_in_flight{a}")),
            1.0
        );
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_over_quota_total{a}")),
            1.0
        );
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_denied_total{a}")),
            1.0
        );
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_denied_total{d}")),
            1.0
        );
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_cpu_seconds_total{a}")),
            1.5
        );
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_queued{a}")),
            0.0
        );
        assert_eq!(
            sample(&during, &format!("tensorwire_tenant_connections{a}")),
            0.0
        );
        drop(ticket);
        let after = m.render().expect("render");
        assert_eq!(
            sample(&after, &format!("tensorwire_tenant_in_flight{a}")),
            0.0
        );
    }

    #[test]
    fn metrics_uris() {
        assert!(parse_metrics_uri("http://127.0.0.1:0").is_ok());
        for bad in [
            "grpc://127.0.0.1:1",
            "http://127.0.0.1",
            "http://h:1/metrics",
        ] {
            assert!(parse_metrics_uri(bad).is_err(), "{bad}");
        }
    }
}
