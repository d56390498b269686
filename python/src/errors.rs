//! Python exceptions: `TensorwireError` and one subclass per kind of
//! failure, each carrying the message the CLI prints for it.

use client::ClientError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    TensorwireError,
    PyException,
    "Every error tensorwire raises."
);
create_exception!(
    _native,
    ConnectError,
    TensorwireError,
    "The endpoint is malformed or could not be reached."
);
create_exception!(
    _native,
    UnknownModel,
    TensorwireError,
    "The agent serves no model by this name."
);
create_exception!(
    _native,
    InvalidInput,
    TensorwireError,
    "The tensors do not fit the model (names, count, dtype, shape), or are malformed."
);
create_exception!(
    _native,
    LimitExceeded,
    TensorwireError,
    "A size or count is over the session's limits (a full shm arena included)."
);
create_exception!(
    _native,
    Overloaded,
    TensorwireError,
    "Refused at once, not run: the session already has its maximum of requests in flight, \
     or the model's queue in the agent is full (its max_queue requests wait already)."
);
create_exception!(
    _native,
    PermissionDenied,
    TensorwireError,
    "The client's tenant may not do this: call or see the model, or connect with this \
     token (the agent's tenants file decides; the message names the model and tenant)."
);
create_exception!(
    _native,
    Timeout,
    TensorwireError,
    "No response came within the timeout (the request was given up), or the request \
     waited its whole queue timeout in the agent and was never computed."
);
create_exception!(
    _native,
    Disconnected,
    TensorwireError,
    "The agent closed the connection or died."
);
create_exception!(
    _native,
    ShuttingDown,
    Disconnected,
    "The agent is shutting down and refused the request."
);
create_exception!(
    _native,
    EngineError,
    TensorwireError,
    "The engine failed to run the model."
);
create_exception!(
    _native,
    ProtocolError,
    TensorwireError,
    "The agent broke the protocol, or reported an error of another kind."
);
create_exception!(
    _native,
    ReleasedError,
    TensorwireError,
    "The output (or buffer) was released; its memory may hold something else now."
);
create_exception!(
    _native,
    ForkedError,
    TensorwireError,
    "The object belongs to the process this one was forked from."
);
create_exception!(
    _native,
    AgentError,
    TensorwireError,
    "An embedded agent could not start (bad endpoint, model, or setting)."
);

/// The Python exception for a client error, with its message.
pub fn to_py(e: ClientError) -> PyErr {
    let msg = e.to_string();
    match e {
        ClientError::Connect(_) => ConnectError::new_err(msg),
        ClientError::UnknownModel(_) => UnknownModel::new_err(msg),
        ClientError::InvalidInput(_) => InvalidInput::new_err(msg),
        ClientError::LimitExceeded(_) => LimitExceeded::new_err(msg),
        ClientError::TooManyInFlight(_) | ClientError::Overloaded(_) => Overloaded::new_err(msg),
        ClientError::Timeout(_) | ClientError::QueueTimeout(_) => Timeout::new_err(msg),
        ClientError::AgentGone(_) => Disconnected::new_err(msg),
        ClientError::ShuttingDown(_) => ShuttingDown::new_err(msg),
        ClientError::Engine(_) => EngineError::new_err(msg),
        ClientError::PermissionDenied(_) => PermissionDenied::new_err(msg),
        ClientError::Remote { .. } | ClientError::Protocol(_) => ProtocolError::new_err(msg),
    }
}

/// The error for an object used after `fork()` in the child.
pub fn forked(what: &str) -> PyErr {
    ForkedError::new_err(format!(
        "this {what} was made before fork() and belongs to the parent process; \
         connect again in the child (its shm rings and socket are the parent's)"
    ))
}

/// The error for a closed client.
pub fn closed() -> PyErr {
    Disconnected::new_err("the client is closed")
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TensorwireError", py.get_type::<TensorwireError>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("UnknownModel", py.get_type::<UnknownModel>())?;
    m.add("InvalidInput", py.get_type::<InvalidInput>())?;
    m.add("LimitExceeded", py.get_type::<LimitExceeded>())?;
    m.add("Overloaded", py.get_type::<Overloaded>())?;
    m.add("PermissionDenied", py.get_type::<PermissionDenied>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("Disconnected", py.get_type::<Disconnected>())?;
    m.add("ShuttingDown", py.get_type::<ShuttingDown>())?;
    m.add("EngineError", py.get_type::<EngineError>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    m.add("ReleasedError", py.get_type::<ReleasedError>())?;
    m.add("ForkedError", py.get_type::<ForkedError>())?;
    m.add("AgentError", py.get_type::<AgentError>())?;
    Ok(())
}
