"""Kueue's manager as a local process of the local cluster.

Kueue runs as it would in a cluster, minus the Deployment: the binary built from
``gomod/kueue`` reads a ``Configuration`` file, talks to the local API server
with a client certificate of the cluster's CA, and serves its admission and
conversion webhooks on 127.0.0.1. As there is no Service in front of it, its
Mutating/ValidatingWebhookConfigurations (Kueue's own, from the pinned module)
and its CRDs' conversion webhooks name it by URL instead.

Certificates: Kueue's internal certificate management stays on, as in Kueue's
own install (with it off, Kueue insists on a metrics certificate under
/etc/kueue). Its rotator keeps the CA and serving certificate it finds in its
Secret when they are valid for its names, so the cluster seeds that Secret with
a Kueue CA signed by the cluster's CA and a serving certificate for both the
Service name the rotator checks and 127.0.0.1, the address the API server dials.

Only the ``pod`` integration is on: the hub's servers are bare pods. Kueue gates
the pods that carry ``kueue.x-k8s.io/queue-name`` in every namespace but
kube-system and its own, and leaves every other pod alone.

DRA: Kueue 0.19 counts the devices of a pod's ResourceClaimTemplates (its
KueueDRAIntegration feature, beta and on by default) under the name its
Configuration's ``resources.deviceClassMappings`` gives their DeviceClass. The
local cluster maps the simulated driver's two classes, ``gpu.nvidia.com`` and
``mig.nvidia.com``, as ``jupyterhub-gpu check`` tells a site to
(``core.schedulers.kueue.device_class_mappings``), so a policy's ClusterQueues
count DRA servers' devices.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from jupyterhub_gpu.core.objects import device_class_resource

from . import crds, pki
from .dra import DEVICE_CLASSES

MODULE = "sigs.k8s.io/kueue"
#: Kueue's own namespace (events, the visibility server's objects); it manages no pod there
NAMESPACE = "kueue-system"
#: namespaces Kueue never manages: the control plane's and its own
UNMANAGED_NAMESPACES = ("kube-system", NAMESPACE)
#: the webhook configurations' names, as Kueue's kustomize install names them
WEBHOOK_CONFIGURATIONS = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
#: the pinned module's webhook manifests (controller-gen output, one per kind)
WEBHOOK_MANIFESTS = "config/components/webhook/manifests.yaml"
#: the Secret and Service names Kueue's certificate rotator uses (Kueue's defaults)
CERT_SECRET = "kueue-webhook-server-cert"
WEBHOOK_SERVICE = "kueue-webhook-service"
#: the name the rotator requires of its CA certificate
CA_NAME = "kueue-ca"
#: the CRDs Kueue's install converts through its webhook (and its rotator injects into)
CONVERTED_CRDS = (
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
)
#: the client identity Kueue's manager uses: it watches and writes pods, workloads and
#: its own objects cluster-wide, so it runs as a cluster admin, like kwok
IDENTITY = ("kueue", "system:kueue-controller-manager", "system:masters")


def managed_namespaces_selector() -> dict[str, Any]:
    return {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(UNMANAGED_NAMESPACES),
            }
        ]
    }


def configuration(
    ports: dict[str, int], cert_dir: Path, *, fair_sharing: bool = False
) -> dict[str, Any]:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for the local cluster.

    ``ports`` holds ``webhook``, ``metrics``, ``health`` and ``visibility``; every
    server binds 127.0.0.1. Pods without a queue label are not Kueue's business
    (``manageJobsWithoutQueueName: false``): only the hub's queued servers are held.
    ``fair_sharing``: Kueue's fair sharing among the queues of a cohort, by their
    ``fairSharing.weight`` (Kueue's default preemption strategies, spelt out). The
    simulated DRA driver's DeviceClasses are mapped (see the module doc).
    """
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": managed_namespaces_selector(),
        # Kueue's rotator serves the certificate seeded in its Secret (see the module doc)
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": CERT_SECRET,
        },
        "webhook": {"host": "127.0.0.1", "port": ports["webhook"], "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": ports["visibility"]},
        "leaderElection": {"leaderElect": False},
        "integrations": {"frameworks": ["pod"]},
        # the simulated DRA driver's DeviceClasses, by the names the policy's
        # ClusterQueues count their devices in
        "resources": {
            "deviceClassMappings": [
                {"name": device_class_resource(name), "deviceClassNames": [name]}
                for name in (c["metadata"]["name"] for c in DEVICE_CLASSES)
            ]
        },
    }
    if fair_sharing:
        config["fairSharing"] = {
            "preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
        }
    return config


def _served_here(webhook: dict[str, Any]) -> bool:
    """True for the webhooks of Kueue's own kinds and of pods: the only ones a manager
    with just the ``pod`` integration serves. Any other (Jobs, Deployments, ...) would
    name a path nobody answers, and with ``failurePolicy: Fail`` block those objects."""
    for rule in webhook.get("rules", []):
        if "kueue.x-k8s.io" in rule.get("apiGroups", []):
            return True
        if rule.get("apiGroups") == [""] and rule.get("resources") == ["pods"]:
            return True
    return False


def webhook_configurations(
    manifests: list[dict[str, Any]], base_url: str, ca_bundle: str
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations pointed at ``base_url`` (``https://127.0.0.1:PORT``).

    ``manifests`` are the documents of the pinned module's webhook manifests. Each
    ``clientConfig.service`` becomes a ``url`` on ``base_url`` with ``caBundle``
    (base64 PEM); the pod webhooks skip kube-system and Kueue's namespace, as Kueue's
    kustomize install makes them do.
    """
    configurations = []
    for document in manifests:
        if not document or document.get("kind") not in WEBHOOK_CONFIGURATIONS:
            continue
        configuration = copy.deepcopy(document)
        configuration["metadata"] = {"name": WEBHOOK_CONFIGURATIONS[document["kind"]]}
        webhooks = []
        for webhook in configuration["webhooks"]:
            if not _served_here(webhook):
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": base_url + path, "caBundle": ca_bundle}
            if any("pods" in rule.get("resources", []) for rule in webhook["rules"]):
                webhook["namespaceSelector"] = managed_namespaces_selector()
            webhooks.append(webhook)
        configuration["webhooks"] = webhooks
        configurations.append(configuration)
    return configurations


def with_conversion_webhook(crd: dict[str, Any], base_url: str, ca_bundle: str) -> dict[str, Any]:
    """A Kueue CRD that converts between its served versions through Kueue's webhook,
    as Kueue's install does: without it an object written as v1beta1 would be stored
    as v1beta2 unconverted, and fields renamed between the two would be lost."""
    crd = copy.deepcopy(crd)
    if crd["metadata"]["name"] in CONVERTED_CRDS:
        crd["spec"]["conversion"] = {
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"url": f"{base_url}/convert", "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"],
            },
        }
    return crd


def module_manifests() -> list[dict[str, Any]]:
    """The documents of the webhook manifests in the pinned Kueue module."""
    path = crds.module_dirs()[MODULE] / WEBHOOK_MANIFESTS
    if not path.is_file():
        raise crds.BuildError(
            f"{MODULE} {crds.pinned_versions().get(MODULE)}: no {WEBHOOK_MANIFESTS} in its "
            "module; pin a version that ships it in gomod/crds/go.mod"
        )
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def write_credentials(pki_dir: Path, server: str) -> tuple[Path, dict[str, bytes]]:
    """Kueue's kubeconfig (a client certificate of the cluster's CA) and the data of
    its certificate Secret: a Kueue CA signed by the cluster's CA, and a serving
    certificate of it for the webhook Service name and 127.0.0.1."""
    ca = pki.CertificateAuthority.load(pki_dir)
    stem, common_name, organization = IDENTITY
    cert, key = ca.issue(common_name, organization=organization)
    (pki_dir / f"{stem}.crt").write_bytes(cert)
    (pki_dir / f"{stem}.key").write_bytes(key)
    (pki_dir / f"{stem}.key").chmod(0o600)
    kubeconfig = pki_dir / f"{stem}.kubeconfig"
    pki.write_kubeconfig(
        kubeconfig,
        server,
        pki_dir / "ca.crt",
        pki_dir / f"{stem}.crt",
        pki_dir / f"{stem}.key",
        common_name,
    )
    kueue_ca = ca.intermediate(CA_NAME, [CA_NAME])
    serving_cert, serving_key = kueue_ca.issue(
        WEBHOOK_SERVICE,
        server_names=[f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"],
        server_ips=["127.0.0.1"],
    )
    secret_data = {
        "ca.crt": kueue_ca.cert_pem,
        "ca.key": kueue_ca.key_pem_pkcs1,
        "tls.crt": serving_cert,
        "tls.key": serving_key,
    }
    return kubeconfig, secret_data


def certificate_secret(data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CERT_SECRET, "namespace": NAMESPACE},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
