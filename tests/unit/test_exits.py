"""The exit of a server's container as its pod reports it, and what the spawn says (pure)."""

from __future__ import annotations

from jupyterhub_gpu.core.exits import (
    LINE_CHARS,
    LOG_CHARS,
    ContainerExit,
    container_exit,
    exit_html,
    exit_message,
    log_tail,
)


def pod(status: dict, deleting: bool = False) -> dict:
    meta = {"name": "jupyter-ann", "namespace": "jhub"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "notebook"}, {"name": "sidecar"}]},
        "status": {"phase": "Running", "containerStatuses": [status]},
    }


def test_an_exited_container_is_read_from_its_state_or_its_last_state():
    terminated = {"exitCode": 1, "reason": "Error", "message": "boom\n"}
    exited = container_exit(pod({"name": "notebook", "state": {"terminated": terminated}}))
    assert exited == ContainerExit(1, "Error", "boom\n", restarted=False)
    # restarted after the exit (restartPolicy OnFailure): waiting in CrashLoopBackOff
    crashing = {
        "name": "notebook",
        "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
    }
    assert container_exit(pod(crashing)) == ContainerExit(137, "OOMKilled", None, restarted=True)


def test_a_running_or_waiting_container_or_a_pod_being_deleted_has_not_exited():
    assert container_exit(None) is None
    assert container_exit(pod({"name": "notebook", "state": {"running": {}}})) is None
    creating = {"name": "notebook", "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert container_exit(pod(creating)) is None
    stopped = {"name": "notebook", "state": {"terminated": {"exitCode": 143}}}
    assert container_exit(pod(stopped, deleting=True)) is None
    # another container's exit is not the server's
    sidecar = {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}}
    assert container_exit(pod(sidecar)) is None


def test_the_log_tail_is_plain_bounded_and_keeps_the_end():
    text = "\x1b[31mred\x1b[0m\r\n\n  \nbell\x07 and \x00nul\n" + "x" * 1000 + "\nlast"
    lines = log_tail(text)
    assert lines == ["red", "bell and nul", "x" * (LINE_CHARS - 1) + "…", "last"]
    many = "\n".join(f"line {i}" for i in range(100))
    assert log_tail(many) == [f"line {i}" for i in range(80, 100)]
    wide = "\n".join("y" * 250 + str(i) for i in range(20))
    kept = log_tail(wide)
    assert sum(len(line) + 1 for line in kept) <= LOG_CHARS
    assert kept[-1].endswith("19")


def test_the_message_names_the_code_the_reason_and_the_log():
    exited = ContainerExit(1, "Error", None)
    fix = "Fix what its log shows, or tell an admin if the image is at fault, then start it again."
    assert exit_message(exited, ["Traceback", "ValueError: <bad>"]) == (
        f"The server's process exited with code 1 at start. {fix} Last lines of its log:\n"
        "Traceback\nValueError: <bad>"
    )
    assert exit_message(ContainerExit(137, "OOMKilled", None), []) == (
        "The server's process exited with code 137 (OOMKilled) at start. "
        "It ran out of memory: choose a profile with more memory. "
        "It wrote nothing to its log."
    )
    assert exit_message(exited, [], "the API server answered 403: forbidden") == (
        f"The server's process exited with code 1 at start. {fix} "
        "Its log could not be read: the API server answered 403: forbidden."
    )
    assert "must keep running" in exit_message(ContainerExit(0, "Completed", None), ["done"])
    # the page's form escapes the log: it is the server's to write
    page = exit_html(exited, ["<script>alert(1)</script>"])
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;</pre>" in page
