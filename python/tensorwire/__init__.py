"""tensorwire: call models that live in a shared agent, from Python.

    import numpy as np, tensorwire as tw

    c = tw.connect("shm://demo")                 # shm://, unix://, tcp://, inproc://
    m = c.model("digits")
    out = m.infer({"x": np.zeros((1, 64), np.float32)})    # dict name -> ndarray
    fut = m.submit({"x": x}); out = fut.result(timeout=1.0)  # many in flight
    out = await m.infer_async({"x": x})                      # asyncio
    out = m.infer({"x": x}, priority=1, queue_timeout=0.005) # agent's queue: level 1, ≤ 5 ms
    buf = c.empty((1, 64), np.float32)           # over shm: lives in the arena
    buf[:] = x; out = m.infer({"x": buf})        # sent where it lies: no copy

Over ``shm://`` outputs are read-only arrays that view the session's arena
without a copy; their memory stays theirs until the last array (or view) of
it is garbage-collected, or ``out.release()`` frees it at once. Elsewhere
they are ordinary read-only arrays over the response buffer.

Every failure raises a subclass of :class:`TensorwireError`.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import threading
import weakref
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import (
    AgentError,
    ConnectError,
    Disconnected,
    EngineError,
    ForkedError,
    InvalidInput,
    LimitExceeded,
    Overloaded,
    PermissionDenied,
    ProtocolError,
    ReleasedError,
    ShuttingDown,
    Timeout,
    TensorwireError,
    UnknownModel,
)

__all__ = [
    "connect",
    "Client",
    "Model",
    "ModelInfo",
    "TensorInfo",
    "Future",
    "Outputs",
    "Agent",
    "TensorwireError",
    "ConnectError",
    "UnknownModel",
    "InvalidInput",
    "LimitExceeded",
    "Overloaded",
    "PermissionDenied",
    "Timeout",
    "Disconnected",
    "ShuttingDown",
    "EngineError",
    "ProtocolError",
    "ReleasedError",
    "ForkedError",
    "AgentError",
    "CancelledError",
]

try:  # NumPy has no bfloat16; ml_dtypes (if installed) provides one.
    import ml_dtypes as _ml_dtypes

    _BF16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None


def _np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a wire dtype name (bfloat16: ml_dtypes' or uint16)."""
    if name == "bfloat16":
        return _BF16 if _BF16 is not None else np.dtype(np.uint16)
    return np.dtype(name)


def _wire_name(dt: np.dtype) -> Optional[str]:
    """The wire dtype name of a NumPy dtype, or None if the wire lacks it."""
    if _BF16 is not None and dt == _BF16:
        return "bfloat16"
    name = dt.name
    if name in _WIRE_NAMES and dt.byteorder in "=|<":
        return name
    return None


_WIRE_NAMES = frozenset(_native.DTYPES) - {"bfloat16"}




class TensorInfo(NamedTuple):
    """One input or output of a model: name, dtype, dims (None = any size)."""

    name: str
    dtype: np.dtype
    shape: Tuple[Optional[int], ...]


class ModelInfo(NamedTuple):
    """A model's name and signature."""

    name: str
    inputs: List[TensorInfo]
    outputs: List[TensorInfo]


def _infos(specs: Iterable[Tuple[str, str, List[Optional[int]]]]) -> List[TensorInfo]:
    return [TensorInfo(n, _np_dtype(d), tuple(s)) for n, d, s in specs]


class Outputs(Dict[str, np.ndarray]):
    """The outputs of one request: a dict of output name -> read-only ndarray.

    ``release()`` frees the outputs' memory now instead of when the dict is
    garbage-collected (over shm: gives the agent its arena blocks back).
    Memory an array still reads is never freed: outputs whose arrays (or
    views of them) are referenced elsewhere stay valid, and are freed when
    those go. After ``release()``, reading an output from this dict raises
    :class:`ReleasedError`.
    """

    _released = False  # set on the instance by release()

    def __getitem__(self, name: str) -> np.ndarray:
        if self._released:
            raise ReleasedError(f"output {name!r} was released (out.release())")
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        if self._released:
            raise ReleasedError(f"output {name!r} was released (out.release())")
        return dict.get(self, name, default)

    @property
    def released(self) -> bool:
        """Whether release() was called."""
        return self._released

    def release(self) -> List[str]:
        """Drops this dict's outputs, freeing those no other array refers
        to; returns the names of those still referenced elsewhere (freed
        when their arrays go)."""
        if self._released:
            return []
        # Each output's memory belongs to the array's base (a Block), which
        # lives exactly as long as some array or view refers to it: drop
        # ours, then see through weak references which ones live on.
        bases = []
        for name in list(dict.keys(self)):
            arr = dict.pop(self, name)
            bases.append((name, weakref.ref(arr.base)))
            del arr
        self._released = True
        return [name for name, base in bases if base() is not None]


class CancelledError(TensorwireError):
    """The request was cancelled (:meth:`Future.cancel`)."""


class Future:
    """A request in flight (:meth:`Model.submit`); wait with :meth:`result`.
    Any thread may wait; every waiter gets the same outputs (or error).

    Unlike ``concurrent.futures.Future``, a request whose wait times out is
    given up (its response is discarded when it comes): :meth:`result` then
    raises :class:`Timeout`, now and on every later call.
    """

    __slots__ = ("_pending", "_lock", "_outputs", "_error")

    def __init__(self, pending: "_native.Pending") -> None:
        self._pending = pending
        self._lock = threading.Lock()
        self._outputs: Optional[Outputs] = None
        self._error: Optional[BaseException] = None

    @property
    def id(self) -> int:
        """The request id."""
        return self._pending.id

    def done(self) -> bool:
        """Whether the outcome (outputs, error or cancellation) is known."""
        return self._outputs is not None or self._error is not None

    def result(self, timeout: Optional[float] = None) -> Outputs:
        """Waits at most ``timeout`` seconds (default: the client's) and
        returns the outputs, or raises the request's error."""
        with self._lock:
            if self._outputs is None and self._error is None:
                try:
                    self._outputs = self._pending.wait(timeout)
                except TensorwireError as e:
                    self._error = e
            if self._error is not None:
                raise self._error
            assert self._outputs is not None
            return self._outputs

    def cancel(self) -> bool:
        """Gives the request up (its response is discarded when it comes);
        :meth:`result` raises :class:`CancelledError` from now on. Returns
        False if the outcome was already known."""
        with self._lock:
            if self.done():
                return False
            self._pending.cancel()
            self._error = CancelledError(f"request {self.id} was cancelled")
            return True


Inputs = Union[Mapping[str, Any], Sequence[Any]]


class Model:
    """A model on a client (:meth:`Client.model`): call it with a dict of
    input name -> array (or a sequence in signature order)."""

    __slots__ = ("_m", "name", "inputs", "outputs")

    def __init__(self, native: "_native.Model") -> None:
        self._m = native
        self.name: str = native.name
        self.inputs: List[TensorInfo] = _infos(native.inputs)
        self.outputs: List[TensorInfo] = _infos(native.outputs)

    def __repr__(self) -> str:
        return f"Model({self.name!r}, inputs={self.inputs}, outputs={self.outputs})"

    def infer(
        self,
        inputs: Inputs,
        timeout: Optional[float] = None,
        *,
        priority: int = 0,
        queue_timeout: Optional[float] = None,
    ) -> Outputs:
        """Runs the model and waits at most ``timeout`` seconds (default: the
        client's) for its outputs: a dict of output name -> read-only ndarray.

        ``inputs``: a dict of input name -> array (or a sequence in the
        signature's order). Each must have the signature's dtype and shape
        (:class:`InvalidInput` names the one that does not, before anything
        is sent); arrays that are not C-contiguous are copied once
        (``copy_stats()["contiguous_copies"]``).

        When the model is busy, the request waits in the agent's queue for
        it; two arguments say how:

        ``priority``: the request's level, 1 the highest, up to the model's
        ``priority_levels``; 0 (the default) is the model's default level.
        Higher levels are served first; a waiting request rises one level
        per ``priority_aging_ms`` of the model, so none starves. A level
        the model does not have raises :class:`InvalidInput`; one outside
        0..=255 raises ``ValueError`` before anything is sent.

        ``queue_timeout``: the most seconds the request may wait in that
        queue (None or 0: the model's default, ``queue_timeout_ms``; at most
        ~4295 s). A request still waiting then is never computed and raises
        :class:`Timeout`. A negative, infinite or NaN value raises
        ``ValueError``. ``timeout`` (the wait for the answer) should be
        longer. A model whose queue is full (``max_queue``) refuses the
        request at once: :class:`Overloaded`."""
        return self._m.infer(inputs, timeout, priority=priority, queue_timeout=queue_timeout)

    def submit(
        self,
        inputs: Inputs,
        *,
        priority: int = 0,
        queue_timeout: Optional[float] = None,
    ) -> Future:
        """Sends a request without waiting; many may be in flight at once.
        The inputs are sent (or copied into the arena) before it returns, so
        they may be reused at once — except :meth:`Client.empty` buffers,
        which are read in place until the response has come. ``priority``
        and ``queue_timeout``: as for :meth:`infer` (a bad value raises
        ``ValueError`` here; the agent's refusals come from
        :meth:`Future.result`)."""
        return Future(self._m.submit(inputs, priority=priority, queue_timeout=queue_timeout))

    async def infer_async(
        self,
        inputs: Inputs,
        timeout: Optional[float] = None,
        *,
        priority: int = 0,
        queue_timeout: Optional[float] = None,
    ) -> Outputs:
        """:meth:`infer` for asyncio: sends at once, then waits in the loop's
        default executor, so the event loop goes on meanwhile. ``priority``
        and ``queue_timeout``: as for :meth:`infer`."""
        fut = self.submit(inputs, priority=priority, queue_timeout=queue_timeout)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, fut.result, timeout)


class Client:
    """A connection to an agent; see :func:`connect`. Thread-safe: many
    threads may share one client and call its models at once."""

    __slots__ = ("_c", "__weakref__")

    def __init__(
        self,
        uri: str,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        spin_us: Optional[int] = None,
        token: Optional[str] = None,
    ) -> None:
        self._c = _native.Client(uri, timeout, connect_timeout, spin_us, token)

    def __repr__(self) -> str:
        return f"Client({self.uri!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def uri(self) -> str:
        """The endpoint."""
        return self._c.uri

    @property
    def transport(self) -> str:
        """``shm``, ``unix``, ``tcp`` or ``inproc``."""
        return self._c.transport

    def models(self) -> List[ModelInfo]:
        """The models the agent serves, with their signatures."""
        return [ModelInfo(n, _infos(i), _infos(o)) for n, i, o in self._c.models()]

    def model(self, name: str) -> Model:
        """A handle on the model called ``name`` (:class:`UnknownModel` if
        the agent serves none)."""
        return Model(self._c.model(name))

    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
        """A writable array to fill and send. Over shm it lives in the
        session's arena, so sending it copies nothing; elsewhere it is
        ordinary memory. Its contents are unspecified: overwrite them. Do not
        write to it while a request that reads it is in flight."""
        dt = np.dtype(dtype)
        wire = _wire_name(dt)
        if wire is None:
            raise InvalidInput(f"tensorwire does not carry {dt}")
        try:
            dims = [operator.index(shape)] if not isinstance(shape, Sequence) else [operator.index(d) for d in shape]
        except TypeError:
            raise InvalidInput(f"a shape is a sequence of integers, not {shape!r}") from None
        if any(d < 0 or d >= 1 << 63 for d in dims):
            raise InvalidInput(f"dimension out of range in {tuple(dims)}")
        return self._c.empty(wire, dims)

    def copy_stats(self) -> Dict[str, int]:
        """Tensor bytes copied so far: by the Rust client (into the arena,
        out of a socket's staging buffer) and by this package (inputs that
        were not C-contiguous, ``contiguous_copies`` / ``contiguous_bytes``)."""
        return dict(self._c.copy_stats())

    def shm_info(self) -> Optional[Dict[str, int]]:
        """Over shm: the arena's regions and free bytes; None elsewhere."""
        return self._c.shm_info()

    def ping(self) -> float:
        """One Ping/Pong round trip with the agent; its seconds."""
        return self._c.ping()

    def close(self) -> None:
        """Closes the connection once nothing made from it (models, pending
        requests, outputs) is left; calls raise :class:`Disconnected` after."""
        self._c.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._c.closed


def connect(
    uri: str,
    timeout: float = 30.0,
    connect_timeout: float = 5.0,
    spin_us: Optional[int] = None,
    token: Optional[str] = None,
) -> Client:
    """Connects to a tensorwire agent.

    ``uri``: ``shm://name`` (shared memory: the fastest, zero-copy with
    :meth:`Client.empty`), ``unix:///path/to.sock``, ``tcp://host:port``,
    ``tls://host:port``, ``vsock://CID:PORT`` (from a VM to its host:
    ``vsock://2:PORT``), or ``inproc://name`` (an :class:`Agent` in this
    process).
    ``timeout``: seconds a call waits for its response (:class:`Timeout`).
    ``connect_timeout``: seconds connecting may take.
    ``spin_us``: microseconds a waiting call polls before it sleeps.
    ``token``: the bearer token naming this client's tenant in an agent
    with a tenants file (default: the ``TENSORWIRE_TOKEN`` environment
    variable, if set).

    Raises :class:`ConnectError` when the agent cannot be reached, and
    :class:`PermissionDenied` when it does not accept the token.
    """
    if token is None:
        token = os.environ.get("TENSORWIRE_TOKEN") or None
    return Client(uri, timeout, connect_timeout, spin_us, token)


def _find_onnxruntime() -> None:
    """Points the engine at the onnxruntime wheel's library when the caller
    did not (ORT_DYLIB_PATH) and the wheel is importable."""
    import glob
    import os

    if os.environ.get("ORT_DYLIB_PATH"):
        return
    try:
        import importlib.util

        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    for root in spec.submodule_search_locations:
        libs = sorted(glob.glob(os.path.join(root, "capi", "libonnxruntime.so*")))
        if libs:
            os.environ["ORT_DYLIB_PATH"] = libs[0]
            return


def _toml_value(name: str, key: str, v: Any) -> str:
    """``v`` as a TOML value (what ``--model NAME=PATH;KEY=VALUE`` takes)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(name, key, x) for x in v) + "]"
    raise AgentError(f"model {name!r}: setting {key!r} is a {type(v).__name__}, "
                     "not a number, bool, string or list")


def _model_flag(name: str, v: Any) -> str:
    """A ``models`` value as ``PATH[;KEY=VALUE...]``."""
    if not isinstance(v, Mapping):
        return str(v)
    if "path" not in v:
        raise AgentError(f"model {name!r}: its settings need the ONNX file as 'path'")
    path = str(v["path"])
    if ";" in path:
        raise AgentError(f"model {name!r}: a path with settings may not contain ';': {path!r}")
    opts = [f"{k}={_toml_value(name, str(k), x)}" for k, x in v.items() if k != "path"]
    return ";".join([path, *opts])


class Agent:
    """A tensorwire agent inside this Python process: the one
    ``tensorwire serve`` runs, with the same models and endpoints.

        agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
                         listen=["shm://demo", "unix:///tmp/tw.sock"])

    ``models``: name -> ONNX file (``identity`` is always served), or name
    -> a dict with the file as ``"path"`` and any settings of a config
    file's ``[[model]]`` table (batching, instances, queue):

        agent = tw.Agent(models={"digits": {"path": "models/build/digits_mlp.onnx",
                                            "max_batch": 32,
                                            "max_queue_delay_us": 200}},
                         listen=["shm://demo"])

    ``listen``: endpoints, ``inproc://name`` included (for clients in this
    process), and the KServe v2 front doors ``grpc://HOST:PORT`` and
    ``http://HOST:PORT`` (port 0 picks a free one), which stock
    ``tritonclient.grpc`` / ``tritonclient.http`` clients talk to:

        agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
                         listen=["shm://demo", "grpc://127.0.0.1:8001",
                                 "http://127.0.0.1:8000"])

    ``config``: a TOML file as for ``tensorwire serve --config`` (front
    doors in its ``listen`` list are started too). Every URI is checked
    before anything starts; a bad one, or one that cannot be bound, raises
    :class:`AgentError` naming it, and leaves nothing running.
    Stops with :meth:`stop`, at the end of a ``with`` block, or when
    garbage-collected.
    """

    __slots__ = ("_a",)

    def __init__(
        self,
        models: Optional[Mapping[str, str]] = None,
        listen: Sequence[str] = (),
        config: Optional[str] = None,
        intra_threads: Optional[int] = None,
        inter_threads: Optional[int] = None,
    ) -> None:
        if isinstance(listen, str):
            listen = [listen]
        if models:
            _find_onnxruntime()
        pairs = [(str(k), _model_flag(str(k), v)) for k, v in (models or {}).items()]
        self._a = _native.Agent(pairs, list(listen), config, intra_threads, inter_threads)

    def __repr__(self) -> str:
        return f"Agent({self.endpoints})"

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def endpoints(self) -> List[str]:
        """The endpoints listened on: the agent's own, then its front doors
        (``grpc://…``, then ``http://…``), each ``…:0`` resolved to its port."""
        return self._a.endpoints

    @property
    def running(self) -> bool:
        """Whether the agent still serves."""
        return self._a.running

    def stats(self) -> Dict[str, int]:
        """Counters: responses, errors, connections, in flight, shm sessions."""
        return dict(self._a.stats())

    def stop(self, grace: float = 5.0) -> int:
        """Stops as ``tensorwire serve`` does: the front doors answer
        not-ready, the agent refuses new requests and gives those in flight
        (front-door ones included) up to ``grace`` seconds, closes every
        session, then the front doors close. Returns how many requests were
        unfinished."""
        return self._a.stop(grace)
