"""The GPU service at a year of records, on its event loop: start-up, the passes that
read the month's utilisation, the passes after, and the first showback request, for
two versions of the code side by side in one run.

Method (in-process, stated honestly):

- A usage database (SQLite, in a temporary directory) holds ``--rows`` servers
  spread over the year before ``NOW`` (written straight with ``executemany``, by
  ``tests/usage_rows.py``): 4 departments with a year's budget, 20 groups with 30
  days' and a per-member budget of 30 days, 2,000 members; a few hundred servers
  still running. 657,000 rows is a year of a 500-GPU cluster, 112,000 two months.
  ``NOW`` is the 29th of a month at noon: 28 finished days of utilisation to read.
- Each version runs in a process of its own, on the same database: this tree
  (after) and ``--against``'s (before: ``git archive`` of that revision). The
  versions alternate which runs first from one size to the next.
- The real ``GPUTime`` with its executors set as the service sets them
  (``enforcement_first``: the passes' work on the enforcement threads, the
  readers' own threads), the running servers' pods as the watch shows them, and a
  stand-in for Prometheus' HTTP API, in a process of its own on 127.0.0.1, asked
  by the service's own client: it answers showback's chunk queries from the rows
  (every pod busy at its own steady percentage, a sample a minute), as Prometheus
  encodes its answers. Not a real Prometheus: a year of a cluster's samples is
  more than the test machine can load.
- Measured on the loop: each callback the loop runs is timed (the loop's time in
  a pass is their sum, the longest one its worst stall), and a heartbeat beats
  every 10 ms (its longest gap: the stall as anything else on the loop sees it,
  the 10 ms between beats included).
- Start-up: the first read. The month's read: passes 30 s apart from the first one
  until every finished day of the month is read (four a pass, the newest first):
  each makes final the sessions of the days read for good. Then ``--passes``
  passes. Then the first admin's ``api/showback`` after a pass (its view rendered
  and encoded), and a member's.
- The two versions' admin answers must agree to the 4 decimals shown.

Run: python benchmarks/service_year.py --against <revision> [--rows 112000 657000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from answers import agree  # noqa: E402
from loop_timing import LoopTimer  # noqa: E402
from usage_rows import fill, year_policy  # noqa: E402

#: 2027-01-29 12:00 UTC
NOW = 1_801_224_000.0
DAY = 86400.0
INTERVAL = 30.0  # the service's usage_interval
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"


class StandInPrometheus:
    """Answers showback's chunk queries (``service.utilisation.chunk_query``) from the
    usage rows: every pod busy at its own steady percentage, a sample a minute."""

    def __init__(self, rows: list[tuple[str, float, float | None]], now: float) -> None:
        self.now = now
        #: by day (UTC, as the chunks are): (pod key, start, end, percent)
        self.days: dict[int, list[tuple[str, float, float, float]]] = {}
        for key, started, ended in rows:
            end = ended if ended is not None else float("inf")
            busy = float(zlib.crc32(key.encode()) % 101)
            for day in range(int(started // DAY), int(min(end, now) // DAY) + 1):
                self.days.setdefault(day, []).append((key, started, end, busy))

    def body(self, start: float, end: float) -> bytes:
        """Prometheus' answer for the chunk (start, end], encoded (its own work)."""
        result = []
        seen: set[str] = set()
        for day in range(int(start // DAY), int((end - 1e-6) // DAY) + 1):
            for key, began, ended, busy in self.days.get(day, ()):
                overlap = min(ended, end) - max(began, start)
                if overlap <= 0 or key in seen:
                    continue
                seen.add(key)
                namespace, pod = key.split("/", 1)
                samples = overlap / 60
                for part, value in (("sum", busy * samples), ("count", samples)):
                    labels = {"namespace": namespace, "pod": pod, "part": f"{GPU_UTIL}:{part}"}
                    result.append({"metric": labels, "value": [end, str(value)]})
        step = max(1, min(60, int((end - start) // 20)))
        result.append({"metric": {"part": "covered"}, "value": [end, str((end - start) / step)]})
        answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return json.dumps(answer).encode()

    def answer(self, promql: str) -> bytes:
        at = float(re.search(r"@ ([0-9.]+)", promql).group(1))
        window = int(re.search(r"\[(\d+)ms\]", promql).group(1))
        return self.body(at - (window + 1) / 1000, at)

    @staticmethod
    def rows(url: str) -> list[tuple]:
        connection = sqlite3.connect(url.removeprefix("sqlite:///"))
        rows = connection.execute(
            'SELECT uid, key, user, "group", profile, flavor, gpus, started, last_seen, ended '
            "FROM jupyterhub_gpu_usage"
        ).fetchall()
        connection.close()
        return rows


def serve(url: str) -> None:
    """The stand-in's HTTP API on 127.0.0.1 (a port the OS chooses, printed), in a
    process of its own as Prometheus is, until its input closes."""
    standin = StandInPrometheus([(r[1], r[7], r[9]) for r in StandInPrometheus.rows(url)], NOW)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            body = standin.answer(form["query"][0])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "worst": max(values)}


async def measure(url: str, passes: int, prometheus_url: str) -> dict:
    """One version (the one on PYTHONPATH) over the database at ``url``."""
    import jupyterhub_gpu
    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.core.budgets import UsageRecord
    from jupyterhub_gpu.core.showback import month_bounds
    from jupyterhub_gpu.service.gpu_time import GPUTime
    from jupyterhub_gpu.service.idle import Prometheus
    from jupyterhub_gpu.service.readers import enforcement_first
    from jupyterhub_gpu.service.views import Viewer

    rows = StandInPrometheus.rows(url)
    prometheus = Prometheus(prometheus_url)
    running = (UsageRecord(*r[:9]) for r in rows if r[9] is None)
    pods = {u.key: SimpleNamespace(usage=u, uid=u.uid) for u in running}
    # (no DRA objects: what later versions read of them)
    state = SimpleNamespace(server_pods=pods, server_pods_behind_since=None, dra=None)
    clock = [NOW]
    enforcement_first(
        asyncio.get_running_loop(),
        ThreadPoolExecutor(max_workers=4, thread_name_prefix="enforcement"),
    )
    store = UsageStore(url)
    gpu_time = GPUTime(year_policy(), state, store, clock=lambda: clock[0], prometheus=prometheus)
    gpu_time.readers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="readers")
    gpu_time.reader_store = UsageStore(url)
    month = gpu_time.month_of(NOW)
    since, until = month_bounds(month)
    timer = LoopTimer()
    out: dict = {"code": str(Path(jupyterhub_gpu.__file__).parent.parent)}

    out["start"] = await timer.window(gpu_time.read())

    def days_left() -> int:
        chunks = gpu_time.utilisation_reader.chunks
        wanted = chunks.wanted(since, clock[0], clock[0])
        return sum(1 for s, e in wanted if e <= clock[0] - chunks.settle)

    reading = []
    while days_left() and len(reading) < 20:
        clock[0] += INTERVAL
        reading.append(await timer.window(gpu_time.record()))
    out["month"] = reading
    steady = []
    for _ in range(passes):
        clock[0] += INTERVAL
        steady.append(await timer.window(gpu_time.record()))
    out["steady"] = steady

    clock[0] += INTERVAL
    await gpu_time.record()
    views = {}

    async def request(viewer: Viewer, admin: bool, groups: set[str] | None) -> None:
        # the service's handler: the view, then its JSON encoded
        view = await gpu_time.showback_view(month, viewer, admin, groups)
        views[viewer.name] = view
        json.dumps(view)

    admin = Viewer(name="root", admin=True)
    out["admin_request"] = await timer.window(request(admin, True, None))
    member = Viewer(name="u1", groups=frozenset({"lab0-1"}))
    out["member_request"] = await timer.window(request(member, False, {"lab0-1"}))
    out["answer"] = views
    out["month_records"] = sum(1 for r in rows if r[7] < until and (r[9] is None or r[9] > since))
    store.dispose()
    gpu_time.reader_store.dispose()
    return out


def run(tree: Path, url: str, passes: int) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--measure", url, "--passes", str(passes)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        raise SystemExit(f"the run of {tree} failed:\n{result.stderr}")
    out = json.loads(result.stdout.splitlines()[-1])
    if Path(out["code"]).resolve() != tree.resolve():
        raise SystemExit(f"the run of {tree} ran the code in {out['code']}")
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}" if seconds >= 0.0995 else f"{seconds * 1000:.1f}"


def report(rows: int, results: dict[str, dict]) -> None:
    after = results["after"]
    print(
        f"\n{rows:,} rows ({after['month_records']:,} in the month); answers agree: "
        f"{agree(results['before']['answer'], after['answer'])}"
    )
    head = "loop ms | loop CPU ms | longest callback ms | heartbeat gap ms"
    print(f"| | before: {head} | after: {head} | loop time, before / after |")
    print("|---" * 10 + "|")

    def line(what: str, key: str) -> None:
        cells, medians = [], []
        for label in ("before", "after"):
            runs = results[label][key]
            runs = runs if isinstance(runs, list) else [runs]
            loops, cpus = [w["loop"] for w in runs], [w["cpu"] for w in runs]
            medians.append(statistics.median(loops))
            if len(runs) == 1:
                cells += [ms(loops[0]), ms(cpus[0])]
            else:
                cells += [
                    f"{ms(statistics.median(loops))} (worst {ms(max(loops))})",
                    f"{ms(statistics.median(cpus))} (worst {ms(max(cpus))})",
                ]
            cells += [ms(max(w["callback"] for w in runs)), ms(max(w["gap"] for w in runs))]
        cells.append(f"{medians[0] / medians[1]:.1f}x")
        print(f"| {what} | " + " | ".join(cells) + " |")

    line("start-up (the first read)", "start")
    counts = " and ".join(str(len(results[k]["month"])) for k in ("before", "after"))
    line(f"a pass reading the month's days ({counts} passes)", "month")
    line(f"a pass after ({len(after['steady'])} passes)", "steady")
    line("an admin's first api/showback after a pass", "admin_request")
    line("a member's", "member_request")
    walls = {k: v["start"]["wall"] for k, v in results.items()}
    print(f"(start-up wall time: before {walls['before']:.1f} s, after {walls['after']:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[112_000, 657_000])
    parser.add_argument("--against", help="the revision to compare with (before)")
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.measure:
        serving = [sys.executable, __file__, "--serve", args.measure]
        with subprocess.Popen(serving, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as standin:
            url = f"http://127.0.0.1:{int(standin.stdout.readline())}"
            out = asyncio.run(measure(args.measure, args.passes, url))
            standin.stdin.close()
        print(json.dumps(out))
        return
    if not args.against:
        parser.error("--against: the revision to compare with, such as main")
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.against], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        for i, rows in enumerate(args.rows):
            url = fill(Path(tmp) / f"usage-{rows}.sqlite", rows, NOW)
            order = [("before", before), ("after", ROOT)]
            results = {
                label: run(tree, url, args.passes) for label, tree in order[:: 1 - 2 * (i % 2)]
            }
            report(rows, results)


if __name__ == "__main__":
    main()
