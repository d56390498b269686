//! Python exceptions: `TensorwireError` and one subclass per kind of
//! failure, each carrying the message the CLI prints for it.

use client::ClientError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

// Each docstring is what `help()` shows and what python/tensorwire/_native.pyi
// repeats word for word (python/tests/test_doc_examples.py checks both and
// runs their examples).
create_exception!(
    tensorwire,
    TensorwireError,
    PyException,
    r#"Every error tensorwire raises: catch it to handle them all.

Examples
--------
>>> import tensorwire as tw
>>> agent = tw.Agent(listen=["inproc://doc-tensorwireerror"])
>>> c = tw.connect("inproc://doc-tensorwireerror")
>>> try:
...     c.model("nope")
... except tw.TensorwireError as e:
...     print(type(e).__name__, "-", e)
UnknownModel - unknown model: no model named 'nope' (see `tensorwire models`)
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    ConnectError,
    TensorwireError,
    r#"The endpoint is malformed or could not be reached.

Examples
--------
>>> import tensorwire as tw
>>> for uri in ["unix:///nonexistent/agent.sock", "bogus://nowhere"]:
...     try:
...         tw.connect(uri, connect_timeout=1.0)
...     except tw.ConnectError as e:
...         print(e)
cannot connect: connect to unix:///nonexistent/agent.sock: No such file or directory (os error 2)
cannot connect: bad endpoint 'bogus://nowhere': unknown scheme 'bogus' (known: inproc, unix, tcp, tls, shm, vsock)"#
);
create_exception!(
    tensorwire,
    UnknownModel,
    TensorwireError,
    r#"The agent serves no model by this name.

Examples
--------
>>> import tensorwire as tw
>>> agent = tw.Agent(listen=["inproc://doc-unknownmodel"])
>>> c = tw.connect("inproc://doc-unknownmodel")
>>> try:
...     c.model("digits")
... except tw.UnknownModel as e:
...     print(e)
unknown model: no model named 'digits' (see `tensorwire models`)
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    InvalidInput,
    TensorwireError,
    r#"The tensors do not fit the model (names, count, dtype, shape), or are malformed.

Examples
--------
>>> import numpy as np, tensorwire as tw
>>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
...                  listen=["inproc://doc-invalidinput"])
>>> digits = tw.connect("inproc://doc-invalidinput").model("digits")
>>> for x in [np.zeros((1, 64)), np.zeros((1, 8, 8), np.float32)]:
...     try:
...         digits.infer({"x": x})
...     except tw.InvalidInput as e:
...         print(e)
digits: input "x" is float64, the model takes float32
digits: input "x" has shape [1, 8, 8], the model takes (?, 64)
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    LimitExceeded,
    TensorwireError,
    r#"A size or count is over the session's limits (a full shm arena included).

Examples
--------
>>> import numpy as np, tensorwire as tw
>>> agent = tw.Agent(listen=["shm://doc-limitexceeded"])
>>> c = tw.connect("shm://doc-limitexceeded")
>>> try:
...     c.empty(1 << 40, np.uint8)
... except tw.LimitExceeded as e:
...     print(e)
limit exceeded: a uint8[1099511627776] tensor is 1099511627776 bytes, the session allows 268435456
>>> c.close()
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    Overloaded,
    TensorwireError,
    r#"Refused at once, not run: the session already has its maximum of requests in flight,
or the model's queue in the agent is full (its max_queue requests wait already).

Examples
--------
slow_echo computes for 100-300 ms, one request at a time, and lets one
more wait: of three requests sent at once, one is refused.

>>> import tempfile, numpy as np, tensorwire as tw
>>> sock = tempfile.mkdtemp() + "/agent.sock"
>>> agent = tw.Agent(models={"slow_echo": {"path": "models/build/slow_echo.onnx", "max_queue": 1}},
...                  listen=[f"unix://{sock}"], intra_threads=1)
>>> clients = [tw.connect(f"unix://{sock}") for _ in range(3)]
>>> futures = [c.model("slow_echo").submit({"x": np.ones(4, np.float32)}) for c in clients]
>>> outcomes = []
>>> for f in futures:
...     try:
...         outcomes.append(float(f.result()["y"].sum()))
...     except tw.Overloaded as e:
...         outcomes.append(str(e))
>>> sorted(outcomes, key=str)
[4.0, 4.0, "overloaded: model 'slow_echo': the model's queue is full (1 requests wait already; retry later)"]
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    PermissionDenied,
    TensorwireError,
    r#"The client's tenant may not do this: call or see the model, or connect with this
token (the agent's tenants file decides; the message names the model and tenant).

Examples
--------
An agent whose only tenant, "vision", may call digits and nothing else
(tenants apply to clients of its sockets; an ``inproc://`` client is the
program that owns the agent):

>>> import hashlib, os, tempfile, tensorwire as tw
>>> d = tempfile.mkdtemp()
>>> digest = hashlib.sha256(b"vision-token").hexdigest()
>>> with open(os.path.join(d, "tenants.toml"), "w") as f:
...     _ = f.write(f'[[tenant]]\nname = "vision"\ntokens_sha256 = ["{digest}"]\nmodels = ["digits"]\n')
>>> with open(os.path.join(d, "agent.toml"), "w") as f:
...     _ = f.write(f'[access]\ntenants = "{d}/tenants.toml"\n')
>>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
...                  listen=[f"unix://{d}/agent.sock"], config=os.path.join(d, "agent.toml"))
>>> c = tw.connect(f"unix://{d}/agent.sock", token="vision-token")
>>> c.model("digits").name
'digits'
>>> try:
...     c.model("identity")
... except tw.PermissionDenied as e:
...     print(e)
permission denied: ...
>>> try:
...     tw.connect(f"unix://{d}/agent.sock", token="guessed")
... except tw.PermissionDenied as e:
...     print(e)
permission denied: ...
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    Timeout,
    TensorwireError,
    r#"No response came within the timeout (the request was given up), or the request
waited its whole queue timeout in the agent and was never computed.

Examples
--------
slow_echo computes for 100-300 ms:

>>> import tempfile, numpy as np, tensorwire as tw
>>> sock = tempfile.mkdtemp() + "/agent.sock"
>>> agent = tw.Agent(models={"slow_echo": "models/build/slow_echo.onnx"},
...                  listen=[f"unix://{sock}"], intra_threads=1)
>>> slow = tw.connect(f"unix://{sock}").model("slow_echo")
>>> try:
...     slow.infer({"x": np.ones(4, np.float32)}, timeout=0.02)
... except tw.Timeout as e:
...     print(e)
timed out after 20ms waiting for the agent
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    Disconnected,
    TensorwireError,
    r#"The agent closed the connection or died.

Examples
--------
>>> import tempfile, tensorwire as tw
>>> sock = tempfile.mkdtemp() + "/agent.sock"
>>> agent = tw.Agent(listen=[f"unix://{sock}"])
>>> c = tw.connect(f"unix://{sock}")
>>> agent.stop()
0
>>> try:
...     c.ping()
... except tw.Disconnected as e:
...     print(type(e).__name__)
Disconnected"#
);
create_exception!(
    tensorwire,
    ShuttingDown,
    Disconnected,
    r#"The agent is shutting down and refused the request.

Examples
--------
An in-process agent refuses requests once stopped; over a socket a
stopping agent may close the connection instead, so catching the base
class, Disconnected, handles both:

>>> import numpy as np, tensorwire as tw
>>> agent = tw.Agent(listen=["inproc://doc-shuttingdown"])
>>> identity = tw.connect("inproc://doc-shuttingdown").model("identity")
>>> agent.stop()
0
>>> try:
...     identity.infer({"a": np.zeros(1)})
... except tw.Disconnected as e:
...     print(type(e).__name__, "-", e)
ShuttingDown - agent is shutting down: the agent is shutting down and accepts no new requests"#
);
create_exception!(
    tensorwire,
    EngineError,
    TensorwireError,
    r#"The engine failed to run the model.

Examples
--------
slow_echo scales a matrix by its input's first value: an empty input
passes the signature check (any length) and fails in ONNX Runtime.

>>> import numpy as np, tensorwire as tw
>>> agent = tw.Agent(models={"slow_echo": "models/build/slow_echo.onnx"},
...                  listen=["inproc://doc-engineerror"])
>>> slow = tw.connect("inproc://doc-engineerror").model("slow_echo")
>>> try:
...     slow.infer({"x": np.zeros(0, np.float32)})
... except tw.EngineError as e:
...     print(e)
inference failed: model 'slow_echo': Non-zero status code returned while running Mul node. Name:'scale' Status Message: ... 512 is invalid.
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    ProtocolError,
    TensorwireError,
    r#"The agent broke the protocol, or reported an error of another kind.

Examples
--------
Something that is not an agent (here it echoes the client's Hello back)
on the socket:

>>> import os, socket, tempfile, threading, tensorwire as tw
>>> path = os.path.join(tempfile.mkdtemp(), "echo.sock")
>>> server = socket.socket(socket.AF_UNIX)
>>> server.bind(path)
>>> server.listen(1)
>>> def echo_once():
...     conn, _ = server.accept()
...     with conn:
...         conn.sendall(conn.recv(4096))
>>> t = threading.Thread(target=echo_once)
>>> t.start()
>>> try:
...     tw.connect(f"unix://{path}")
... except tw.ProtocolError as e:
...     print(e)
protocol error: expected HelloAck, agent sent Hello
>>> t.join()
>>> server.close()"#
);
create_exception!(
    tensorwire,
    ReleasedError,
    TensorwireError,
    r#"The output (or buffer) was released; its memory may hold something else now.

Examples
--------
>>> import numpy as np, tensorwire as tw
>>> agent = tw.Agent(listen=["shm://doc-releasederror"])
>>> c = tw.connect("shm://doc-releasederror")
>>> out = c.model("identity").infer({"a": np.zeros(4)})
>>> _ = out.release()
>>> try:
...     out["a"]
... except tw.ReleasedError as e:
...     print(e)
output 'a' was released (out.release())
>>> c.close()
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    ForkedError,
    TensorwireError,
    r#"The object belongs to the process this one was forked from.

Examples
--------
>>> import os, tensorwire as tw
>>> agent = tw.Agent(listen=["inproc://doc-forkederror"])
>>> c = tw.connect("inproc://doc-forkederror")
>>> r, w = os.pipe()
>>> pid = os.fork()
>>> if pid == 0:  # the child: its copy of c is the parent's session
...     try:
...         c.ping()
...     except tw.ForkedError as e:
...         os.write(w, str(e).encode())
...     os._exit(0)
>>> os.close(w)
>>> os.waitpid(pid, 0)[1]
0
>>> print(os.read(r, 1000).decode())
this client was made before fork() and belongs to the parent process; connect again in the child (its shm rings and socket are the parent's)
>>> os.close(r)
>>> agent.stop()
0"#
);
create_exception!(
    tensorwire,
    AgentError,
    TensorwireError,
    r#"An embedded agent could not start (bad endpoint, model, or setting).

Examples
--------
>>> import tensorwire as tw
>>> try:
...     tw.Agent(listen=["inproc://doc-agenterror", "bogus://nowhere"])
... except tw.AgentError as e:
...     print(e)
invalid setting: bad listen address 'bogus://nowhere': unknown scheme 'bogus' (the agent's endpoints: inproc://, unix://, tcp://, tls://, shm://; KServe v2 front doors: grpc://, http://, grpcs://, https://)"#
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
