"""Per-model statistics and Prometheus metrics, from outside: Triton's
statistics extension through the stock `tritonclient.http` and
`tritonclient.grpc` (`get_inference_statistics`), `/metrics` on the HTTP
front door and on the metrics-only listener (`serve --metrics-listen`),
parsed with `prometheus_client`; requests over the native protocol (unix,
shm) are counted by the same core. Every check compares counts before and
after a known number of requests against one agent."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest

from twtest import BUILD, FrontDoorAgent, tensorwire_bin

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
parser = pytest.importorskip(
    "prometheus_client.parser", reason="prometheus-client is not installed (requirements.txt)"
)
from tritonclient.utils import InferenceServerException  # noqa: E402

MODELS = {"digits": BUILD / "digits_mlp.onnx"}
DIGITS = {"model": "digits", "version": "1"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stats")
    a = FrontDoorAgent(
        "http",
        MODELS,
        [
            "--listen", "grpc://127.0.0.1:0",
            "--listen", f"unix://{tmp / 'agent.sock'}",
            "--listen", f"shm://pytest-stats-{uuid.uuid4().hex[:10]}",
            "--metrics-listen", "http://127.0.0.1:0",
        ],
    )
    yield a
    a.stop()
    assert a.proc.returncode == 0, a.proc.stderr.read()


def listening(agent, scheme: str) -> str:
    return next(u for u in agent.listening if u.startswith(f"{scheme}://"))


@pytest.fixture()
def http(agent):
    c = httpclient.InferenceServerClient(agent.address)
    yield c
    c.close()


@pytest.fixture()
def grpc(agent):
    c = grpcclient.InferenceServerClient(listening(agent, "grpc").removeprefix("grpc://"))
    yield c
    c.close()


def digits_input(module, shape=(4, 64), name="x"):
    x = np.fromfile(BUILD / "digits_mlp_input.bin", dtype="<f4").reshape(4, 64)
    i = module.InferInput(name, list(shape), "FP32")
    i.set_data_from_numpy(np.ascontiguousarray(x[:, : shape[1]]))
    return i


def http_stats(c, model="digits", version=""):
    r = c.get_inference_statistics(model, version)
    assert len(r["model_stats"]) == 1
    return r["model_stats"][0]


def grpc_stats(c, model="digits"):
    r = c.get_inference_statistics(model)
    assert len(r.model_stats) == 1
    return r.model_stats[0]


def scrape(url: str) -> dict:
    """Every sample of a /metrics page: {(name, sorted label items): value},
    under the names the page gives (prometheus_client's parser reports a
    counter without a `_total` suffix, as Triton's are, with one added)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    written = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name if s.name in written else family.name
            assert name in written, (s.name, family.name)
            samples[(name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no {key} in {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


def test_server_metadata_lists_statistics(http, grpc):
    assert "statistics" in http.get_server_metadata()["extensions"]
    assert "statistics" in grpc.get_server_metadata().extensions


def test_http_statistics_move_by_exactly_the_requests_made(http):
    before = http_stats(http)
    n = 5
    for _ in range(n):
        http.infer("digits", [digits_input(httpclient)])
    # Refused by the core: the shape does not fit the signature.
    with pytest.raises(InferenceServerException):
        http.infer("digits", [digits_input(httpclient, shape=(4, 63))])
    after = http_stats(http)
    assert (after["name"], after["version"]) == ("digits", "1")
    b, a = before["inference_stats"], after["inference_stats"]
    assert a["success"]["count"] - b["success"]["count"] == n
    assert a["fail"]["count"] - b["fail"]["count"] == 1
    assert after["inference_count"] - before["inference_count"] == n
    assert after["execution_count"] - before["execution_count"] == n
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert a[stage]["count"] == a["success"]["count"]
    assert a["success"]["ns"] > b["success"]["ns"]
    assert a["compute_infer"]["ns"] > b["compute_infer"]["ns"]
    assert a["fail"]["ns"] > b["fail"]["ns"]
    stages = sum(a[s]["ns"] for s in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert a["success"]["ns"] == stages
    assert after["last_inference"] >= before["last_inference"]
    assert after["last_inference"] > 1_600_000_000_000, "ms since the epoch"
    assert after["batch_stats"] == []
    assert a["cache_hit"] == {"count": 0, "ns": 0}


def test_grpc_statistics_move_by_exactly_the_requests_made(grpc):
    before = grpc_stats(grpc)
    n = 3
    for _ in range(n):
        grpc.infer("digits", [digits_input(grpcclient)])
    # Refused by the front door before the core: no input named "y".
    with pytest.raises(InferenceServerException):
        grpc.infer("digits", [digits_input(grpcclient, name="y")])
    after = grpc_stats(grpc)
    b, a = before.inference_stats, after.inference_stats
    assert (after.name, after.version) == ("digits", "1")
    assert a.success.count - b.success.count == n
    assert a.fail.count - b.fail.count == 1
    assert after.inference_count - before.inference_count == n
    assert after.execution_count - before.execution_count == n
    assert a.compute_infer.ns > b.compute_infer.ns
    assert a.success.ns > b.success.ns


def test_statistics_of_every_model_and_unknown_ones(http, grpc):
    names = {m["name"] for m in http.get_inference_statistics()["model_stats"]}
    assert names == {"digits", "identity"}
    assert {m.name for m in grpc.get_inference_statistics().model_stats} == names
    assert http_stats(http, "digits", "1")["name"] == "digits"
    for model, version in [("nope", ""), ("digits", "2")]:
        with pytest.raises(InferenceServerException):
            http.get_inference_statistics(model, version)
        with pytest.raises(InferenceServerException) as e:
            grpc.get_inference_statistics(model, version)
        assert "NOT_FOUND" in str(e.value.status())


def test_metrics_count_requests(agent, http):
    url = f"http://{agent.address}/metrics"
    before = scrape(url)
    n = 4
    for _ in range(n):
        http.infer("digits", [digits_input(httpclient)])
    with pytest.raises(InferenceServerException):
        http.infer("digits", [digits_input(httpclient, shape=(4, 63))])
    after = scrape(url)

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("nv_inference_request_success", **DIGITS) == n
    assert moved("nv_inference_request_failure", **DIGITS) == 1
    assert moved("nv_inference_count", **DIGITS) == n
    assert moved("nv_inference_exec_count", **DIGITS) == n
    assert moved("nv_inference_request_duration_us", **DIGITS) > 0
    assert moved("nv_inference_compute_infer_duration_us", **DIGITS) > 0
    for h in ("request", "queue", "compute"):
        name = f"tensorwire_{h}_duration_seconds"
        assert moved(f"{name}_count", **DIGITS) == n
        assert value(after, f"{name}_bucket", le="+Inf", **DIGITS) == value(after, f"{name}_count", **DIGITS)
    assert moved("tensorwire_request_duration_seconds_sum", **DIGITS) > 0
    assert moved("tensorwire_requests_total", transport="http", **DIGITS) == n + 1
    assert moved("tensorwire_requests_total", transport="grpc", **DIGITS) == 0
    assert value(after, "nv_inference_pending_request_count", **DIGITS) == 0
    assert value(after, "tensorwire_inflight_requests", **DIGITS) == 0
    assert moved("tensorwire_errors_total") >= 1
    assert value(after, "process_cpu_seconds_total") > 0
    assert value(after, "process_resident_memory_bytes") > 1 << 20


def test_metrics_listener_serves_the_same(agent, http):
    assert agent.metrics_uri.startswith("http://127.0.0.1:")
    http.infer("digits", [digits_input(httpclient)])
    own = scrape(f"{agent.metrics_uri}/metrics")
    door = scrape(f"http://{agent.address}/metrics")
    model_samples = {k: v for k, v in door.items() if ("model", "digits") in k[1]}
    assert model_samples and value(door, "nv_inference_request_success", **DIGITS) > 0
    for k, v in model_samples.items():
        assert own[k] == v, k
    assert value(own, "process_resident_memory_bytes") > 0
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{agent.metrics_uri}/v2", timeout=10)
    assert e.value.code == 404


def test_native_requests_are_counted(agent, http):
    tw = pytest.importorskip("tensorwire", reason="the tensorwire Python package is not installed")
    x = np.fromfile(BUILD / "digits_mlp_input.bin", dtype="<f4").reshape(4, 64)
    url = f"{agent.metrics_uri}/metrics"
    before, stats_before = scrape(url), http_stats(http)
    for scheme, n in [("unix", 3), ("shm", 2)]:
        m = tw.connect(listening(agent, scheme)).model("digits")
        for _ in range(n):
            m.infer({"x": x})
    after, stats_after = scrape(url), http_stats(http)
    for scheme, n in [("unix", 3), ("shm", 2)]:
        key = dict(transport=scheme, **DIGITS)
        assert value(after, "tensorwire_requests_total", **key) - value(before, "tensorwire_requests_total", **key) == n
    b, a = stats_before["inference_stats"], stats_after["inference_stats"]
    assert a["success"]["count"] - b["success"]["count"] == 5
    assert a["compute_infer"]["ns"] > b["compute_infer"]["ns"]


def test_without_request_timing_counts_move_and_durations_stay_zero():
    a = FrontDoorAgent("http", MODELS, ["--no-request-timing"])
    try:
        c = httpclient.InferenceServerClient(a.address)
        for _ in range(2):
            c.infer("digits", [digits_input(httpclient)])
        with pytest.raises(InferenceServerException):
            c.infer("digits", [digits_input(httpclient, shape=(4, 63))])
        s = http_stats(c)
        i = s["inference_stats"]
        assert (i["success"]["count"], i["fail"]["count"]) == (2, 1)
        assert i["success"]["ns"] == i["compute_infer"]["ns"] == i["fail"]["ns"] == 0
        assert s["last_inference"] > 0
        samples = scrape(f"http://{a.address}/metrics")
        assert value(samples, "nv_inference_request_success", **DIGITS) == 2
        assert value(samples, "tensorwire_request_duration_seconds_count", **DIGITS) == 0
        c.close()
    finally:
        a.stop()
    assert a.proc.returncode == 0, a.proc.stderr.read()


@pytest.mark.parametrize("uri", ["grpc://127.0.0.1:1", "http://127.0.0.1", "http://127.0.0.1:1/metrics"])
def test_a_bad_metrics_address_is_refused(uri):
    r = subprocess.run(
        [str(tensorwire_bin()), "serve", "--listen", "http://127.0.0.1:0", "--metrics-listen", uri],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "metrics" in r.stderr and uri in r.stderr, r.stderr
