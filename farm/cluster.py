"""Getting workers: connect to a Ray cluster (or start one here), size the worker pool, launch RenderWorkers.

One worker per GPU (`num_gpus=1`; Ray sets CUDA_VISIBLE_DEVICES, so each sees `cuda:0`). A cluster with
no GPUs gets CPU workers instead, for the demo.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray._common.utils import get_default_system_temp_dir  # where Ray puts its sessions: no public API
from ray._private import ray_constants  # whether a node may join others: no public API
from ray._private import worker as ray_worker  # its log printer: there is no public hook for it

try:  # Ray's token lookup; there is no public API for it
    from ray._private.authentication import authentication_token_setup
except ImportError:  # a Ray without token authentication
    authentication_token_setup = None

from farm import memory as farm_memory
from farm import terminal
from farm.errors import ClusterError
from farm.job import ModelSpec
from farm.memory import CLASS_SLIVER
from farm.scheduler import Capacity, Launch
from worker.actor import PipelineFactory, RenderWorker


@dataclass(frozen=True)
class Connection:
    owned: bool  # this process started the cluster (or the connection) and shuts it down
    dashboard_url: str | None
    reaper: subprocess.Popen | None = None  # farm.reaper, watching over a cluster this process started
    temp_dir: Path | None = None  # the embedded cluster's processes' $TMPDIR, removed with the cluster


@dataclass(frozen=True)
class WorkerPlan:
    count: int
    num_gpus: int  # 1 per GPU worker, 0 for CPU workers
    num_cpus: float
    accelerator_type: str | None
    # GPU memory classes (farm.memory) the workers go to, smallest first, each with its GPUs; empty: any GPU
    classes: tuple[tuple[str, int], ...] = ()

    def class_of(self, slot: int) -> str | None:
        """The memory class of a slot's worker: the smallest classes' GPUs fill first."""
        order = [name for name, gpus in self.classes for _ in range(gpus)]
        return order[slot % len(order)] if order else None


def connect(address: str | None) -> Connection:
    """Joins the cluster at `address` (or $RAY_ADDRESS, which `ray job submit` sets), else starts an embedded
    one with the dashboard on 127.0.0.1. A process that is already connected (tests, a notebook) keeps it.

    # Raises: ClusterError when no cluster answers at `address`.
    """
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        _check_reachable(address)
    if ray.is_initialized():
        return Connection(owned=False, dashboard_url=None)
    token = address is not None and _use_token_auth()
    temp_dir = None
    try:
        if address:
            context = ray.init(address=address)
        else:
            # Ray ends its processes with SIGKILL, so what they make in $TMPDIR stays behind (the dashboard's
            # multiprocessing folder, `pymp-*`, at every shutdown; a killed worker's encode scratch): the
            # cluster gets a folder of its own, removed with it.
            temp_dir = Path(tempfile.mkdtemp(prefix="farm-"))
            # Ray keeps its sessions (logs, sockets) where they would go without it: Ray reads $TMPDIR for them.
            # The cluster is this machine's alone, so every port it opens (the metrics port, which answers anyone
            # without authentication, the GCS, the raylet) listens on loopback only (`_loopback_only`).
            with _environment(TMPDIR=str(temp_dir), RAY_TMPDIR=get_default_system_temp_dir(),
                              **{ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0"}), _loopback_only():
                # "local": a new cluster even when one started by `ray start` runs on this machine (plain
                # ray.init() would join the newest of those instead).
                context = ray.init(address="local", include_dashboard=True, dashboard_host="127.0.0.1")
    except BaseException as err:  # Ctrl-C while Ray starts too
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        if not isinstance(err, (ConnectionError, RuntimeError, ValueError)):
            raise
        hint = "" if token or not address else (
            "; if the cluster uses token authentication (Ray's default), this machine has no token: copy the "
            "head's ~/.ray/auth_token to ~/.ray/auth_token here, or set RAY_AUTH_TOKEN")
        raise ClusterError(f"cannot connect to Ray at {address or 'a new local cluster'}: {err}{hint}") from err
    _forward_worker_logs_only()
    url = context.dashboard_url
    reaper = None if address or not Path("/proc").is_dir() else subprocess.Popen(
        [sys.executable, "-m", "farm.reaper", str(os.getpid()), str(temp_dir)], start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Connection(owned=True, dashboard_url=f"http://{url}" if url else None, reaper=reaper, temp_dir=temp_dir)


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray starts a cluster on 127.0.0.1 when it runs as a single machine's (its rule on macOS and Windows:
    `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`): the node's address is then loopback, and its metrics agent binds
    there instead of on every interface. Ray reads that variable once, at import, so the driver's copy is set
    meanwhile too; the processes it starts read the variable itself."""
    previous = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = previous


@contextlib.contextmanager
def _environment(**changes: str) -> Iterator[None]:
    """os.environ with `changes` meanwhile: what the processes started meanwhile inherit."""
    previous = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def join(address: str | None) -> Connection | None:
    """The connection to a cluster other drivers may join: the one at `address` or $RAY_ADDRESS, or the one this
    process is connected to; None when the run would start a cluster of its own (no other driver shares it).

    # Raises: ClusterError when no cluster answers at `address`.
    """
    if address or os.environ.get("RAY_ADDRESS") or ray.is_initialized():
        return connect(address)
    return None


def _use_token_auth() -> bool:
    """Whether this driver authenticates with a token. Ray turns token auth on by itself only for
    `address=auto`; for HOST:PORT it needs RAY_AUTH_MODE=token, and without it joining a cluster that uses
    tokens failed after ~20 s of InvalidAuthToken warnings. Ray's own rule (a token in RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, and RAY_AUTH_MODE unset) decides."""
    if authentication_token_setup is None:
        return False
    return authentication_token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _forward_worker_logs_only() -> None:
    """Ray prints in the driver what every node sends it: its workers' log lines (a job's traceback is the
    user's to see) and its raylets' (their stderr, and notices such as a dead raylet's last log lines, pages of
    `[state-dump]`). The raylets' are dropped: a lost node is the run's one `node_lost` line, and a worker's
    death reaches the events log as its job's error. Both kinds pass through one printer, wrapped here once, which
    also shows a worker's lines through `terminal.escape`."""
    printer = ray_worker.print_worker_logs
    if getattr(printer, "drops_raylet_lines", False):
        return

    def print_worker_logs(data: dict, print_file: Any, ignore_prefix: bool = False) -> None:
        if data.get("pid") != "raylet":  # a worker's lines may quote a prompt: shown as the farm's own lines are
            printer({**data, "lines": [terminal.escape(line) for line in data.get("lines", [])]}, print_file,
                    ignore_prefix)

    print_worker_logs.drops_raylet_lines = True
    ray_worker.print_worker_logs = print_worker_logs


def _check_reachable(address: str) -> None:
    """Fails fast on a GCS address nobody listens on: ray.init would retry it for many minutes."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # `auto`, `ray://` and dashboard URLs are resolved by Ray itself
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as err:
        raise ClusterError(f"no Ray cluster answers at {address} ({err.strerror or err}); "
                           "start one with `ray start --head`, or check --address") from err


def disconnect(connection: Connection) -> None:
    if connection.owned:
        ray.shutdown()
    if connection.reaper is not None:  # the cluster is down: nothing is left for it to end
        connection.reaper.terminate()
        connection.reaper.wait()
    if connection.temp_dir is not None:
        shutil.rmtree(connection.temp_dir, ignore_errors=True)


def _gpus(accelerator_type: str | None, classes: tuple[tuple[str, int], ...] = ()) -> int:
    """GPUs on alive nodes, only those of `accelerator_type` when given (Ray's `accelerator_type:<T>` resource) and
    of one of the memory `classes` when given (farm.memory)."""
    total = 0
    for node in ray.nodes():
        resources = node.get("Resources", {})
        if not node.get("Alive") or (accelerator_type and f"accelerator_type:{accelerator_type}" not in resources):
            continue
        if not classes or any(name in resources for name, _ in classes):
            total += int(resources.get("GPU", 0))
    return total


def memory_classes() -> dict[int, int]:
    """The GPU memory classes of the cluster's alive nodes (farm.memory): GiB -> GPUs; empty where none is named."""
    return farm_memory.memory_classes(ray.nodes())


def plan_workers(workers: int | None, accelerator_type: str | None, max_workers: int | None = None, *,
                 jobs: int, classes: dict[str, int] | None = None) -> WorkerPlan:
    """One worker per GPU (at most `workers`); `workers` CPU workers (default 1) on a cluster without GPUs, each
    with a whole CPU at least. With `max_workers`, GPU workers for min(`jobs`, `max_workers`) whatever GPUs the
    cluster has now: the workers still waiting for a GPU are the demand Ray's autoscaler adds nodes for. Never
    more workers than `jobs` (more would render nothing), and a count the cluster cannot hold is refused here,
    before the driver makes a slot for any. `classes`: the GPU memory classes whose GPUs hold the manifest's jobs
    (`farm.memory.eligible_classes`); only their GPUs count and workers go only there.

    # Raises: ClusterError when asked for a GPU type, GPU count or CPU count the cluster does not have.
    """
    placed = tuple((classes or {}).items())
    if max_workers:
        return WorkerPlan(min(jobs, max_workers), 1, 1, accelerator_type, placed)
    gpus = _gpus(accelerator_type, placed)
    if accelerator_type and not gpus:
        raise ClusterError(f"no {accelerator_type} GPUs in the cluster (--accelerator-type {accelerator_type})")
    if gpus:
        if workers and workers > gpus:
            raise ClusterError(f"--workers {workers:,} asks for more GPU workers than the cluster's {gpus} GPUs")
        return WorkerPlan(min(workers or gpus, jobs), 1, 1, accelerator_type, placed)
    cores = int(ray.cluster_resources().get("CPU", 1))
    if workers and workers > max(cores, 1):
        raise ClusterError(f"--workers {workers:,} asks for more CPU workers than the cluster's {cores} CPUs (each "
                           f"takes one CPU at least); use --workers {max(cores, 1)} or fewer")
    count = min(workers or 1, jobs)
    # CPU workers split the cores, so torch's threads in one worker do not fight another's.
    return WorkerPlan(count, 0, max(1, cores // count), None)


def capacity(plan: WorkerPlan, workers: int | None, max_workers: int | None) -> Capacity | None:
    """The cluster's GPUs of the plan's type, counted again as nodes join mid-run, so the pool grows with them;
    None (a fixed pool) for CPU workers and when `workers` or `max_workers` sizes the pool."""
    if not plan.num_gpus or workers or max_workers:
        return None
    return functools.partial(_gpus, plan.accelerator_type, plan.classes)


def launcher(plan: WorkerPlan, model: ModelSpec, factory: PipelineFactory, origin: dict) -> Launch:
    """A function that starts one RenderWorker for a slot."""
    options: dict[str, Any] = {
        "num_gpus": plan.num_gpus, "num_cpus": plan.num_cpus,
        # The driver replaces dead workers and retries jobs itself (it must pick a different worker and
        # count init failures), so Ray restarts and retries nothing.
        "max_restarts": 0, "max_task_retries": 0,
        # Two threads: a job's publish (CPU: encode, hash, fsync) runs beside the next job's render (GPU).
        "max_concurrency": 2,
    }
    if plan.accelerator_type:
        options["accelerator_type"] = plan.accelerator_type
    actor_class = ray.remote(RenderWorker)

    def launch(slot: int) -> Any:
        memory_class = plan.class_of(slot)  # a sliver of it, as `accelerator_type` asks of its resource
        placed = options if memory_class is None else {**options, "resources": {memory_class: CLASS_SLIVER}}
        return actor_class.options(**placed).remote(model, factory, origin, slot)

    return launch
