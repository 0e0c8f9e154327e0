"""Ends an embedded Ray cluster's processes when its driver dies without shutting it down (SIGKILL, OOM killer).

Ray fate-shares the head's processes with the driver that started them, but the agents its raylet starts
(ray::DashboardAgent, ray::RuntimeEnvAgent) outlive a SIGKILLed driver. So `farm submit` starting a cluster
of its own also starts this watcher, `python -m farm.reaper DRIVER_PID`, in a session of its own (Ctrl-C in
the terminal does not reach it). Each second it notes the driver's descendants from /proc; once the driver is
gone it SIGKILLs those still running, each checked to be the same process (pid and start time), and removes
the cluster's temp folder when given one (`python -m farm.reaper DRIVER_PID TEMP_DIR`). The driver
stops the watcher (SIGTERM) when it shuts its cluster down itself. The driver also ends a start cut short by an
interrupt itself, at once (`end_descendants`). Linux only (/proc); elsewhere it is not started.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

EVERY = 1.0  # seconds between looks at the process table
GONE = 10.0  # seconds `end_descendants` waits for processes it SIGKILLed to be gone


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time in clock ticks) of every process this user can see."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (command) ": state, ppid, ... starttime
        table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(table: dict[int, tuple[int, int]], root: int) -> dict[int, int]:
    """pid -> start time of every process below `root`."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1]
        todo += children.get(pid, [])
    return found


def watch(driver: int) -> list[int]:
    """Waits for `driver` to end, then kills the descendants it had; returns their pids."""
    started = processes()[driver][1]
    known: dict[int, int] = {}
    while (table := processes()).get(driver, (0, None))[1] == started:
        known.update(descendants(table, driver))
        known.pop(os.getpid(), None)
        time.sleep(EVERY)
    return _signal(known, signal.SIGKILL)


def end_descendants(root: int, spare: set[int]) -> list[int]:
    """Ends every process below `root` but those of `spare` and theirs, while `root` lives (a driver whose cluster's
    start was interrupted): each is stopped (SIGSTOP: a stopped process starts no other, so the raylet cannot
    start an agent behind this back), looking again until no new one appears; then all are killed (SIGKILL)
    together, and this waits until they are gone (at most GONE seconds). Returns their pids."""
    stopped: dict[int, int] = {}
    while True:
        table = processes()
        spared = set(spare).union(*(descendants(table, pid) for pid in spare))
        new = {pid: start for pid, start in descendants(table, root).items() if pid not in spared | stopped.keys()}
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        stopped.update(new)
    _signal(stopped, signal.SIGKILL)
    deadline = time.monotonic() + GONE
    while any(_running(pid, start) for pid, start in stopped.items()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return list(stopped)


def _signal(known: dict[int, int], signum: int) -> list[int]:
    """Sends `signum` to each process of `known` (pid -> start time) that is still that process; returns their pids."""
    table = processes()
    sent = [pid for pid, start in known.items() if table.get(pid, (0, None))[1] == start]
    for pid in sent:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    return sent


def _running(pid: int, start: int) -> bool:
    """Whether `pid` is still the process that started at `start` and has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] != "Z" and int(fields[19]) == start


if __name__ == "__main__":
    watch(int(sys.argv[1]))
    if len(sys.argv) > 2:  # the cluster's $TMPDIR, which its killed processes can no longer write to
        shutil.rmtree(sys.argv[2], ignore_errors=True)
