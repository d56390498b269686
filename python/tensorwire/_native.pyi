"""Type stubs for tensorwire._native, the Rust half of the package (pyo3).
Use the names re-exported by ``tensorwire``; this module is private.

Each docstring here is the runtime one (the Rust doc comment in python/src)
word for word, and python/tests/test_doc_examples.py checks that they stay
so and runs their examples (the exceptions', which ``tensorwire``
re-exports)."""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

# The wire's dtype names, in code order (a list: it carries no docstring).
DTYPES: List[str]

_Spec = Tuple[str, str, List[Optional[int]]]
_Inputs = Union[Mapping[str, Any], Sequence[Any]]

class TensorwireError(Exception):
    """Every error tensorwire raises: catch it to handle them all.

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
    0
    """

class ConnectError(TensorwireError):
    """The endpoint is malformed or could not be reached.

    Examples
    --------
    >>> import tensorwire as tw
    >>> for uri in ["unix:///nonexistent/agent.sock", "bogus://nowhere"]:
    ...     try:
    ...         tw.connect(uri, connect_timeout=1.0)
    ...     except tw.ConnectError as e:
    ...         print(e)
    cannot connect: connect to unix:///nonexistent/agent.sock: No such file or directory (os error 2)
    cannot connect: bad endpoint 'bogus://nowhere': unknown scheme 'bogus' (known: inproc, unix, tcp, tls, shm, vsock)
    """

class UnknownModel(TensorwireError):
    """The agent serves no model by this name.

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
    0
    """

class InvalidInput(TensorwireError):
    """The tensors do not fit the model (names, count, dtype, shape), or are malformed.

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
    0
    """

class LimitExceeded(TensorwireError):
    """A size or count is over the session's limits (a full shm arena included).

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
    0
    """

class Overloaded(TensorwireError):
    """Refused at once, not run: the session already has its maximum of requests in flight,
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
    0
    """

class PermissionDenied(TensorwireError):
    r"""The client's tenant may not do this: call or see the model, or connect with this
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
    0
    """

class Timeout(TensorwireError):
    """No response came within the timeout (the request was given up), or the request
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
    0
    """

class Disconnected(TensorwireError):
    """The agent closed the connection or died.

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
    Disconnected
    """

class ShuttingDown(Disconnected):
    """The agent is shutting down and refused the request.

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
    ShuttingDown - agent is shutting down: the agent is shutting down and accepts no new requests
    """

class EngineError(TensorwireError):
    """The engine failed to run the model.

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
    0
    """

class ProtocolError(TensorwireError):
    """The agent broke the protocol, or reported an error of another kind.

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
    >>> server.close()
    """

class ReleasedError(TensorwireError):
    """The output (or buffer) was released; its memory may hold something else now.

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
    0
    """

class ForkedError(TensorwireError):
    """The object belongs to the process this one was forked from.

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
    0
    """

class AgentError(TensorwireError):
    """An embedded agent could not start (bad endpoint, model, or setting).

    Examples
    --------
    >>> import tensorwire as tw
    >>> try:
    ...     tw.Agent(listen=["inproc://doc-agenterror", "bogus://nowhere"])
    ... except tw.AgentError as e:
    ...     print(e)
    invalid setting: bad listen address 'bogus://nowhere': unknown scheme 'bogus' (the agent's endpoints: inproc://, unix://, tcp://, tls://, shm://; KServe v2 front doors: grpc://, http://, grpcs://, https://)
    """

class Block:
    """Memory an ndarray views (the array's `base`): an output, or a buffer
    made by `Client.empty`. Private to the package: use the arrays.
    """

    @property
    def dtype(self) -> str:
        """The element type's name (`float32`, `bfloat16`, ...)."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """The dimensions."""
    @property
    def nbytes(self) -> int:
        """Length in bytes."""
    @property
    def in_arena(self) -> bool:
        """Whether the memory lies in the session's shared-memory arena."""

class Pending:
    """A request in flight (`Model.submit`). Waited for once."""

    @property
    def id(self) -> int:
        """The request id."""
    def wait(self, timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """Waits at most `timeout` seconds (default: the client's) for the
        outputs. On `Timeout` the request is given up.
        """
    def cancel(self) -> None:
        """Gives the request up: its response is discarded when it comes."""

class Model:
    """A model on one client (`Client.model(name)`)."""

    @property
    def name(self) -> str:
        """The model's name."""
    @property
    def inputs(self) -> List[_Spec]:
        """Inputs, in the order requests carry them: `(name, dtype, dims)`."""
    @property
    def outputs(self) -> List[_Spec]:
        """Outputs, in the order responses carry them."""
    def infer(
        self,
        inputs: _Inputs,
        timeout: Optional[float] = None,
        *,
        priority: Optional[int] = None,
        queue_timeout: Optional[float] = None,
    ) -> Dict[str, np.ndarray]:
        """Runs the model on `inputs` (a dict of name -> array, or a sequence
        in signature order) and waits at most `timeout` seconds (default:
        the client's) for its outputs. `priority`: the request's level, 1
        the highest (0 or None: the model's default); `queue_timeout`: the
        most seconds it may wait in the agent's queue for the model (None
        or 0: the model's default).
        """
    def submit(
        self,
        inputs: _Inputs,
        *,
        priority: Optional[int] = None,
        queue_timeout: Optional[float] = None,
    ) -> Pending:
        """Sends a request without waiting for it (`priority`, `queue_timeout`:
        as for `infer`).
        """

class Client:
    """A connection to an agent (`tensorwire._native.Client(uri, ...)`).
    Thread-safe: many Python threads may call it at once.
    """

    def __init__(
        self,
        uri: str,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        spin_us: Optional[int] = None,
        token: Optional[str] = None,
    ) -> None: ...
    @property
    def uri(self) -> str:
        """The endpoint, normalised."""
    @property
    def transport(self) -> str:
        """`shm`, `unix`, `tcp` or `inproc`."""
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
    def models(self) -> List[Tuple[str, List[_Spec], List[_Spec]]]:
        """The models the agent serves: `[(name, inputs, outputs)]`, each
        tensor `(name, dtype, dims)`.
        """
    def model(self, name: str) -> Model:
        """A handle on the model called `name` (`UnknownModel` if there is none)."""
    def empty(self, dtype: str, shape: List[int]) -> np.ndarray:
        """A writable array of `dtype` (a wire dtype name) and `shape` to fill
        and send: in the session's arena over shm (sent without a copy),
        ordinary memory elsewhere.
        """
    def copy_stats(self) -> Dict[str, int]:
        """Tensor bytes the Rust client copied so far, and requests sent."""
    def shm_info(self) -> Optional[Dict[str, int]]:
        """Over shm: the arena's regions and free space (`None` elsewhere)."""
    def ping(self) -> float:
        """One Ping/Pong round trip; returns its seconds."""
    def close(self) -> None:
        """Closes this handle: calls through it and through the models made
        from it raise `Disconnected` from now on. Requests already sent may
        still be waited for; the connection ends when nothing made from it
        (models, pending requests, outputs) is left.
        """

class Agent:
    """An agent running in this process (`tensorwire._native.Agent(...)`)."""

    def __init__(
        self,
        models: List[Tuple[str, str]] = ...,
        listen: List[str] = ...,
        config: Optional[str] = None,
        intra_threads: Optional[int] = None,
        inter_threads: Optional[int] = None,
    ) -> None: ...
    @property
    def endpoints(self) -> List[str]:
        """The endpoints listened on, the agent's own then its front doors
        (gRPC, then HTTP), each `…:0` port resolved.
        """
    @property
    def running(self) -> bool:
        """Whether the agent is still serving."""
    def stats(self) -> Dict[str, int]:
        """Counters: responses, errors, connections, ..."""
    def stop(self, grace: float = 5.0) -> int:
        """Stops, in the order of `tensorwire serve`: the front doors answer
        not-ready; the agent refuses new requests, gives those in flight
        (front-door ones included) up to `grace` seconds and closes every
        session; then the front doors close. Returns how many requests
        were unfinished.
        """
