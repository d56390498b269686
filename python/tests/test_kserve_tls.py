"""The KServe v2 doors over TLS (`tensorwire serve --listen https://HOST:PORT
--listen grpcs://HOST:PORT --tls-cert FILE --tls-key FILE [--tls-client-ca
FILE]`) driven by the stock, unmodified `tritonclient.http` (ssl=True) and
`tritonclient.grpc` (ssl=True, root_certificates=...): health, metadata and
inference with correct results; a client trusting another CA refused; a
plain-text client refused cleanly while the agent keeps serving; client
certificates required with a client CA; a connection that never handshakes
holding up nobody. Certificates are made with trustme."""

from __future__ import annotations

import socket
import ssl
import time

import numpy as np
import pytest

from twtest import BUILD, FrontDoorAgent, digits_sample

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
trustme = pytest.importorskip("trustme", reason="trustme is not installed (requirements.txt)")
from tritonclient.utils import InferenceServerException  # noqa: E402

SCHEMES = ["https", "grpcs"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The agent's CA, its certificate (localhost, 127.0.0.1), a client's
    certificate of the same CA, and another CA with a client of its own."""
    d = tmp_path_factory.mktemp("pki")
    files = {}

    def write(name, blob):
        files[name] = d / name
        blob.write_to_path(str(files[name]))

    ca, other = trustme.CA(), trustme.CA()
    write("ca.pem", ca.cert_pem)
    write("other-ca.pem", other.cert_pem)
    for prefix, issuer, names in (
        ("server", ca, ["localhost", "127.0.0.1"]),
        ("client", ca, ["client.test"]),
        ("stranger", other, ["stranger.test"]),
    ):
        cert = issuer.issue_cert(*names)
        write(f"{prefix}.key", cert.private_key_pem)
        files[f"{prefix}.pem"] = d / f"{prefix}.pem"
        files[f"{prefix}.pem"].write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
    return files


def start(pki, extra=()):
    return FrontDoorAgent(
        SCHEMES,
        {"digits": BUILD / "digits_mlp.onnx"},
        ["--tls-cert", str(pki["server.pem"]), "--tls-key", str(pki["server.key"]), *extra],
    )


@pytest.fixture(scope="module")
def agent(pki):
    a = start(pki)
    yield a
    a.stop()
    assert a.proc.returncode == 0, a.proc.stderr.read()


@pytest.fixture(scope="module")
def mtls_agent(pki):
    a = start(pki, ["--tls-client-ca", str(pki["ca.pem"])])
    yield a
    a.stop()
    assert a.proc.returncode == 0, a.proc.stderr.read()


def http_client(address, ca, cert=None, key=None):
    opts = {"ca_certs": str(ca)}
    if cert:
        opts.update(certfile=str(cert), keyfile=str(key))
    return httpclient.InferenceServerClient(address, ssl=True, ssl_options=opts, network_timeout=10)


def grpc_client(address, ca, cert=None, key=None):
    return grpcclient.InferenceServerClient(
        address,
        ssl=True,
        root_certificates=str(ca),
        private_key=str(key) if key else None,
        certificate_chain=str(cert) if cert else None,
    )


def check_serves(client, module):
    """Health, metadata and one inference with the reference results."""
    if module is grpcclient:
        assert client.is_server_live(client_timeout=10)
        meta = client.get_model_metadata("digits", as_json=True)
    else:
        assert client.is_server_live()
        meta = client.get_model_metadata("digits")
    assert meta["name"] == "digits"
    assert meta["inputs"][0]["name"] == "x" and meta["outputs"][0]["name"] == "logits"
    x, want = digits_sample()
    i = module.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    r = client.infer("digits", [i])
    np.testing.assert_allclose(r.as_numpy("logits"), want, rtol=1e-5, atol=1e-5)


def test_agent_prints_tls_uris(agent):
    assert agent.uris["https"].startswith("https://127.0.0.1:")
    assert agent.uris["grpcs"].startswith("grpcs://127.0.0.1:")


def test_tritonclient_http_over_tls(agent, pki):
    c = http_client(agent.addresses["https"], pki["ca.pem"])
    try:
        check_serves(c, httpclient)
    finally:
        c.close()


def test_tritonclient_grpc_over_tls(agent, pki):
    c = grpc_client(agent.addresses["grpcs"], pki["ca.pem"])
    try:
        check_serves(c, grpcclient)
    finally:
        c.close()


def test_a_client_trusting_another_ca_is_refused(agent, pki):
    c = http_client(agent.addresses["https"], pki["other-ca.pem"])
    try:
        with pytest.raises(ssl.SSLError, match="(?i)certificate verify failed"):
            c.is_server_live()
    finally:
        c.close()
    c = grpc_client(agent.addresses["grpcs"], pki["other-ca.pem"])
    try:
        with pytest.raises(InferenceServerException):
            c.is_server_live(client_timeout=10)
    finally:
        c.close()


def test_plain_text_clients_are_refused_cleanly(agent, pki):
    plain = httpclient.InferenceServerClient(agent.addresses["https"], network_timeout=10)
    try:
        # The door answers 400 with the reason, in the KServe error JSON.
        assert not plain.is_server_live()
        x, _ = digits_sample()
        i = httpclient.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException, match="this door speaks HTTPS"):
            plain.infer("digits", [i])
    finally:
        plain.close()
    plain = grpcclient.InferenceServerClient(agent.addresses["grpcs"])
    try:
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=10)
    finally:
        plain.close()
    # The agent goes on serving the good clients.
    for module, make in ((httpclient, http_client), (grpcclient, grpc_client)):
        scheme = "https" if module is httpclient else "grpcs"
        c = make(agent.addresses[scheme], pki["ca.pem"])
        try:
            check_serves(c, module)
        finally:
            c.close()
    assert agent.proc.poll() is None


def test_a_connection_that_never_handshakes_blocks_nobody(agent, pki):
    idle = []
    for scheme in SCHEMES:
        host, port = agent.addresses[scheme].rsplit(":", 1)
        idle.append(socket.create_connection((host, int(port)), timeout=5))
    # One more that starts a TLS record and stops.
    host, port = agent.addresses["https"].rsplit(":", 1)
    stalled = socket.create_connection((host, int(port)), timeout=5)
    stalled.sendall(b"\x16\x03\x01")
    idle.append(stalled)
    try:
        t0 = time.monotonic()
        for module, make in ((httpclient, http_client), (grpcclient, grpc_client)):
            scheme = "https" if module is httpclient else "grpcs"
            c = make(agent.addresses[scheme], pki["ca.pem"])
            try:
                check_serves(c, module)
            finally:
                c.close()
        # Inside the 3 s the silent ones have for their handshakes.
        assert time.monotonic() - t0 < 2.5
    finally:
        for s in idle:
            s.close()


def test_client_certificates_required_with_a_client_ca(mtls_agent, pki):
    https, grpcs = mtls_agent.addresses["https"], mtls_agent.addresses["grpcs"]
    # Without a certificate, or with one of another CA: refused.
    for cert, key in ((None, None), (pki["stranger.pem"], pki["stranger.key"])):
        c = http_client(https, pki["ca.pem"], cert, key)
        try:
            # The agent's alert (TLS 1.3: after the client's side is done),
            # or the connection closed under the request.
            with pytest.raises((ssl.SSLError, ConnectionError)):
                c.is_server_live()
        finally:
            c.close()
        c = grpc_client(grpcs, pki["ca.pem"], cert, key)
        try:
            with pytest.raises(InferenceServerException):
                c.is_server_live(client_timeout=10)
        finally:
            c.close()
    # With a certificate of the client CA: served.
    c = http_client(https, pki["ca.pem"], pki["client.pem"], pki["client.key"])
    try:
        check_serves(c, httpclient)
    finally:
        c.close()
    c = grpc_client(grpcs, pki["ca.pem"], pki["client.pem"], pki["client.key"])
    try:
        check_serves(c, grpcclient)
    finally:
        c.close()
    assert mtls_agent.proc.poll() is None
