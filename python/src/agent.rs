//! `Agent`: a tensorwire agent embedded in the Python process — the same
//! [`server::Agent`] `tensorwire serve` runs, listening on any endpoints
//! (`inproc://name` included, for clients in this process).

use crate::errors::AgentError;
use crate::fork;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use server::config::parse_endpoint;
use server::{AgentConfig, ModelConfig};
use std::sync::Mutex;

/// An agent running in this process (`tensorwire._native.Agent(...)`).
#[pyclass(frozen, module = "tensorwire._native")]
pub struct Agent {
    agent: Mutex<Option<server::Agent>>,
    endpoints: Vec<String>,
    made: u64,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if !fork::same_process(self.made) {
            // The parent's threads are not in this process: shutting down
            // would wait for them forever.
            let a = self.agent.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(a.take());
        }
    }
}

fn agent_error(e: impl std::fmt::Display) -> PyErr {
    AgentError::new_err(e.to_string())
}

#[pymethods]
impl Agent {
    /// Loads `models` (`[(name, path.onnx)]`; `identity` is always served)
    /// and listens on each URI of `listen`. `config`: a TOML file with the
    /// same settings as `tensorwire serve --config`, which the arguments
    /// add to.
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
        for l in &listen {
            cfg.listen.push(parse_endpoint(l).map_err(agent_error)?);
        }
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
        if cfg.listen.is_empty() {
            return Err(agent_error(
                "nothing to listen on: give listen=[URI, ...] (e.g. \"shm://demo\")",
            ));
        }
        let agent = py
            .detach(|| server::Agent::start(cfg))
            .map_err(agent_error)?;
        let endpoints = agent.endpoints().iter().map(|e| e.to_string()).collect();
        Ok(Agent {
            agent: Mutex::new(Some(agent)),
            endpoints,
            made: fork::now(),
        })
    }

    /// The endpoints listened on (a `tcp://…:0` port resolved).
    #[getter]
    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// Whether the agent is still serving.
    #[getter]
    fn running(&self) -> bool {
        self.agent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Counters: responses, errors, connections, ...
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let guard = self.agent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = guard.as_ref() {
            let s = a.stats();
            d.set_item("connections", s.connections)?;
            d.set_item("accepted", s.accepted)?;
            d.set_item("responses", s.responses)?;
            d.set_item("errors", s.errors)?;
            d.set_item("in_flight", s.in_flight)?;
            d.set_item("shm_sessions", s.shm_sessions)?;
        }
        Ok(d)
    }

    /// Stops: refuses new requests, gives those in flight up to `grace`
    /// seconds, closes every session. Returns how many were unfinished.
    #[pyo3(signature = (grace = 5.0))]
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<usize> {
        let grace = crate::session::seconds("grace", grace)?;
        let a = self.agent.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(match a {
            Some(a) if fork::same_process(self.made) => py.detach(|| a.shutdown(grace)),
            Some(a) => {
                std::mem::forget(a);
                0
            }
            None => 0,
        })
    }

    fn __repr__(&self) -> String {
        format!("Agent({:?})", self.endpoints)
    }
}
