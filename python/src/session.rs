//! `Client`, `Model` and `Pending`: the Rust client's connection, model
//! handle and ticket, for Python.
//!
//! Inputs arrive as a dict of name -> array (or a sequence in signature
//! order), are checked against the signature before anything is sent
//! (`InvalidInput` names the input) and are read where they lie: a request
//! is written to the socket, copied into the shm arena (or pinned there, if
//! it lies in the arena already), or run in process before `infer`/`submit`
//! returns, and the arrays stay referenced until then. Outputs leave as an
//! `Outputs` dict of read-only ndarrays over [`Block`]s. The GIL is
//! released for everything that waits or copies.
//!
//! A request may carry a priority level and a queue timeout (`priority=`,
//! `queue_timeout=`): they are checked here (`ValueError` naming the bad
//! one) and sent through a clone of the Rust `Model` made
//! `with_priority` / `with_queue_timeout`, so the handle itself keeps the
//! model's defaults.

use crate::arrays::{self, InputArray};
use crate::block::Block;
use crate::errors::{closed, forked, to_py, InvalidInput, ProtocolError};
use crate::fork;
use client::{ClientOptions, Response, TensorRef, Ticket};
use numpy::PyUntypedArray;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyMapping, PyString, PyType};
use std::borrow::Cow;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wire::{DType, TensorSpec, MAX_DIMS};

/// A tensor spec for Python: name, dtype name, dims (`None` = dynamic).
type SpecTuple = (String, &'static str, Vec<Option<u64>>);
/// A model for Python: name, inputs, outputs.
type ModelTuple = (String, Vec<SpecTuple>, Vec<SpecTuple>);

/// A duration from seconds given by the caller: finite and not negative;
/// over [`client::MAX_WAIT`] (100 years) it is taken as that.
pub(crate) fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    if !s.is_finite() || s < 0.0 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{what} must be a finite number of seconds ≥ 0, not {s}"
        )));
    }
    Ok(Duration::from_secs_f64(
        s.min(client::MAX_WAIT.as_secs_f64()),
    ))
}

/// A request's priority level from the caller: an integer 0..=255 (1 the
/// highest, 0 or `None` the model's default level). Out of range:
/// `ValueError` naming it; not an integer: `TypeError`.
fn parse_priority(p: Option<&Bound<'_, PyAny>>) -> PyResult<u8> {
    let Some(p) = p.filter(|p| !p.is_none()) else {
        return Ok(0);
    };
    let out_of_range = || {
        pyo3::exceptions::PyValueError::new_err(format!(
            "priority must be 0..=255 (1 = the highest level, 0 = the model's default), not {p}"
        ))
    };
    match p.extract::<i64>() {
        Ok(n) => u8::try_from(n).map_err(|_| out_of_range()),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(p.py()) => {
            Err(out_of_range())
        }
        Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "priority must be an integer 0..=255, not {}",
            p.get_type().name()?
        ))),
    }
}

/// The longest queue timeout a request header holds: `u32::MAX` µs.
const MAX_QUEUE_TIMEOUT: Duration = Duration::from_micros(u32::MAX as u64);

/// A request's queue timeout from seconds given by the caller (`None` or 0:
/// the model's default): finite, ≥ 0 and at most [`MAX_QUEUE_TIMEOUT`]
/// (~71.6 min), else `ValueError`; a fraction of a µs counts as a whole one
/// (it is not 0, the model's default).
fn parse_queue_timeout(s: Option<f64>) -> PyResult<Option<Duration>> {
    let Some(s) = s else {
        return Ok(None);
    };
    let d = seconds("queue_timeout", s)?;
    if d > MAX_QUEUE_TIMEOUT {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "queue_timeout must be at most {} seconds (the request header holds whole µs \
             in 32 bits), not {s}",
            MAX_QUEUE_TIMEOUT.as_secs_f64()
        )));
    }
    let us = d.as_nanos().div_ceil(1000);
    Ok(Some(Duration::from_micros(us as u64)))
}

fn specs(v: &[TensorSpec]) -> Vec<SpecTuple> {
    v.iter()
        .map(|s| (s.name.clone(), s.dtype.name(), s.shape.clone()))
        .collect()
}

/// What every object made from a client shares.
struct Shared {
    /// `close()` was called.
    closed: AtomicBool,
    /// The session is over shared memory (outputs view the arena).
    shm: bool,
    /// Inputs that were not C-contiguous and were copied, and their bytes.
    contiguous_copies: AtomicU64,
    contiguous_bytes: AtomicU64,
}

/// A connection to an agent (`tensorwire._native.Client(uri, ...)`).
/// Thread-safe: many Python threads may call it at once.
#[pyclass(frozen, module = "tensorwire._native")]
pub struct Client {
    inner: Mutex<Option<client::Client>>,
    shared: Arc<Shared>,
    uri: String,
    transport: &'static str,
    made: u64,
}

impl Client {
    fn get(&self) -> PyResult<client::Client> {
        if !fork::same_process(self.made) {
            return Err(forked("client"));
        }
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(closed)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !fork::same_process(self.made) {
            let c = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(c.take());
        }
    }
}

#[pymethods]
impl Client {
    /// Connects to `uri` (`shm://name`, `unix:///path`, `tcp://host:port`,
    /// `inproc://name`). `timeout`: seconds a call waits for its response;
    /// `connect_timeout`: seconds connecting may take; `spin_us`: how long
    /// a waiting call polls before it blocks (default: the Rust client's);
    /// `token`: the bearer token naming the client's tenant (the Python
    /// layer defaults it to `TENSORWIRE_TOKEN`).
    #[new]
    #[pyo3(signature = (uri, timeout = 30.0, connect_timeout = 5.0, spin_us = None, token = None))]
    fn new(
        py: Python<'_>,
        uri: &str,
        timeout: f64,
        connect_timeout: f64,
        spin_us: Option<u64>,
        token: Option<String>,
    ) -> PyResult<Client> {
        let mut opts = ClientOptions {
            timeout: seconds("timeout", timeout)?,
            connect_timeout: seconds("connect_timeout", connect_timeout)?,
            token: token.filter(|t| !t.is_empty()),
            ..ClientOptions::default()
        };
        if opts.timeout.is_zero() || opts.connect_timeout.is_zero() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "timeout and connect_timeout must be more than 0 seconds",
            ));
        }
        if let Some(us) = spin_us {
            opts.spin = Duration::from_micros(us);
        }
        let c = py
            .detach(|| client::Client::connect_with(uri, opts))
            .map_err(to_py)?;
        let uri = c.uri().to_string();
        let transport = ["shm", "unix", "tcp", "inproc"]
            .into_iter()
            .find(|t| uri.starts_with(&format!("{t}://")))
            .unwrap_or("unknown");
        Ok(Client {
            inner: Mutex::new(Some(c)),
            shared: Arc::new(Shared {
                closed: AtomicBool::new(false),
                shm: transport == "shm",
                contiguous_copies: AtomicU64::new(0),
                contiguous_bytes: AtomicU64::new(0),
            }),
            uri,
            transport,
            made: fork::now(),
        })
    }

    /// The endpoint, normalised.
    #[getter]
    fn uri(&self) -> &str {
        &self.uri
    }

    /// `shm`, `unix`, `tcp` or `inproc`.
    #[getter]
    fn transport(&self) -> &'static str {
        self.transport
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.shared.closed.load(Ordering::Relaxed)
    }

    /// The models the agent serves: `[(name, inputs, outputs)]`, each
    /// tensor `(name, dtype, dims)`.
    fn models(&self, py: Python<'_>) -> PyResult<Vec<ModelTuple>> {
        let c = self.get()?;
        let list = py.detach(|| c.models()).map_err(to_py)?;
        Ok(list
            .iter()
            .map(|m| {
                let s = &m.signature;
                (s.name.clone(), specs(&s.inputs), specs(&s.outputs))
            })
            .collect())
    }

    /// A handle on the model called `name` (`UnknownModel` if there is none).
    fn model(&self, py: Python<'_>, name: &str) -> PyResult<Model> {
        let c = self.get()?;
        let model = py.detach(|| c.model(name)).map_err(to_py)?;
        let names = |v: &[TensorSpec]| {
            v.iter()
                .map(|s| PyString::new(py, &s.name).unbind())
                .collect()
        };
        Ok(Model {
            in_names: names(&model.signature().inputs),
            out_names: names(&model.signature().outputs),
            model: ManuallyDrop::new(model),
            shared: self.shared.clone(),
            made: self.made,
        })
    }

    /// A writable array of `dtype` (a wire dtype name) and `shape` to fill
    /// and send: in the session's arena over shm (sent without a copy),
    /// ordinary memory elsewhere.
    fn empty<'py>(
        &self,
        py: Python<'py>,
        dtype: &str,
        shape: Vec<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let d = DType::from_name(dtype)
            .ok_or_else(|| InvalidInput::new_err(format!("unknown dtype {dtype}")))?;
        let c = self.get()?;
        let b = py.detach(|| c.alloc_tensor(d, &shape)).map_err(to_py)?;
        arrays::over_block(py, Block::buffer(b))
    }

    /// Tensor bytes the Rust client copied so far, and requests sent.
    fn copy_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.get()?.copy_stats();
        let d = PyDict::new(py);
        d.set_item("input_bytes_copied", s.input_bytes_copied)?;
        d.set_item("output_bytes_copied", s.output_bytes_copied)?;
        d.set_item("staged_bytes", s.staged_bytes)?;
        d.set_item("requests", s.requests)?;
        let sh = &self.shared;
        d.set_item(
            "contiguous_copies",
            sh.contiguous_copies.load(Ordering::Relaxed),
        )?;
        d.set_item(
            "contiguous_bytes",
            sh.contiguous_bytes.load(Ordering::Relaxed),
        )?;
        Ok(d)
    }

    /// Over shm: the arena's regions and free space (`None` elsewhere).
    fn shm_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(s) = self.get()?.shm_info() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("client_len", s.client_len)?;
        d.set_item("agent_len", s.agent_len)?;
        d.set_item("client_free", s.client_free)?;
        d.set_item("client_largest_free", s.client_largest_free)?;
        Ok(Some(d))
    }

    /// One Ping/Pong round trip; returns its seconds.
    fn ping(&self, py: Python<'_>) -> PyResult<f64> {
        let c = self.get()?;
        Ok(py.detach(|| c.ping()).map_err(to_py)?.as_secs_f64())
    }

    /// Closes this handle: calls through it and through the models made
    /// from it raise `Disconnected` from now on. Requests already sent may
    /// still be waited for; the connection ends when nothing made from it
    /// (models, pending requests, outputs) is left.
    fn close(&self, py: Python<'_>) {
        self.shared.closed.store(true, Ordering::Relaxed);
        let c = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        if fork::same_process(self.made) {
            py.detach(|| drop(c));
        } else {
            std::mem::forget(c);
        }
    }

    fn __repr__(&self) -> String {
        format!("Client({:?})", self.uri)
    }
}

/// A model on one client (`Client.model(name)`).
#[pyclass(frozen, module = "tensorwire._native")]
pub struct Model {
    /// Dropped by hand: forgotten instead in a forked child.
    model: ManuallyDrop<client::Model>,
    /// Input and output names, as Python strings (dict keys).
    in_names: Vec<Py<PyString>>,
    out_names: Vec<Py<PyString>>,
    shared: Arc<Shared>,
    made: u64,
}

impl Model {
    /// The Rust model to send a request through: this handle's, or a clone
    /// carrying the request's priority level and queue timeout.
    fn scheduled(&self, priority: u8, queue_timeout: Option<Duration>) -> Cow<'_, client::Model> {
        if priority == 0 && queue_timeout.is_none() {
            return Cow::Borrowed(&*self.model);
        }
        let mut m = (*self.model).clone().with_priority(priority);
        if let Some(t) = queue_timeout {
            m = m.with_queue_timeout(t);
        }
        Cow::Owned(m)
    }

    fn check(&self) -> PyResult<()> {
        if !fork::same_process(self.made) {
            return Err(forked("model"));
        }
        if self.shared.closed.load(Ordering::Relaxed) {
            return Err(closed());
        }
        Ok(())
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // In a forked child the model (a clone of the parent's client,
        // whose last drop would close the parent's session) is forgotten.
        if fork::same_process(self.made) {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.model) };
        }
    }
}

/// `Outputs`, the Python half's dict class for a response.
fn outputs_class(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static OUTPUTS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    OUTPUTS.import(py, "tensorwire", "Outputs")
}

impl Model {
    /// The inputs in signature order (any order and names for a model
    /// without a signature, such as `identity`), with their names.
    fn prepare<'py>(
        &self,
        inputs: &Bound<'py, PyAny>,
    ) -> PyResult<(Vec<InputArray<'py>>, Vec<Bound<'py, PyString>>)> {
        let py = inputs.py();
        let sig = self.model.signature();
        let model = &sig.name;
        let takes = || {
            let names: Vec<&str> = sig.inputs.iter().map(|s| s.name.as_str()).collect();
            names.join(", ")
        };
        let mut pairs: Vec<(Bound<'py, PyString>, Bound<'py, PyAny>)> = Vec::new();
        // Any mapping reads as a dict (a dict itself costs no copy).
        let as_dict = match inputs.cast::<PyDict>() {
            Ok(d) => Some(d.clone()),
            Err(_) => match inputs.cast::<PyMapping>() {
                Ok(m) => Some(PyDict::from_sequence(&m.items()?.into_any())?),
                Err(_) => None,
            },
        };
        if let Some(d) = as_dict {
            if sig.inputs.is_empty() {
                for (k, v) in d.iter() {
                    let k = k.cast_into::<PyString>().map_err(|_| {
                        InvalidInput::new_err(format!("{model}: input names must be strings"))
                    })?;
                    pairs.push((k, v));
                }
            } else {
                for name in &self.in_names {
                    let name = name.bind(py);
                    let v = d.get_item(name)?.ok_or_else(|| {
                        InvalidInput::new_err(format!(
                            "{model}: missing input {:?} (it takes {})",
                            name.to_string(),
                            takes()
                        ))
                    })?;
                    pairs.push((name.clone(), v));
                }
                if d.len() != pairs.len() {
                    let extra = d
                        .keys()
                        .iter()
                        .map(|k| k.to_string())
                        .find(|k| !sig.inputs.iter().any(|s| &s.name == k))
                        .unwrap_or_default();
                    return Err(InvalidInput::new_err(format!(
                        "{model}: unknown input {extra:?} (it takes {})",
                        takes()
                    )));
                }
            }
        } else {
            // A list or tuple of arrays; an array, a string or bytes would
            // iterate into something else than meant.
            if inputs.cast::<PyUntypedArray>().is_ok()
                || inputs.cast::<PyString>().is_ok()
                || inputs.cast::<PyBytes>().is_ok()
            {
                return Err(InvalidInput::new_err(format!(
                    "{model}: inputs are a dict of name -> array, or a list of arrays in \
                     signature order, not a {}",
                    inputs.get_type().name()?
                )));
            }
            let values: Vec<Bound<'py, PyAny>> = inputs
                .try_iter()
                .map_err(|_| {
                    InvalidInput::new_err(format!(
                        "{model}: inputs are a dict of name -> array, or a list of arrays in \
                         signature order"
                    ))
                })?
                .collect::<PyResult<_>>()?;
            if !sig.inputs.is_empty() && values.len() != sig.inputs.len() {
                return Err(InvalidInput::new_err(format!(
                    "{model}: {} inputs given, it takes {} ({})",
                    values.len(),
                    sig.inputs.len(),
                    takes()
                )));
            }
            for (i, v) in values.into_iter().enumerate() {
                let name = match self.in_names.get(i) {
                    Some(n) => n.bind(py).clone(),
                    None => PyString::new(py, &format!("input_{i}")),
                };
                pairs.push((name, v));
            }
        }
        let mut arrays = Vec::with_capacity(pairs.len());
        let mut names = Vec::with_capacity(pairs.len());
        for (i, (name, v)) in pairs.into_iter().enumerate() {
            // The input's name for errors, made only when there is one.
            let what = || format!("{model}: input {:?}", name.to_string());
            let a = arrays::input(what, &v)?;
            if a.shape.len() > MAX_DIMS {
                return Err(InvalidInput::new_err(format!(
                    "{} has {} dims, at most {MAX_DIMS} are allowed",
                    what(),
                    a.shape.len()
                )));
            }
            if let Some(spec) = sig.inputs.get(i) {
                if a.dtype != spec.dtype {
                    return Err(InvalidInput::new_err(format!(
                        "{} is {}, the model takes {}",
                        what(),
                        a.dtype,
                        spec.dtype
                    )));
                }
                if !spec.accepts(a.dtype, &a.shape) {
                    let want: Vec<String> = spec
                        .shape
                        .iter()
                        .map(|d| d.map_or("?".to_string(), |d| d.to_string()))
                        .collect();
                    return Err(InvalidInput::new_err(format!(
                        "{} has shape {:?}, the model takes ({})",
                        what(),
                        a.shape,
                        want.join(", ")
                    )));
                }
            }
            if a.copied > 0 {
                self.shared
                    .contiguous_copies
                    .fetch_add(1, Ordering::Relaxed);
                self.shared
                    .contiguous_bytes
                    .fetch_add(a.copied as u64, Ordering::Relaxed);
            }
            arrays.push(a);
            names.push(name);
        }
        Ok((arrays, names))
    }
}

/// The tensors of prepared inputs.
fn tensor_refs<'a>(arrays: &'a [InputArray<'_>]) -> PyResult<Vec<TensorRef<'a>>> {
    arrays
        .iter()
        .map(|a| TensorRef::new(a.dtype, &a.shape, a.bytes()).map_err(to_py))
        .collect()
}

/// A response as an `Outputs` dict: output names from the signature; a
/// model without one (identity) names its outputs after its inputs.
fn outputs<'py>(
    py: Python<'py>,
    r: Response,
    shm: bool,
    out_names: &[Py<PyString>],
    in_names: &[Py<PyString>],
) -> PyResult<Bound<'py, PyAny>> {
    let n = r.outputs.len();
    let names = if !out_names.is_empty() {
        if out_names.len() != n {
            return Err(ProtocolError::new_err(format!(
                "the agent answered with {n} outputs, the model's signature has {}",
                out_names.len()
            )));
        }
        Some(out_names)
    } else {
        Some(in_names).filter(|v| v.len() == n)
    };
    let out = outputs_class(py)?.call0()?;
    let d = out.cast::<PyDict>()?;
    for (i, t) in r.outputs.into_iter().enumerate() {
        let a = arrays::over_block(py, Block::output(t, shm))?;
        match names {
            Some(names) => d.set_item(names[i].bind(py), a)?,
            None => d.set_item(format!("output_{i}"), a)?,
        }
    }
    Ok(out)
}

#[pymethods]
impl Model {
    /// The model's name.
    #[getter]
    fn name(&self) -> &str {
        &self.model.signature().name
    }

    /// Inputs, in the order requests carry them: `(name, dtype, dims)`.
    #[getter]
    fn inputs(&self) -> Vec<SpecTuple> {
        specs(&self.model.signature().inputs)
    }

    /// Outputs, in the order responses carry them.
    #[getter]
    fn outputs(&self) -> Vec<SpecTuple> {
        specs(&self.model.signature().outputs)
    }

    /// Runs the model on `inputs` (a dict of name -> array, or a sequence
    /// in signature order) and waits at most `timeout` seconds (default:
    /// the client's) for its outputs. `priority`: the request's level, 1
    /// the highest (0 or None: the model's default); `queue_timeout`: the
    /// most seconds it may wait in the agent's queue for the model (None
    /// or 0: the model's default).
    #[pyo3(signature = (inputs, timeout = None, *, priority = None, queue_timeout = None))]
    fn infer<'py>(
        &self,
        inputs: &Bound<'py, PyAny>,
        timeout: Option<f64>,
        priority: Option<&Bound<'py, PyAny>>,
        queue_timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.check()?;
        let py = inputs.py();
        let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let model = self.scheduled(
            parse_priority(priority)?,
            parse_queue_timeout(queue_timeout)?,
        );
        let (arrays, names) = self.prepare(inputs)?;
        let refs = tensor_refs(&arrays)?;
        let r = py
            .detach(|| match timeout {
                None => model.infer(&refs),
                Some(t) => model.submit(&refs)?.wait_timeout(t),
            })
            .map_err(to_py)?;
        drop(refs);
        drop(arrays);
        let in_names: Vec<Py<PyString>> = names.into_iter().map(Bound::unbind).collect();
        outputs(py, r, self.shared.shm, &self.out_names, &in_names)
    }

    /// Sends a request without waiting for it (`priority`, `queue_timeout`:
    /// as for `infer`).
    #[pyo3(signature = (inputs, *, priority = None, queue_timeout = None))]
    fn submit<'py>(
        &self,
        inputs: &Bound<'py, PyAny>,
        priority: Option<&Bound<'py, PyAny>>,
        queue_timeout: Option<f64>,
    ) -> PyResult<Pending> {
        self.check()?;
        let py = inputs.py();
        let model = self.scheduled(
            parse_priority(priority)?,
            parse_queue_timeout(queue_timeout)?,
        );
        let (arrays, names) = self.prepare(inputs)?;
        let refs = tensor_refs(&arrays)?;
        let t = py.detach(|| model.submit(&refs)).map_err(to_py)?;
        Ok(Pending {
            id: t.id(),
            ticket: Mutex::new(Some(t)),
            shared: self.shared.clone(),
            out_names: self.out_names.iter().map(|n| n.clone_ref(py)).collect(),
            in_names: names.into_iter().map(Bound::unbind).collect(),
            made: self.made,
        })
    }

    fn __repr__(&self) -> String {
        format!("Model({:?})", self.model.signature().name)
    }
}

/// A request in flight (`Model.submit`). Waited for once.
#[pyclass(frozen, module = "tensorwire._native")]
pub struct Pending {
    id: u64,
    ticket: Mutex<Option<Ticket>>,
    shared: Arc<Shared>,
    out_names: Vec<Py<PyString>>,
    in_names: Vec<Py<PyString>>,
    made: u64,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !fork::same_process(self.made) {
            let t = self.ticket.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(t.take());
        }
    }
}

#[pymethods]
impl Pending {
    /// The request id.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// Waits at most `timeout` seconds (default: the client's) for the
    /// outputs. On `Timeout` the request is given up.
    #[pyo3(signature = (timeout = None))]
    fn wait<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        if !fork::same_process(self.made) {
            return Err(forked("pending request"));
        }
        let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let ticket = self
            .ticket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err(
                    "this request was already waited for (or cancelled)",
                )
            })?;
        let r = py
            .detach(|| match timeout {
                None => ticket.wait(),
                Some(t) => ticket.wait_timeout(t),
            })
            .map_err(to_py)?;
        outputs(py, r, self.shared.shm, &self.out_names, &self.in_names)
    }

    /// Gives the request up: its response is discarded when it comes.
    fn cancel(&self, py: Python<'_>) {
        let t = self.ticket.lock().unwrap_or_else(|p| p.into_inner()).take();
        if fork::same_process(self.made) {
            py.detach(|| drop(t));
        } else {
            std::mem::forget(t);
        }
    }
}
