"""What a `farm submit` child left on this machine, read from /proc: its process tree and the sockets it listens on."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from farm import reaper


def tree(pid: int) -> dict[int, int]:
    """pid -> start time of `pid`'s descendants now."""
    return reaper.descendants(reaper.processes(), pid)


def still_running(known: dict[int, int]) -> list[str]:
    """The command lines of the processes of `known` (pid -> start time) that are still the same processes."""
    table = reaper.processes()
    alive = []
    for pid, start in known.items():
        if table.get(pid, (0, None))[1] == start:
            try:
                alive.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
            except OSError:  # ended meanwhile
                continue
    return alive


def kill(known: dict[int, int]) -> None:
    """SIGKILLs the processes of `known` that are still the same processes (a test's clean-up, pass or fail)."""
    table = reaper.processes()
    for pid, start in known.items():
        if table.get(pid, (0, None))[1] == start:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def listening(pids) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the processes `pids` listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        except OSError:  # ended meanwhile
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                found.append((str(_address(address)), int(port, 16)))
    return found


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net's hex address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback
