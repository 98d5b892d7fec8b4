"""What the spawn page shows while a server starts.

While the spawn waits in its group's line there is no pod yet: the page shows the
line's position. Then KubeSpawner's events, with a scheduler's FailedScheduling said
in plain language, and, whenever it changes, where the pod waits in its scheduler's
queue (a pod Kueue gates has no events of its own to show).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..core.pending import explain_unschedulable
from ..core.selection import Selection
from ..core.shaping import PodShape

Event = dict[str, Any]


async def progress_events(
    group_line: Callable[[], str | None],
    queue_line: Callable[[], str | None],
    kubespawner_progress: Callable[[], AsyncIterator[Event]],
    explain: Callable[[Event], Event],
) -> AsyncIterator[Event]:
    """The spawn page's events: ``group_line()`` while the spawn waits in its group's
    line; then ``kubespawner_progress()``'s events, each ``explain``ed, and
    ``queue_line()`` whenever it changes."""
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
    shown = None
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), timeout=1)
            except TimeoutError:
                event = None
            if event is done:
                break
            if event is not None:
                yield event
            line = queue_line()
            if line and line != shown:
                yield {"message": line}  # no "progress": the bar stays where it is
            shown = line
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
