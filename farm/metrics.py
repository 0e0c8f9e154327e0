"""Ray metrics (`ray.util.metrics`), exported on each node's metrics port for Prometheus and the dashboard.

Ray prefixes names with `ray_` and suffixes counters with `_total`: `farm_jobs_done` is scraped as
`ray_farm_jobs_done_total{manifest="city"}`. The driver owns the job metrics; each worker reports its
own progress through the current job and, on a GPU, how its GPU's clock ran, tagged by its slot and the manifest
it renders for (docs/deploy/farm_grafana_dashboard.json draws every series per manifest).
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

_JOB_SECONDS = [1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600]
_STEP_SECONDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30]


class RunMetrics:
    """The driver's view of one manifest's run of `jobs` jobs."""

    def __init__(self, manifest: str, jobs: int):
        tags = {"manifest": manifest}
        keys = ("manifest",)
        self._unfinished = jobs  # neither done nor failed: queued, rendering, publishing or waiting for a retry
        self._done = Counter("farm_jobs_done", "Jobs rendered, published and verified", tag_keys=keys)
        self._failed = Counter("farm_jobs_failed", "Jobs that ended failed after their retries", tag_keys=keys)
        self._retried = Counter("farm_jobs_retried", "Attempts requeued after a failure or timeout", tag_keys=keys)
        self._pending = Gauge("farm_jobs_pending", "Jobs of the run neither done nor failed yet", tag_keys=keys)
        self._queue = Gauge("farm_queue_depth", "Jobs waiting for a worker", tag_keys=keys)
        self._busy = Gauge("farm_busy_workers", "Workers rendering a job right now", tag_keys=keys)
        self._wanted = Gauge("farm_workers_wanted", "Workers the run asks the cluster for", tag_keys=keys)
        self._ready = Gauge("farm_workers_ready", "Workers started and holding their GPU", tag_keys=keys)
        self._job = Histogram("farm_job_seconds", "Wall time of one attempt, dispatch to result",
                              boundaries=_JOB_SECONDS, tag_keys=keys)
        self._step = Histogram("farm_step_seconds", "Wall time of one denoising step (both CFG passes)",
                               boundaries=_STEP_SECONDS, tag_keys=keys)
        for metric in (self._done, self._failed, self._retried, self._pending, self._queue, self._busy, self._wanted,
                       self._ready, self._job, self._step):
            metric.set_default_tags(tags)

    def job_done(self, seconds: float, step_seconds: list[float]) -> None:
        self._done.inc()
        self._unfinished -= 1
        self._job.observe(seconds)
        for step in step_seconds:
            self._step.observe(step)

    def job_failed(self) -> None:
        self._failed.inc()
        self._unfinished -= 1

    def job_retried(self) -> None:
        self._retried.inc()

    def load(self, queued: int, busy: int) -> None:
        """Every pass of the driver's loop: Ray drops a gauge not set for ~20 s, so the pending count is set here."""
        self._queue.set(queued)
        self._busy.set(busy)
        self._pending.set(self._unfinished)

    def pool(self, wanted: int, ready: int) -> None:
        self._wanted.set(wanted)
        self._ready.set(ready)


class WorkerProgress:
    """One worker's fraction of denoising steps done in its current job; the pipeline's step callback feeds it."""

    def __init__(self, slot: int, manifest: str):
        self._gauge = Gauge("farm_worker_progress", "Fraction of steps done in the current job",
                            tag_keys=("manifest", "slot"))
        self._gauge.set_default_tags({"manifest": manifest, "slot": str(slot)})

    def step(self, step: int, num_steps: int) -> None:
        self._gauge.set((step + 1) / num_steps)  # `step` counts from 0


class WorkerGpu:
    """One GPU worker's clock while it renders: every telemetry sample sets the SM clock and power gauges (live on
    the dashboard: a still at the 700 W cap runs near 1,600 MHz, an idle or throttled GPU shows apart), and each
    job's end its share of samples held down by the power cap."""

    def __init__(self, slot: int, manifest: str):
        keys, tags = ("manifest", "slot"), {"manifest": manifest, "slot": str(slot)}
        self._clock = Gauge("farm_worker_sm_clock_mhz", "GPU SM clock at the last sample of a render",
                            tag_keys=keys)
        self._power = Gauge("farm_worker_power_w", "GPU power draw at the last sample of a render", tag_keys=keys)
        self._capped = Gauge("farm_worker_power_capped_share",
                             "Share of the last job's samples whose clock the power cap held down", tag_keys=keys)
        for metric in (self._clock, self._power, self._capped):
            metric.set_default_tags(tags)

    def sample(self, clock_mhz: float, power_w: float) -> None:
        self._clock.set(clock_mhz)
        self._power.set(power_w)

    def job(self, telemetry: dict) -> None:
        """After a job: its ``gpu_telemetry`` figures (nothing set where nothing was sampled)."""
        if telemetry["power_capped_share"] is not None:
            self._capped.set(telemetry["power_capped_share"])
