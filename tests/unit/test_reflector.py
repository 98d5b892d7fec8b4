"""The list+watch reflector's account of its own view (pure: a scripted API): after a
failed list or watch its items may be behind the API server until a list succeeds."""

from __future__ import annotations

import json
import time

import pytest

from jupyterhub_gpu.kube.client import KubeAPIError
from jupyterhub_gpu.kube.reflector import Reflector


def pod(name: str, version: str = "1") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


class Response:
    def __init__(self, status: int = 200, body: dict | None = None, lines=(), fails=None):
        self.status = status
        self.body = json.dumps(body or {}).encode()
        self.lines = [json.dumps(line).encode() + b"\n" for line in lines]
        self.fails = fails

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass

    @property
    def content(self):
        async def stream():
            for line in self.lines:
                yield line
            if self.fails is not None:
                raise self.fails

        return stream()


class API:
    """Answers each call with the next scripted response."""

    def __init__(self, *responses: Response) -> None:
        self.responses = list(responses)

    async def __call__(self, **kwargs) -> Response:
        return self.responses.pop(0)


def listing(*items: dict) -> Response:
    return Response(body={"metadata": {"resourceVersion": "5"}, "items": list(items)})


async def test_a_failed_list_or_watch_marks_the_items_behind_until_a_list_succeeds():
    api = API(
        Response(status=503, body={"message": "unavailable"}),
        listing(pod("a"), pod("b")),
        # the watch sees one pod come, then its connection drops
        Response(lines=[{"type": "ADDED", "object": pod("c", "6")}], fails=ConnectionError()),
        listing(pod("a")),
        # a watch that expires: listed again at once, nothing failed
        Response(lines=[{"type": "ERROR", "object": {"code": 410}}]),
    )
    reflector = Reflector("pods", api)
    assert reflector.failing_since is None
    before = time.time()
    with pytest.raises(KubeAPIError):
        await reflector.run()
    assert reflector.items is None
    assert reflector.failing_since is not None
    failed = reflector.failing_since
    assert before <= failed <= time.time()
    with pytest.raises(ConnectionError):
        await reflector.run()
    # listed (the failure is over), then the watch failed: what it holds may be behind
    assert set(reflector.items or {}) == {"ns/a", "ns/b", "ns/c"}
    assert reflector.failing_since is not None
    assert reflector.failing_since >= failed
    assert await reflector.run() == "pods: watch expired, listed again"
    assert set(reflector.items or {}) == {"ns/a"}
    assert reflector.failing_since is None


async def test_a_failure_keeps_the_time_of_the_first():
    api = API(
        Response(status=500, body={"message": "down"}),
        Response(status=500, body={"message": "down"}),
    )
    reflector = Reflector("pods", api)
    with pytest.raises(KubeAPIError):
        await reflector.run()
    first = reflector.failing_since
    with pytest.raises(KubeAPIError):
        await reflector.run()
    assert reflector.failing_since == first
