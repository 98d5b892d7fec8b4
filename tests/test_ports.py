"""Ports chosen for the servers the local cluster, hubs and tests start: never in the
kernel's ephemeral range (where any process's bind(0) or connection may take them before
our server binds), and never the same for two processes choosing at once."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import textwrap

from jupyterhub_gpu_dev.localcluster import ports


def test_ports_are_outside_the_kernels_ephemeral_range_and_bindable():
    low, high = ports._ephemeral_range()
    chosen = [ports.free_port() for _ in range(20)]
    assert len(set(chosen)) == 20
    for port in chosen:
        assert not low <= port <= high, port
        with socket.socket() as s:  # free for the server it was chosen for
            s.bind(("127.0.0.1", port))
    for port in chosen:
        ports.release(port)


def test_two_processes_choosing_the_same_ports_at_once_never_share_one():
    """Both draw the same sequence of candidates: the second skips what the first holds."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import random, sys
                from jupyterhub_gpu_dev.localcluster import ports
                taken = [ports.free_port(random.Random(7)) for _ in range(5)]
                print(" ".join(map(str, taken)), flush=True)
                sys.stdin.read()  # hold them until told to exit
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = {int(p) for p in holder.stdout.readline().split()}
        assert len(theirs) == 5
        ours = {ports.free_port(random.Random(7)) for _ in range(5)}
        assert not ours & theirs
    finally:
        holder.communicate("")
    for port in ours:
        ports.release(port)
    # once the holder has exited its ports are free to choose again
    again = ports.free_port(random.Random(7))
    assert again in theirs
    ports.release(again)


def test_a_port_some_server_already_listens_on_is_never_chosen():
    rng = random.Random(11)
    first = ports.free_port(random.Random(11))
    ports.release(first)
    with socket.socket() as server:
        server.bind(("127.0.0.1", first))
        server.listen()
        assert ports.free_port(rng) != first
