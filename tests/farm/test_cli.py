"""The `farm` command: exit codes, resume after an interrupted run, status, retry, and a driver without torch."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from farm import cli, driver, manifest
from tests.farm import fakes
from tests.farm.helpers import local_cluster, output_files, publish, state, temp_files, write_manifest

REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def address():
    with local_cluster(num_gpus=2, num_cpus=4):
        yield ray.get_runtime_context().gcs_address


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """This process ignores SIGINT meanwhile, as a test run started from a background job of a script does."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _sidecars(root: Path) -> list[Path]:
    return sorted(root.rglob("*.mp4.json"))


def _count(root: Path, event: str) -> int:
    """How many `event`s the run has logged so far (0 before its log exists)."""
    log = root / ".farm" / "test" / "events.jsonl"
    return sum(json.loads(line)["event"] == event for line in log.read_text().splitlines()) if log.exists() else 0


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def test_farm_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import farm.cli, farm.driver, farm.scheduler, farm.cluster, worker.actor, worker.fake\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# Ctrl-C, and `ray job stop` (SIGTERM, which Ray's own handler would turn into an abort). Two jobs render at
# once; the other four wait for a gate file that opens only after the signal, so exactly two are done when it
# lands however slow the machine is.
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_submit_after_an_interrupted_run_renders_only_what_was_missing(address, tmp_path, signum, farm):
    gate = tmp_path / "gate"
    jobs = [{"id": f"clip{i}", "prompt": f"shot {i}" + (f" wait-for {gate}" if i >= 2 else "")} for i in range(6)]
    path = write_manifest(tmp_path, jobs)
    root = tmp_path / "out"
    with _sigint_ignored():  # the child must still stop on SIGINT
        run = farm("submit", str(path), "--address", address, "--start-timeout", "120",
                   pipeline="tests.farm.fakes:gated")
    _wait_for(lambda: _count(root, "job_done") == 2 and _count(root, "job_started") >= 4)
    run.send_signal(signum)
    _, err = run.communicate(timeout=120)

    assert run.returncode == cli.EXIT_INTERRUPTED, err
    first = {p: json.loads(p.read_text())["run"] for p in _sidecars(root)}
    assert len(first) == 2 and not temp_files(root)  # the two held jobs' workers were killed, nothing half-kept
    assert state(root)["result"] == "interrupted"

    gate.touch()
    report = driver.submit(manifest.load(path), driver.SubmitOptions(factory=fakes.gated, progress=False,
                                                                     start_timeout=120))
    assert report.ok and len(report.skipped) == 2
    assert len(report.outcomes) == len(jobs) - 2
    assert all(json.loads(p.read_text())["run"] == run_id for p, run_id in first.items())
    assert len(output_files(root)) == 2 * len(jobs)


def test_status_retry_and_plan_after_a_run_with_a_failure(address, tmp_path, capsys):
    jobs = [{"id": "good", "prompt": "fine"}, {"id": "bad", "prompt": "fail", "retries": 0}]
    path = write_manifest(tmp_path, jobs)
    args = cli.build_parser().parse_args(["submit", str(path), "--no-progress", "--start-timeout", "120"])
    args.pipeline = _failing_pipeline(tmp_path)
    assert args.func(args) == 1
    capsys.readouterr()

    assert cli.main(["status", str(tmp_path / "out"), "--output", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["manifests"][0]
    assert (row["manifest"], row["done"], row["failed"], row["pending"]) == ("test", 1, 1, 0)

    # The cause is fixed (here: a pipeline that works); retry renders the failed job and nothing else.
    assert cli.main(["retry", str(path), "--pipeline", "worker.fake:factory", "--no-progress",
                     "--start-timeout", "120"]) == 0
    assert "1 done, 0 failed, 0 pending, 0 skipped" in capsys.readouterr().out
    assert {k: v["state"] for k, v in state(tmp_path / "out")["jobs"].items()} == {"good": "done", "bad": "done"}

    assert cli.main(["plan", str(path)]) == 0
    assert "2 renders, 0 to do, 2 done" in capsys.readouterr().out


def test_submit_with_everything_done_starts_no_run(tmp_path, capsys):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    publish(manifest.load(path).jobs[0], run="earlier")
    assert cli.main(["submit", str(path), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"done": 0, "failed": 0, "pending": 0, "skipped": 1}
    assert not (tmp_path / "out/.farm/test/events.jsonl").exists()  # no workers, no events


def _failing_pipeline(tmp_path: Path):
    (tmp_path / "markers").mkdir()
    return functools.partial(fakes.scripted, markers=str(tmp_path / "markers"))


def test_an_address_nobody_listens_on_fails_fast_with_a_message(tmp_path, capsys):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    assert cli.main(["submit", str(path), "--address", "127.0.0.1:1"]) == 1
    assert "error: no Ray cluster answers at 127.0.0.1:1" in capsys.readouterr().err
    # A cluster is joined (and its lock taken) before the lease and any record: nothing ran, nothing is recorded.
    assert not (tmp_path / "out" / ".farm" / "test").exists()


@pytest.mark.parametrize("flags, problem", [(["--max-workers", "0"], "at least 1, got 0"),
                                            (["--max-workers", "4", "--workers", "2"], "not allowed with argument")])
def test_max_workers_is_a_positive_count_and_excludes_workers(tmp_path, capsys, flags, problem):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["submit", str(tmp_path / "m.yaml"), *flags])
    assert problem in capsys.readouterr().err
