"""The simulated DCGM exporter's GPU power: what each GPU draws, following its
utilisation, and its total-energy counter, integrated from that power. See
``dcgm_exporter``.

dcgm-exporter reports, per GPU, ``DCGM_FI_DEV_POWER_USAGE`` (watts) and
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (millijoules since the driver loaded, a
counter); a MIG instance's series repeat its parent GPU's, and each time-sliced
replica's its device's: a device's power is all its users'. Here a GPU draws its idle
power plus its utilisation's share of the rest up to its model's maximum; a MIG
GPU's utilisation is its instances' engine activity, each weighed by its compute
slices. Each power series carries the labels of the utilisation series it follows.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Collection

from prometheus_client.core import Metric

from .dcgm_dra import ENGINE_ACTIVE, GPU_UTIL

POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
#: the most a GPU draws (its board power, watts), by a part of its model's name
MAX_WATTS = (
    ("B200", 1000.0),
    ("H200", 700.0),
    ("H100", 700.0),
    ("A100", 400.0),
    ("L40S", 350.0),
    ("A30", 165.0),
    ("A10", 150.0),
    ("L4", 72.0),
    ("T4", 70.0),
)
OTHER_MAX_WATTS = 300.0
#: what an idle GPU draws (at most a quarter of its maximum)
IDLE_WATTS = 60.0
#: compute slices of a GPU that MIG partitions
MIG_SLICES = 7


def power_watts(model: str, percent: float) -> float:
    """What a GPU of ``model`` (``NVIDIA H200 NVL``) draws at ``percent`` utilisation."""
    top = next((watts for part, watts in MAX_WATTS if part in model), OTHER_MAX_WATTS)
    idle = min(IDLE_WATTS, top / 4)
    return idle + min(max(percent, 0.0), 100.0) / 100 * (top - idle)


def _slices(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 1


class EnergyMeter:
    """Each GPU's energy counter (mJ, by its UUID): between two scrapes a GPU draws
    what the earlier one reported, as a counter read between two power samples adds."""

    def __init__(self) -> None:
        #: UUID -> (millijoules, when, watts since then)
        self.devices: dict[str, tuple[float, float, float]] = {}

    def read(self, uuid: str, watts: float, now: float) -> float:
        # a counter since the driver loaded, whose start is not zero
        energy, at, drawn = self.devices.get(uuid, (zlib.crc32(uuid.encode()) * 1000.0, now, 0))
        energy += drawn * max(now - at, 0.0) * 1000
        self.devices[uuid] = (energy, now, watts)
        return energy

    def reset(self, uuids: Collection[str] | None = None) -> None:
        """These GPUs' counters (None: every GPU's) back to zero, as when the driver is
        reloaded."""
        self.devices = {
            uuid: (0.0, at, watts) if uuids is None or uuid in uuids else (energy, at, watts)
            for uuid, (energy, at, watts) in self.devices.items()
        }


def power_families(
    usage: list[Metric],
    meter: EnergyMeter,
    now: float | None = None,
    published: Callable[[str, str], tuple[bool, bool]] = lambda namespace, pod: (True, True),
) -> tuple[list[Metric], dict[tuple[str, str], float]]:
    """The power gauge and the energy counter for every GPU the utilisation series
    (``usage``: their families) report, each series with a utilisation series' labels;
    and each pod's power (its GPUs' together, watts). ``published(namespace, pod)``:
    whether a pod's series have the gauge and the counter (an exporter whose counters
    file lacks one)."""
    now = time.time() if now is None else now
    samples = [s for family in usage for s in family.samples]
    # each GPU's utilisation: a whole GPU's own (a shared one's, once per pod), or its
    # MIG instances' engine activity weighed by their slices
    busy: dict[str, float] = {}
    instances: dict[str, dict[str, float]] = {}
    models: dict[str, str] = {}
    for sample in samples:
        uuid = sample.labels.get("UUID", "")
        models[uuid] = sample.labels.get("modelName", "")
        if sample.name == GPU_UTIL:
            busy[uuid] = max(busy.get(uuid, 0.0), sample.value)
        elif sample.name == ENGINE_ACTIVE:
            share = sample.value * 100 * _slices(sample.labels.get("GPU_I_PROFILE", ""))
            instances.setdefault(uuid, {})[sample.labels.get("GPU_I_ID", "")] = share
    for uuid, shares in instances.items():
        busy[uuid] = min(busy.get(uuid, 0.0) + sum(shares.values()) / MIG_SLICES, 100.0)
    watts = {uuid: power_watts(models[uuid], percent) for uuid, percent in busy.items()}
    energy = {uuid: meter.read(uuid, w, now) for uuid, w in sorted(watts.items())}
    power = Metric(POWER_USAGE, "Power draw (in W).", "gauge")
    total = Metric(TOTAL_ENERGY, "Total energy consumption since boot (in mJ).", "counter")
    per_pod: dict[tuple[str, str], dict[str, float]] = {}
    for sample in samples:
        uuid, labels = sample.labels.get("UUID", ""), sample.labels
        gauge = counter = True
        if "pod" in labels:
            pod = (labels.get("namespace", ""), labels["pod"])
            per_pod.setdefault(pod, {})[uuid] = watts[uuid]
            gauge, counter = published(*pod)
        if gauge:
            power.add_sample(POWER_USAGE, dict(labels), watts[uuid])
        if counter:
            total.add_sample(TOTAL_ENERGY, dict(labels), energy[uuid])
    return [power, total], {pod: sum(gpus.values()) for pod, gpus in per_pod.items()}
