"""The spawn page's events, pure: a DRA server's devices named once known, whether the
hub's watch shows them while the pod starts or the start reads them after it runs."""

from __future__ import annotations

import asyncio

from jupyterhub_gpu.hub.progress import progress_events


async def events_of(kubespawner: list[dict], device_line, devices_read=None, wait=5.0):
    async def kubespawner_progress():
        for event in kubespawner:
            yield event

    return [
        event
        async for event in progress_events(
            lambda: None,
            lambda: None,
            kubespawner_progress,
            lambda event: event,
            device_line=device_line,
            devices_read=devices_read,
            device_wait=wait,
        )
    ]


async def test_the_devices_the_watch_shows_are_named_once():
    line = "DRA: kube-scheduler allocated gpu-1 (NVIDIA H200 NVL) on h200dra-0"
    events = await events_of(
        [{"progress": 50, "message": "pod scheduled"}, {"progress": 80, "message": "pulled"}],
        lambda: line,
    )
    assert [e["message"] for e in events] == ["pod scheduled", line, "pulled"]
    assert "progress" not in events[1]  # the bar stays where it is


async def test_the_devices_the_start_reads_after_the_pod_runs_are_named_before_it_ends():
    """KubeSpawner's events end as the pod runs; the start reads the claims later: the
    page waits for that read (not for its bound) and names them."""
    read = asyncio.Event()
    words: list[str] = []

    async def start_reads_claims():
        await asyncio.sleep(0.3)
        words.append("gpu-0-mig-3g71gb-1 (NVIDIA H200 NVL 3g.71gb) on h200-dra-0")
        read.set()

    async def devices_read() -> bool:
        if read.is_set():
            return False
        await asyncio.wait_for(read.wait(), timeout=0.5)
        return True

    reading = asyncio.ensure_future(start_reads_claims())
    loop = asyncio.get_running_loop()
    began = loop.time()
    events = await events_of(
        [{"progress": 100, "message": "pod running"}],
        lambda: f"DRA: kube-scheduler allocated {words[0]}" if words else None,
        devices_read,
        wait=30,
    )
    await reading
    assert [e["message"] for e in events] == [
        "pod running",
        "DRA: kube-scheduler allocated gpu-0-mig-3g71gb-1 (NVIDIA H200 NVL 3g.71gb) on h200-dra-0",
    ]
    assert loop.time() - began < 5  # the read ended the wait, not device_wait


async def test_devices_never_read_end_the_wait_at_its_bound_without_a_line():
    async def devices_read() -> bool:
        await asyncio.sleep(0.1)
        return True  # still starting, nothing read

    loop = asyncio.get_running_loop()
    began = loop.time()
    events = await events_of(
        [{"progress": 100, "message": "pod running"}], lambda: None, devices_read, wait=1
    )
    assert [e["message"] for e in events] == ["pod running"]
    assert 1 <= loop.time() - began < 5
