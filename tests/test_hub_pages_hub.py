"""The hub's home page rendered by a real hub whose usage database hangs: a heartbeat on
the hub's own event loop never misses 100 ms and the page comes without the stops.
(That the stops return once the database answers: tests/unit/test_hub_pages.py.)"""

from __future__ import annotations

import asyncio
import http.cookiejar
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hub_helpers import running_hub

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "flavors": {"h200": {"kind": "gpu"}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"alpha": {"quota": {"gpus": 2}, "profiles": ["small"]}},
}

#: in the hub's config: a callback every 10 ms on the hub's loop that writes down each
#: gap over 100 ms (its wall-clock time and length); the service, which loads the same
#: file with no loop running, skips it
HEARTBEAT = """
import asyncio as _asyncio, time as _time

def _beat(last=[None]):
    now = _time.monotonic()
    if last[0] is not None and now - last[0] > 0.1:
        with open({path!r}, "a") as f:
            f.write(f"{{_time.time()}} {{now - last[0]}}\\n")
    last[0] = now
    _asyncio.get_running_loop().call_later(0.01, _beat)

try:
    _asyncio.get_running_loop().call_soon(_beat)
except RuntimeError:
    pass
"""


def logged_in(url: str, user: str, password: str) -> urllib.request.OpenerDirector:
    """Logged in through the hub's form, not following where it sends the user next (the
    spawn page, whose profile list waits for the usage database)."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), Stay)
    form = opener.open(f"{url}/hub/login", timeout=30).read().decode()
    xsrf = re.search(r'name="_xsrf"\s+value="([^"]+)"', form)
    fields = {"username": user, "password": password, **({"_xsrf": xsrf[1]} if xsrf else {})}
    with pytest.raises(urllib.error.HTTPError) as sent_on:
        opener.open(f"{url}/hub/login", urllib.parse.urlencode(fields).encode(), timeout=30)
    assert sent_on.value.code == 302
    return opener


def gaps(path: Path, since: float) -> list[float]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        at, length = map(float, line.split())
        if at >= since:
            found.append(length)
    return found


async def test_a_hung_usage_database_never_stalls_the_hubs_pages(
    local_cluster, core, priority_class_objects, tmp_path
):
    """The usage database is a server that accepts connections and never answers:
    pages render after their 2 s wait for the stops, without them, while the hub's
    loop keeps its beat and its API answers."""
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    database = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = database.sockets[0].getsockname()[1]
    beats = tmp_path / "gaps.txt"
    policy = {
        **POLICY,
        "accounting_url": f"postgresql+psycopg2://gpu:hunter2@127.0.0.1:{port}/usage",
    }
    try:
        async with running_hub(
            local_cluster,
            core,
            users={"ann": ["alpha"], "bob": ["alpha"]},
            policy=policy,
            extra_config=HEARTBEAT.format(path=str(beats)),
        ) as hub:
            ann = await asyncio.to_thread(logged_in, hub.url, "ann", hub.password)
            bob = await asyncio.to_thread(logged_in, hub.url, "bob", hub.password)

            def get(opener, path: str) -> tuple[float, str]:
                began = time.monotonic()
                body = opener.open(f"{hub.url}{path}", timeout=60).read().decode()
                return time.monotonic() - began, body

            # the hub compiles its templates at their first page (not the database's doing)
            await asyncio.to_thread(get, bob, "/hub/home")
            began = time.time()
            answers = await asyncio.gather(
                *(asyncio.to_thread(get, o, "/hub/home") for o in (ann, bob, ann, bob)),
                asyncio.to_thread(get, ann, "/hub/api/"),
            )
            assert gaps(beats, began) == [], "the hub's event loop stalled while pages rendered"
            *pages, api = answers
            # the API answered while pages waited for the database; each page waited
            # its 2 s for the stops, not for the database
            assert api[0] < 1.5, api
            assert all(took < 8 for took, _ in pages), [took for took, _ in pages]
            assert all("Start My Server" in body or "My Server" in body for _, body in pages)
            assert all("jupyterhub-gpu-last-stop" not in body for _, body in pages)
    finally:
        database.close()
        for writer in held:
            writer.close()
