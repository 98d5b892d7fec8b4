"""The default scheduler: kube-scheduler places each server's pod as it comes.

It keeps no queue of its own: the hub's admission holds each group to its quota,
and the policy's PriorityClasses let in-quota servers preempt bursting ones.
"""

from __future__ import annotations

from .base import Scheduler


class KubeScheduler(Scheduler):
    name = "default"
    display_name = "kube-scheduler"
