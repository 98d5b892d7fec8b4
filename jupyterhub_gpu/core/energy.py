"""Energy for showback: which servers' GPU power is their own, their kWh, and what part
of a showback's GPU-hours the energy covers.

NVIDIA's DCGM exporter reports each GPU's power (``DCGM_FI_DEV_POWER_USAGE``, W) and
its total energy since boot (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ). A
device's power is all its users': a server is given the power of the GPUs it holds
whole, never a share of a device others use at the same time (time-sliced and MPS
replicas, fractions, HAMi shares, and MIG slices, whose series repeat their parent
GPU's power). A MIG profile as large as its GPU holds the parent whole: its power is
the server's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from . import words
from .model import Flavor, Policy
from .utilisation import Coverage

#: joules in a kilowatt-hour
JOULES_PER_KWH = 3_600_000.0


def kwh(watts: float, seconds: float) -> float:
    """The kilowatt-hours a server drawing ``watts`` on average (its GPUs together)
    used in ``seconds``."""
    return max(watts, 0.0) * seconds / JOULES_PER_KWH


def emissions_kg(energy_kwh: float, grams_per_kwh: float) -> float:
    """Kilograms of CO2 equivalent for ``energy_kwh`` at a site's emissions factor."""
    return energy_kwh * grams_per_kwh / 1000


def holds_whole_devices(flavor: Flavor) -> bool:
    """Whether a server of ``flavor`` holds its GPUs whole, so their power is its own:
    a whole GPU, a MIG profile as large as its GPU, or a DRA claim of whole GPUs not
    shared. A DRA flavor whose DeviceClass serves MIG partitions may be given a slice:
    not whole."""
    if flavor.sharing is not None:
        return False
    if flavor.kind == "gpu":
        return True
    if flavor.kind == "dra" and "mig" in (flavor.device_class or "").lower():
        return False
    if flavor.kind in ("mig", "dra"):
        return flavor.unit_equivalents >= 1
    return False


def unmetered_flavors(policy: Policy) -> frozenset[str]:
    """The flavors whose servers share their GPUs' power with others: never measured."""
    return frozenset(name for name, f in policy.flavors.items() if not holds_whole_devices(f))


@dataclass(frozen=True)
class EnergyCoverage:
    """Which of a showback's GPU-hours the energy figures cover: ``measured`` (servers
    whose GPUs' power was read), ``shared`` (servers on shared devices or MIG slices:
    never measured) and ``without_series`` (servers holding whole GPUs that Prometheus
    had no power series for, or whose days are not read yet)."""

    gpu_hours: float
    measured: float
    shared: float
    without_series: float
    #: which part of the range the readings cover (None: nothing read, no Prometheus)
    readings: Coverage | None = None

    @property
    def complete(self) -> bool:
        return (
            self.readings is not None
            and self.readings.complete
            and not self.shared
            and self.without_series < 5e-5
        )

    def note(self) -> str | None:
        """What a reader of the kWh must know, in words; None when it is whole."""
        if self.readings is None:
            return None
        parts = []
        if self.shared:
            shared = words.gpu_hours(self.shared)
            parts.append(f"{shared} on shared GPUs or MIG slices not measured")
        if self.without_series >= 5e-5:
            parts.append(f"{words.gpu_hours(self.without_series)} without power series")
        parts += self.readings.parts()
        return "energy: " + ", ".join(parts) if parts else None


def energy_coverage(
    detail: Mapping[tuple[str, str, str], float],
    metered: Mapping[tuple[str, str, str], float],
    unmetered: Container[str],
    readings: Coverage | None,
    visible: Callable[[str], bool] = lambda group: True,
) -> EnergyCoverage:
    """The coverage of the rows (group, user, flavor) of ``visible`` groups: their
    GPU-hours (``detail``), those whose energy was measured (``metered``), and of the
    rest those of ``unmetered`` flavors (shared devices) and the others."""
    total = measured = shared = without = 0.0
    for key, hours in detail.items():
        if not visible(key[0]):
            continue
        total += hours
        if key[2] in unmetered:
            shared += hours
            continue
        done = metered.get(key, 0.0)
        measured += done
        without += max(hours - done, 0.0)
    return EnergyCoverage(total, measured, shared, without, readings)
