//! `Agent`: a tensorwire agent embedded in the Python process — the same
//! [`server::Agent`] `tensorwire serve` runs, listening on any endpoints
//! (`inproc://name` included, for clients in this process), with the
//! KServe v2 front doors (`grpc://HOST:PORT`, `http://HOST:PORT`) of its
//! listen list (or config file) started and stopped as `serve` does, by
//! [`frontend::FrontDoors`].

use crate::errors::AgentError;
use crate::fork;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use server::{AgentConfig, ModelConfig};
use std::sync::Mutex;
use std::time::Duration;

/// The agent and its front doors, stopped together.
struct Running {
    agent: server::Agent,
    doors: frontend::FrontDoors,
}

/// An agent running in this process (`tensorwire._native.Agent(...)`).
#[pyclass(frozen, module = "tensorwire._native")]
pub struct Agent {
    running: Mutex<Option<Running>>,
    endpoints: Vec<String>,
    made: u64,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let r = self
            .running
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match r {
            // The parent's threads (the agent's, the doors' runtimes) are
            // not in this process: shutting down would wait for them
            // forever.
            Some(r) if !fork::same_process(self.made) => std::mem::forget(r),
            // Garbage-collected while running: the order of `stop`, with
            // the grace the agent's own drop gives.
            // The GIL is let go meanwhile: nothing in the shutdown needs it,
            // and the other Python threads go on.
            Some(r) => {
                Python::attach(|py| {
                    py.detach(|| r.doors.shutdown_with(r.agent, Duration::from_secs(5)))
                });
            }
            None => {}
        }
    }
}

fn agent_error(e: impl std::fmt::Display) -> PyErr {
    AgentError::new_err(e.to_string())
}

#[pymethods]
impl Agent {
    /// Loads `models` (`[(name, path.onnx)]`; `identity` is always served)
    /// and listens on each URI of `listen`: the agent's own endpoints, and
    /// the KServe v2 front doors `grpc://HOST:PORT` / `http://HOST:PORT`.
    /// `config`: a TOML file with the same settings as `tensorwire serve
    /// --config`, which the arguments add to. Every URI is checked before
    /// anything starts; if anything fails to start, whatever did is
    /// stopped again.
    #[new]
    #[pyo3(signature = (models = Vec::new(), listen = Vec::new(), config = None, intra_threads = None, inter_threads = None))]
    fn new(
        py: Python<'_>,
        models: Vec<(String, String)>,
        listen: Vec<String>,
        config: Option<std::path::PathBuf>,
        intra_threads: Option<usize>,
        inter_threads: Option<usize>,
    ) -> PyResult<Agent> {
        let mut cfg = match &config {
            Some(p) => AgentConfig::from_file(p).map_err(agent_error)?,
            None => AgentConfig::default(),
        };
        // The file's front doors, then the argument's URIs: sorted by
        // scheme and checked, as `tensorwire serve` does.
        let split =
            frontend::split_listen(std::mem::take(&mut cfg.front_doors).iter().chain(&listen))
                .map_err(agent_error)?;
        cfg.listen.extend(split.endpoints);
        for (name, path) in models {
            cfg.models
                .push(ModelConfig::parse_flag(&format!("{name}={path}")).map_err(agent_error)?);
        }
        if let Some(n) = intra_threads {
            cfg.intra_threads = n;
        }
        if let Some(n) = inter_threads {
            cfg.inter_threads = n;
        }
        if cfg.listen.is_empty() && split.grpc.is_empty() && split.http.is_empty() {
            return Err(agent_error(
                "nothing to listen on: give listen=[URI, ...] (e.g. \"shm://demo\")",
            ));
        }
        let doors_cfg = frontend::DoorsConfig {
            grpc: split.grpc,
            http: split.http,
            insecure: cfg.insecure,
            ..frontend::DoorsConfig::default()
        };
        let running = py.detach(|| {
            let agent = server::Agent::start(cfg).map_err(|e| e.to_string())?;
            match frontend::FrontDoors::start(agent.core().clone(), doors_cfg) {
                Ok(doors) => Ok(Running { agent, doors }),
                Err(e) => {
                    agent.shutdown(Duration::ZERO);
                    Err(e.to_string())
                }
            }
        });
        let running = running.map_err(agent_error)?;
        let mut endpoints: Vec<String> = running
            .agent
            .endpoints()
            .iter()
            .map(|e| e.to_string())
            .collect();
        endpoints.extend(running.doors.uris().into_iter().map(String::from));
        Ok(Agent {
            running: Mutex::new(Some(running)),
            endpoints,
            made: fork::now(),
        })
    }

    /// The endpoints listened on, the agent's own then its front doors
    /// (gRPC, then HTTP), each `…:0` port resolved.
    #[getter]
    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// Whether the agent is still serving.
    #[getter]
    fn running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Counters: responses, errors, connections, ...
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let guard = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = guard.as_ref() {
            let s = r.agent.stats();
            d.set_item("connections", s.connections)?;
            d.set_item("accepted", s.accepted)?;
            d.set_item("responses", s.responses)?;
            d.set_item("errors", s.errors)?;
            d.set_item("in_flight", s.in_flight)?;
            d.set_item("shm_sessions", s.shm_sessions)?;
        }
        Ok(d)
    }

    /// Stops, in the order of `tensorwire serve`: the front doors answer
    /// not-ready; the agent refuses new requests, gives those in flight
    /// (front-door ones included) up to `grace` seconds and closes every
    /// session; then the front doors close. Returns how many requests
    /// were unfinished.
    #[pyo3(signature = (grace = 5.0))]
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<usize> {
        let grace = crate::session::seconds("grace", grace)?;
        let r = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        Ok(match r {
            Some(r) if fork::same_process(self.made) => {
                py.detach(|| r.doors.shutdown_with(r.agent, grace))
            }
            Some(r) => {
                std::mem::forget(r);
                0
            }
            None => 0,
        })
    }

    fn __repr__(&self) -> String {
        format!("Agent({:?})", self.endpoints)
    }
}
