"""Tenants on the KServe front doors (issue 16), from outside: a real
`tensorwire serve` with a tenants file, driven by the stock
`tritonclient.http` and `tritonclient.grpc` sending `Authorization:
Bearer TOKEN` (HTTP header / gRPC metadata), and by plain HTTP for the
malformed headers. Tenants: `ops` (every model: may load, unload and
manage shared memory), `app` (model `digits` only); no `default` tenant,
so a call without a token may use nothing. The tokens file lists hex
SHA-256 digests, computed here. `/metrics` shows the per-tenant
counters moving."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest

from twtest import BUILD, FrontDoorAgent, digits_sample, tensorwire_bin

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
parser = pytest.importorskip(
    "prometheus_client.parser", reason="prometheus-client is not installed (requirements.txt)"
)
from tritonclient.utils import InferenceServerException  # noqa: E402

OPS_TOKEN = "ops-7f3c1e-token"
APP_TOKEN = "app-2b9d44-token"
WRONG_TOKEN = "not-a-token-anyone-lists"
OPS = {"Authorization": f"Bearer {OPS_TOKEN}"}
APP = {"Authorization": f"Bearer {APP_TOKEN}"}
WRONG = {"Authorization": f"Bearer {WRONG_TOKEN}"}
# gRPC metadata keys are lower case.
G_OPS = {"authorization": f"Bearer {OPS_TOKEN}"}
G_APP = {"authorization": f"Bearer {APP_TOKEN}"}
G_WRONG = {"authorization": f"Bearer {WRONG_TOKEN}"}


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


TENANTS = f"""
[[tenant]]
name = "ops"
tokens_sha256 = ["{sha256(OPS_TOKEN)}"]
models = ["*"]

[[tenant]]
name = "app"
tokens_sha256 = ["{sha256(APP_TOKEN)}"]
models = ["digits"]
"""


def cli_has_tenants_flag() -> bool:
    out = subprocess.run(
        [str(tensorwire_bin()), "serve", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    return "--tenants" in out


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenants")
    repo = tmp / "repo"
    for name in ("digits", "other"):
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(BUILD / "digits_mlp.onnx", repo / name / "1" / "model.onnx")
    tenants = tmp / "tenants.toml"
    tenants.write_text(TENANTS)
    if cli_has_tenants_flag():
        access = ["--tenants", str(tenants)]
    else:
        # The same setting in a config file (`[access] tenants`).
        config = tmp / "agent.toml"
        config.write_text(f'[access]\ntenants = "{tenants}"\n')
        access = ["--config", str(config)]
    a = FrontDoorAgent(
        ["http", "grpc"],
        {},
        [
            "--model-repository", str(repo),
            "--model-control-mode", "explicit",
            "--load-model", "digits",
            "--load-model", "other",
            *access,
        ],
    )
    yield a
    a.stop()
    err = a.proc.stderr.read()
    assert a.proc.returncode == 0, err
    # The tokens never reach the agent's output.
    for t in (OPS_TOKEN, APP_TOKEN, WRONG_TOKEN):
        assert t not in err


@pytest.fixture()
def http(agent):
    c = httpclient.InferenceServerClient(agent.addresses["http"])
    yield c
    c.close()


@pytest.fixture()
def grpc(agent):
    c = grpcclient.InferenceServerClient(agent.addresses["grpc"])
    yield c
    c.close()


def digits_inputs(module):
    x, expected = digits_sample()
    i = module.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return [i], expected


def refused(call, status: str, *needles: str) -> str:
    """Runs `call`, which must fail with `status`; its message must hold
    every needle. Returns the message."""
    with pytest.raises(InferenceServerException) as e:
        call()
    assert e.value.status() == status, (e.value.status(), e.value.message())
    msg = e.value.message()
    for n in needles:
        assert n in msg, msg
    return msg


def raw(agent, method: str, path: str, headers=None, body: bytes | None = None):
    """(status, headers, JSON body) of one plain HTTP call."""
    url = f"{agent.uris['http']}{path}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read()
            return r.status, r.headers, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, e.headers, json.loads(text) if text else None


def metrics(agent) -> dict:
    """{(name, tenant): value} of the tensorwire_tenant_* samples."""
    with urllib.request.urlopen(f"{agent.uris['http']}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("tensorwire_tenant_"):
                out[(s.name, s.labels["tenant"])] = s.value
    return out


# --- HTTP ----------------------------------------------------------------


def test_http_the_right_token_infers(http):
    inputs, expected = digits_inputs(httpclient)
    r = http.infer("digits", inputs, headers=APP)
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    assert http.get_model_metadata("digits", headers=APP)["name"] == "digits"
    assert http.get_model_config("digits", headers=APP)["name"] == "digits"
    # ops may use every model.
    r = http.infer("other", inputs, headers=OPS)
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)


def test_http_without_a_token_the_default_tenant_may_use_nothing(http):
    inputs, _ = digits_inputs(httpclient)
    refused(lambda: http.infer("digits", inputs), "403", "'digits'", "tenant 'default'")
    refused(lambda: http.get_model_metadata("digits"), "403", "'digits'", "tenant 'default'")


def test_http_a_wrong_token_is_unauthenticated(agent, http):
    inputs, _ = digits_inputs(httpclient)
    msg = refused(lambda: http.infer("digits", inputs, headers=WRONG), "401", "not one the agent accepts")
    assert WRONG_TOKEN not in msg
    status, headers, _ = raw(agent, "GET", "/v2/models/digits", WRONG)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")


def test_http_a_model_outside_the_tenants_rights_is_refused(agent, http):
    inputs, _ = digits_inputs(httpclient)
    refused(lambda: http.infer("other", inputs, headers=APP), "403", "'other'", "tenant 'app'")
    refused(lambda: http.get_model_metadata("other", headers=APP), "403", "'other'", "tenant 'app'")
    refused(lambda: http.get_model_config("other", headers=APP), "403", "'other'", "tenant 'app'")
    refused(lambda: http.get_inference_statistics("other", headers=APP), "403", "'other'")
    assert raw(agent, "GET", "/v2/models/other/ready", APP)[0] == 403
    assert raw(agent, "GET", "/v2/models/digits/ready", APP)[0] == 200
    # A model the agent does not serve is refused the same way (no probing),
    # and the served models a 404 names are only the tenant's.
    refused(lambda: http.get_model_metadata("nosuch", headers=APP), "403", "'nosuch'")
    msg = refused(lambda: http.get_model_metadata("nosuch", headers=OPS), "404", "'nosuch'")
    assert "digits" in msg and "other" in msg
    # Lists hold only the tenant's models.
    assert [m["name"] for m in http.get_model_repository_index(headers=APP)] == ["digits"]
    assert sorted(m["name"] for m in http.get_model_repository_index(headers=OPS)) == ["digits", "other"]
    stats = http.get_inference_statistics(headers=APP)["model_stats"]
    assert [s["name"] for s in stats] == ["digits"]
    assert http.get_model_repository_index() == []


def test_http_operator_actions_need_every_model(http):
    refused(lambda: http.unload_model("other", headers=APP), "403", "tenant 'app'", "unload models")
    refused(lambda: http.load_model("other", headers=APP), "403", "tenant 'app'", "load models")
    refused(lambda: http.load_model("other"), "403", "tenant 'default'")
    refused(
        lambda: http.register_system_shared_memory("r", "/tw-none", 64, headers=APP),
        "403",
        "register shared-memory regions",
    )
    refused(lambda: http.unregister_system_shared_memory(headers=APP), "403", "unregister")
    # ops may: reload a model, unregister every region (none registered).
    http.load_model("other", headers=OPS)
    http.unregister_system_shared_memory(headers=OPS)
    assert http.is_model_ready("other", headers=OPS)


@pytest.mark.parametrize(
    "value,needle",
    [
        ("Basic dXNlcjpwYXNz", "not 'Bearer'"),
        ("Bearer", "no token"),
        ("Bearer " + "t" * 1025, "1025 bytes"),
        ("Bearer a b", "visible ASCII"),
    ],
)
def test_http_a_malformed_authorization_header_is_a_bad_request(agent, value, needle):
    status, _, body = raw(agent, "GET", "/v2/models/digits", {"Authorization": value})
    assert status == 400, body
    assert needle in body["error"], body


def test_http_health_needs_no_token(agent, http):
    assert http.is_server_live() and http.is_server_ready()
    assert raw(agent, "GET", "/v2")[0] == 200


# --- gRPC ----------------------------------------------------------------


def test_grpc_the_right_token_infers(grpc):
    inputs, expected = digits_inputs(grpcclient)
    r = grpc.infer("digits", inputs, headers=G_APP)
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    assert grpc.get_model_metadata("digits", headers=G_APP).name == "digits"
    assert grpc.is_model_ready("digits", headers=G_APP)


def test_grpc_refusals(grpc):
    inputs, _ = digits_inputs(grpcclient)
    denied = "StatusCode.PERMISSION_DENIED"
    refused(lambda: grpc.infer("digits", inputs), denied, "'digits'", "tenant 'default'")
    refused(lambda: grpc.infer("other", inputs, headers=G_APP), denied, "'other'", "tenant 'app'")
    refused(lambda: grpc.get_model_metadata("other", headers=G_APP), denied, "tenant 'app'")
    refused(lambda: grpc.is_model_ready("other", headers=G_APP), denied, "tenant 'app'")
    refused(lambda: grpc.get_model_config("other", headers=G_APP), denied, "tenant 'app'")
    refused(lambda: grpc.get_inference_statistics("other", headers=G_APP), denied)
    refused(lambda: grpc.unload_model("other", headers=G_APP), denied, "unload models")
    refused(lambda: grpc.unregister_system_shared_memory(headers=G_APP), denied, "unregister")
    msg = refused(
        lambda: grpc.infer("digits", inputs, headers=G_WRONG),
        "StatusCode.UNAUTHENTICATED",
        "not one the agent accepts",
    )
    assert WRONG_TOKEN not in msg
    refused(
        lambda: grpc.get_model_metadata("digits", headers={"authorization": "Basic eA=="}),
        "StatusCode.INVALID_ARGUMENT",
        "not 'Bearer'",
    )
    names = [m.name for m in grpc.get_model_repository_index(headers=G_APP).models]
    assert names == ["digits"]
    names = sorted(m.name for m in grpc.get_model_repository_index(headers=G_OPS).models)
    assert names == ["digits", "other"]
    stats = grpc.get_inference_statistics(headers=G_APP).model_stats
    assert [s.name for s in stats] == ["digits"]


def test_grpc_stream_carries_the_token(grpc):
    inputs, expected = digits_inputs(grpcclient)
    results = []
    grpc.start_stream(lambda result, error: results.append((result, error)), headers=G_APP)
    try:
        grpc.async_stream_infer("digits", inputs)
        grpc.async_stream_infer("other", inputs)
    finally:
        grpc.stop_stream()
    assert len(results) == 2
    ok, err = results[0]
    assert err is None, err
    np.testing.assert_allclose(ok.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    assert results[1][0] is None
    assert "tenant 'app'" in str(results[1][1])


# --- metrics -------------------------------------------------------------


def test_metrics_count_per_tenant(agent, http, grpc):
    before = metrics(agent)
    for key in [
        ("tensorwire_tenant_requests_total", "app"),
        ("tensorwire_tenant_denied_total", "app"),
        ("tensorwire_tenant_over_quota_total", "app"),
        ("tensorwire_tenant_in_flight", "app"),
        ("tensorwire_tenant_queued", "ops"),
        ("tensorwire_tenant_connections", "ops"),
        ("tensorwire_tenant_cpu_seconds_total", "app"),
        ("tensorwire_tenant_denied_total", "default"),
    ]:
        assert key in before, (key, sorted(before))
    inputs_h, _ = digits_inputs(httpclient)
    inputs_g, _ = digits_inputs(grpcclient)
    for _ in range(3):
        http.infer("digits", inputs_h, headers=APP)
    for _ in range(2):
        grpc.infer("digits", inputs_g, headers=G_APP)
    with pytest.raises(InferenceServerException):
        http.infer("other", inputs_h, headers=APP)
    with pytest.raises(InferenceServerException):
        http.infer("digits", inputs_h, headers=WRONG)
    after = metrics(agent)

    def moved(name, tenant):
        return after[(name, tenant)] - before[(name, tenant)]

    assert moved("tensorwire_tenant_requests_total", "app") == 5
    assert moved("tensorwire_tenant_requests_total", "ops") == 0
    assert moved("tensorwire_tenant_denied_total", "app") == 1
    assert moved("tensorwire_tenant_denied_total", "default") == 1
    assert after[("tensorwire_tenant_in_flight", "app")] == 0
