"""Showback's energy against the real Prometheus (Debian's package) scraping the
simulated DCGM exporter: a session's kWh from the total-energy counter where the
exporter has it (across a counter reset), else from the power gauge, its GPUs
together; a server on a shared
GPU or a MIG slice is never given its device's power, and one without series is
reported as such, in the coverage the JSON gives."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from jupyterhub_gpu.core.energy import unmetered_flavors
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.showback import sessions_of, showback
from jupyterhub_gpu.core.usage import UsageRecord
from jupyterhub_gpu.core.utilisation import Chunks
from jupyterhub_gpu.service.idle import Prometheus
from jupyterhub_gpu.service.showback_months import shared_flavors
from jupyterhub_gpu.service.time_views import showback_json
from jupyterhub_gpu.service.utilisation import POWER_USAGE, TOTAL_ENERGY, UtilisationReader
from jupyterhub_gpu.service.views import Viewer
from kube_helpers import eventually, pod_manifest

pytestmark = pytest.mark.k8s
CHUNK = 10.0  # seconds: a "day" of the test, so chunk edges pass during it
#: how long the sessions run once every pod's series are in Prometheus
RUN = 25.0
POLICY = parse_policy(
    flavors={
        "gpu": {"kind": "gpu"},
        "h200-shared": {"kind": "timeslice", "resource": "nvidia.com/gpu.shared", "replicas": 4},
        "mig-1g5": {"kind": "mig", "profile": "1g.5gb", "strategy": "mixed"},
    },
    profiles={
        "gpu": {"gpu": {"flavor": "gpu"}},
        "light": {"gpu": {"flavor": "h200-shared"}},
        "slice": {"gpu": {"flavor": "mig-1g5"}},
    },
    groups={"lab": {"quota": {"gpus": 16}, "profiles": ["gpu", "light", "slice"]}},
)
#: pod -> (its devices, its flavor, GPU-equivalents, utilisation, the power series
#: published: gauge, counter; mapped to the pod)
PODS = {
    # two whole GPUs; the exporter gives the counter alone: the counter's path
    "jupyter-eve": ({"nvidia.com/gpu": "2"}, "gpu", 2.0, 50, (False, True), True),
    # one whole GPU; the gauge alone: the power's path
    "jupyter-fay": ({"nvidia.com/gpu": "1"}, "gpu", 1.0, 20, (True, False), True),
    # one whole GPU the exporter cannot map to its pod: no series of its own
    "jupyter-gus": ({"nvidia.com/gpu": "1"}, "gpu", 1.0, 30, (True, True), False),
    # a time-sliced replica and a MIG slice: their series give the whole device's power
    "jupyter-hal": ({"nvidia.com/gpu.shared": "1"}, "h200-shared", 0.25, 60, (True, True), True),
    "jupyter-ivy": ({"nvidia.com/mig-1g.5gb": "1"}, "mig-1g5", 1 / 7, 80, (True, True), True),
}


async def test_a_sessions_kwh_comes_from_the_counter_or_the_gauge_and_shared_gpus_from_neither(
    core, namespace, gpu_metrics
):
    exporter, prometheus = gpu_metrics.exporter, gpu_metrics.prometheus
    for name, (devices, _, _, percent, (gauge, counter), mapped) in PODS.items():
        exporter.set_utilization(namespace, name, percent)
        exporter.set_power_series(namespace, name, gauge=gauge, counter=counter)
        exporter.set_mapped(namespace, name, mapped)
        manifest = pod_manifest(name, devices)
        manifest["metadata"]["labels"] = {"gpu.jupyterhub.org/group": "lab"}
        await core.create_namespaced_pod(namespace, manifest)

    def samples(metric: str, pod: str) -> float:
        found = prometheus.query(
            f'count_over_time({metric}{{namespace="{namespace}", pod="{pod}"}}[60s])'
        )
        return min((float(s["value"][1]) for s in found), default=0.0)

    async def every_series_in():
        return (
            samples(TOTAL_ENERGY, "jupyter-eve") >= 3
            and samples(POWER_USAGE, "jupyter-fay") >= 3
            and samples(POWER_USAGE, "jupyter-hal") >= 3
            and samples(POWER_USAGE, "jupyter-ivy") >= 3
        )

    await eventually(every_series_in, "the pods' power series in Prometheus", within=90)
    # what the exporter simulates them drawing: eve's two GPUs at 50 %, fay's one at 20 %
    watts = {name: exporter.pod_power(namespace, name) for name in PODS}
    assert watts["jupyter-eve"] > 2 * watts["jupyter-fay"] > 0
    assert watts["jupyter-gus"] is None  # no series carries its labels
    # the exporter does have series of the others: eve's without its gauge, fay's
    # without its counter
    assert samples(POWER_USAGE, "jupyter-eve") == 0
    assert samples(TOTAL_ENERGY, "jupyter-fay") == 0
    began = time.time()
    await asyncio.sleep(RUN / 2)
    # a driver reloaded on one of eve's GPUs: its counter starts again from zero. The
    # chunk with the reset is left out of eve's mean (never read as a drop or a leap,
    # nor as her other GPU's power alone)
    (one, *_) = prometheus.query(f'{TOTAL_ENERGY}{{namespace="{namespace}", pod="jupyter-eve"}}')
    exporter.reset_energy([one["metric"]["UUID"]])
    await asyncio.sleep(RUN / 2)
    ended = time.time()
    records = [
        UsageRecord(
            f"u-{name}", f"{namespace}/{name}", name[8:], "lab", "gpu", flavor, gpus,
            began, ended, ended,
        )
        for name, (_, flavor, gpus, *_) in PODS.items()
    ]  # fmt: skip
    since = (began - CHUNK) // CHUNK * CHUNK
    reader = UtilisationReader(
        Prometheus(prometheus.url), Chunks(length=CHUNK, settle=2, refresh=3600, max_reads=1000)
    )
    sessions = sessions_of(records, since, ended, ended, (), shared_flavors(POLICY))
    measured = await reader.measure(since, ended, sessions)
    # the mean power each session's pod drew, its GPUs together
    assert measured.power["u-jupyter-eve"] == pytest.approx(watts["jupyter-eve"], rel=0.01)
    assert measured.power["u-jupyter-fay"] == pytest.approx(watts["jupyter-fay"], rel=0.01)
    assert "u-jupyter-gus" not in measured.power
    # the MIG slice's series are its parent GPU's: read, and never given to it (below)
    assert measured.power["u-jupyter-ivy"] > 0
    assert "u-jupyter-hal" not in sessions  # a shared GPU's utilisation is not measured
    result = showback(
        records,
        since,
        ended,
        ended,
        (),
        measured.utilisation,
        None,
        measured.power,
        unmetered_flavors(POLICY),
    )
    result = dataclasses.replace(result, coverage=measured.coverage)
    view = showback_json(
        "2026-11",
        result,
        Viewer(name="root", admin=True),
        True,
        None,
        {},
        POLICY.charged_groups,
        "UTC",
        POLICY,
    )
    hours = (ended - began) / 3600
    # each session's own time at its pod's power (the JSON's are rounded to 4 places)
    assert result.energy[("lab", "eve", "gpu")] == pytest.approx(
        watts["jupyter-eve"] * hours / 1000, rel=0.01
    )
    assert result.energy[("lab", "fay", "gpu")] == pytest.approx(
        watts["jupyter-fay"] * hours / 1000, rel=0.01
    )
    users = {u["user"]: u for u in view["users"]}
    assert users["eve"]["energy_kwh"] == round(result.energy[("lab", "eve", "gpu")], 4)
    for user in ("gus", "hal", "ivy"):
        assert users[user]["energy_kwh"] is None, user
    coverage = view["energy_coverage"]
    rounded = 1e-4
    assert coverage["measured_gpu_hours"] == pytest.approx(3 * hours, abs=rounded)
    shared = (0.25 + 1 / 7) * hours
    assert coverage["shared_gpu_hours"] == pytest.approx(shared, abs=rounded)
    assert coverage["gpu_hours_without_series"] == pytest.approx(hours, abs=rounded)
    assert "on shared GPUs or MIG slices not measured" in coverage["note"]
    assert "without power series" in coverage["note"]
    assert not coverage["complete"]
