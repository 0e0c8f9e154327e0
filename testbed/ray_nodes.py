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
START_WAIT = 180.0  # seconds for `ray start` to say its node has started, or to fail
STARTS = 3


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

    def start_autoscaling_head(self, *, gpus_per_node: int, max_nodes: int, idle_timeout_s: float) -> Node:
        """A head whose autoscaler launches worker nodes of `gpus_per_node` logical GPUs (and as many CPUs), up to
        `max_nodes`, on Ray's fake multi-node provider (each node a raylet on this machine), and removes a node
        idle for `idle_timeout_s`. No worker node runs at first."""
        self.port = free_port()
        config = {
            "cluster_name": "farm-test", "max_workers": max_nodes, "upscaling_speed": 1.0,
            "idle_timeout_minutes": idle_timeout_s / 60,
            "provider": {"type": "fake_multinode", "gcs_address": self.address, "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True},
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
                "gpu_node": {"resources": {"CPU": gpus_per_node, "GPU": gpus_per_node}, "node_config": {},
                             "min_workers": 0, "max_workers": max_nodes},
            },
            "head_node_type": "ray.head.default", "auth": {}, "docker": {}, "file_mounts": {},
            **{key: [] for key in ("initialization_commands", "setup_commands", "head_setup_commands",
                                   "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
                                   "cluster_synced_files", "rsync_exclude", "rsync_filter")},
        }
        path = self.root / "autoscaler.json"
        path.write_text(json.dumps(config))
        # RAY_FAKE_CLUSTER: the provider refuses to run without it; the autoscaler looks every second.
        return self._start("head", ["--head", f"--port={self.port}", "--num-cpus=0", "--num-gpus=0",
                                    "--include-dashboard=false", f"--ray-client-server-port={free_port()}",
                                    f"--autoscaling-config={path}"],
                           {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"})

    def add_node(self, name: str, *, gpus: int, cpus: int, resources: dict | None = None) -> Node:
        """A worker node with `gpus` logical GPUs, a `node_tag_<name>` resource and `resources`."""
        return self._start(name, [f"--address={self.address}", f"--num-gpus={gpus}", f"--num-cpus={cpus}",
                                  f"--resources={json.dumps({f'node_tag_{name}': 1, **(resources or {})})}",
                                  f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}"])

    def _start(self, name: str, args: list[str], env: dict | None = None) -> Node:
        """`ray start --block` with `args`; a start that fails is tried again, up to STARTS times: `ray start` gives
        its node a fixed 30 s to register with the GCS, which a loaded machine can miss."""
        for attempt in range(1, STARTS + 1):
            temp_dir, log = self.root / f"{name}.{attempt}", self.root / f"{name}.{attempt}.log"
            # Ports every node would otherwise take at the same fixed number on this one host: 0 picks free ones.
            common = [f"--temp-dir={temp_dir}", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                      "--dashboard-agent-listen-port=0", "--metrics-export-port=0"]
            with open(log, "w") as out:
                process = subprocess.Popen([str(VENV_BIN / "ray"), "start", "--block", *args, *common],
                                           env={**self.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
            node = Node(name, process, temp_dir, log)
            self.nodes.append(node)
            if _started(node):
                return node
            _kill_group(process.pid)
        raise RuntimeError(f"node {name} did not start in {STARTS} tries:\n{node.log.read_text()[-3000:]}")

    def watch_nodes(self) -> Path:
        """Starts `watch` on this cluster (killed with it); returns the file it writes."""
        out = self.root / "nodes.jsonl"
        out.touch()
        with open(self.root / "watch.log", "w") as log:  # why a watcher wrote nothing, for a failing test to show
            subprocess.Popen([sys.executable, "-m", "testbed.ray_nodes", self.address, str(out)], env=self.env,
                             cwd=Path(__file__).parents[1], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        return out

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


def _started(node: Node) -> bool:
    """Whether `ray start` said its node registered with the cluster (True) or ended without (False)."""
    deadline = time.monotonic() + START_WAIT
    while "Ray runtime started" not in node.log.read_text():
        if node.process.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {node.name} neither started nor failed in {START_WAIT:g}s:\n"
                               f"{node.log.read_text()[-3000:]}")
        time.sleep(0.1)
    return True


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


def watch(address: str, out: Path) -> None:
    """Appends a JSON line to `out` each time the cluster's alive GPU nodes change ({"t", "nodes", "gpus"}), until
    killed: the nodes of a cluster over time, for a test to wait on and a benchmark to print."""
    import ray

    ray.init(address=address, log_to_driver=False)
    last = None
    with open(out, "a", buffering=1) as log:
        while True:
            gpus = [int(node["Resources"]["GPU"]) for node in ray.nodes()
                    if node["Alive"] and node["Resources"].get("GPU")]
            if (len(gpus), sum(gpus)) != last:
                last = len(gpus), sum(gpus)
                log.write(json.dumps({"t": time.time(), "nodes": last[0], "gpus": last[1]}) + "\n")
            time.sleep(0.5)  # a sample rate, not a wait for anything


if __name__ == "__main__":
    watch(sys.argv[1], Path(sys.argv[2]))
