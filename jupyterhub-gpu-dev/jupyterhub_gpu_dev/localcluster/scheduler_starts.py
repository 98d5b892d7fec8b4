"""Kueue and Volcano started beside a local cluster's control plane, on 127.0.0.1: their
CRDs, certificates and webhooks installed first, and a start that returns once the API
server reaches them."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import yaml

from . import kueue as kueue_manager
from . import volcano
from .cluster_state import ClusterError, ProgressFn

#: the servers Kueue's manager runs, each on a port of its own on 127.0.0.1
KUEUE_SERVERS = ("webhook", "metrics", "health", "visibility")


class SchedulerStarts:
    """Mixed into ``LocalCluster``: the schedulers it runs besides kube-scheduler."""

    def _start_kueue(self, bins: Path, progress: ProgressFn, timeout: float) -> None:
        """Kueue's CRDs, certificate Secret and webhooks, then its manager on 127.0.0.1;
        returns once the API server reaches its webhooks."""
        p = self.state.ports
        pk = self.state.path / "pki"
        kubeconfig, secret_data = kueue_manager.write_credentials(pk, self.state.server)
        webhook_url = f"https://127.0.0.1:{p['kueue-webhook']}"
        ca_bundle = base64.b64encode(secret_data["ca.crt"]).decode()
        # the Secret's files, where a kubelet would mount it for Kueue's webhook server
        cert_dir = self.state.path / "kueue-certs"
        cert_dir.mkdir(exist_ok=True)
        for name, content in secret_data.items():
            (cert_dir / name).write_bytes(content)
            if name.endswith(".key"):
                (cert_dir / name).chmod(0o600)
        config = kueue_manager.configuration(
            {server: p[f"kueue-{server}"] for server in KUEUE_SERVERS},
            cert_dir,
            fair_sharing=self.state.kueue_fair_sharing,
        )
        config_path = self.state.path / "kueue-config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))

        progress("installing Kueue's CRDs and webhooks")
        asyncio.run(self._install_kueue(webhook_url, ca_bundle, secret_data, timeout))
        progress(f"starting Kueue {self.state.versions.get('kueue', '')}")
        self._spawn(
            "kueue",
            [str(bins / "kueue"), f"--config={config_path}", f"--kubeconfig={kubeconfig}"],
        )
        self._wait(
            lambda: self._http_ok(f"http://127.0.0.1:{p['kueue-health']}/readyz"), "kueue", timeout
        )
        asyncio.run(self._kueue_webhooks_answer(webhook_url, timeout))

    def _start_volcano(
        self, bins: Path, kubeconfig: Path, progress: ProgressFn, timeout: float
    ) -> None:
        """Volcano's CRDs, then its controller-manager and scheduler on 127.0.0.1; returns
        once both are healthy and the scheduler has created its default queue."""
        ports = {server: self.state.ports[f"volcano-{server}"] for server in volcano.SERVERS}
        progress("installing Volcano's CRDs")
        asyncio.run(self._install_crds("volcano", timeout))
        progress(f"starting Volcano {self.state.versions.get('volcano', '')}")
        config = volcano.write_scheduler_configuration(
            self.state.path, proportion=self.state.volcano_proportion
        )
        for role, argv in (
            (
                volcano.CONTROLLER_MANAGER,
                volcano.controller_manager_argv(
                    bins / volcano.CONTROLLER_MANAGER, kubeconfig, ports
                ),
            ),
            (
                volcano.SCHEDULER,
                volcano.scheduler_argv(bins / volcano.SCHEDULER, kubeconfig, config, ports),
            ),
        ):
            self._spawn(role, argv)
        for role, server in (
            (volcano.CONTROLLER_MANAGER, "controllers-health"),
            (volcano.SCHEDULER, "scheduler-health"),
        ):
            url = f"http://127.0.0.1:{ports[server]}/healthz"
            self._wait(lambda url=url: self._http_ok(url), role, timeout)
        asyncio.run(self._volcano_queue_open(volcano.DEFAULT_QUEUE, timeout))

    async def _install_crds(self, scheduler: str, within: float) -> None:
        from . import crds

        async with self.api() as api:
            await crds.install(api, scheduler, within=within)

    async def _volcano_queue_open(self, name: str, within: float) -> None:
        """Wait until Volcano's scheduler created ``name`` and its queue controller opened
        it: both talk to the API server then."""
        from kubernetes_asyncio import client

        async with self.api() as api:
            custom = client.CustomObjectsApi(api)
            deadline = time.monotonic() + within
            state = "missing"
            while state != "Open":
                try:
                    queue = await custom.get_cluster_custom_object(
                        "scheduling.volcano.sh", "v1beta1", "queues", name
                    )
                    state = queue.get("status", {}).get("state") or "without a state"
                except client.ApiException as e:
                    if e.status != 404:
                        raise
                if state != "Open" and time.monotonic() > deadline:
                    raise ClusterError(
                        f"Volcano's {name} queue is {state} after {within:.0f}s; see "
                        f"{self.state.path / 'logs'} ({volcano.SCHEDULER}.log, "
                        f"{volcano.CONTROLLER_MANAGER}.log)"
                    )
                await asyncio.sleep(0.25)

    async def _install_kueue(
        self, webhook_url: str, ca_bundle: str, secret_data: dict[str, bytes], within: float
    ) -> None:
        """What Kueue needs before it starts: its CRDs (converted through its webhook),
        its namespace, the certificate Secret its rotator adopts, and its webhook
        configurations (the rotator waits for them to exist)."""
        from kubernetes_asyncio import client

        from . import crds

        async with self.api() as api:
            await crds.install(
                api,
                "kueue",
                within=within,
                adapt=lambda crd: kueue_manager.with_conversion_webhook(
                    crd, webhook_url, ca_bundle
                ),
            )
            core = client.CoreV1Api(api)
            await core.create_namespace({"metadata": {"name": kueue_manager.NAMESPACE}})
            await core.create_namespaced_secret(
                kueue_manager.NAMESPACE, kueue_manager.certificate_secret(secret_data)
            )
            registration = client.AdmissionregistrationV1Api(api)
            for configuration in kueue_manager.webhook_configurations(
                kueue_manager.module_manifests(), webhook_url, ca_bundle
            ):
                if configuration["kind"] == "MutatingWebhookConfiguration":
                    await registration.create_mutating_webhook_configuration(configuration)
                else:
                    await registration.create_validating_webhook_configuration(configuration)

    async def _kueue_webhooks_answer(self, webhook_url: str, within: float) -> None:
        """Wait until the API server reaches Kueue's webhooks: a server-side dry run
        passes the admission webhooks, so once one for a Kueue object succeeds, pods
        and queues are Kueue's."""
        from kubernetes_asyncio import client

        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "jupyterhub-gpu-webhook-probe"},
            "spec": {},
        }
        async with self.api() as api:
            custom = client.CustomObjectsApi(api)
            deadline = time.monotonic() + within
            while True:
                try:
                    await custom.create_cluster_custom_object(
                        "kueue.x-k8s.io", "v1beta2", "resourceflavors", probe, dry_run="All"
                    )
                    return
                except client.ApiException as e:
                    if time.monotonic() > deadline:
                        raise ClusterError(
                            f"Kueue's webhooks at {webhook_url} do not answer the API server "
                            f"after {within:.0f}s ({e.status} {e.reason}: {e.body}); "
                            f"see {self.state.path / 'logs' / 'kueue.log'}"
                        ) from e
                await asyncio.sleep(0.25)
