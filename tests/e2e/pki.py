"""The certificates and kubeconfigs of a local test cluster (one CA, one key pair per component)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class Credential:
    cert: Path
    key: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class Pki:
    """A CA under `directory` that signs component certificates on demand (idempotent per name)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        self.ca = Credential(directory / "ca.crt", directory / "ca.key")
        if not self.ca.cert.exists():
            key = _key()
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dradriver-e2e-ca")])
            now = datetime.datetime.now(datetime.UTC)
            cert = (
                x509.CertificateBuilder()
                .subject_name(name)
                .issuer_name(name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + VALIDITY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(
                    x509.KeyUsage(True, False, False, False, False, True, True, False, False), True
                )
                .sign(key, hashes.SHA256())
            )
            _write_key(self.ca.key, key)
            self.ca.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._ca_key = serialization.load_pem_private_key(self.ca.key.read_bytes(), password=None)
        self._ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())
        self.service_account = directory / "sa.key"
        self.service_account_public = directory / "sa.pub"
        if not self.service_account.exists():
            key = _key()
            _write_key(self.service_account, key)
            self.service_account_public.write_bytes(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )

    def issue(
        self,
        name: str,
        common_name: str,
        organization: str | None = None,
        *,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> Credential:
        """A client certificate, or a serving (and client) one when it has subject alt names."""
        credential = Credential(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        if credential.cert.exists():
            return credential
        key = _key()
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(datetime.UTC)
        serving = bool(dns or ips)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if serving else [])
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if serving:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())  # type: ignore[arg-type]
        _write_key(credential.key, key)
        credential.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return credential

    def kubeconfig(self, path: Path, user: str, credential: Credential, server: str) -> Path:
        def b64(file: Path) -> str:
            return base64.b64encode(file.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {"server": server, "certificate-authority-data": b64(self.ca.cert)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(credential.cert),
                        "client-key-data": b64(credential.key),
                    },
                }
            ],
            "contexts": [{"name": f"{user}@e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": f"{user}@e2e",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path
