"""One `farm submit`: take the manifest's lock (on a cluster other drivers may join) and its lease, skip what is
done, get workers, run the scheduler, leave state and a summary on storage.

Records under `<output.root>/.farm/<manifest name>/`: `lease.json` (the running driver, `farm.lease`),
`state.json` (every job's state, for `farm status` and `farm retry`), `events.jsonl` (every run's events)
and `runs/<run id>.json` (one run's summary).
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from farm import claims, cluster, cluster_lock, lease, memory, storage
from farm.errors import StorageFault
from farm.events import RunLog
from farm.job import JobState
from farm.manifest import Manifest
from farm.metrics import RunMetrics
from farm.scheduler import Outcome, Scheduler, Settings
from worker.actor import PipelineFactory, cosmos3_factory

STATE_FORMAT = 1


@dataclass
class SubmitOptions:
    address: str | None = None  # an existing cluster; None starts an embedded one
    workers: int | None = None  # CPU workers without GPUs; at most this many GPU workers with them
    max_workers: int | None = None  # autoscaling: GPU workers for min(jobs, this); idle ones stop once none is queued
    accelerator_type: str | None = None  # e.g. B200: only GPUs of this type
    force: bool = False  # render jobs that are already done
    only: frozenset[str] | None = None  # job keys to consider (`farm retry`); None = all
    factory: PipelineFactory = cosmos3_factory
    init_failure_budget: int | None = None  # None: one failed start per worker
    start_timeout: float = 900.0
    progress: bool = True
    wait: bool = False  # another driver renders this manifest: wait for it to end instead of refusing


@dataclass
class RunReport:
    run_id: str
    manifest: Manifest
    outcomes: dict[str, Outcome]  # the jobs this run rendered or tried
    skipped: list[str]  # already done before the run
    interrupted: bool = False
    dashboard_url: str | None = None
    summary_path: str | None = None
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # what ended the run early: its lease lost, its output root gone

    @property
    def ok(self) -> bool:
        return not self.error and not self.interrupted and all(o.state is JobState.DONE for o in self.outcomes.values())


def submit(manifest: Manifest, options: SubmitOptions) -> RunReport:
    """Renders every job of `manifest` that is not done yet; the records are written however it ends.

    # Raises: StorageFault (the root cannot be written), LeaseHeld (another driver renders this manifest: its
    # storage lease, or on a shared cluster its Ray lock, is held), ClaimConflict (another manifest uses this name in
    # this root, or writes one of its files), ClusterError (no cluster, no GPUs of the type).
    """
    started = time.monotonic()
    report = RunReport(storage.new_run_id(), manifest, {}, [])
    storage.prepare_root(manifest.output_root)
    with contextlib.ExitStack() as stack:
        # On a cluster other drivers may join, Ray's lock comes first: a driver it refuses has written no record
        # and left the storage lease alone (its holder may be alive, only slow to touch it).
        shared = cluster.join(options.address)
        if shared is not None:
            stack.callback(cluster.disconnect, shared)
            stack.callback(_take_cluster_lock(manifest, report, options.wait).release)
        stack.callback(_take_lease(manifest, report, options.wait).release)
        claims.claim(manifest)
        jobs = [job for job in manifest.jobs if options.only is None or job.key in options.only]
        report.skipped = [] if options.force else [job.key for job in jobs if storage.is_done(job)]
        skipped = set(report.skipped)
        todo = [job for job in jobs if job.key not in skipped]
        report.outcomes = {job.key: Outcome(JobState.PENDING) for job in todo}
        try:
            if todo:
                _render(manifest, todo, options, report, shared)
        except KeyboardInterrupt:  # before the run loop (connecting, sizing the pool); the loop handles its own
            report.interrupted = True
        finally:
            report.seconds = time.monotonic() - started
            _record(report)
    return report


def _take_lease(manifest: Manifest, report: RunReport, wait: bool) -> lease.Lease:
    """The manifest's lease, kept fresh while the run lasts; losing it (the root deleted, a takeover) stops the
    run (KeyboardInterrupt in the main thread) with `report.error` saying why."""
    path = _lease_path(manifest)
    owner = lease.Owner.this_process(report.run_id, manifest.path)
    log = structlog.get_logger("farm")
    held = lease.acquire(path, owner, wait=wait,
                         on_wait=lambda holder, why: log.info("lease held", holder=holder.describe(), why=why))
    held.keep(functools.partial(_stop_run, report))
    return held


def _stop_run(report: RunReport, reason: str) -> None:
    """Stops the run from a watch thread (KeyboardInterrupt in the main thread), `report.error` saying why."""
    report.error = f"run stopped: {reason}"
    _thread.interrupt_main()


def _take_cluster_lock(manifest: Manifest, report: RunReport, wait: bool) -> cluster_lock.Held:
    """The manifest's lock on the connected cluster (`farm.cluster_lock`), held while Ray counts this driver alive;
    losing it stops the run as losing the lease does."""
    log = structlog.get_logger("farm")
    owner = lease.Owner.this_process(report.run_id, manifest.path)
    held = cluster_lock.acquire(
        _lease_path(manifest), manifest.output_root, manifest.name, owner, wait=wait,
        on_wait=lambda holder, why: log.info("cluster lock held", holder=holder.describe(), why=why))
    held.keep(functools.partial(_stop_run, report))
    return held


def _lease_path(manifest: Manifest) -> Path:
    return storage.records_dir(manifest.output_root, manifest.name) / lease.LEASE_FILE


def _render(manifest: Manifest, todo: list, options: SubmitOptions, report: RunReport,
            shared: cluster.Connection | None) -> None:
    storage.discard_temps(*todo)  # left by a run that crashed mid-write
    _write_state(report, "running")
    connection = shared or cluster.connect(options.address)
    # `ray job stop` and batch schedulers send SIGTERM: end as cleanly as Ctrl-C does. Installed after
    # connecting, because ray.init installs its own SIGTERM handler, which aborts the process.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    report.dashboard_url = connection.dashboard_url
    if connection.dashboard_url:
        structlog.get_logger("farm").info("dashboard", url=connection.dashboard_url)
    log = RunLog(storage.events_path(manifest.output_root, manifest.name), report.run_id, len(todo),
                 progress=options.progress)
    try:
        # Planned before a worker starts: a job no GPU memory class of the cluster holds is refused here, workers go
        # only where their manifest's largest job fits, and each checks its own GPU before it loads anything.
        least = memory.plan_manifest(manifest, gpu_memory=0)
        classes = cluster.memory_classes()
        eligible = memory.eligible_classes(least, classes) if classes else None
        model = memory.with_plan(manifest, least).model
        plan = cluster.plan_workers(options.workers, options.accelerator_type, options.max_workers, jobs=len(todo),
                                    classes=eligible)
        origin = {"run": report.run_id, "path": manifest.path, "sha256": manifest.sha256, "name": manifest.name,
                  "root": manifest.output_root}
        settings = Settings(options.init_failure_budget, options.start_timeout,
                            release_idle=options.max_workers is not None)
        log.emit("run_started", manifest=manifest.path, jobs=len(todo), skipped=len(report.skipped),
                 workers=plan.count, gpus_per_worker=plan.num_gpus, accelerator_type=plan.accelerator_type,
                 gpu_memory_need_gib=round(model.memory.need / memory.GIB, 1), gpu_memory_job=model.memory.job,
                 gpu_memory_classes=[name for name, _ in plan.classes])
        scheduler = Scheduler(todo, cluster.launcher(plan, model, options.factory, origin), plan.count,
                              settings, log, RunMetrics(manifest.name, len(todo)),
                              cluster.capacity(plan, options.workers, options.max_workers))
        report.outcomes = scheduler.run()
        report.interrupted = scheduler.interrupted
        log.emit("run_finished", **_counts(report))
        if log.fault:
            report.error = f"run stopped: {log.fault}"
    finally:
        log.close()
        if connection is not shared:
            cluster.disconnect(connection)
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _counts(report: RunReport) -> dict[str, int]:
    states = [o.state for o in report.outcomes.values()]
    return {**{state.value: states.count(state) for state in JobState}, "skipped": len(report.skipped)}


def _result(report: RunReport) -> str:
    if report.error:
        return "failed"
    if report.interrupted:
        return "interrupted"
    return "complete" if report.ok else "incomplete"


def _record(report: RunReport) -> None:
    manifest = report.manifest
    report.counts = _counts(report)
    if not Path(manifest.output_root).is_dir():  # writing records would bring it back, empty
        report.error = f"output root {manifest.output_root} vanished during the run; no records were written"
        return
    path = storage.summary_path(manifest.output_root, manifest.name, report.run_id)
    unwritten = []
    try:
        storage.write_json(path, {
            "run": report.run_id, "result": _result(report), "seconds": round(report.seconds, 3),
            "manifest": {"path": manifest.path, "sha256": manifest.sha256, "name": manifest.name},
            "counts": report.counts, "skipped": report.skipped,
            "jobs": report.outcomes,
        })
        report.summary_path = str(path)
    except StorageFault as err:
        unwritten.append(f"the run summary ({err})")
    try:  # the state matters most (status, retry): tried even when the summary could not be written
        _write_state(report, _result(report))
    except StorageFault as err:
        unwritten.append(f"the state ({err}); farm status may call this run's driver gone")
    if unwritten:
        report.error = "; ".join([*filter(None, [report.error]), *(f"not recorded: {u}" for u in unwritten)])


def _write_state(report: RunReport, result: str) -> None:
    """Every job of the manifest with its state; jobs outside this run keep what the last state said."""
    manifest = report.manifest
    path = storage.state_path(manifest.output_root, manifest.name)
    previous = (storage.read_state(manifest.output_root, manifest.name) or {}).get("jobs", {})
    skipped = set(report.skipped)
    jobs = {}
    for job in manifest.jobs:
        entry = {"media": job.media, "files": list(job.files), "config_hash": job.config_hash,
                 "state": JobState.PENDING, "attempts": 0, "error": None}
        old = previous.get(job.key, {})
        if old.get("config_hash") == job.config_hash:
            entry.update({k: old[k] for k in ("state", "attempts", "error") if k in old})
        if job.key in skipped:
            entry.update(state=JobState.DONE, attempts=0, error=None)
        elif job.key in report.outcomes:
            outcome = report.outcomes[job.key]
            entry.update(state=outcome.state, attempts=outcome.attempts, error=outcome.error)
        jobs[job.key] = entry
    storage.write_json(path, {
        "format": STATE_FORMAT, "manifest": {"path": manifest.path, "sha256": manifest.sha256, "name": manifest.name},
        "run": report.run_id, "result": result, "updated": time.time(), "jobs": jobs,
    })
