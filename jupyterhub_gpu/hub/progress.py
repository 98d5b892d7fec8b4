"""What the spawn page shows while a server starts.

While the spawn waits in its group's line there is no pod yet: the page shows the
line's position. Then KubeSpawner's events, with a scheduler's FailedScheduling said
in plain language, and, whenever they change, where the pod waits in its scheduler's
queue (a pod Kueue gates has no events of its own to show) and the DRA devices
kube-scheduler allocated the server (named before the server is ready: once its pod
runs, the page waits for them while the start reads them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from ..core.pending import explain_unschedulable
from ..core.selection import Selection
from ..core.shaping import PodShape

Event = dict[str, Any]
#: how long the page waits, once the pod runs, for a DRA server's devices to be named
DEVICE_LINE_WAIT = 30.0


async def progress_events(
    group_line: Callable[[], str | None],
    queue_line: Callable[[], str | None],
    kubespawner_progress: Callable[[], AsyncIterator[Event]],
    explain: Callable[[Event], Event],
    device_line: Callable[[], str | None] = lambda: None,
    devices_read: Callable[[], Awaitable[bool]] | None = None,
    device_wait: float = DEVICE_LINE_WAIT,
) -> AsyncIterator[Event]:
    """The spawn page's events: ``group_line()`` while the spawn waits in its group's
    line; then ``kubespawner_progress()``'s events, each ``explain``ed, and
    ``queue_line()`` and ``device_line()`` whenever they change; once KubeSpawner's
    events end, ``device_line()`` each time ``devices_read()`` (a brief wait for the
    start to read the devices) says to look again, for ``device_wait`` s at most."""
    # while waiting in line there is no pod yet: report the queue position
    while group_line():
        yield {"progress": 1, "message": group_line()}
        await asyncio.sleep(1)
    events: asyncio.Queue = asyncio.Queue()
    done = object()

    async def forward() -> None:
        try:
            async for event in kubespawner_progress():
                if queue_line() and not {"raw_event", "progress"} & set(event):
                    # KubeSpawner's "please be patient" would take the place of the
                    # line that says where the server waits
                    continue
                await events.put(explain(event))
        finally:
            await events.put(done)

    forwarding = asyncio.ensure_future(forward())
    shown: dict[Callable[[], str | None], str | None] = {}

    def changed() -> Iterator[Event]:
        for source in (queue_line, device_line):
            line = source()
            if line and line != shown.get(source):
                yield {"message": line}  # no "progress": the bar stays where it is
            shown[source] = line

    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), timeout=1)
            except TimeoutError:
                event = None
            if event is not None and event is not done:
                yield event
            for line_event in changed():
                yield line_event
            if event is done:
                break
        # the pod runs: its devices are allocated, named as soon as the start reads them
        # where the hub's watch has not shown them yet
        loop = asyncio.get_running_loop()
        deadline = loop.time() + device_wait
        while devices_read is not None and not shown.get(device_line) and loop.time() < deadline:
            if not await devices_read():
                break
            for line_event in changed():
                yield line_event
        for line_event in changed():
            yield line_event
    finally:
        forwarding.cancel()
    await forwarding  # KubeSpawner's errors, if any, are the page's


def explained(event: Event, selection: Selection | None, shape: PodShape | None) -> Event:
    """A scheduler's FailedScheduling event, said in plain language."""
    raw = event.get("raw_event") or {}
    if raw.get("reason") != "FailedScheduling" or selection is None:
        return event
    resources = tuple(shape.extended_resources) if shape else ()
    text = explain_unschedulable(raw.get("message") or "", selection.flavor, resources)
    return {**event, "message": text} if text else event
