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

Every public name has an ``Examples`` section. Each starts its own
:class:`Agent` in this process and runs from the repository's root (where
``models/build`` holds the models ``scripts/setup.sh`` builds);
``python/tests/test_doc_examples.py`` runs them all.

Examples
--------
An agent serving the digits classifier, and a client calling it over
shared memory:

>>> import numpy as np, tensorwire as tw
>>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
...                  listen=["shm://doc-module"])
>>> c = tw.connect("shm://doc-module")
>>> digits = c.model("digits")
>>> images = np.fromfile("models/build/digits_mlp_input.bin", np.float32).reshape(4, 64)
>>> out = digits.infer({"x": images})
>>> out["logits"].shape, out["logits"].argmax(axis=1)
((4, 10), array([8, 5, 9, 6]))
>>> buf = c.empty((4, 64), np.float32)  # in the session's arena
>>> buf[:] = images
>>> same = digits.infer({"x": buf})      # sent where it lies
>>> bool((same["logits"] == out["logits"]).all()), c.copy_stats()["input_bytes_copied"]
(True, 1024)
>>> c.close()
>>> agent.stop()
0
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
    """One input or output of a model: name, dtype, dims (None = any size).

    Examples
    --------
    >>> import tensorwire as tw
    >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
    ...                  listen=["inproc://doc-tensorinfo"])
    >>> c = tw.connect("inproc://doc-tensorinfo")
    >>> x = c.model("digits").inputs[0]
    >>> x
    TensorInfo(name='x', dtype=dtype('float32'), shape=(None, 64))
    >>> x.name, x.dtype.itemsize, x.shape[1]
    ('x', 4, 64)
    >>> agent.stop()
    0
    """

    name: str
    dtype: np.dtype
    shape: Tuple[Optional[int], ...]


class ModelInfo(NamedTuple):
    """A model's name and signature (:meth:`Client.models`); ``identity``
    declares no tensors: it takes any and returns them.

    Examples
    --------
    >>> import tensorwire as tw
    >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
    ...                  listen=["inproc://doc-modelinfo"])
    >>> c = tw.connect("inproc://doc-modelinfo")
    >>> for info in c.models():
    ...     print(info.name, [i.name for i in info.inputs], [o.name for o in info.outputs])
    identity [] []
    digits ['x'] ['logits']
    >>> agent.stop()
    0
    """

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

    Examples
    --------
    >>> import numpy as np, tensorwire as tw
    >>> agent = tw.Agent(listen=["shm://doc-outputs"])
    >>> c = tw.connect("shm://doc-outputs")
    >>> out = c.model("identity").infer({"a": np.arange(3, dtype=np.int64)})
    >>> out
    {'a': array([0, 1, 2], dtype=int64)}
    >>> out["a"].flags.writeable, out["a"].base.in_arena  # read-only, in the arena
    (False, True)
    >>> out.release()
    []
    >>> c.close()
    >>> agent.stop()
    0
    """

    _released = False  # set on the instance by release()

    def __getitem__(self, name: str) -> np.ndarray:
        """The output called ``name`` (``KeyError`` if there is none;
        :class:`ReleasedError` after :meth:`release`).

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-outputs-getitem"])
        >>> c = tw.connect("inproc://doc-outputs-getitem")
        >>> out = c.model("identity").infer({"a": np.float32(1.5)})
        >>> out["a"]
        array(1.5, dtype=float32)
        >>> agent.stop()
        0
        """
        if self._released:
            raise ReleasedError(f"output {name!r} was released (out.release())")
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """The output called ``name``, or ``default`` if there is none
        (:class:`ReleasedError` after :meth:`release`).

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-outputs-get"])
        >>> c = tw.connect("inproc://doc-outputs-get")
        >>> out = c.model("identity").infer({"a": np.ones(2, np.uint8)})
        >>> out.get("a"), out.get("b")
        (array([1, 1], dtype=uint8), None)
        >>> agent.stop()
        0
        """
        if self._released:
            raise ReleasedError(f"output {name!r} was released (out.release())")
        return dict.get(self, name, default)

    @property
    def released(self) -> bool:
        """Whether release() was called.

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-outputs-released"])
        >>> c = tw.connect("inproc://doc-outputs-released")
        >>> out = c.model("identity").infer({"a": np.zeros(4)})
        >>> out.released
        False
        >>> _ = out.release()
        >>> out.released
        True
        >>> agent.stop()
        0
        """
        return self._released

    def release(self) -> List[str]:
        """Drops this dict's outputs, freeing those no other array refers
        to; returns the names of those still referenced elsewhere (freed
        when their arrays go).

        Examples
        --------
        Over shm this gives the agent its arena blocks back at once:

        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["shm://doc-outputs-release"])
        >>> c = tw.connect("shm://doc-outputs-release")
        >>> out = c.model("identity").infer({"a": np.zeros(4), "b": np.ones(4)})
        >>> kept = out["b"]          # still read elsewhere: stays valid
        >>> out.release()
        ['b']
        >>> kept
        array([1., 1., 1., 1.])
        >>> try:
        ...     out["a"]
        ... except tw.ReleasedError as e:
        ...     print(e)
        output 'a' was released (out.release())
        >>> c.close()
        >>> agent.stop()
        0
        """
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
    """The request was cancelled (:meth:`Future.cancel`).

    Examples
    --------
    >>> import tempfile, numpy as np, tensorwire as tw
    >>> sock = tempfile.mkdtemp() + "/agent.sock"
    >>> agent = tw.Agent(listen=[f"unix://{sock}"])
    >>> c = tw.connect(f"unix://{sock}")
    >>> fut = c.model("identity").submit({"a": np.zeros(8)})
    >>> fut.cancel()
    True
    >>> try:
    ...     fut.result()
    ... except tw.CancelledError as e:
    ...     print(type(e).__name__, isinstance(e, tw.TensorwireError))
    CancelledError True
    >>> c.close()
    >>> agent.stop()
    0
    """


class Future:
    """A request in flight (:meth:`Model.submit`); wait with :meth:`result`.
    Any thread may wait; every waiter gets the same outputs (or error).

    Unlike ``concurrent.futures.Future``, a request whose wait times out is
    given up (its response is discarded when it comes): :meth:`result` then
    raises :class:`Timeout`, now and on every later call.

    Examples
    --------
    >>> import tempfile, numpy as np, tensorwire as tw
    >>> sock = tempfile.mkdtemp() + "/agent.sock"
    >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
    ...                  listen=[f"unix://{sock}"])
    >>> c = tw.connect(f"unix://{sock}")
    >>> digits = c.model("digits")
    >>> futures = [digits.submit({"x": np.zeros((n, 64), np.float32)}) for n in (1, 2, 3)]
    >>> [f.result(timeout=10.0)["logits"].shape for f in futures]
    [(1, 10), (2, 10), (3, 10)]
    >>> c.close()
    >>> agent.stop()
    0
    """

    __slots__ = ("_pending", "_lock", "_outputs", "_error")

    def __init__(self, pending: "_native.Pending") -> None:
        self._pending = pending
        self._lock = threading.Lock()
        self._outputs: Optional[Outputs] = None
        self._error: Optional[BaseException] = None

    @property
    def id(self) -> int:
        """The request id.

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-future-id"])
        >>> c = tw.connect("inproc://doc-future-id")
        >>> a, b = (c.model("identity").submit({"a": np.zeros(1)}) for _ in range(2))
        >>> a.id != b.id
        True
        >>> agent.stop()
        0
        """
        return self._pending.id

    def done(self) -> bool:
        """Whether the outcome (outputs, error or cancellation) is known:
        after :meth:`result` returned or raised, or :meth:`cancel`.

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-future-done"])
        >>> c = tw.connect("inproc://doc-future-done")
        >>> fut = c.model("identity").submit({"a": np.zeros(1)})
        >>> _ = fut.result()
        >>> fut.done()
        True
        >>> agent.stop()
        0
        """
        return self._outputs is not None or self._error is not None

    def result(self, timeout: Optional[float] = None) -> Outputs:
        """Waits at most ``timeout`` seconds (default: the client's) and
        returns the outputs, or raises the request's error. Any thread may
        call it, any number of times: the outcome is kept.

        Examples
        --------
        >>> import tempfile, numpy as np, tensorwire as tw
        >>> sock = tempfile.mkdtemp() + "/agent.sock"
        >>> agent = tw.Agent(models={"slow_echo": "models/build/slow_echo.onnx"},
        ...                  listen=[f"unix://{sock}"], intra_threads=1)
        >>> c = tw.connect(f"unix://{sock}")
        >>> fut = c.model("identity").submit({"a": np.arange(4, dtype=np.int32)})
        >>> fut.result(timeout=5.0)
        {'a': array([0, 1, 2, 3], dtype=int32)}

        slow_echo computes for 100-300 ms; a shorter wait gives it up:

        >>> fut = c.model("slow_echo").submit({"x": np.ones(4, np.float32)})
        >>> try:
        ...     fut.result(timeout=0.02)
        ... except tw.Timeout as e:
        ...     print(e)
        timed out after 20ms waiting for the agent
        >>> c.close()
        >>> agent.stop()
        0
        """
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
        False if the outcome was already known.

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-future-cancel"])
        >>> c = tw.connect("inproc://doc-future-cancel")
        >>> fut = c.model("identity").submit({"a": np.zeros(1)})
        >>> fut.cancel(), fut.cancel()
        (True, False)
        >>> try:
        ...     fut.result()
        ... except tw.CancelledError as e:
        ...     print(e)
        request 3 was cancelled
        >>> fut.id
        3
        >>> agent.stop()
        0
        """
        with self._lock:
            if self.done():
                return False
            self._pending.cancel()
            self._error = CancelledError(f"request {self.id} was cancelled")
            return True


Inputs = Union[Mapping[str, Any], Sequence[Any]]


class Model:
    """A model on a client (:meth:`Client.model`): call it with a dict of
    input name -> array (or a sequence in signature order).

    Examples
    --------
    >>> import numpy as np, tensorwire as tw
    >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
    ...                  listen=["inproc://doc-model"])
    >>> c = tw.connect("inproc://doc-model")
    >>> digits = c.model("digits")
    >>> digits
    Model('digits', inputs=[TensorInfo(name='x', dtype=dtype('float32'), shape=(None, 64))], outputs=[TensorInfo(name='logits', dtype=dtype('float32'), shape=(None, 10))])
    >>> digits.name, [i.name for i in digits.inputs], [o.name for o in digits.outputs]
    ('digits', ['x'], ['logits'])
    >>> digits.infer([np.zeros((2, 64), np.float32)])["logits"].shape  # a sequence: signature order
    (2, 10)
    >>> agent.stop()
    0
    """

    __slots__ = {
        "_m": "The native model handle.",
        "name": "The model's name.",
        "inputs": "Its inputs (:class:`TensorInfo`), in the order requests carry them.",
        "outputs": "Its outputs (:class:`TensorInfo`), in the order responses carry them.",
    }

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
        request at once: :class:`Overloaded`.

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
        ...                  listen=["inproc://doc-model-infer"])
        >>> c = tw.connect("inproc://doc-model-infer")
        >>> digits = c.model("digits")
        >>> images = np.fromfile("models/build/digits_mlp_input.bin", np.float32).reshape(4, 64)
        >>> out = digits.infer({"x": images}, timeout=10.0)
        >>> out["logits"].argmax(axis=1)
        array([8, 5, 9, 6])
        >>> out = digits.infer({"x": images}, priority=1, queue_timeout=0.5)
        >>> try:
        ...     digits.infer({"x": images[:, :63]})
        ... except tw.InvalidInput as e:
        ...     print(e)
        digits: input "x" has shape [4, 63], the model takes (?, 64)
        >>> agent.stop()
        0
        """
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
        :meth:`Future.result`).

        Examples
        --------
        >>> import tempfile, numpy as np, tensorwire as tw
        >>> sock = tempfile.mkdtemp() + "/agent.sock"
        >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
        ...                  listen=[f"unix://{sock}"])
        >>> c = tw.connect(f"unix://{sock}")
        >>> digits = c.model("digits")
        >>> x = np.zeros((1, 64), np.float32)
        >>> futures = [digits.submit({"x": x}) for _ in range(8)]  # x may be reused at once
        >>> len({f.id for f in futures}), all(f.result()["logits"].shape == (1, 10) for f in futures)
        (8, True)
        >>> c.close()
        >>> agent.stop()
        0
        """
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
        and ``queue_timeout``: as for :meth:`infer`.

        Examples
        --------
        >>> import asyncio, numpy as np, tensorwire as tw
        >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
        ...                  listen=["inproc://doc-model-async"])
        >>> digits = tw.connect("inproc://doc-model-async").model("digits")
        >>> async def classify(batches):
        ...     outs = await asyncio.gather(*(digits.infer_async({"x": b}) for b in batches))
        ...     return [o["logits"].shape for o in outs]
        >>> asyncio.run(classify([np.zeros((n, 64), np.float32) for n in (1, 2)]))
        [(1, 10), (2, 10)]
        >>> agent.stop()
        0
        """
        fut = self.submit(inputs, priority=priority, queue_timeout=queue_timeout)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, fut.result, timeout)


class Client:
    """A connection to an agent; see :func:`connect` (which takes the
    token from ``TENSORWIRE_TOKEN`` too). Thread-safe: many threads may
    share one client and call its models at once. A ``with`` block closes
    it.

    Examples
    --------
    >>> import tempfile, numpy as np, tensorwire as tw
    >>> sock = tempfile.mkdtemp() + "/agent.sock"
    >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
    ...                  listen=[f"unix://{sock}"])
    >>> with tw.Client(f"unix://{sock}", timeout=10.0) as c:
    ...     out = c.model("digits").infer({"x": np.zeros((1, 64), np.float32)})
    ...     print(c.transport, out["logits"].shape)
    unix (1, 10)
    >>> c.closed
    True
    >>> agent.stop()
    0
    """

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
        """The endpoint.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["tcp://127.0.0.1:0"])
        >>> uri = agent.endpoints[0]      # port 0: the agent picked one
        >>> c = tw.connect(uri)
        >>> c.uri == uri, c.uri.startswith("tcp://127.0.0.1:")
        (True, True)
        >>> c.close()
        >>> agent.stop()
        0
        """
        return self._c.uri

    @property
    def transport(self) -> str:
        """``shm``, ``unix``, ``tcp``, ``tls``, ``vsock`` or ``inproc``.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-transport", "shm://doc-transport"])
        >>> [tw.connect(uri).transport for uri in agent.endpoints]
        ['inproc', 'shm']
        >>> agent.stop()
        0
        """
        return self._c.transport

    def models(self) -> List[ModelInfo]:
        """The models the agent serves, with their signatures
        (:class:`ModelInfo`).

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
        ...                  listen=["inproc://doc-models"])
        >>> [m.name for m in tw.connect("inproc://doc-models").models()]
        ['identity', 'digits']
        >>> agent.stop()
        0
        """
        return [ModelInfo(n, _infos(i), _infos(o)) for n, i, o in self._c.models()]

    def model(self, name: str) -> Model:
        """A handle on the model called ``name`` (:class:`UnknownModel` if
        the agent serves none). Look a model up once and call it many
        times: the name is resolved here, not per request.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
        ...                  listen=["inproc://doc-client-model"])
        >>> c = tw.connect("inproc://doc-client-model")
        >>> c.model("digits").name
        'digits'
        >>> try:
        ...     c.model("digitz")
        ... except tw.UnknownModel as e:
        ...     print(e)
        unknown model: no model named 'digitz' (see `tensorwire models`)
        >>> agent.stop()
        0
        """
        return Model(self._c.model(name))

    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
        """A writable array to fill and send. Over shm it lives in the
        session's arena, so sending it copies nothing; elsewhere it is
        ordinary memory. Its contents are unspecified: overwrite them. Do not
        write to it while a request that reads it is in flight.

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
        ...                  listen=["shm://doc-empty"])
        >>> c = tw.connect("shm://doc-empty")
        >>> x = c.empty((2, 64), np.float32)
        >>> x[:] = 0.5
        >>> out = c.model("digits").infer({"x": x})
        >>> out["logits"].shape, c.copy_stats()["input_bytes_copied"]  # sent where it lies
        ((2, 10), 0)
        >>> c.close()
        >>> agent.stop()
        0
        """
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
        were not C-contiguous, ``contiguous_copies`` / ``contiguous_bytes``).

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["shm://doc-copy-stats"])
        >>> c = tw.connect("shm://doc-copy-stats")
        >>> identity = c.model("identity")
        >>> _ = identity.infer({"a": np.zeros((8, 8))[:, ::2]})  # not contiguous: copied here
        >>> c.copy_stats()
        {'input_bytes_copied': 256, 'output_bytes_copied': 0, 'staged_bytes': 0, 'requests': 1, 'contiguous_copies': 1, 'contiguous_bytes': 256}
        >>> c.close()
        >>> agent.stop()
        0
        """
        return dict(self._c.copy_stats())

    def shm_info(self) -> Optional[Dict[str, int]]:
        """Over shm: the arena's regions and free bytes; None elsewhere.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["shm://doc-shm-info", "inproc://doc-shm-info"])
        >>> tw.connect("shm://doc-shm-info").shm_info()
        {'client_len': 268435456, 'agent_len': 67108864, 'client_free': 268435456, 'client_largest_free': 268435456}
        >>> print(tw.connect("inproc://doc-shm-info").shm_info())
        None
        >>> agent.stop()
        0
        """
        return self._c.shm_info()

    def ping(self) -> float:
        """One Ping/Pong round trip with the agent; its seconds.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["shm://doc-ping"])
        >>> c = tw.connect("shm://doc-ping")
        >>> 0.0 < c.ping() < 1.0
        True
        >>> c.close()
        >>> agent.stop()
        0
        """
        return self._c.ping()

    def close(self) -> None:
        """Closes the connection once nothing made from it (models, pending
        requests, outputs) is left; calls raise :class:`Disconnected` after.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-close"])
        >>> c = tw.connect("inproc://doc-close")
        >>> c.close()
        >>> try:
        ...     c.ping()
        ... except tw.Disconnected as e:
        ...     print(e)
        the client is closed
        >>> agent.stop()
        0
        """
        self._c.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-closed"])
        >>> c = tw.connect("inproc://doc-closed")
        >>> c.closed
        False
        >>> c.close()
        >>> c.closed
        True
        >>> agent.stop()
        0
        """
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

    Examples
    --------
    >>> import numpy as np, tensorwire as tw
    >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
    ...                  listen=["shm://doc-connect"])
    >>> c = tw.connect("shm://doc-connect", timeout=10.0)
    >>> c
    Client('shm://doc-connect')
    >>> c.model("digits").infer({"x": np.zeros((1, 64), np.float32)})["logits"].shape
    (1, 10)
    >>> c.close()
    >>> try:
    ...     tw.connect("unix:///nonexistent/agent.sock", connect_timeout=1.0)
    ... except tw.ConnectError as e:
    ...     print(e)
    cannot connect: connect to unix:///nonexistent/agent.sock: No such file or directory (os error 2)
    >>> agent.stop()
    0
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

    ``models``: name -> ONNX file (``identity`` is always served), or name
    -> a dict with the file as ``"path"`` and any settings of a config
    file's ``[[model]]`` table (batching, instances, queue).

    ``listen``: endpoints, ``inproc://name`` included (for clients in this
    process), and the KServe v2 front doors ``grpc://HOST:PORT`` and
    ``http://HOST:PORT`` (port 0 picks a free one), which stock
    ``tritonclient.grpc`` / ``tritonclient.http`` clients talk to.

    ``config``: a TOML file as for ``tensorwire serve --config`` (front
    doors in its ``listen`` list are started too). ``intra_threads`` /
    ``inter_threads``: ONNX Runtime's threads per run. Every URI is checked
    before anything starts; a bad one, or one that cannot be bound, raises
    :class:`AgentError` naming it, and leaves nothing running.
    Stops with :meth:`stop`, at the end of a ``with`` block, or when
    garbage-collected.

    Examples
    --------
    >>> import tempfile, numpy as np, tensorwire as tw
    >>> sock = tempfile.mkdtemp() + "/agent.sock"
    >>> agent = tw.Agent(models={"digits": "models/build/digits_mlp.onnx"},
    ...                  listen=["shm://doc-agent", f"unix://{sock}"])
    >>> for uri in agent.endpoints:
    ...     with tw.connect(uri) as c:
    ...         print(c.transport, c.model("digits").infer({"x": np.zeros((1, 64), np.float32)})["logits"].shape)
    shm (1, 10)
    unix (1, 10)
    >>> agent.stop()
    0

    A model's settings, and the KServe v2 front doors on ports the system
    picks:

    >>> settings = {"path": "models/build/digits_mlp.onnx", "max_batch": 32,
    ...             "max_queue_delay_us": 200}
    >>> with tw.Agent(models={"digits": settings},
    ...               listen=["inproc://doc-agent", "grpc://127.0.0.1:0",
    ...                       "http://127.0.0.1:0"]) as agent:
    ...     print(agent)
    Agent(['inproc://doc-agent', 'grpc://127.0.0.1:...', 'http://127.0.0.1:...'])
    >>> agent.running
    False
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
        (``grpc://…``, then ``http://…``), each ``…:0`` resolved to its port.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-endpoints", "tcp://127.0.0.1:0"])
        >>> agent.endpoints
        ['inproc://doc-endpoints', 'tcp://127.0.0.1:...']
        >>> agent.stop()
        0
        """
        return self._a.endpoints

    @property
    def running(self) -> bool:
        """Whether the agent still serves.

        Examples
        --------
        >>> import tensorwire as tw
        >>> agent = tw.Agent(listen=["inproc://doc-running"])
        >>> agent.running
        True
        >>> agent.stop()
        0
        >>> agent.running
        False
        """
        return self._a.running

    def stats(self) -> Dict[str, int]:
        """Counters: responses, errors, connections, in flight, shm sessions.

        Examples
        --------
        >>> import numpy as np, tensorwire as tw
        >>> agent = tw.Agent(listen=["shm://doc-stats"])
        >>> c = tw.connect("shm://doc-stats")
        >>> _ = c.model("identity").infer({"a": np.zeros(4)})
        >>> agent.stats()
        {'connections': 1, 'accepted': 1, 'responses': 1, 'errors': 0, 'in_flight': 0, 'shm_sessions': 1}
        >>> c.close()
        >>> agent.stop()
        0
        """
        return dict(self._a.stats())

    def stop(self, grace: float = 5.0) -> int:
        """Stops as ``tensorwire serve`` does: the front doors answer
        not-ready, the agent refuses new requests and gives those in flight
        (front-door ones included) up to ``grace`` seconds, closes every
        session, then the front doors close. Returns how many requests were
        unfinished.

        Examples
        --------
        A request computing when the agent stops is given the grace period
        to finish; clients then see :class:`Disconnected`:

        >>> import tempfile, time, numpy as np, tensorwire as tw
        >>> sock = tempfile.mkdtemp() + "/agent.sock"
        >>> agent = tw.Agent(models={"slow_echo": "models/build/slow_echo.onnx"},
        ...                  listen=[f"unix://{sock}"], intra_threads=1)
        >>> c = tw.connect(f"unix://{sock}")
        >>> fut = c.model("slow_echo").submit({"x": np.arange(3, dtype=np.float32)})
        >>> for _ in range(5000):  # until the agent has it (at most 5 s)
        ...     if agent.stats()["in_flight"]:
        ...         break
        ...     time.sleep(0.001)
        >>> agent.stop(grace=10.0)
        0
        >>> fut.result()["y"]
        array([0., 1., 2.], dtype=float32)
        >>> try:
        ...     c.ping()
        ... except tw.Disconnected as e:
        ...     print(type(e).__name__)
        Disconnected
        """
        return self._a.stop(grace)
