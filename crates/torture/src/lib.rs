//! `tensorwire torture`: the reliability suite a platform team can rerun.
//! It starts a real agent (`tensorwire serve` on unix, tcp and shm, serving
//! `identity` and the digits MLP), attacks it one way at a time — hostile
//! bytes at volume, slowloris senders, thousands of idle connections,
//! connect churn, clients SIGKILLed mid-request, and then the agent
//! itself stopped, killed and restarted, and a soak of mixed load over
//! every transport at once ([`soak`]) — while a well-behaved
//! client ([`observer::Observer`]) is served beside each attack, and
//! reports per scenario: the volume tried, the defects found (connections
//! the agent neither answered nor closed, an agent that died), the
//! observer's errors and its p99 before/during/after, and what the agent
//! kept afterwards (descriptors over its baseline, resident memory).
//!
//! The claim each row makes is "others kept being served": a row is clean
//! when it has no defects, the observer no errors, and no descriptor was
//! left behind. [`run`] returns the [`Report`]; [`report`] writes it as
//! `results.json` and `report.md`.
//!
//! Modules: [`agent`] (the child under test and its `/proc` readings),
//! [`observer`] (the well-behaved client), [`hostile`] (the hostile
//! messages), [`scenarios`] (the attacks), [`listeners`] (each socket
//! listener — unix, tcp, tls, vsock, the http and grpc front doors — and
//! the hostile messages that mean something for its protocol),
//! [`shm_rings`] (shm clients breaking their ring indices and sleep
//! words), [`kills`] (clients killed at a chosen stage of their request),
//! [`budget`] (the payload budget against real bytes, and its control
//! run), [`soak`] (the long mixed load), [`report`] (the files).
//!
//! # Examples
//!
//! One round of the hostile-bytes scenario, small: every fixed hostile
//! message of the `unix` door (each corruption and truncation of a valid
//! request) on its own connection, a watched client served beside them.
//! ([`run`] does this at volume against a `tensorwire serve` child; here
//! the agent runs in-process.)
//!
//! ```
//! use std::time::Duration;
//! use torture::listeners::{attack_once, Door, Outcome, Target};
//! use torture::observer::{Observer, Phase};
//! let digits = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
//! let cfg = torture::Config::new("tensorwire".into(), digits.into(), true); // `torture --quick`
//! assert!(cfg.transports.iter().any(|t| t == "unix"));
//!
//! let dir = tempfile::tempdir()?;
//! let uri = format!("unix://{}", dir.path().join("agent.sock").display());
//! let mut agent_cfg = server::AgentConfig::default();
//! agent_cfg.add_listen(&uri)?;
//! agent_cfg.models.push(server::ModelConfig::new("digits", &cfg.digits));
//! let agent = server::Agent::start(agent_cfg)?;
//! let identity = agent.core().registry.find("identity").ok_or("served")?.id;
//!
//! let observer = Observer::start(&uri); // calls identity and digits, checking every answer
//! std::thread::sleep(cfg.phase / 5);
//! observer.mark(Phase::During);
//! let target = Target::new(&uri)?;
//! let shots = Door::parse("unix").ok_or("a socket door")?.fixed_shots(identity);
//! let hung: Vec<&str> = shots
//!     .iter()
//!     .filter(|s| attack_once(&target, s) == Outcome::Hung)
//!     .map(|s| s.name.as_str())
//!     .collect();
//! observer.mark(Phase::After);
//! std::thread::sleep(cfg.phase / 5);
//! let [before, during, after] = observer.finish();
//!
//! assert!(shots.len() > 10);
//! assert!(hung.is_empty(), "left hanging: {hung:?}"); // each answered or closed
//! assert_eq!(before.errors + during.errors + after.errors, 0, "{:?}", during.first_errors);
//! assert!(!during.latencies_ns.is_empty() && !after.latencies_ns.is_empty());
//! agent.shutdown(Duration::from_secs(5));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod agent;
pub mod budget;
pub mod hostile;
pub mod kills;
pub mod listeners;
pub mod observer;
pub mod report;
pub mod scenarios;
pub mod shm_rings;
pub mod soak;

use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// An error that stops the run (the agent cannot start, a file cannot be
/// written). Defects found in the agent are not errors: they are rows.
#[derive(Debug, Clone)]
pub struct TortureError(pub String);

impl std::fmt::Display for TortureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TortureError {}

/// How hard the run is.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `tensorwire` binary (the agent and the ping clients).
    pub exe: PathBuf,
    /// The digits model (`models/build/digits_mlp.onnx`).
    pub digits: PathBuf,
    /// The slow model the kills aim at (`slow_echo.onnx` beside digits,
    /// built by `models/build_slow_echo.py`).
    pub slow: PathBuf,
    /// Transports to attack (of `unix`, `tcp`, `shm`; the socket attacks
    /// skip `shm`).
    pub transports: Vec<String>,
    /// Hostile messages per socket transport.
    pub messages: u64,
    /// Listeners beyond unix and tcp that get the socket attacks (of
    /// `tls`, `vsock`, `http`, `grpc`; vsock is skipped, saying why, where
    /// this machine cannot connect to itself over it).
    pub listeners: Vec<String>,
    /// Hostile messages per listener of `listeners`.
    pub listener_messages: u64,
    /// Slowloris connections.
    pub slow_senders: usize,
    /// Idle connections held at once.
    pub idle: usize,
    /// Clients killed per transport.
    pub kills: u64,
    /// Hostile shm clients, one after another.
    pub shm_rounds: u64,
    /// How long the slowloris, idle and churn attacks last.
    pub attack: Duration,
    /// How long the observer runs before and after each attack.
    pub phase: Duration,
    /// How long the soak runs (0: no soak).
    pub soak: Duration,
    /// Whether this is the `--quick` run.
    pub quick: bool,
    /// The groups of scenarios to run (all of [`Group::ALL`] by default).
    pub groups: Vec<Group>,
    /// The tweet classifier to put in the soak's mix, when its files exist.
    pub classifier: Option<soak::ClassifierFiles>,
}

impl Config {
    /// The `--quick` run (a few minutes, for CI) or the full one.
    pub fn new(exe: PathBuf, digits: PathBuf, quick: bool) -> Config {
        let transports = ["unix", "tcp", "shm"].map(String::from).to_vec();
        let slow = digits.with_file_name("slow_echo.onnx");
        let listeners = ["tls", "vsock", "http", "grpc"].map(String::from).to_vec();
        if quick {
            Config {
                exe,
                digits,
                slow: slow.clone(),
                transports,
                messages: 3_000,
                listeners,
                listener_messages: 600,
                slow_senders: 32,
                idle: 500,
                kills: 4,
                shm_rounds: 30,
                attack: Duration::from_secs(1),
                phase: Duration::from_millis(500),
                soak: Duration::from_secs(20),
                quick,
                groups: Group::ALL.to_vec(),
                classifier: None,
            }
        } else {
            Config {
                exe,
                digits,
                slow,
                transports,
                messages: 500_000,
                listeners,
                listener_messages: 200_000,
                slow_senders: 256,
                idle: 10_000,
                kills: 40,
                shm_rounds: 3000,
                attack: Duration::from_secs(10),
                phase: Duration::from_secs(3),
                soak: Duration::from_secs(3600),
                quick,
                groups: Group::ALL.to_vec(),
                classifier: None,
            }
        }
    }
}

/// A group of scenarios, chosen with `--only` to rerun part of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Hostile bytes, slowloris, idle connections, churn and client kills
    /// on the socket transports.
    Sockets,
    /// Hostile shm clients, broken ring indices, held sleep words and
    /// client kills over shm.
    Shm,
    /// The attacks on tls, vsock and the KServe http and grpc doors.
    Listeners,
    /// The payload budget rows (declared and real bytes).
    Budget,
    /// Clients killed while queued, computing or being answered.
    Kills,
    /// The agent killed, stopped and restarted under its clients.
    Faults,
    /// The soak (when its duration is not 0).
    Soak,
}

impl Group {
    /// Every group, in the order the suite runs them.
    pub const ALL: [Group; 7] = [
        Group::Sockets,
        Group::Shm,
        Group::Listeners,
        Group::Budget,
        Group::Kills,
        Group::Faults,
        Group::Soak,
    ];

    /// The group's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Group::Sockets => "sockets",
            Group::Shm => "shm",
            Group::Listeners => "listeners",
            Group::Budget => "budget",
            Group::Kills => "kills",
            Group::Faults => "faults",
            Group::Soak => "soak",
        }
    }
}

impl std::str::FromStr for Group {
    type Err = String;

    /// # Examples
    ///
    /// ```
    /// use torture::Group;
    /// assert_eq!("kills".parse::<Group>(), Ok(Group::Kills));
    /// assert!("kill".parse::<Group>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Group, String> {
        Group::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Group::ALL.iter().map(|g| g.name()).collect();
                format!("'{s}' is not one of {}", names.join(", "))
            })
    }
}

/// What an agent kept after a scenario.
#[derive(Clone, Debug, Serialize)]
pub struct Leaks {
    /// Open descriptors over the baseline 5 s after the attack ended.
    pub fds: usize,
    /// Resident memory after minus before, KiB (allocators keep freed
    /// memory: read it as a trend, not a leak by itself).
    pub rss_delta_kib: i64,
}

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    /// The scenario (`hostile bytes`, `slowloris`, ...).
    pub name: String,
    /// The transport attacked (and the observer's).
    pub transport: String,
    /// Volume: messages, connections or kills.
    pub tried: u64,
    /// Defects: hung connections, an agent that died.
    pub defects: u64,
    /// The observer's requests that succeeded, all phases.
    pub others_requests: u64,
    /// The observer's failed requests, all phases.
    pub others_errors: u64,
    /// Of those, answers with wrong bytes.
    pub others_wrong: u64,
    /// The observer's p99 before the attack, µs.
    pub others_p99_before_us: f64,
    /// Its p99 during the attack, µs.
    pub others_p99_during_us: f64,
    /// Its p99 after, µs.
    pub others_p99_after_us: f64,
    /// During over before.
    pub others_p99_ratio: f64,
    /// What the agent kept.
    pub leaks: Leaks,
    /// How long the attack ran, s.
    pub seconds: f64,
    /// Outcome counts and remarks.
    pub notes: Vec<String>,
}

impl ScenarioResult {
    /// A row without a watched client: `tried` attempts, `defects` of them
    /// failed, over `seconds`, with one note.
    pub fn unobserved(
        name: &str,
        transport: &str,
        tried: u64,
        defects: u64,
        seconds: f64,
        note: String,
    ) -> ScenarioResult {
        ScenarioResult {
            name: name.into(),
            transport: transport.into(),
            tried,
            defects,
            others_requests: 0,
            others_errors: 0,
            others_wrong: 0,
            others_p99_before_us: 0.0,
            others_p99_during_us: 0.0,
            others_p99_after_us: 0.0,
            others_p99_ratio: 0.0,
            leaks: Leaks {
                fds: 0,
                rss_delta_kib: 0,
            },
            seconds,
            notes: vec![note],
        }
    }

    /// No defect, no observer error, no descriptor left behind.
    pub fn clean(&self) -> bool {
        self.defects == 0 && self.others_errors == 0 && self.leaks.fds == 0
    }
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The command line.
    pub command: String,
    /// Whether it was `--quick`.
    pub quick: bool,
    /// Seconds it took.
    pub elapsed_s: f64,
    /// The rows, in the order run.
    pub scenarios: Vec<ScenarioResult>,
    /// The soak's seconds: requests, p99, the agent's RSS and descriptors.
    pub soak: Vec<soak::Second>,
}

/// Runs every scenario on every transport it applies to, printing each row
/// as it completes (unless `quiet`).
pub fn run(cfg: &Config, quiet: bool) -> Result<Report, TortureError> {
    let t0 = std::time::Instant::now();
    let mut rows = Vec::new();
    let push = |r: ScenarioResult, rows: &mut Vec<ScenarioResult>| {
        if !quiet {
            println!("{}", report::line(&r));
        }
        rows.push(r);
    };
    attacks(cfg, &mut |r| push(r, &mut rows))?;
    let mut soak_seconds = Vec::new();
    if cfg.groups.contains(&Group::Soak) && !cfg.soak.is_zero() {
        let s = soak::soak(cfg, cfg.soak.as_secs().max(1))?;
        push(s.row, &mut rows);
        soak_seconds = s.seconds;
    }
    Ok(Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        quick: cfg.quick,
        elapsed_s: t0.elapsed().as_secs_f64(),
        scenarios: rows,
        soak: soak_seconds,
    })
}

/// Every attack scenario of `cfg.groups` on every transport it applies
/// to, each row handed to `push` as it completes.
fn attacks(cfg: &Config, push: &mut dyn FnMut(ScenarioResult)) -> Result<(), TortureError> {
    let on = |g: Group| cfg.groups.contains(&g);
    if on(Group::Sockets) || on(Group::Shm) || on(Group::Listeners) {
        let mut agent = agent::AgentUnderTest::start(&cfg.exe, &cfg.digits, &[])?;
        for t in &cfg.transports {
            let t = t.as_str();
            let group = if t == "shm" {
                Group::Shm
            } else {
                Group::Sockets
            };
            if !on(group) {
                continue;
            }
            if t == "shm" {
                push(scenarios::shm_hostile(&mut agent, cfg)?);
                shm_rings::attack(&mut agent, cfg, push)?;
            } else {
                push(scenarios::hostile_bytes(&mut agent, cfg, t, cfg.messages)?);
                push(scenarios::slowloris(&mut agent, cfg, t)?);
                push(scenarios::idle(&mut agent, cfg, t)?);
                push(scenarios::churn(&mut agent, cfg, t)?);
            }
            push(scenarios::client_kills(
                &mut agent,
                cfg,
                &cfg.exe.clone(),
                t,
            )?);
        }
        if on(Group::Listeners) {
            listeners::attack(&mut agent, cfg, push)?;
        }
    }
    if on(Group::Budget) {
        for t in cfg.transports.iter().filter(|t| *t != "shm") {
            push(scenarios::payload_budget(cfg, t)?);
        }
        for r in budget::real_bytes_rows(cfg)? {
            push(r);
        }
    }
    if on(Group::Kills) {
        for r in kills::kill_stages(cfg)? {
            push(r);
        }
    }
    if on(Group::Faults) {
        for r in scenarios::agent_faults(cfg)? {
            push(r);
        }
    }
    Ok(())
}
