"""A server whose process exited as it started: found in its pod, said in words (pure).

A kubelet reports a container that exited in the pod's status: ``state.terminated``
while it stays exited (``restartPolicy: Never``, or a pod marked ``Failed``), or
``lastState.terminated`` once it was restarted after the exit (KubeSpawner's pods
are ``OnFailure``: the container then waits in ``CrashLoopBackOff``). Either way
the server will not come up by waiting, so its spawn fails at once with the exit
code and the last lines of its log, instead of after ``start_timeout`` or
``http_timeout`` with JupyterHub's generic error.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the container KubeSpawner runs the single-user server in
NOTEBOOK_CONTAINER = "notebook"
#: the log lines a message shows, and the most characters of each and of all
LOG_LINES = 20
LINE_CHARS = 300
LOG_CHARS = 2000

#: terminal colour and cursor sequences, which logs carry and a page cannot show
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.")
#: control characters other than tab (newlines are where lines are split)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class ContainerExit:
    """How a server's container ended, as its pod reports it."""

    exit_code: int | None
    reason: str | None  # "Error", "OOMKilled", "ContainerCannotRun", ...
    #: the kubelet's termination message: with ``terminationMessagePolicy:
    #: FallbackToLogsOnError``, the end of the log of a container that failed
    message: str | None
    #: the container was restarted since (its log of that run is the previous one)
    restarted: bool = False


def container_exit(
    pod: Mapping[str, Any] | None, container: str = NOTEBOOK_CONTAINER
) -> ContainerExit | None:
    """The server container's exit, if its pod reports one; None while it runs or waits
    to start for the first time, and for a pod being deleted (that exit is a stop's)."""
    if not pod or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    # the server's container by its name; a pod shaped otherwise: its first one
    chosen = next((s for s in statuses if s.get("name") == container), None)
    if chosen is None and statuses:
        first = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name")
        chosen = next((s for s in statuses if s.get("name") == first), None)
    if chosen is None:
        return None
    terminated = (chosen.get("state") or {}).get("terminated")
    restarted = False
    if terminated is None:
        terminated = (chosen.get("lastState") or {}).get("terminated")
        restarted = terminated is not None
    if terminated is None:
        return None
    code = terminated.get("exitCode")
    return ContainerExit(
        exit_code=code if isinstance(code, int) else None,
        reason=terminated.get("reason") or None,
        message=terminated.get("message") or None,
        restarted=restarted,
    )


def log_tail(text: str, lines: int = LOG_LINES) -> list[str]:
    """The last ``lines`` non-blank lines of a log, as plain text a page can show:
    terminal sequences and control characters removed, each line and the whole cut to
    a bound (the end is kept: the error is at the end)."""
    cleaned = []
    for raw in text.splitlines():
        line = _CONTROL.sub("", _ANSI.sub("", raw)).rstrip()
        if line.strip():
            cleaned.append(line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…")
    kept = cleaned[-lines:] if lines > 0 else []
    while kept and sum(len(line) + 1 for line in kept) > LOG_CHARS:
        kept.pop(0)
    return kept


def _headline(exited: ContainerExit) -> str:
    code = "an unknown code" if exited.exit_code is None else f"code {exited.exit_code}"
    reason = ""
    if exited.reason and exited.reason not in ("Error", "Completed"):
        reason = f" ({exited.reason})"
    text = f"The server's process exited with {code}{reason} at start."
    if exited.exit_code == 0:
        text += " A server must keep running: check the command it is given."
    elif exited.reason == "OOMKilled":
        text += " It ran out of memory: choose a profile with more memory."
    else:
        text += (
            " Fix what its log shows, or tell an admin if the image is at fault, then start "
            "it again."
        )
    return text


def _no_log(log_error: str | None) -> str:
    if log_error:
        return f" Its log could not be read: {log_error}."
    return " It wrote nothing to its log."


def exit_message(exited: ContainerExit, log: list[str], log_error: str | None = None) -> str:
    """What the REST API and the hub log say about a server that exited at start."""
    if log:
        return _headline(exited) + " Last lines of its log:\n" + "\n".join(log)
    return _headline(exited) + _no_log(log_error)


def exit_html(exited: ContainerExit, log: list[str], log_error: str | None = None) -> str:
    """The same for the spawn page, escaped (a log is the server's to write), its lines
    kept as lines."""
    text = html.escape(_headline(exited))
    if log:
        lines = html.escape("\n".join(log))
        return (
            f"{text} Last lines of its log:"
            f'<pre style="text-align: left; white-space: pre-wrap">{lines}</pre>'
        )
    return text + html.escape(_no_log(log_error))
