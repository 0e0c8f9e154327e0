"""The driver loop: a priority queue of jobs, one render in flight per worker, and every failure policy.

State lives in a few named collections (the shape of Ray's ActorPool): `pending` (jobs by priority, then
manifest order), `idle` workers, `inflight` (result ref -> attempt) and `starting` (ready ref -> slot).
The loop waits on all of them with one `ray.wait(num_returns=1)`; it never `ray.get`s anything that is
not already finished.

An attempt has two calls on its worker: `render` (the GPU's work; the worker keeps the output) and then `publish`
(encode, hash, fsync, sidecar). The worker takes its next render as soon as a render returns, so an encode never
holds the GPU; a worker publishes at most one job beside a render, and one with two publishes waiting renders
nothing until one has ended. A job is done when its publish has returned and verifies.

Failure policies:
- a job the model refuses (cosmos3's PipelineError or ConfigError: the user's mistake) fails at once, without
  retries, and does not count against its worker; so does a job with sound when the checkpoint's sound tokenizer
  did not build (SoundTokenizerLoadError: no worker could make its sound), while its silent jobs render, and a job
  whose image or video changed since its config hash took it (InputChanged);
- any other failed attempt is requeued, on a *different* worker while one that has not failed it is alive;
- Ray has no task timeout, so an attempt past its job's timeout gets its worker killed and replaced;
- a worker is retired for the run (a bad GPU) once RETIRE_AFTER different jobs it failed in a row have rendered
  on other workers: only then is the failure shown to be its own, not the jobs'. A job that failed on
  JOB_FAULT_AFTER different workers is the job's fault and fails at once; so bad jobs never retire a worker,
  and a worker with no other to compare with (the last one) is never retired for failed jobs. What is plainly the
  job's own counts against no worker at all: running out of memory for its size (`JobFault`) and its timeout; nor
  do storage faults (ENOSPC, a read-only or vanished root: `StorageFault`);
- a worker that fails to start is started again, until RETIRE_AFTER starts in a row failed, or the run's
  init-failure budget is spent, so one bad GPU neither stops the run nor loops forever. A start can also fail
  after `ready()`: a worker's pipeline builds its VAE in the background, and a build that failed raises
  `WorkerStartError` from the job that needed it. That job goes back to pending as if never dispatched (its
  attempt not counted, no worker avoided) and the worker counts as failed to start; so a start counts as good,
  and its slot's failed starts in a row go back to 0, only once the worker has finished a job;
- a worker killed or restarted for one attempt's sake (its timeout, its crash, its failed start) takes the other
  attempt it held with it: that one goes back to pending as if never dispatched, its half-written files removed;
- Ctrl-C kills the workers and puts in-flight jobs back as pending: nothing half-written is kept.

The pool grows while jobs are pending: GPUs of nodes that join mid-run get workers of their own (`capacity`),
never more than the jobs pending. On a cluster that autoscales (`release_idle`) the pool's actors are the demand:
Ray's autoscaler adds nodes for the ones still waiting for a GPU, and once no job is left to take, an idle worker
is stopped so its node can go. A node Ray marks dead is reported in one `node_lost` event: the workers and jobs
it took with it.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cosmos3.errors import ConfigError, PipelineError, SoundTokenizerLoadError
from farm import storage
from farm.errors import InputChanged, JobFault, OutputPathError, StorageFault, WorkerStartError
from farm.events import RunLog
from farm.job import Job, JobState
from farm.metrics import RunMetrics
from farm.processes import pid_alive

RETIRE_AFTER = 3  # Deadline's and Flamenco's bad-worker threshold
JOB_FAULT_AFTER = 2  # different workers a job failed on: then it is the job, not them
# A job every worker would refuse: the model's rules, an output path that leads out of the root (a symlink made
# after validation), or sound from a checkpoint whose sound tokenizer diffusers could not build.
USER_ERRORS = (PipelineError, ConfigError, OutputPathError, SoundTokenizerLoadError, InputChanged)
KILL_WAIT = 30.0  # seconds to wait for a killed worker's process to be gone


@dataclass(frozen=True)
class Settings:
    init_failure_budget: int | None  # worker starts that may fail in one run; None: one per worker slot
    start_timeout: float = 900.0  # seconds for a worker to load its model; longer counts as a failed start
    poll: float = 1.0  # longest single wait, so deadlines are checked while nothing finishes
    grow_every: float = 5.0  # seconds between looks at the cluster for nodes that joined or died (a GCS call each)
    release_idle: bool = False  # stop idle workers once no job is pending, so an autoscaler can remove their nodes


@dataclass(eq=False)
class Slot:
    """A worker position (one GPU's worth of resources); its actor is replaced when it dies."""

    index: int
    actor: Any = None
    started: float = 0.0  # monotonic time its current actor was created
    identity: dict = field(default_factory=dict)  # what `RenderWorker.ready()` reported
    failed_jobs: dict[str, str] = field(default_factory=dict)  # job key -> error: different jobs failed since its
    # last success, each counting against it once it renders on another worker
    failed_elsewhere_done: set[str] = field(default_factory=set)
    failed_starts: int = 0  # in a row
    retired: bool = False
    released: bool = False  # stopped while idle with no job left for it; started again if a job comes back


@dataclass(eq=False)
class Attempt:
    job: Job
    slot: Slot
    number: int  # 1 for the first attempt
    started: float  # monotonic
    deadline: float  # monotonic: the job's timeout covers its render and its publish
    publishing: bool = False  # rendered; its worker publishes it (and may render the next job meanwhile)


@dataclass
class NodeLoss:
    """What a dead node took with it, gathered as its workers' results fail, until Ray marks it dead."""

    slots: set[int] = field(default_factory=set)
    jobs: int = 0  # attempts requeued (or failed for good) because their worker died with the node


@dataclass
class Outcome:
    """How a job ended in this run: done, failed (refused, or after its retries) or pending (never finished)."""

    state: JobState
    attempts: int = 0
    error: str | None = None
    seconds: float | None = None  # the successful attempt, dispatch to result
    worker: dict | None = None  # the identity of the worker that published it
    figures: dict | None = None  # the published attempt's timings, memory, gpu_seconds and worker_start


Launch = Callable[[int], Any]  # slot index -> a new RenderWorker actor handle
Capacity = Callable[[], int]  # how many workers the cluster holds now (its GPUs)


def _rank(job: Job) -> tuple[int, int]:
    return -job.priority, job.order


def describe(err: BaseException) -> str:
    """The reason from a Ray error: the job's own exception, whole (a refused request lists every problem
    on its own line), or the line of Ray's message that says why the worker died."""
    if isinstance(err, RayTaskError) and err.cause is not None:
        return f"{type(err.cause).__name__}: {err.cause}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if getattr(err, "actor_init_failed", False) and lines:
        return lines[-1]  # the creation task's exception is the last line of Ray's message
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


class Scheduler:
    def __init__(self, jobs: list[Job], launch: Launch, workers: int, settings: Settings,
                 log: RunLog, metrics: RunMetrics, capacity: Capacity | None = None):
        self.launch, self.settings, self.log, self.metrics = launch, settings, log, metrics
        self.capacity = capacity  # None: the pool keeps its first size
        self.next_growth_check = 0.0  # monotonic
        self.run_id = log.run_id
        self.slots = [Slot(i) for i in range(workers)]
        self.pending: list[Job] = sorted(jobs, key=_rank)
        self.idle: list[Slot] = []
        self.inflight: dict[ray.ObjectRef, Attempt] = {}
        self.starting: dict[ray.ObjectRef, Slot] = {}
        self.attempts: dict[str, int] = {}
        self.avoid: dict[str, set[int]] = {}  # job key -> slots it failed on
        self.outcomes: dict[str, Outcome] = {job.key: Outcome(JobState.PENDING) for job in jobs}
        self.failed_starts = 0
        self.last_retired = ""  # why the last worker was retired: the cause a stranded job reports
        self.interrupted = False
        self.node_losses: dict[str, NodeLoss] = {}  # node id -> its losses, until `node_lost` reports them
        self.reported_nodes: set[str] = set()
        self.next_node_check = 0.0  # monotonic
        self.pool = (0, 0)  # workers wanted and ready, as last reported

    def run(self) -> dict[str, Outcome]:
        """Renders every job it can; returns each job's outcome. Ctrl-C ends it early (`interrupted`)."""
        try:
            for slot in self.slots:
                self._start(slot)
            while (self.pending or self.inflight) and self.log.fault is None:  # a full disk ends the run
                self._grow()
                self._watch_nodes()
                self._dispatch()
                self._release_idle()
                self._report_pool()
                if not self.inflight and not self.starting:
                    self._abandon("no worker left to run it (all retired or failed to start); "
                                  f"last: {self.last_retired}")
                    break
                self._wait()
                self._enforce_deadlines()
        except KeyboardInterrupt:
            self.interrupted = True
            self.log.emit("run_interrupted", inflight=[a.job.key for a in self.inflight.values()])
        finally:
            self._stop_workers()
            self.metrics.load(len(self.pending), 0)
            self._report_pool(stopped=True)
        return self.outcomes

    # -- dispatch ------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        for slot in list(self.idle):
            if len(self._held_by(slot)) > 1:  # two publishes: its host is behind, so it takes no render yet
                continue
            job = self._next_job_for(slot)
            if job is not None:
                self.idle.remove(slot)
                self._submit(slot, job)
        self.metrics.load(len(self.pending), sum(not a.publishing for a in self.inflight.values()))

    def _render_on(self, slot: Slot) -> ray.ObjectRef | None:
        """The ref of the render in flight on `slot`'s worker, if one is."""
        return next((ref for ref in self._held_by(slot) if not self.inflight[ref].publishing), None)

    def _held_by(self, slot: Slot) -> list[ray.ObjectRef]:
        """The refs of the attempts in flight on `slot`'s worker: a render, publishes, or both."""
        return [ref for ref, attempt in self.inflight.items() if attempt.slot is slot]

    def _next_job_for(self, slot: Slot) -> Job | None:
        """The highest-ranked job this worker may take: one it has not failed, unless every live worker has."""
        live = {s.index for s in self.slots if not s.retired and not s.released}
        for i, job in enumerate(self.pending):
            avoid = self.avoid.get(job.key, set())
            if slot.index not in avoid or live <= avoid:
                return self.pending.pop(i)
        return None

    def _submit(self, slot: Slot, job: Job) -> None:
        number = self.attempts[job.key] = self.attempts.get(job.key, 0) + 1
        # Named per job so the dashboard groups a job's attempts.
        ref = slot.actor.render.options(name=f"render:{job.key}").remote(job, number)
        now = time.monotonic()
        self.inflight[ref] = Attempt(job, slot, number, now, now + job.timeout)
        self.log.emit("job_started", key=job.key, attempt=number, slot=slot.index, node=slot.identity.get("node"))

    def _requeue(self, job: Job) -> None:
        bisect.insort(self.pending, job, key=_rank)
        released = next((s for s in self.slots if s.released), None)
        if released is not None and not self.idle:  # a job came back after the pool shrank: a worker for it
            released.released = False
            self.log.emit("worker_added", slot=released.index)
            self._start(released)

    # -- waiting -------------------------------------------------------------------------------

    def _wait(self) -> None:
        now = time.monotonic()
        deadlines = [a.deadline for a in self.inflight.values()]
        deadlines += [s.started + self.settings.start_timeout for s in self.starting.values()]
        timeout = max(0.0, min([self.settings.poll, *(d - now for d in deadlines)]))
        ready, _ = ray.wait([*self.inflight, *self.starting], num_returns=1, timeout=timeout)
        for ref in ready:
            if ref in self.starting:
                self._on_started(self.starting.pop(ref), ref)
            else:
                self._on_result(self.inflight.pop(ref), ref)

    def _on_started(self, slot: Slot, ref: ray.ObjectRef) -> None:
        try:
            slot.identity = ray.get(ref)
        except RayError as err:
            self._start_failed(slot, describe(err))
            return
        self.idle.append(slot)
        self.log.emit("worker_ready", **slot.identity)
        if slot.identity.get("gpu") and slot.identity.get("device") == "cpu":
            self.log.emit("worker_on_cpu", slot=slot.index, reason="holds a Ray GPU but CUDA is not available")

    def _on_result(self, attempt: Attempt, ref: ray.ObjectRef) -> None:
        try:
            result = ray.get(ref)
        except RayTaskError as err:  # the job raised; its worker is alive
            if isinstance(err.cause, WorkerStartError):
                self._start_failed_in_job(attempt, describe(err))
            elif isinstance(err.cause, USER_ERRORS):
                self._refused(attempt, describe(err))
            else:
                # Full or lost storage, or a job too large for memory, is no sign of a bad worker.
                blamed = not isinstance(err.cause, (StorageFault, JobFault))
                self._attempt_failed(attempt, describe(err), worker_lost=False, blamed=blamed)
            return
        except RayError as err:  # the worker died: a crash, the OOM killer, a lost node
            self._count_node_loss(attempt.slot)
            render = self._render_on(attempt.slot) if attempt.publishing else None
            if render is not None:  # renders crash workers (CUDA, memory), publishes hardly: it takes the blame
                self.inflight[ref] = attempt  # and this publish is the restart's bystander
                attempt = self.inflight.pop(render)
            self._attempt_failed(attempt, f"worker lost: {describe(err)}", worker_lost=True)
            return
        if not attempt.publishing:
            self._publish(attempt)
            return
        problem = storage.check_published(attempt.job.files, attempt.job.config_hash, (self.run_id, attempt.number))
        if problem:
            self._attempt_failed(attempt, f"published output does not verify: {problem}", worker_lost=False)
        else:
            self._succeeded(attempt, result)

    def _publish(self, attempt: Attempt) -> None:
        """The render returned: its worker publishes it, and is free for its next render meanwhile."""
        job, slot = attempt.job, attempt.slot
        ref = slot.actor.publish.options(name=f"publish:{job.key}").remote(job, attempt.number)
        attempt.publishing = True
        self.inflight[ref] = attempt
        self.idle.append(slot)
        self.log.emit("job_rendered", key=job.key, attempt=attempt.number, slot=slot.index)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for ref, attempt in list(self.inflight.items()):
            if ref in self.inflight and now >= attempt.deadline:
                del self.inflight[ref]
                self.log.emit("job_timeout", key=attempt.job.key, attempt=attempt.number, slot=attempt.slot.index)
                # Ray cannot interrupt a running actor task; killing the actor is the only way to stop it.
                reason = f"timed out after {attempt.job.timeout:g}s (worker killed)"
                self._kill_slot(attempt.slot, f"{attempt.job.key} {reason}", [ref])
                self._attempt_failed(attempt, reason, worker_lost=True, blamed=False)  # the job's own time
        for ref, slot in list(self.starting.items()):
            if now >= slot.started + self.settings.start_timeout:
                del self.starting[ref]
                self._start_failed(slot, f"not ready within {self.settings.start_timeout:g}s")

    # -- outcomes ------------------------------------------------------------------------------

    def _succeeded(self, attempt: Attempt, result: dict) -> None:
        slot, job = attempt.slot, attempt.job
        slot.failed_jobs.clear()
        slot.failed_elsewhere_done.clear()
        slot.failed_starts = 0  # its start is proven: what it loaded after ready() has rendered
        seconds = time.monotonic() - attempt.started
        figures = result["figures"]
        self.outcomes[job.key] = Outcome(JobState.DONE, attempt.number, None, seconds, slot.identity, figures)
        self._blame_workers_that_failed(job, slot)
        self.metrics.job_done(seconds, figures["timings"].get("steps", []))
        self.log.emit("job_done", key=job.key, attempt=attempt.number, slot=slot.index, seconds=round(seconds, 3),
                      worker_started=result["started"], worker_finished=result["finished"])

    def _refused(self, attempt: Attempt, error: str) -> None:
        """The model refused the job: retrying cannot help, and the worker did nothing wrong."""
        job, slot = attempt.job, attempt.slot
        storage.discard_temps(job)
        self.outcomes[job.key] = Outcome(JobState.FAILED, attempt.number, error)
        self.metrics.job_failed()
        self.log.emit("job_failed", key=job.key, attempt=attempt.number, slot=slot.index, error=error, refused=True)
        self._free(attempt)

    def _start_failed_in_job(self, attempt: Attempt, error: str) -> None:
        """The worker's start failed under this job: the job goes back to pending as if never dispatched (its
        attempt number is given back, no worker is avoided for it) and the worker is a failed start."""
        job = attempt.job
        self.attempts[job.key] -= 1
        self._requeue(job)
        self.log.emit("job_requeued", key=job.key, attempt=attempt.number, slot=attempt.slot.index, error=error)
        self._start_failed(attempt.slot, error)

    def _attempt_failed(self, attempt: Attempt, error: str, *, worker_lost: bool, blamed: bool = True) -> None:
        job, slot = attempt.job, attempt.slot
        # The attempt is over (its worker raised, died or was killed): whatever it half-wrote can go.
        storage.discard_temps(job)
        failed_on = self.avoid.setdefault(job.key, set())
        failed_on.add(slot.index)
        if blamed:
            slot.failed_jobs[job.key] = error
        own_fault = len(failed_on) >= JOB_FAULT_AFTER
        if own_fault:
            error = f"{error} (failed on {len(failed_on)} different workers: the job's own fault)"
        if attempt.number > job.retries or own_fault:
            self.outcomes[job.key] = Outcome(JobState.FAILED, attempt.number, error)
            self.metrics.job_failed()
            self.log.emit("job_failed", key=job.key, attempt=attempt.number, slot=slot.index, error=error)
        else:
            self.outcomes[job.key] = Outcome(JobState.PENDING, attempt.number, error)
            self._requeue(job)
            self.metrics.job_retried()
            self.log.emit("job_retry", key=job.key, attempt=attempt.number, slot=slot.index, error=error)
        self._after_failure(attempt, error, worker_lost)

    def _after_failure(self, attempt: Attempt, error: str, worker_lost: bool) -> None:
        slot = attempt.slot
        if worker_lost:
            self.log.emit("worker_lost", slot=slot.index, node=slot.identity.get("node"), error=error)
            self._restart(slot)
        else:
            self._free(attempt)

    def _blame_workers_that_failed(self, job: Job, done_on: Slot) -> None:
        """`job` rendered on `done_on`: the workers that failed it are to blame for that failure, and one with
        RETIRE_AFTER such failures in a row is retired."""
        for slot in self.slots:
            if slot is done_on or slot.retired or job.key not in slot.failed_jobs:
                continue
            slot.failed_elsewhere_done.add(job.key)
            if len(slot.failed_elsewhere_done) >= RETIRE_AFTER:
                self._retire(slot, f"failed {len(slot.failed_elsewhere_done)} different jobs in a row that rendered "
                                   f"on other workers; last: {slot.failed_jobs[job.key]}")

    def _free(self, attempt: Attempt) -> None:
        """An attempt ended with its worker alive: a render's end frees the worker (a publish's end already did)."""
        if not attempt.publishing:
            self.idle.append(attempt.slot)

    def _abandon(self, reason: str) -> None:
        for job in self.pending:
            self.outcomes[job.key].error = reason
        self.log.emit("run_stalled", reason=reason, left=[job.key for job in self.pending])

    # -- workers -------------------------------------------------------------------------------

    def _start(self, slot: Slot) -> None:
        slot.actor = self.launch(slot.index)
        slot.started = time.monotonic()
        self.starting[slot.actor.ready.remote()] = slot

    def _count_node_loss(self, slot: Slot) -> None:
        """The worker on `slot` died with every attempt it held: counted against its node, in case the node died."""
        node = slot.identity.get("node")
        if node is None or node in self.reported_nodes:
            return
        loss = self.node_losses.setdefault(node, NodeLoss())
        loss.slots.add(slot.index)
        loss.jobs += 1 + len(self._held_by(slot))  # the failed attempt was popped; the rest go with it

    def _watch_nodes(self) -> None:
        """Reports each node Ray has marked dead that held this run's workers, once, in one `node_lost` event, and
        restarts its idle workers before a job is sent to them (their jobs in flight fail on their own)."""
        now = time.monotonic()
        if now < self.next_node_check:
            return
        self.next_node_check = now + self.settings.grow_every
        dead = {node["NodeID"] for node in ray.nodes() if not node["Alive"]} - self.reported_nodes
        for node in dead:
            loss = self.node_losses.pop(node, NodeLoss())
            on_it = [s for s in self.slots if s.identity.get("node") == node and not s.retired and not s.released]
            loss.slots.update(s.index for s in on_it)
            if not loss.slots:
                continue  # none of this run's workers were there
            self.reported_nodes.add(node)
            loss.jobs += sum(1 for a in self.inflight.values() if a.slot in on_it)
            for slot in [s for s in on_it if s in self.idle]:
                self._restart(slot)
            self.log.emit("node_lost", node=node, workers=len(loss.slots), jobs=loss.jobs)

    def _release_idle(self) -> None:
        """With no job left to take, an idle worker is stopped, so its GPU (and, once all are, its node) goes back
        to the cluster; the workers still rendering keep theirs."""
        if not self.settings.release_idle or self.pending:
            return
        for slot in [s for s in self.idle if not self._held_by(s)]:
            self.idle.remove(slot)
            ray.kill(slot.actor, no_restart=True)
            slot.actor, slot.released = None, True
            self.log.emit("worker_released", slot=slot.index, node=slot.identity.get("node"))

    def _report_pool(self, stopped: bool = False) -> None:
        """How many workers the run wants (slots not retired or released) and has (ready), none once `stopped`: an
        event when either changes, and the dashboard's gauges."""
        wanted = 0 if stopped else sum(not s.retired and not s.released for s in self.slots)
        pool = (wanted, 0 if stopped else wanted - len(self.starting))
        if pool != self.pool:
            self.pool = pool
            self.log.emit("workers", wanted=pool[0], ready=pool[1])
            self.metrics.pool(*pool)

    def _grow(self) -> None:
        """Starts a worker for every GPU beyond the slots this run has had. Retired slots count, so a bad GPU
        is not refilled, and so do slots whose node was lost: their restarted actors are waiting for a GPU,
        and a node that replaces the lost one is theirs to take."""
        now = time.monotonic()
        if self.capacity is None or not self.pending or now < self.next_growth_check:
            return
        self.next_growth_check = now + self.settings.grow_every
        for index in range(len(self.slots), min(self.capacity(), len(self.slots) + len(self.pending))):
            slot = Slot(index)
            self.slots.append(slot)
            self.log.emit("worker_added", slot=index)
            self._start(slot)

    def _restart(self, slot: Slot) -> None:
        self._kill_slot(slot, f"worker {slot.index} restarted")
        self._start(slot)

    def _kill_slot(self, slot: Slot, reason: str, running: list[ray.ObjectRef] = ()) -> None:
        """Kills `slot`'s worker, waiting for `running` (the refs of the attempt it is killed for) to end. The other
        attempt it held goes back to pending as if never dispatched (its number given back, no worker avoided):
        it did nothing wrong. Its half-written files go once the process is gone."""
        others = [ref for ref in self._held_by(slot) if ref not in running]
        cut = [self.inflight.pop(ref) for ref in others]
        if slot in self.idle:
            self.idle.remove(slot)
        self._kill([slot], [*running, *others])
        for attempt in cut:
            storage.discard_temps(attempt.job)
            self.attempts[attempt.job.key] -= 1
            self._requeue(attempt.job)
            self.log.emit("job_requeued", key=attempt.job.key, attempt=attempt.number, slot=slot.index,
                          error=f"its worker was stopped: {reason}")

    def _kill(self, slots: list[Slot], running: list[ray.ObjectRef] = ()) -> None:
        for slot in slots:
            ray.kill(slot.actor, no_restart=True)
        if running:
            ray.wait(list(running), num_returns=len(running), timeout=KILL_WAIT)
            _wait_exited(slots)

    def _start_failed(self, slot: Slot, error: str) -> None:
        self.failed_starts += 1
        slot.failed_starts += 1
        self.log.emit("worker_init_failed", slot=slot.index, error=error, in_a_row=slot.failed_starts,
                      run_total=self.failed_starts)
        budget = self.settings.init_failure_budget or len(self.slots)  # slots added mid-run bring their own
        if slot.failed_starts >= RETIRE_AFTER or self.failed_starts >= budget:
            self._retire(slot, f"could not start: {error}")
        else:
            self._restart(slot)

    def _retire(self, slot: Slot, reason: str) -> None:
        slot.retired = True
        self.last_retired = f"worker {slot.index} {reason}"
        self._kill_slot(slot, f"worker {slot.index} retired")
        self.log.emit("worker_retired", slot=slot.index, node=slot.identity.get("node"), reason=reason)

    def _stop_workers(self) -> None:
        """Kills every actor (they are the driver's; a shared cluster gets its GPUs back at once). A publish that
        finished meanwhile (after Ctrl-C, before the kill) is on disk and verifies: it is logged done like any
        other, so the event log tells of every file the farm published; other attempts' half-written files go."""
        self._kill([s for s in self.slots if s.actor is not None], list(self.inflight))
        for attempt in self.inflight.values():
            job = attempt.job
            if attempt.publishing and storage.check_published(job.files, job.config_hash,
                                                              (self.run_id, attempt.number)) is None:
                seconds = time.monotonic() - attempt.started
                self.outcomes[job.key] = Outcome(JobState.DONE, attempt.number, None, seconds, attempt.slot.identity)
                self.metrics.job_done(seconds, [])
                self.log.emit("job_done", key=job.key, attempt=attempt.number, slot=attempt.slot.index,
                              seconds=round(seconds, 3), after_stop=True)
            else:
                storage.discard_temps(job)
        self.inflight.clear()
        self.starting.clear()


def _wait_exited(slots: list[Slot]) -> None:
    """Returns once the killed workers' processes are gone (or after KILL_WAIT): Ray fails a killed actor's result
    as soon as it marks the actor dead, which can be before the process has stopped writing its temp files.
    A process on this node is watched here; one elsewhere by a task on its node."""
    here = ray.get_runtime_context().get_node_id()
    deadline = time.monotonic() + KILL_WAIT
    elsewhere = []
    for slot in slots:
        pid, node = slot.identity.get("pid"), slot.identity.get("node")
        if pid is None:
            continue  # never became ready: it ran no job
        if node == here:
            _until_gone(pid, deadline)
        else:
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            elsewhere.append(_exited.options(scheduling_strategy=strategy).remote(pid, KILL_WAIT))
    if elsewhere:
        ray.wait(elsewhere, num_returns=len(elsewhere), timeout=KILL_WAIT)


def _until_gone(pid: int, deadline: float) -> None:
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


@ray.remote(num_cpus=0)
def _exited(pid: int, timeout: float) -> None:
    _until_gone(pid, time.monotonic() + timeout)
