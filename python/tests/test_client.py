"""The Python client against real agents on every transport."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import tensorwire as tw
from twtest import digits_sample

try:
    import ml_dtypes  # noqa: F401

    HAVE_BF16 = True
except ImportError:
    HAVE_BF16 = False


def test_models_lists_signatures(uri):
    c = tw.connect(uri)
    models = {m.name: m for m in c.models()}
    assert {"identity", "digits", "mixed"} <= set(models)
    d = models["digits"]
    assert d.inputs == [tw.TensorInfo("x", np.dtype(np.float32), (None, 64))]
    assert d.outputs == [tw.TensorInfo("logits", np.dtype(np.float32), (None, 10))]
    m = c.model("mixed")
    assert [t.name for t in m.inputs] == ["a", "b", "c"]
    assert [t.dtype for t in m.outputs] == [np.dtype(np.float16), np.dtype(bool), np.dtype(np.int64), np.dtype(np.int64)]


def test_digits_match_the_reference(uri):
    x, y = digits_sample()
    c = tw.connect(uri)
    out = c.model("digits").infer({"x": x})
    assert list(out) == ["logits"]
    np.testing.assert_allclose(out["logits"], y, rtol=1e-5, atol=1e-5)
    # A sequence in signature order works too.
    np.testing.assert_allclose(c.model("digits").infer([x])["logits"], y, rtol=1e-5, atol=1e-5)


def test_outputs_are_read_only_arrays(uri):
    x, _ = digits_sample()
    out = tw.connect(uri).model("digits").infer({"x": x})
    with pytest.raises(ValueError):
        out["logits"][0, 0] = 1.0
    assert out["logits"].copy().flags.writeable


@pytest.mark.parametrize(
    "dtype", ["float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"]
)
def test_every_dtype_round_trips_through_identity(uri, dtype):
    rng = np.random.default_rng(7)
    shape = (3, 5, 2)
    if dtype == "bool":
        x = rng.integers(0, 2, shape).astype(bool)
    elif dtype.startswith("float"):
        x = rng.standard_normal(shape).astype(dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype)
    out = tw.connect(uri).model("identity").infer({"t": x})
    assert out["t"].dtype == x.dtype and out["t"].shape == shape
    np.testing.assert_array_equal(out["t"], x)


@pytest.mark.skipif(not HAVE_BF16, reason="bfloat16 needs the ml_dtypes package, which is not installed")
def test_bfloat16_round_trips(uri):
    x = np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3)
    out = tw.connect(uri).model("identity").infer({"t": x})
    np.testing.assert_array_equal(out["t"], x)


def test_several_inputs_and_outputs_with_dynamic_dims(uri):
    m = tw.connect(uri).model("mixed")
    for n, k in [(1, 4), (5, 2), (0, 1)]:
        a = np.arange(n * 3, dtype=np.float16).reshape(n, 3)
        b = (np.arange(k) % 2).astype(bool)
        c = np.arange(n * k, dtype=np.int64).reshape(n, k) - 3
        out = m.infer({"c": c, "a": a, "b": b})  # dict order does not matter
        assert list(out) == ["a2", "nb", "c1", "s"]
        np.testing.assert_array_equal(out["a2"], a * np.float16(2))
        np.testing.assert_array_equal(out["nb"], ~b)
        np.testing.assert_array_equal(out["c1"], c + 1)
        assert out["s"].shape == () and int(out["s"]) == int(c.sum())


def test_identity_names_outputs_after_inputs(uri):
    out = tw.connect(uri).model("identity").infer({"p": np.ones(2), "q": np.zeros(3, np.int32)})
    assert list(out) == ["p", "q"]
    out = tw.connect(uri).model("identity").infer([np.ones(2)])
    assert list(out) == ["input_0"]


def test_pipelined_submits(uri):
    m = tw.connect(uri).model("digits")
    x, y = digits_sample()
    futs = [m.submit({"x": x[i % 4 : i % 4 + 1]}) for i in range(64)]
    for i, f in enumerate(futs):
        out = f.result(timeout=10.0)
        assert f.done()
        np.testing.assert_allclose(out["logits"][0], y[i % 4], rtol=1e-5, atol=1e-5)
        assert f.result() is out  # collected once, kept


def test_asyncio(uri):
    m = tw.connect(uri).model("identity")

    async def main():
        xs = [np.full(4, i, np.int64) for i in range(50)]
        outs = await asyncio.gather(*(m.infer_async({"v": x}, timeout=10.0) for x in xs))
        return xs, outs

    xs, outs = asyncio.run(main())
    for x, o in zip(xs, outs):
        np.testing.assert_array_equal(o["v"], x)


def test_eight_threads_share_one_client(uri):
    c = tw.connect(uri)
    m = c.model("digits")
    x, y = digits_sample()
    errors = []

    def work(t):
        try:
            for i in range(100):
                j = (t + i) % 4
                out = m.infer({"x": x[j : j + 1]})
                np.testing.assert_allclose(out["logits"][0], y[j], rtol=1e-5, atol=1e-5)
                if i % 10 == 0:
                    fut = c.model("identity").submit({"t": np.full(3, t)})
                    np.testing.assert_array_equal(fut.result()["t"], np.full(3, t))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_non_contiguous_inputs_are_copied_and_counted(uri):
    c = tw.connect(uri)
    x, y = digits_sample()
    xf = np.asfortranarray(x)
    assert not xf.flags.c_contiguous
    before = c.copy_stats()["contiguous_copies"]
    out = c.model("digits").infer({"x": xf})
    np.testing.assert_allclose(out["logits"], y, rtol=1e-5, atol=1e-5)
    s = c.copy_stats()
    assert s["contiguous_copies"] == before + 1
    assert s["contiguous_bytes"] >= x.nbytes
    # A strided view of an identity input arrives as its values.
    v = np.arange(20, dtype=np.int32)[::2]
    np.testing.assert_array_equal(c.model("identity").infer({"v": v})["v"], v)


def test_empty_buffers_are_sent_in_place_over_shm(served):
    c = tw.connect(served.uris["shm"])
    buf = c.empty((256, 1024), np.float32)  # 1 MiB in the arena
    buf[:] = np.arange(buf.size, dtype=np.float32).reshape(buf.shape)
    before = c.copy_stats()["input_bytes_copied"]
    out = c.model("identity").infer({"x": buf})
    assert c.copy_stats()["input_bytes_copied"] == before  # nothing copied in
    # The identity's output is the input, where it lies: no copy back either.
    assert out["x"].ctypes.data == buf.ctypes.data
    np.testing.assert_array_equal(out["x"], buf)
    # Ordinary arrays are copied into the arena once.
    c.model("identity").infer({"x": np.ones(1024, np.float32)})
    assert c.copy_stats()["input_bytes_copied"] == before + 4096


def test_empty_buffers_work_on_every_transport(uri):
    c = tw.connect(uri)
    buf = c.empty((2, 64), np.float32)
    assert buf.flags.writeable and buf.shape == (2, 64)
    x, y = digits_sample()
    buf[:] = x[:2]
    np.testing.assert_allclose(c.model("digits").infer({"x": buf})["logits"], y[:2], rtol=1e-5, atol=1e-5)


def test_release_frees_only_what_no_array_reads(served):
    c = tw.connect(served.uris["shm"])
    ident = c.model("identity")
    free0 = c.shm_info()["client_free"]
    buf = c.empty(8 << 20, np.uint8)  # 8 MiB
    buf[:] = 7
    out = ident.infer({"x": buf})
    del buf  # the output still aliases the allocation
    assert c.shm_info()["client_free"] <= free0 - (8 << 20)
    kept = out["x"][:10]  # a view keeps the memory alive
    assert out.release() == ["x"]
    with pytest.raises(tw.ReleasedError):
        out["x"]
    assert int(kept.sum()) == 70  # still valid memory
    assert c.shm_info()["client_free"] <= free0 - (8 << 20)
    del kept  # the last reader goes: the block with it
    assert c.shm_info()["client_free"] == free0

    buf = c.empty(8 << 20, np.uint8)
    out = ident.infer({"x": buf})
    del buf
    assert out.release() == []  # nothing else held it: freed now
    assert out.released
    assert c.shm_info()["client_free"] == free0
    assert out.release() == []  # idempotent


def test_closed_client_raises(uri):
    c = tw.connect(uri)
    m = c.model("identity")
    c.close()
    assert c.closed
    with pytest.raises(tw.Disconnected):
        m.infer({})
    with pytest.raises(tw.Disconnected):
        c.models()


def test_a_future_is_shared_by_threads_and_can_be_cancelled(uri):
    m = tw.connect(uri).model("identity")
    fut = m.submit({"v": np.arange(5)})
    got = []
    threads = [threading.Thread(target=lambda: got.append(fut.result(timeout=10.0))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 4 and all(g is got[0] for g in got)
    np.testing.assert_array_equal(got[0]["v"], np.arange(5))
    assert not fut.cancel()  # already done
    fut = m.submit({"v": np.arange(5)})
    assert fut.cancel()
    assert fut.done()
    with pytest.raises(tw.CancelledError):
        fut.result()
    np.testing.assert_array_equal(m.infer({"v": np.arange(3)})["v"], np.arange(3))
