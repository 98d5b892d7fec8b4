"""The timings of the GPU service replicas' Lease, and what makes them unsafe (pure).

The protocol is client-go's leader election (``kube.leader`` runs it): a replica
holds the Lease while it renews it every ``retry_period``; another may take it once
it has seen the Lease unchanged for ``duration``; the holder acts only until
``renew_deadline`` after its last renewal began. ``renew_deadline < duration`` is
what keeps two replicas from acting at once.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a retry period this many times over must still fit in the renew deadline
JITTER = 1.2


@dataclass(frozen=True)
class LeaseTimings:
    """The Lease's timings, in seconds (client-go's defaults: 15, 10, 2)."""

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def errors(self) -> list[str]:
        """What makes these timings unsafe, in words (empty: none)."""
        errors = []
        if self.duration < 1:
            errors.append(f"lease_duration: expected at least 1 second, got {self.duration}")
        if self.renew_deadline >= self.duration:
            errors.append(
                f"lease_renew_deadline ({self.renew_deadline}) must be shorter than "
                f"lease_duration ({self.duration}): a leader that cannot renew must stop "
                "acting before another replica may take the Lease"
            )
        if self.retry_period * JITTER >= self.renew_deadline:
            errors.append(
                f"lease_retry_period ({self.retry_period}) times {JITTER} must be shorter "
                f"than lease_renew_deadline ({self.renew_deadline}): a leader must be able to "
                "retry a failed renewal before its deadline"
            )
        return errors
