"""`farm validate | plan | submit | retry | status`.

Each `do_<command>(args)` returns a `Result`; `@print_result` prints it (text, or `--output json`) and turns
it into the exit code. A `FarmError` (bad manifest, no cluster, no records) prints as one message, no traceback.
"""

from __future__ import annotations

import argparse
import errno
import functools
import importlib
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import claims, lease, memory, storage, terminal
from farm import manifest as manifests
from farm.errors import FarmError, ManifestError, StateError
from farm.events import configure_logging
from farm.job import Job

if TYPE_CHECKING:
    from farm import driver

EXIT_INTERRUPTED = 130  # the shell's code for a process ended by Ctrl-C


@dataclass
class Result:
    ok: bool
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    code: int | None = None  # None: 0 when ok, else 1

    @property
    def exit_code(self) -> int:
        return self.code if self.code is not None else (0 if self.ok else 1)


def print_result(do: Callable[[argparse.Namespace], Result]) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(do)
    def run(args: argparse.Namespace) -> int:
        try:
            result = do(args)
        except FarmError as err:
            result = Result(False, f"error: {err}", _error_data(err))
        except KeyboardInterrupt:
            result = Result(False, "interrupted", {"interrupted": True}, EXIT_INTERRUPTED)
        if args.output == "json":
            print(json.dumps({"ok": result.ok, **result.data}, indent=2, default=str))
        else:
            print(terminal.escape(result.text, lines=True), file=sys.stdout if result.ok else sys.stderr)
        return result.exit_code

    return run


def _error_data(err: FarmError) -> dict[str, Any]:
    data: dict[str, Any] = {"error": str(err)}
    if isinstance(err, ManifestError):
        data["problems"] = [{"file": str(err.path), "line": p.line, "where": p.where, "message": p.message}
                            for p in err.problems]
    return data


def _load(path: str) -> manifests.Manifest:
    """The manifest, validated, and refused when its files belong to another manifest of its root."""
    try:
        m = manifests.load(path)
    except OSError as err:
        why = err.strerror or str(err)
        if err.errno == errno.ENAMETOOLONG:
            why = storage.too_long(os.path.abspath(path)) or f"{why}: a name in it is longer than its file system takes"
        raise StateError(f"cannot read manifest {terminal.escape(path)}: {why}") from err
    claims.check(m)
    return m


# -- validate / plan ---------------------------------------------------------------------------------


@print_result
def do_validate(args: argparse.Namespace) -> Result:
    m = _load(args.manifest)
    ids = len({job.id for job in m.jobs})
    text = f"{terminal.escape(Path(m.path).name)}: ok, {ids} jobs -> {len(m.jobs)} renders into {m.output_root}"
    return Result(True, text, {"manifest": m.path, "jobs": ids, "renders": len(m.jobs)})


@print_result
def do_plan(args: argparse.Namespace) -> Result:
    m = _load(args.manifest)
    gpu = None if args.gpu_memory is None else int(args.gpu_memory * memory.GIB)
    planned = memory.plan_manifest(m, gpu)
    rows = [_plan_row(m, job, planned.jobs[job.key]) for job in sorted(m.jobs, key=lambda j: (-j.priority, j.order))]
    todo = sum(row["state"] == "todo" for row in rows)
    header = f"{m.name}: {len(rows)} renders, {todo} to do, {len(rows) - todo} done; model {m.model.checkpoint}"
    key, largest = planned.largest()
    lines = [header, f"GPU memory: {planned.model.resident / memory.GIB:.1f} GiB resident; the largest job, {key}, "
                     f"needs {largest.describe()}", _table(rows)]
    over = [] if gpu is None else planned.over(gpu)
    if over:
        lines.append(f"{len(over)} job(s) need more than --gpu-memory {args.gpu_memory:g} GiB: "
                     f"{', '.join(k for k, _ in over)}")
    return Result(not over, "\n".join(lines), {"manifest": m.path, "jobs": rows,
                                               "resident_gib": round(planned.model.resident / memory.GIB, 2)})


def _plan_row(m: manifests.Manifest, job: Job, planned: memory.JobMemory) -> dict[str, Any]:
    r = job.request
    return {
        "key": job.key, "task": r.task, "size": f"{r.width}x{r.height}", "frames": r.frames,
        "steps": r.steps, "seed": r.seed, "priority": job.priority,
        "state": "done" if storage.is_done(job) else "todo",
        "gpu_gib": round(planned.need / memory.GIB, 1),
        "output": str(Path(job.media).relative_to(m.output_root)),
    }


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    cells = [{c: terminal.escape(str(r[c])) for c in columns} for r in rows]  # aligned as the terminal shows them
    widths = {c: max(len(c), *(len(r[c]) for r in cells)) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


# -- submit / retry ----------------------------------------------------------------------------------


@print_result
def do_submit(args: argparse.Namespace) -> Result:
    return _run(_load(args.manifest), args, only=None)


@print_result
def do_retry(args: argparse.Namespace) -> Result:
    m = _load(args.manifest)
    path = storage.records_dir(m.output_root, m.name) / lease.LEASE_FILE
    running = lease.holder(path)
    if running is not None:  # which of its jobs fail is known once it has ended
        raise lease.LeaseHeld(path, running)
    state = storage.read_state(m.output_root, m.name)
    if state is None:
        raise StateError(f"no runs of {m.name} recorded under {m.output_root}; use farm submit")
    if "unreadable" in state:
        raise StateError(f"cannot tell which jobs failed: {state['unreadable']}; farm submit renders what is missing")
    failed = frozenset(key for key, entry in state["jobs"].items() if entry.get("state") == "failed")
    if not failed:
        return Result(True, f"{m.name}: no failed jobs to retry", {"retried": []})
    return _run(m, args, only=failed)


def _run(m: manifests.Manifest, args: argparse.Namespace, only: frozenset[str] | None) -> Result:
    if args.gpu_memory is not None:  # the GPUs are known: a job none of them holds is refused before anything starts
        memory.refuse_unplaceable(memory.plan_manifest(m, gpu_memory=0), int(args.gpu_memory * memory.GIB),
                                  f"--gpu-memory {args.gpu_memory:g}")
    from farm import driver  # imports Ray (~1 s): only the commands that render pay for it

    options = driver.SubmitOptions(
        address=args.address, workers=args.workers, max_workers=args.max_workers,
        accelerator_type=args.accelerator_type,
        force=args.force, only=only, factory=args.pipeline, init_failure_budget=args.init_failures,
        start_timeout=args.start_timeout, progress=not args.no_progress, wait=args.wait,
    )
    return _report_result(driver.submit(m, options))


def _report_result(report: driver.RunReport) -> Result:
    c = report.counts
    lines = [f"{report.manifest.name}: {c['done']} done, {c['failed']} failed, {c['pending']} pending, "
             f"{c['skipped']} skipped (already done) in {report.seconds:.1f}s"]
    failures = {k: o for k, o in report.outcomes.items() if o.state != "done"}
    # An error keeps all its lines (a refused request lists every problem), indented under its job.
    lines += ["  " + f"{key} ({o.state}, {o.attempts} attempts): {o.error or 'not run'}".replace("\n", "\n    ")
              for key, o in failures.items()]
    if report.error:
        lines.append(f"error: {report.error}")
    elif report.interrupted:
        lines.append("interrupted: in-flight jobs were cancelled; farm submit again renders what is missing")
    lines.append(f"outputs: {report.manifest.output_root}")
    if report.dashboard_url:
        lines.append(f"dashboard: {report.dashboard_url}")
    lines.append(f"summary: {report.summary_path}")
    data = {"run": report.run_id, "counts": c, "summary": report.summary_path, "interrupted": report.interrupted,
            "error": report.error,
            "failed": {k: {"state": o.state, "attempts": o.attempts, "error": o.error} for k, o in failures.items()}}
    interrupted = report.interrupted and not report.error
    return Result(report.ok, "\n".join(lines), data, EXIT_INTERRUPTED if interrupted else None)


# -- status ------------------------------------------------------------------------------------------


@print_result
def do_status(args: argparse.Namespace) -> Result:
    states = storage.read_states(args.output_root)
    if not states:
        expected = f"{storage.RECORDS_DIR}/<name>/state.json"
        hint = ("; farm status takes an output root (a manifest's output.root), not a file"
                if Path(args.output_root).is_file() else "")
        raise StateError(f"no farm records under {terminal.escape(args.output_root)} (expected {expected}){hint}")
    rows = [_status_row(args.output_root, name, state) for name, state in states.items()]
    # A damaged state's note is a line of its own under the table, not a column every row would be as wide as.
    notes = [f"{row['manifest']}: {row['damaged']}" for row in rows if "damaged" in row]
    table = _table([{k: v for k, v in row.items() if k != "damaged"} for row in rows])
    return Result(True, "\n".join([table, *notes]), {"manifests": rows})


def _status_row(root: str, name: str, state: dict) -> dict[str, Any]:
    if "unreadable" in state:
        return {"manifest": name, "done": "-", "failed": "-", "pending": "-", "last_run": state["unreadable"]}
    counts = {"done": 0, "failed": 0, "pending": 0}
    for entry in state.get("jobs", {}).values():
        # Trust storage, not the record: a deleted or truncated output is pending again. Sizes, not hashes:
        # reading every video of a 10,000-job manifest would take minutes; `farm plan` and submit read them.
        if storage.check_published(storage.state_files(entry), entry["config_hash"], content=False) is None:
            counts["done"] += 1
        else:
            counts["failed" if entry.get("state") == "failed" else "pending"] += 1
    result = state.get("result")
    if result == "running" and lease.holder(storage.records_dir(root, name) / lease.LEASE_FILE) is None:
        result = "interrupted: its driver is gone"  # killed without a chance to say so (SIGKILL, a lost node)
    row = {"manifest": name, **counts, "last_run": f"{state.get('run')} ({result})"}
    return {**row, "damaged": state["damaged"]} if "damaged" in state else row


# -- arguments ---------------------------------------------------------------------------------------


def _count(text: str) -> int:
    """A whole number >= 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    """A finite number of seconds > 0 (argparse type): nan and inf pass every comparison, so they are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {terminal.escape(text)}")
    return value


def _factory(spec: str) -> Any:
    """`module:function` -> the function (a `worker.actor.PipelineFactory`)."""
    module_name, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise argparse.ArgumentTypeError(f"cannot import pipeline factory {spec!r}: {err}") from err


GPU_MEMORY = {"type": float, "metavar": "GIB",
              "help": "each GPU's memory in GiB (nvidia-smi's memory.total / 1024): jobs that need more are refused "
                      "before anything starts (a cluster's nodes can say it themselves: docs/farm.md, 'GPU memory')"}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--output", choices=("text", "json"), default="text", help="result format on stdout")
    common.add_argument("--log-json", action="store_true", help="log one JSON object a line")
    parser = argparse.ArgumentParser(prog="farm", description="Render YAML manifests of Cosmos3 jobs on Ray.")
    commands = parser.add_subparsers(dest="command", required=True)

    for name, do, help_ in (("validate", do_validate, "check a manifest; nothing is rendered"),
                            ("plan", do_plan, "list resolved jobs, output paths and what is done")):
        sub = commands.add_parser(name, parents=[common], help=help_)
        sub.add_argument("manifest")
        sub.set_defaults(func=do)
        if name == "plan":
            sub.add_argument("--gpu-memory", **GPU_MEMORY)

    for name, do, help_ in (("submit", do_submit, "render every job that is not done"),
                            ("retry", do_retry, "render again the jobs the last runs left failed")):
        sub = commands.add_parser(name, parents=[common], help=help_)
        sub.add_argument("manifest")
        _add_run_options(sub)
        sub.set_defaults(func=do)

    status = commands.add_parser("status", parents=[common], help="done / failed / pending per manifest")
    status.add_argument("output_root")
    status.set_defaults(func=do_status)
    return parser


def _add_run_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--address", help="Ray cluster to join (default: start one here, dashboard on 127.0.0.1)")
    pool = sub.add_mutually_exclusive_group()
    pool.add_argument("--workers", type=_count,
                      help="CPU workers when the cluster has no GPUs (default 1); else this many GPU workers "
                           "(default: one per GPU, and more as GPU nodes join mid-run)")
    pool.add_argument("--max-workers", type=_count, metavar="N",
                      help="on a cluster that autoscales: ask for a GPU worker per pending job, at most N, "
                           "whatever GPUs it has now (Ray's autoscaler adds nodes for them); idle workers stop "
                           "once no job is left, so the autoscaler can remove their nodes")
    sub.add_argument("--accelerator-type", help="only use GPUs of this type, e.g. B200 or H200")
    sub.add_argument("--gpu-memory", **GPU_MEMORY)
    sub.add_argument("--force", action="store_true", help="render jobs that are already done")
    sub.add_argument("--pipeline", type=_factory, default="worker.actor:cosmos3_factory", metavar="MODULE:FUNC",
                     help="pipeline factory (worker.fake:factory renders flat colours without a model)")
    sub.add_argument("--init-failures", type=_count, help="worker starts that may fail in a run (default: workers)")
    sub.add_argument("--start-timeout", type=_seconds, default=900.0, help="seconds for a worker to load its model")
    sub.add_argument("--no-progress", action="store_true", help="no progress bar")
    sub.add_argument("--wait", action="store_true",
                     help="when another driver is rendering this manifest into its root, wait for it to end "
                          "(default: refuse, naming it)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_json)
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, so a closed pipe raises where it is handled, not at the interpreter's exit
        return code
    except BrokenPipeError:  # `farm plan m.yaml | head -1`: the reader has what it wanted
        # Python flushes stdout again at exit; pointing it at /dev/null keeps that from raising too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

