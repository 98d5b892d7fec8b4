"""Which addresses a set of processes listens on, read from /proc (Linux).

The local cluster's rule is absolute: loopback only. This lets a test (or an
admin) check it for every process a cluster or hub started, their children
included.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

_LISTEN = "0A"


def descendants(pids: list[int]) -> set[int]:
    """The given pids and every process below them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _decode(hex_addr: str, family: int) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if family == socket.AF_INET:
        addr = socket.inet_ntop(family, struct.pack("<I", int.from_bytes(raw, "big")))
    else:
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        addr = socket.inet_ntop(family, b"".join(words))
    return f"{addr}:{int(port, 16)}"


def listening_addresses(pids: list[int]) -> dict[int, list[str]]:
    """pid -> the TCP addresses it listens on, for the pids and their descendants."""
    owners: dict[str, int] = {}
    for pid in descendants(pids):
        for inode in _socket_inodes(pid):
            owners[inode] = pid
    result: dict[int, list[str]] = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != _LISTEN or fields[9] not in owners:
                continue
            result.setdefault(owners[fields[9]], []).append(_decode(fields[1], family))
    return result


def listening_hosts() -> set[str]:
    """Every IPv4 address some process on this machine listens on."""
    hosts = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return hosts
    for line in lines:
        fields = line.split()
        if fields[3] == _LISTEN:
            hosts.add(_decode(fields[1], socket.AF_INET).rsplit(":", 1)[0])
    return hosts


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return ipaddress.ip_address(host).is_loopback
