"""GPU time of servers on DRA devices: charged by what their claims were allocated.

A server of a ``dra`` flavor, or of a ``gpu`` flavor whose extended resource a DRA
driver serves (the extended-resource bridge), holds the devices kube-scheduler
allocated to the ResourceClaims its pod owns. Its GPU time counts those devices
(``core.dra.pod_allocation``: a whole GPU 1 GPU-equivalent, a MIG partition its
compute slices out of 7, or the flavor's ``gpu_equivalents`` per device), not the
count the profile asked for. A server's charge is fixed the first time its
allocation is seen, and kept while its pod runs (its claims go with the pod). The
hub, which writes a server's record when its start finishes, reads the same
allocation (``kube.clusterview.pod_dra_inventory``): whichever writes first, the
record says what the server holds.

Until then a DRA server is not recorded yet, for at most ``ALLOCATION_WAIT``
seconds after its pod started (its record starts at the pod's start whenever it
is written, so no time is lost unless the server ends meanwhile); past that, as
when the DRA objects cannot be read (no RBAC, a cluster without DRA), it is
charged what it asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..core.dra import DraInventory, allocated_gpus
from ..core.model import Policy
from ..core.usage import UsageRecord

#: seconds after a DRA server's pod started that its record waits for its allocation
ALLOCATION_WAIT = 30.0


class AllocationCharges:
    """Each server pod's charge once its allocation is known, by pod uid."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._charged: dict[str, UsageRecord] = {}

    def charged(
        self, record: UsageRecord, inventory: DraInventory | None, now: float
    ) -> UsageRecord | None:
        """``record`` as GPU time counts it; None: not yet (its allocation not seen)."""
        known = self._charged.get(record.uid)
        if known is not None:
            return known
        flavor = self.policy.flavors.get(record.flavor or "")
        on_dra = flavor is not None and (flavor.kind == "dra" or flavor.bridged)
        per_device = flavor.dra_equivalents if flavor is not None else None
        gpus = allocated_gpus(inventory, record.uid, per_device) if inventory else None
        if gpus is not None:
            charged = replace(record, gpus=float(gpus))
            self._charged[record.uid] = charged
            return charged
        if on_dra and now - record.started < ALLOCATION_WAIT:
            return None
        return record

    def keep_only(self, uids: Iterable[str]) -> None:
        """Forget the charges of pods that are gone."""
        alive = set(uids)
        for uid in [u for u in self._charged if u not in alive]:
            del self._charged[uid]
