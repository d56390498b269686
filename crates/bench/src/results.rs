//! What a bench run produces: one [`Row`] per measured configuration, and
//! the [`Results`] file around them (`results.json`, `results.csv`).
//!
//! Every figure in a row comes from this run: a row aggregates `repeats`
//! measurements of the same configuration, taking the **median** of the
//! per-repeat figures and keeping their minimum and maximum as the spread.

use crate::caller::BenchError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The duration of one stage in a row (µs, over all timed requests of all
/// repeats).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageStat {
    /// [`crate::Stage::name`].
    pub stage: String,
    /// Median.
    pub p50_us: f64,
    /// Mean.
    pub mean_us: f64,
}

/// One measured configuration: a target under one load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The suite that measured it (`vaccel`, `breakdown`, `load`, or
    /// `custom` for a plain `tensorwire bench`).
    pub suite: String,
    /// What was measured, as shown in tables: e.g. `tensorwire shm`,
    /// `raw unix`, `grpc tcp?nodelay=0`, `in-process`.
    pub target: String,
    /// The framework: `tensorwire`, `local` (engine called directly),
    /// `raw`, `grpc` or `ttrpc`.
    pub framework: String,
    /// The transport: `inproc`, `shm`, `unix`, `tcp`, `tcp?nodelay=0`, or
    /// `none` for the in-process baseline.
    pub transport: String,
    /// True for a baseline that is not tensorwire (raw floor or peer).
    pub peer: bool,
    /// The model served (`identity` for the empty RPC and sized tensors).
    pub model: String,
    /// Tensor bytes in each request (0 = the empty RPC).
    pub tensor_bytes: u64,
    /// Concurrent clients (closed loop) or connections issuing the
    /// schedule (open loop).
    pub clients: usize,
    /// `closed`, `poisson`, `constant` or `trace`.
    pub load: String,
    /// Offered load in requests per second (open loop); `None` when closed.
    pub rate: Option<f64>,
    /// Timed requests completed, summed over repeats.
    pub requests: u64,
    /// Requests that failed, summed over repeats.
    pub errors: u64,
    /// Untimed warm-up requests per repeat.
    pub warmup: u64,
    /// Repeats aggregated.
    pub repeats: usize,
    /// Median latency (µs): the median over repeats of each repeat's p50.
    pub p50_us: f64,
    /// Smallest and largest per-repeat p50.
    pub p50_spread_us: [f64; 2],
    /// 90th percentile (median over repeats).
    pub p90_us: f64,
    /// 99th percentile (median over repeats).
    pub p99_us: f64,
    /// Smallest and largest per-repeat p99.
    pub p99_spread_us: [f64; 2],
    /// Mean latency (median over repeats of each repeat's mean).
    pub mean_us: f64,
    /// Completed requests per second (median over repeats).
    pub throughput_rps: f64,
    /// CPU time of the agent (or peer server) and the client process per
    /// request, µs; `None` when it could not be read.
    pub cpu_us_per_req: Option<f64>,
    /// The agent's (or peer server's) share of `cpu_us_per_req`.
    pub agent_cpu_us_per_req: Option<f64>,
    /// Resident set size of the agent (or peer server) process at the end,
    /// KiB; `None` when in this process.
    pub agent_rss_kib: Option<u64>,
    /// The stage split (tensorwire only; empty for the others).
    pub stages: Vec<StageStat>,
    /// Latency at fixed quantiles, `[quantile, µs]` pairs from one merged
    /// histogram of all repeats: the CDF plot.
    pub cdf: Vec<[f64; 2]>,
    /// CPU used by other processes on the machine while this row ran, in
    /// percent of one core (noise).
    pub noise_cpu_pct: f64,
    /// Free-form remarks (e.g. "noisy: other processes used 40% of a core").
    pub note: String,
    /// Dynamic batching figures (`batching` suite only): their fields sit
    /// in the row itself (`batching`, `max_batch`, `mean_batch`,
    /// `offline_rps`, ...), absent from other rows.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub batching: Option<crate::batching::BatchingFigures>,
    /// Tenant isolation figures (`tenants` suite only): their fields sit in
    /// the row itself (`scenario`, `tenant`, `offered_rps`,
    /// `completed_rps`, `overloaded`, `b_p99_ratio`, ...), absent from
    /// other rows.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<crate::tenants::TenantFigures>,
}

/// Facts about the machine a run was made on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// `/proc/cpuinfo` model name.
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Total memory, KiB.
    pub mem_kib: u64,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Host name.
    pub hostname: String,
}

/// A whole run: what was run, where, and every row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// The command line that produced it.
    pub command: String,
    /// tensorwire's commit (`git rev-parse HEAD`, `+dirty` when the tree had
    /// changes), or `unknown`.
    pub commit: String,
    /// Start time, seconds since the Unix epoch.
    pub started_unix: u64,
    /// Seconds the run took.
    pub elapsed_s: f64,
    /// Where it ran.
    pub machine: MachineInfo,
    /// Where clients and servers ran ([`crate::placement::Placement::describe`]).
    pub placement: String,
    /// Whether `--quick` shortened it.
    pub quick: bool,
    /// The rows, in the order measured.
    pub rows: Vec<Row>,
}

/// The columns of `results.csv`, in order (stages are appended as
/// `stage_<name>_p50_us`).
pub const CSV_COLUMNS: &[&str] = &[
    "suite",
    "target",
    "framework",
    "transport",
    "peer",
    "model",
    "tensor_bytes",
    "clients",
    "load",
    "rate",
    "requests",
    "errors",
    "warmup",
    "repeats",
    "p50_us",
    "p50_min_us",
    "p50_max_us",
    "p90_us",
    "p99_us",
    "p99_min_us",
    "p99_max_us",
    "mean_us",
    "throughput_rps",
    "cpu_us_per_req",
    "agent_cpu_us_per_req",
    "agent_rss_kib",
    "noise_cpu_pct",
];

impl Results {
    /// Writes `results.json` into `dir`.
    pub fn write_json(&self, dir: &Path) -> Result<(), BenchError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| BenchError::new(format!("cannot encode results: {e}")))?;
        write_file(&dir.join("results.json"), text.as_bytes())
    }

    /// Reads a `results.json`.
    pub fn read_json(path: &Path) -> Result<Results, BenchError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BenchError::new(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| BenchError::new(format!("{}: {e}", path.display())))
    }

    /// The CSV text: a header line, then one line per row.
    pub fn to_csv(&self) -> String {
        let mut out = String::new();
        let mut header: Vec<String> = CSV_COLUMNS.iter().map(|s| s.to_string()).collect();
        for s in crate::caller::Stage::ALL {
            header.push(format!("stage_{}_p50_us", s.name()));
        }
        out.push_str(&header.join(","));
        out.push('\n');
        for r in &self.rows {
            let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
            let mut cells = vec![
                csv_cell(&r.suite),
                csv_cell(&r.target),
                csv_cell(&r.framework),
                csv_cell(&r.transport),
                r.peer.to_string(),
                csv_cell(&r.model),
                r.tensor_bytes.to_string(),
                r.clients.to_string(),
                csv_cell(&r.load),
                opt(r.rate),
                r.requests.to_string(),
                r.errors.to_string(),
                r.warmup.to_string(),
                r.repeats.to_string(),
                format!("{:.3}", r.p50_us),
                format!("{:.3}", r.p50_spread_us[0]),
                format!("{:.3}", r.p50_spread_us[1]),
                format!("{:.3}", r.p90_us),
                format!("{:.3}", r.p99_us),
                format!("{:.3}", r.p99_spread_us[0]),
                format!("{:.3}", r.p99_spread_us[1]),
                format!("{:.3}", r.mean_us),
                format!("{:.1}", r.throughput_rps),
                opt(r.cpu_us_per_req),
                opt(r.agent_cpu_us_per_req),
                r.agent_rss_kib.map_or(String::new(), |v| v.to_string()),
                format!("{:.1}", r.noise_cpu_pct),
            ];
            for s in crate::caller::Stage::ALL {
                let v = r.stages.iter().find(|x| x.stage == s.name());
                cells.push(v.map_or(String::new(), |x| format!("{:.3}", x.p50_us)));
            }
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    /// Writes `results.csv` into `dir`.
    pub fn write_csv(&self, dir: &Path) -> Result<(), BenchError> {
        write_file(&dir.join("results.csv"), self.to_csv().as_bytes())
    }
}

/// Quotes a CSV cell when it holds a comma, quote or newline.
fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Writes `bytes` to `path`, naming the file in the error.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), BenchError> {
    std::fs::write(path, bytes).map_err(|e| BenchError::new(format!("{}: {e}", path.display())))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A plausible row for tests of the writers.
    pub(crate) fn sample_row(target: &str, clients: usize) -> Row {
        Row {
            suite: "custom".into(),
            target: target.into(),
            framework: "tensorwire".into(),
            transport: "unix".into(),
            peer: false,
            model: "identity".into(),
            tensor_bytes: 0,
            clients,
            load: "closed".into(),
            rate: None,
            requests: 1000,
            errors: 0,
            warmup: 100,
            repeats: 3,
            p50_us: 15.0,
            p50_spread_us: [14.5, 15.5],
            p90_us: 17.0,
            p99_us: 25.0,
            p99_spread_us: [24.0, 26.0],
            mean_us: 15.5,
            throughput_rps: 60000.0,
            cpu_us_per_req: Some(20.0),
            agent_cpu_us_per_req: Some(9.0),
            agent_rss_kib: Some(12000),
            stages: vec![StageStat {
                stage: "compute".into(),
                p50_us: 0.2,
                mean_us: 0.3,
            }],
            cdf: vec![[0.5, 15.0], [0.99, 25.0]],
            noise_cpu_pct: 1.0,
            note: String::new(),
            batching: None,
            tenants: None,
        }
    }

    /// A whole run around `rows`, for tests of the writers.
    pub(crate) fn sample_results(rows: Vec<Row>) -> Results {
        Results {
            command: "tensorwire bench --suite vaccel".into(),
            commit: "abc123+dirty".into(),
            started_unix: 1_700_000_000,
            elapsed_s: 12.0,
            machine: MachineInfo {
                cpu_model: "Test CPU".into(),
                cpus: 2,
                mem_kib: 24 * 1024 * 1024,
                kernel: "6.1.0".into(),
                hostname: "h".into(),
            },
            placement: "unpinned".into(),
            quick: true,
            rows,
        }
    }

    #[test]
    fn csv_has_a_header_and_a_line_per_row() {
        let r = sample_results(vec![
            sample_row("tensorwire unix", 1),
            sample_row("a,\"b\"", 2),
        ]);
        let csv = r.to_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        let cols = CSV_COLUMNS.len() + crate::caller::Stage::COUNT;
        assert_eq!(lines[0].split(',').count(), cols);
        assert_eq!(lines[1].split(',').count(), cols);
        assert!(lines[2].starts_with("custom,\"a,\"\"b\"\"\","));
        let dir = tempfile::tempdir().expect("tempdir");
        r.write_json(dir.path()).expect("write");
        let back = Results::read_json(&dir.path().join("results.json")).expect("read");
        assert_eq!(back, r);
    }
}
