"""The native protocol over TLS from Python: `tls://HOST:PORT?ca=...`
(and `cert=`/`key=` for mutual TLS) reaches a real agent through the same
client as every other URI; certificates name tenants; an untrusted agent
or a missing client certificate is a clear error, not a hang."""

from __future__ import annotations

import numpy as np
import pytest

import tensorwire as tw
from twtest import BUILD, ServedAgent, digits_sample

trustme = pytest.importorskip("trustme")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    agent = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("vision.client")
    paths = {"ca": tmp / "ca.pem", "cert": tmp / "agent.pem", "key": tmp / "agent.key",
             "client_cert": tmp / "client.pem", "client_key": tmp / "client.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    agent.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    agent.private_key_pem.write_to_path(str(paths["key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    return paths


@pytest.fixture(scope="module")
def agent(tmp_path_factory, pki):
    tmp = tmp_path_factory.mktemp("tls")
    tenants = tmp / "tenants.toml"
    tenants.write_text('[[tenant]]\nname = "vision"\ncert_names = ["vision.client"]\n'
                       'models = ["digits"]\n')
    a = ServedAgent(
        tmp,
        {"digits": BUILD / "digits_mlp.onnx"},
        ["--listen", "tls://127.0.0.1:0", "--tls-cert", str(pki["cert"]),
         "--tls-key", str(pki["key"]), "--tls-client-ca", str(pki["ca"]),
         "--tenants", str(tenants)],
    )
    yield a
    a.stop()


def _tls_uri(agent, pki, **params):
    base = next(u for u in agent.listening if u.startswith("tls://"))
    return base + "?" + "&".join(f"{k}={v}" for k, v in params.items())


def test_a_certificate_names_the_tenant_and_digits_answer_over_tls(agent, pki):
    uri = _tls_uri(agent, pki, ca=pki["ca"], cert=pki["client_cert"], key=pki["client_key"])
    with tw.connect(uri) as c:
        assert [m.name for m in c.models()] == ["digits"]
        x, want = digits_sample()
        out = next(iter(c.model("digits").infer({"x": x}).values()))
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        with pytest.raises(tw.PermissionDenied, match="'vision'"):
            c.model("identity")


def test_no_client_certificate_or_an_untrusted_agent_is_a_clear_error(agent, pki, tmp_path):
    with pytest.raises(tw.TensorwireError, match="CertificateRequired"):
        tw.connect(_tls_uri(agent, pki, ca=pki["ca"]))
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    with pytest.raises(tw.TensorwireError, match="invalid peer certificate"):
        tw.connect(_tls_uri(agent, pki, ca=other, cert=pki["client_cert"], key=pki["client_key"]))
