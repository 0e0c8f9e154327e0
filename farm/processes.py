"""The processes of this host, as the lease (a driver's liveness) and the worker (its encoders' scratch folders) see
them: a leaf of the driver/worker contract."""

from __future__ import annotations

import os


def identity(pid: int) -> str:
    """Which process `pid` of this host is: its host's boot and its start, in clock ticks after that boot
    (`/proc/sys/kernel/random/boot_id`, field 22 of `/proc/PID/stat`), so a later process that reuses the pid (a
    restarted container numbers its processes from 1 again) is another one; free of wall-clock steps. "" where
    /proc does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot, open(f"/proc/{pid}/stat") as stat:
            # the command's name, in parentheses, may hold spaces: count fields after its last ")"
            return f"{boot.read().strip()}:{stat.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return ""


def is_running(pid: int, known_as: str) -> bool:
    """Whether the process `pid` of this host that was `known_as` (`identity`; "" unknown: the pid alone) runs."""
    return pid_alive(pid) and (not known_as or identity(pid) in ("", known_as))


def pid_alive(pid: int) -> bool:
    """Whether a process of this host exists (signal 0 only checks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True
