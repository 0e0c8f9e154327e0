"""A Ray cluster of separate `ray start` processes on this machine, started the way docs/farm.md tells users to
start one on several hosts: a token made before the head starts, `RAY_AUTH_MODE=token` and the token on every
node and on the driver.

Several nodes share this host, so each gets its own temp dir (its session, sockets and logs) and its own ports;
each `ray start --block` leads a process group of its own, so one node is killed as a host would die (its raylet
first, `ray start --block` then ends the rest) and the whole cluster is killed by group, never by a name.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
STOP_WAIT = 30.0  # seconds for a killed node's processes to be gone


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    process: subprocess.Popen  # `ray start --block`, leader of the node's process group
    temp_dir: Path
    log: Path

    def raylet(self) -> tuple[int, str]:
        """The pid of this node's raylet and Ray's id of the node (from the raylet's command line)."""
        for pid, cmd in _processes_of(self.process.pid):
            if cmd[:1] and cmd[0].endswith("/raylet"):
                return pid, next(arg.split("=", 1)[1] for arg in cmd if arg.startswith("--node_id="))
        raise AssertionError(f"node {self.name} runs no raylet")

    def node_id(self) -> str:
        return self.raylet()[1]

    def raylet_err(self) -> Path:
        """The raylet's stderr, which Ray forwards to every driver (session_latest: this node's session)."""
        return self.temp_dir / "session_latest" / "logs" / "raylet.err"


class RayNodes:
    """Starts nodes and kills them all in `stop()`, whatever state they are in."""

    def __init__(self):
        # Short: a node's socket paths live under its temp dir and AF_UNIX paths end at 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="farm-ray-", dir="/tmp"))
        # `ray get-auth-token --generate` writes ~/.ray/auth_token; a file of our own keeps the user's untouched.
        self.token = self.root / "auth_token"
        self.token.write_text(secrets.token_hex(32))
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token),
                    "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.env.pop("RAY_ADDRESS", None)
        self.nodes: list[Node] = []
        self.port = 0
        self.dashboard_port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_head(self, *args: str, dashboard: bool = False, env: dict | None = None) -> Node:
        """The head, with no GPUs and no CPUs for renders: the driver's actors never land on it."""
        self.port, self.dashboard_port = free_port(), free_port()
        node = self._start("head", ["--head", f"--port={self.port}", "--num-cpus=0", "--num-gpus=0",
                                    f"--include-dashboard={str(dashboard).lower()}", "--dashboard-host=127.0.0.1",
                                    f"--dashboard-port={self.dashboard_port}",
                                    f"--ray-client-server-port={free_port()}", *args], env)
        return node

    def add_node(self, name: str, *, gpus: int, cpus: int) -> Node:
        """A worker node with `gpus` logical GPUs and a `node_tag_<name>` resource."""
        return self._start(name, [f"--address={self.address}", f"--num-gpus={gpus}", f"--num-cpus={cpus}",
                                  f"--resources={json.dumps({f'node_tag_{name}': 1})}",
                                  f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}"])

    def _start(self, name: str, args: list[str], env: dict | None = None) -> Node:
        temp_dir, log = self.root / name, self.root / f"{name}.log"
        # Ports every node would otherwise take at the same fixed number on this one host: 0 picks a free one.
        common = [f"--temp-dir={temp_dir}", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                  "--dashboard-agent-listen-port=0", "--metrics-export-port=0"]
        with open(log, "w") as out:
            process = subprocess.Popen([str(VENV_BIN / "ray"), "start", "--block", *args, *common],
                                       env={**self.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        node = Node(name, process, temp_dir, log)
        self.nodes.append(node)
        self._wait_started(node)
        return node

    def _wait_started(self, node: Node, seconds: float = 120) -> None:
        """`ray start` prints this once its node has registered with the cluster."""
        deadline = time.monotonic() + seconds
        while "Ray runtime started" not in node.log.read_text():
            if node.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {node.name} did not start:\n{node.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def kill_raylet(self, node: Node) -> str:
        """Kills `node`'s raylet, as a host that dies; returns the node's id."""
        pid, node_id = node.raylet()
        os.kill(pid, signal.SIGKILL)
        return node_id

    def stop(self) -> None:
        """Kills every node's process group and any process started with one of this cluster's temp dirs (a Ray
        worker leaves its parent's group)."""
        for node in self.nodes:
            _kill_group(node.process.pid)
        for node in self.nodes:
            try:
                node.process.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + STOP_WAIT
        while stray := _processes_mentioning(str(self.root)):
            for pid in stray:
                _kill(pid)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of the test cluster outlived it: {stray}")
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _proc_entries() -> list[tuple[int, list[str], int]]:
    """(pid, command line, process group) of every live process."""
    entries = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if fields[0] == "Z":
            continue  # a zombie runs nothing
        entries.append((int(entry.name), [c.decode(errors="replace") for c in cmd if c], int(fields[2])))
    return entries


def _processes_of(pgid: int) -> list[tuple[int, list[str]]]:
    return [(pid, cmd) for pid, cmd, group in _proc_entries() if group == pgid]


def _processes_mentioning(text: str) -> list[int]:
    return [pid for pid, cmd, _ in _proc_entries() if pid != os.getpid() and any(text in arg for arg in cmd)]
