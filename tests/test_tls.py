"""Optional TLS on the control and data planes, with certificates made here."""
from __future__ import annotations

import datetime
import ipaddress

import pytest

from conftest import TOKEN
from data_service.contract.tensor_layout import batch_digest
from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from dnn_worker import ControlClient, LocalDataset, RemoteDataset

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

OPTS = {"size": 40, "batch_size": 8}


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(tmp_path):
    """A CA and a server certificate for localhost / 127.0.0.1, signed by it."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hetero test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "other_ca")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(_pem_key(key))
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(other_key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
             .sign(other_key, hashes.SHA256()))
    paths["other_ca"].write_bytes(other.public_bytes(serialization.Encoding.PEM))
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    server = DataServer(PipelineSpec("examples.synthetic:build_pipeline", OPTS), TOKEN,
                        ServerOptions(host="localhost", num_workers=1, tls_cert=certs["cert"],
                                      tls_key=certs["key"])).start()
    yield server, certs
    server.shutdown(grace_s=1)


def test_tls_on_both_planes_delivers_the_same_batches(tls_server):
    server, certs = tls_server
    got = [batch_digest(b) for b in RemoteDataset([server.address], TOKEN, tls_ca=certs["ca"])]
    ref = [batch_digest(b) for b in LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS))]
    assert got == ref
    with ControlClient(server.address, TOKEN, tls_ca=certs["ca"]) as ctl:
        assert ctl.hello().bulk_tls and ctl.stats().batches_sent >= 5


def test_plain_client_is_told_to_use_tls(tls_server):
    server, _ = tls_server
    with pytest.raises(Exception):
        list(RemoteDataset([server.address], TOKEN, connect_timeout=2))


def test_untrusted_server_certificate_is_refused(tls_server):
    server, certs = tls_server
    with pytest.raises(Exception):
        list(RemoteDataset([server.address], TOKEN, tls_ca=certs["other_ca"], connect_timeout=2))


def test_tls_option_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="together"):
        ServerOptions(tls_cert="x.pem")
    with pytest.raises(ConfigError, match="cannot be read"):
        ServerOptions(tls_cert=str(tmp_path / "missing.pem"), tls_key=str(tmp_path / "missing.key"))
    certs = make_certs(tmp_path)
    with pytest.raises(ConfigError, match="do not load"):
        ServerOptions(tls_cert=certs["ca"], tls_key=certs["key"])
