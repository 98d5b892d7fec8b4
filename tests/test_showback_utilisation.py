"""Showback's utilised figure against the real Prometheus (Debian's package) scraping the
simulated DCGM exporter: read in chunks, each finished chunk once (counted in
Prometheus' own query log), the same as one query over the span, and time
Prometheus holds nothing for reported as missing."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import pytest

from jupyterhub_gpu.core.utilisation import Chunks
from jupyterhub_gpu.service.idle import GPU_UTIL, Prometheus
from jupyterhub_gpu.service.utilisation import UtilisationReader
from kube_helpers import eventually, pod_manifest

pytestmark = pytest.mark.k8s
CHUNK = 10.0  # seconds: a "day" of the test, so chunk edges pass during it


def head_start(url: str) -> float:
    """When Prometheus' first sample was taken (epoch seconds)."""
    with urllib.request.urlopen(f"{url}/api/v1/status/tsdb", timeout=10) as response:
        return json.loads(response.read())["data"]["headStats"]["minTime"] / 1000


def direct_mean(prometheus, pod: str, since: float, until: float) -> float:
    """The mean over the whole span, as one query over it reads it."""
    window = f"{round((until - since) * 1000)}ms"
    series = f'{GPU_UTIL}{{pod="{pod}"}}[{window}] @ {until:.3f}'
    found = prometheus.query(f"sum(sum_over_time({series})) / sum(count_over_time({series}))")
    return float(found[0]["value"][1])


def chunk_ends(queries: list[str]) -> list[float]:
    """The end of every chunk read, from the showback queries in the query log."""
    ends = []
    for query in queries:
        if '"part", "covered"' in query:
            ends.append(float(re.search(r"@ ([0-9.]+)\), \"part\", \"covered\"", query).group(1)))
    return ends


async def test_utilisation_is_read_a_chunk_at_a_time_each_finished_chunk_once(
    core, namespace, gpu_metrics
):
    exporter, prometheus = gpu_metrics.exporter, gpu_metrics.prometheus
    manifest = pod_manifest("jupyter-uma", {"nvidia.com/gpu": "1"})
    manifest["metadata"]["labels"] = {"gpu.jupyterhub.org/group": "lab"}
    exporter.set_utilization(namespace, "jupyter-uma", 40)
    await core.create_namespaced_pod(namespace, manifest)

    async def scraped_for_a_while():
        found = prometheus.query(f'count_over_time({GPU_UTIL}{{pod="jupyter-uma"}}[60s])')
        return found and float(found[0]["value"][1]) >= 25

    await eventually(scraped_for_a_while, "25 s of samples of the pod's GPU", within=90)
    key = f"{namespace}/jupyter-uma"
    reader = UtilisationReader(
        Prometheus(prometheus.url), Chunks(length=CHUNK, settle=2, refresh=3600, max_reads=1000)
    )
    # the span begins a minute before Prometheus' first sample: no data there
    first = head_start(prometheus.url)
    since = (first - 60) // CHUNK * CHUNK
    logged = len(prometheus.queries())
    found, coverage = await reader.read(since, time.time())
    until = coverage.read_until
    assert until is not None
    # (a) the same mean as one query over the whole span, across the chunks' edges
    assert found[key] == pytest.approx(direct_mean(prometheus, "jupyter-uma", since, until), 1e-6)
    assert found[key] == pytest.approx(40)
    # (c) the minute before the first sample is reported missing, not averaged in
    assert coverage.gaps
    assert coverage.gaps[0][0] == since
    assert coverage.missing == pytest.approx(first - since, abs=2 * CHUNK)
    assert coverage.note().startswith("utilised: no data for ")
    assert coverage.covered == pytest.approx(until - first, abs=2 * CHUNK)

    # (b) every chunk was read once, in one query each
    first_ends = chunk_ends(prometheus.queries()[logged:])
    assert len(first_ends) == reader.queries == len(reader.chunks.spans(since, until))
    assert len(set(first_ends)) == len(first_ends)
    # again at once: nothing is read (the chunk under way is not due yet)
    await reader.read(since, time.time())
    assert chunk_ends(prometheus.queries()[logged:]) == first_ends
    # two chunks later: the chunk that was under way and the new ones, nothing before
    await asyncio.sleep(2 * CHUNK + 3)
    found, coverage = await reader.read(since, time.time())
    again = chunk_ends(prometheus.queries()[logged:])[len(first_ends) :]
    assert again
    assert min(again) >= max(first_ends)
    assert set(again).isdisjoint(first_ends[:-1])
    assert len(again) <= 4
    assert found[key] == pytest.approx(
        direct_mean(prometheus, "jupyter-uma", since, coverage.read_until), 1e-6
    )


async def test_prometheus_down_keeps_what_was_read_and_says_the_rest_was_not():
    reader = UtilisationReader(Prometheus("http://127.0.0.1:9", timeout=2), Chunks(length=CHUNK))
    now = time.time()
    found, coverage = await reader.read(now - 5 * CHUNK, now)
    assert found == {}
    assert coverage.unread == pytest.approx(5 * CHUNK)
    assert coverage.error
    assert "cannot connect" in coverage.error
    assert "not read yet (Prometheus did not answer)" in coverage.note()
