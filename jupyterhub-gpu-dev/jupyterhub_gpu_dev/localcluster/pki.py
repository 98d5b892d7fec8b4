"""Certificates and kubeconfigs for the local control plane.

One CA signs the API server's serving certificate and a client certificate per
identity. Each component gets the identity Kubernetes' bootstrap RBAC already
grants it (``system:kube-controller-manager``, ``system:kube-scheduler``,
``system:kwok``-as-admin), so RBAC authorization is real, not bypassed.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _ca_key_usage(*, key_encipherment: bool) -> x509.KeyUsage:
    """What a CA's key may do: sign certificates and CRLs (and, for Kueue's own CA,
    encipher keys)."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


class CertificateAuthority:
    def __init__(self) -> None:
        self.key: ec.EllipticCurvePrivateKey = _key()
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("jupyterhub-gpu local cluster CA"))
            .issuer_name(_name("jupyterhub-gpu local cluster CA"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_ca_key_usage(key_encipherment=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA that ``write_pki`` wrote to ``directory``, to sign more certificates."""
        ca = cls.__new__(cls)
        ca.key = serialization.load_pem_private_key(  # type: ignore[assignment]
            (directory / "ca.key").read_bytes(), password=None
        )
        ca.cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        return ca

    def intermediate(self, common_name: str, dns_names: list[str]) -> CertificateAuthority:
        """A CA signed by this one, with an RSA key and ``dns_names`` as its names: the
        shape Kueue's certificate rotator accepts as its own CA (it checks the CA for
        the name ``kueue-ca`` and reads the key as PKCS#1 RSA)."""
        sub = CertificateAuthority.__new__(CertificateAuthority)
        sub.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # type: ignore[assignment]
        now = datetime.datetime.now(datetime.UTC)
        sub.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(sub.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_ca_key_usage(key_encipherment=True), critical=True)
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        return sub

    @property
    def key_pem_pkcs1(self) -> bytes:
        """The key as PKCS#1 ("RSA PRIVATE KEY"), for an RSA CA (see ``intermediate``)."""
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    def issue(
        self,
        common_name: str,
        *,
        organization: str | None = None,
        server_names: list[str] = (),  # type: ignore[assignment]
        server_ips: list[str] = (),  # type: ignore[assignment]
    ) -> tuple[bytes, bytes]:
        """A (certificate PEM, key PEM) pair; a server certificate when names are given."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names or server_ips:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
            self.key, hashes.SHA256()
        )
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "jupyterhub-gpu",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [
            {"name": "jupyterhub-gpu", "context": {"cluster": "jupyterhub-gpu", "user": user}}
        ],
        "current-context": "jupyterhub-gpu",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


#: (file stem, common name, organization) of every client identity the cluster uses.
CLIENT_IDENTITIES = (
    ("admin", "jupyterhub-gpu-admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", None),
    ("scheduler", "system:kube-scheduler", None),
    # kwok manages nodes and pod status cluster-wide; it runs as a cluster admin,
    # as it does in its own kind/kwokctl clusters
    ("kwok", "system:kwok-controller", "system:masters"),
    # the pod runner reads pods and secrets to start what they describe
    ("pod-runner", "jupyterhub-gpu-pod-runner", "system:masters"),
    # Volcano's scheduler and controllers (when the cluster runs them) bind pods, evict
    # them and write PodGroups and Queues cluster-wide, as a cluster admin like kwok
    ("volcano", "system:volcano", "system:masters"),
)


def write_pki(directory: Path, server: str) -> dict[str, Path]:
    """Write the CA, serving, service-account and client material; return kubeconfig paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority()
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    (directory / "ca.key").write_bytes(_pem_key(ca.key))

    cert, key = ca.issue(
        "kube-apiserver",
        server_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        server_ips=["127.0.0.1"],
    )
    (directory / "apiserver.crt").write_bytes(cert)
    (directory / "apiserver.key").write_bytes(key)

    # service-account token signing: RSA, as every Kubernetes release accepts it
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(_pem_key(sa_key))
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )

    kubeconfigs = {}
    for stem, cn, org in CLIENT_IDENTITIES:
        cert, key = ca.issue(cn, organization=org)
        (directory / f"{stem}.crt").write_bytes(cert)
        (directory / f"{stem}.key").write_bytes(key)
        path = directory / f"{stem}.kubeconfig"
        write_kubeconfig(
            path,
            server,
            directory / "ca.crt",
            directory / f"{stem}.crt",
            directory / f"{stem}.key",
            cn,
        )
        kubeconfigs[stem] = path
    for private in directory.glob("*.key"):
        private.chmod(0o600)
    return kubeconfigs
