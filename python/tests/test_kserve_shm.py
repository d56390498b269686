"""Triton's system shared-memory extension on the agent's KServe front
doors (`tensorwire serve --listen grpc://... --listen http://...`), driven
by the stock, unmodified `tritonclient.grpc`, `tritonclient.http` and
`tritonclient.utils.shared_memory`: digits with inputs and outputs in
shared memory against the reference logits, identity with a 16 MiB tensor
in and out, a region registered over one door and used over the other,
shared-memory and inline tensors in one request, status and unregister,
and bad requests each refused with a clear error while the next good one
succeeds. One agent (both doors) for the module."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from twtest import BUILD, FrontDoorAgent, digits_sample

grpcclient = pytest.importorskip(
    "tritonclient.grpc",
    reason="tritonclient[grpc] is not installed (pip install 'tritonclient[grpc,http]')",
)
httpclient = pytest.importorskip(
    "tritonclient.http",
    reason="tritonclient[http] is not installed (pip install 'tritonclient[grpc,http]')",
)
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

MIB16 = 16 << 20


@pytest.fixture(scope="module")
def agent():
    a = FrontDoorAgent(["grpc", "http"], {"digits": BUILD / "digits_mlp.onnx"})
    yield a
    a.stop()
    assert a.proc.returncode == 0, a.proc.stderr.read()


class Door:
    """One front door through its stock client, with the few calls whose
    shapes differ between tritonclient.http and tritonclient.grpc made
    alike."""

    def __init__(self, kind: str, address: str) -> None:
        self.kind = kind
        self.mod = grpcclient if kind == "grpc" else httpclient
        self.client = self.mod.InferenceServerClient(address)

    def input(self, name, shape, datatype, region=None, byte_size=None, offset=0, data=None):
        i = self.mod.InferInput(name, list(shape), datatype)
        if region is not None:
            i.set_shared_memory(region, byte_size, offset)
        else:
            i.set_data_from_numpy(data)
        return i

    def output(self, name, region=None, byte_size=None, offset=0):
        o = self.mod.InferRequestedOutput(name)
        if region is not None:
            o.set_shared_memory(region, byte_size, offset)
        return o

    def status(self, name=""):
        """[{name, key, offset, byte_size}] by name."""
        s = self.client.get_system_shared_memory_status(name)
        if self.kind == "http":
            regions = s
        else:
            regions = [
                {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for r in s.regions.values()
            ]
        return sorted(regions, key=lambda r: r["name"])

    def placed(self, result, name):
        """(shape, datatype, {shm parameters}) of an output."""
        o = result.get_output(name)
        if self.kind == "http":
            assert "data" not in o, o
            return o["shape"], o["datatype"], o["parameters"]
        params = {}
        for k, v in o.parameters.items():
            params[k] = v.string_param if v.WhichOneof("parameter_choice") == "string_param" else v.int64_param
        return list(o.shape), o.datatype, params

    def refused_status(self, exc):
        return str(exc.status())

    def close(self):
        self.client.close()


CODES = {
    "grpc": {"not_found": "NOT_FOUND", "invalid": "INVALID_ARGUMENT", "exists": "ALREADY_EXISTS",
             "denied": "PERMISSION_DENIED"},
    "http": {"not_found": "404", "invalid": "400", "exists": "409", "denied": "403"},
}


@pytest.fixture(params=["grpc", "http"])
def door(request, agent):
    d = Door(request.param, agent.addresses[request.param])
    yield d
    d.close()


@pytest.fixture()
def doors(agent):
    g, h = Door("grpc", agent.addresses["grpc"]), Door("http", agent.addresses["http"])
    yield g, h
    g.close()
    h.close()


@pytest.fixture()
def regions(agent):
    """Creates shared-memory objects (unique keys) for a test; afterwards
    unregisters what the test registered and destroys the objects."""
    made = []

    def make(byte_size):
        tag = uuid.uuid4().hex[:12]
        handle = shm.create_shared_memory_region(f"r{tag}", f"/tw-pytest-{tag}", byte_size)
        made.append(handle)
        return f"r{tag}", f"/tw-pytest-{tag}", handle

    yield make
    cleanup = httpclient.InferenceServerClient(agent.addresses["http"])
    for h in made:
        cleanup.unregister_system_shared_memory(h._triton_shm_name)
        shm.destroy_shared_memory_region(h)
    cleanup.close()


def refused(call, door, code, *needles):
    with pytest.raises(InferenceServerException) as e:
        call()
    msg = str(e.value)
    for n in needles:
        assert n in msg, msg
    assert door.refused_status(e.value).endswith(CODES[door.kind][code]), (e.value.status(), msg)
    return msg


def test_server_metadata_lists_the_extension(doors):
    g, h = doors
    assert "system_shared_memory" in g.client.get_server_metadata().extensions
    ext = h.client.get_server_metadata()["extensions"]
    assert "system_shared_memory" in ext and "binary_tensor_data" in ext


def test_digits_inputs_and_outputs_in_shared_memory(door, regions):
    x, expected = digits_sample()
    in_name, in_key, in_h = regions(x.nbytes)
    out_name, out_key, out_h = regions(4096)
    shm.set_shared_memory_region(in_h, [x])
    # Garbage where the logits go: they must be written there.
    shm.set_shared_memory_region(out_h, [np.full(1024, np.nan, np.float32)])
    door.client.register_system_shared_memory(in_name, in_key, x.nbytes)
    door.client.register_system_shared_memory(out_name, out_key, 4096)
    for out_offset in (0, 256):
        r = door.client.infer(
            "digits",
            [door.input("x", x.shape, "FP32", in_name, x.nbytes)],
            outputs=[door.output("logits", out_name, 4096 - out_offset, out_offset)],
        )
        shape, datatype, params = door.placed(r, "logits")
        assert (shape, datatype) == ([4, 10], "FP32")
        assert params == {
            "shared_memory_region": out_name,
            "shared_memory_offset": out_offset,
            "shared_memory_byte_size": expected.nbytes,
        }
        got = shm.get_contents_as_numpy(out_h, np.float32, [4, 10], offset=out_offset)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_identity_16mib_in_and_out(door, regions):
    data = np.random.default_rng(7).integers(0, 256, MIB16, dtype=np.uint8)
    in_name, in_key, in_h = regions(MIB16)
    out_name, out_key, out_h = regions(MIB16)
    shm.set_shared_memory_region(in_h, [data])
    door.client.register_system_shared_memory(in_name, in_key, MIB16)
    door.client.register_system_shared_memory(out_name, out_key, MIB16)
    r = door.client.infer(
        "identity",
        [door.input("t", [MIB16], "UINT8", in_name, MIB16)],
        outputs=[door.output("t", out_name, MIB16)],
    )
    assert door.placed(r, "t")[0] == [MIB16]
    got = shm.get_contents_as_numpy(out_h, np.uint8, [MIB16])
    assert np.array_equal(got, data)


def test_a_region_registered_over_http_is_used_over_grpc(doors, regions):
    g, h = doors
    x, expected = digits_sample()
    name, key, handle = regions(8192)
    shm.set_shared_memory_region(handle, [x])
    h.client.register_system_shared_memory(name, key, 8192)
    assert [r["name"] for r in g.status(name)] == [name]
    # The input at 0, the logits after it, in the one region.
    r = g.client.infer(
        "digits",
        [g.input("x", x.shape, "FP32", name, x.nbytes)],
        outputs=[g.output("logits", name, expected.nbytes, 4096)],
    )
    assert g.placed(r, "logits")[2]["shared_memory_region"] == name
    np.testing.assert_allclose(
        shm.get_contents_as_numpy(handle, np.float32, [4, 10], offset=4096),
        expected, rtol=1e-5, atol=1e-5,
    )
    g.client.unregister_system_shared_memory(name)
    assert name not in [r["name"] for r in h.status()]
    with pytest.raises(InferenceServerException):
        h.client.get_system_shared_memory_status(name)


def test_shared_memory_and_inline_tensors_in_one_request(door, regions):
    name, key, handle = regions(4096)
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.array([1.5, -2.0], dtype=np.float64)
    c = np.array([7, 8, 9], dtype=np.int16)
    shm.set_shared_memory_region(handle, [a])
    door.client.register_system_shared_memory(name, key, 4096)
    # a from shared memory, b and c inline (b before a: the raw contents
    # of the inline ones line up with them, not with a); a and c back
    # inline, b into shared memory.
    r = door.client.infer(
        "identity",
        [
            door.input("b", b.shape, "FP64", data=b),
            door.input("a", a.shape, "INT32", name, a.nbytes, 0),
            door.input("c", c.shape, "INT16", data=c),
        ],
        outputs=[door.output("a"), door.output("b", name, 64, 1024), door.output("c")],
    )
    np.testing.assert_array_equal(r.as_numpy("a"), a)
    np.testing.assert_array_equal(r.as_numpy("c"), c)
    assert door.placed(r, "b")[2]["shared_memory_byte_size"] == b.nbytes
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float64, [2], offset=1024), b)


def test_status_unregister_and_unregister_all(door, regions):
    made = [regions(8192) for _ in range(2)]
    for (name, key, _), offset in zip(made, (0, 4096)):
        door.client.register_system_shared_memory(name, key, 4096, offset)
    mine = {name for name, _, _ in made}
    listed = [r for r in door.status() if r["name"] in mine]
    assert listed == sorted(
        [{"name": n, "key": k, "offset": o, "byte_size": 4096} for (n, k, _), o in zip(made, (0, 4096))],
        key=lambda r: r["name"],
    )
    first, second = made[0][0], made[1][0]
    assert [r["name"] for r in door.status(first)] == [first]
    door.client.unregister_system_shared_memory(first)
    refused(lambda: door.client.get_system_shared_memory_status(first), door, "not_found",
            "Unable to find system shared memory region")
    door.client.unregister_system_shared_memory(first)  # again: not an error
    assert [r["name"] for r in door.status(second)] == [second]
    door.client.unregister_system_shared_memory()
    assert door.status() == []


def test_bad_requests_are_refused_and_the_agent_keeps_serving(door, regions):
    x, expected = digits_sample()
    name, key, handle = regions(4096)
    shm.set_shared_memory_region(handle, [x])
    c = door.client

    def infer(x_at=(None, x.nbytes, 0), out_at=(None, 160, 0)):
        ins = [door.input("x", x.shape, "FP32", *x_at) if x_at[0] else door.input("x", x.shape, "FP32", data=x)]
        outs = [door.output("logits", *out_at) if out_at[0] else door.output("logits")]
        return c.infer("digits", ins, outputs=outs)

    def still_serving():
        r = c.infer("digits", [door.input("x", x.shape, "FP32", data=x)])
        np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)

    # Registration.
    refused(lambda: c.register_system_shared_memory("nokey", f"/tw-pytest-none-{uuid.uuid4().hex}", 64),
            door, "not_found", "no shared memory object")
    refused(lambda: c.register_system_shared_memory("big", key, 4097), door, "invalid", "fall outside")
    refused(lambda: c.register_system_shared_memory("big", key, 64, 4090), door, "invalid", "fall outside")
    refused(lambda: c.register_system_shared_memory("bad", "/a/b", 64), door, "invalid", "bad shared memory key")
    c.register_system_shared_memory(name, key, 4096)
    refused(lambda: c.register_system_shared_memory(name, key, 64), door, "exists", "already in manager")
    still_serving()
    # Inference.
    refused(lambda: infer(x_at=("nope", x.nbytes, 0)), door, "not_found",
            "input 'x'", "Unable to find system shared memory region: 'nope'")
    refused(lambda: infer(x_at=(name, x.nbytes, 4000)), door, "invalid", "input 'x'", "fall outside")
    refused(lambda: infer(x_at=(name, x.nbytes - 4, 0)), door, "invalid",
            "input 'x'", f"needs {x.nbytes} bytes", "shared_memory_byte_size")
    refused(lambda: infer(out_at=(name, 100, 2048)), door, "invalid",
            "output 'logits'", "160 bytes", "100 bytes", f"'{name}'")
    refused(lambda: infer(x_at=(name, x.nbytes, 0), out_at=(name, 160, 512)), door, "invalid",
            "overlap")
    still_serving()
    r = infer(x_at=(name, x.nbytes, 0), out_at=(name, 160, 2048))
    np.testing.assert_allclose(shm.get_contents_as_numpy(handle, np.float32, [4, 10], offset=2048),
                               expected, rtol=1e-5, atol=1e-5)
    c.unregister_system_shared_memory(name)
    refused(lambda: infer(x_at=(name, x.nbytes, 0)), door, "not_found",
            f"Unable to find system shared memory region: '{name}'")
    still_serving()


def test_objects_of_other_users_or_writable_by_them_are_refused(door, regions):
    name, key, handle = regions(4096)
    path = "/dev/shm/" + key.lstrip("/")
    os.chmod(path, 0o666)
    refused(lambda: door.client.register_system_shared_memory(name, key, 4096), door, "denied",
            "writable by other users")
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, 65534, -1)
        refused(lambda: door.client.register_system_shared_memory(name, key, 4096), door, "denied",
                "another user's")
        os.chown(path, 0, -1)
    door.client.register_system_shared_memory(name, key, 4096)
    assert [r["name"] for r in door.status(name)] == [name]
