"""Command-line input the farm refuses before it starts anything, and output into a pipe that closed (issue 49)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm import cli, lease, records
from tests.farm.helpers import write_manifest

REPO = Path(__file__).parents[2]

BAD_OPTIONS = [
    pytest.param(["--workers", "-1"], "argument --workers: must be at least 1, got -1", id="workers-negative"),
    pytest.param(["--workers", "0"], "argument --workers: must be at least 1, got 0", id="workers-zero"),
    pytest.param(["--workers", "two"], "argument --workers: 'two' is not a whole number", id="workers-word"),
    pytest.param(["--init-failures", "0"], "argument --init-failures: must be at least 1, got 0", id="init-failures"),
    pytest.param(["--start-timeout", "nan"], "argument --start-timeout: must be a finite number of seconds above 0, "
                 "got nan", id="start-timeout-nan"),
    pytest.param(["--start-timeout", "inf"], "must be a finite number of seconds above 0, got inf",
                 id="start-timeout-inf"),
    pytest.param(["--start-timeout", "-5"], "must be a finite number of seconds above 0, got -5",
                 id="start-timeout-negative"),
]


@pytest.mark.parametrize("options,message", BAD_OPTIONS)
@pytest.mark.parametrize("command", ["submit", "retry"])
def test_a_bad_run_option_is_refused_with_a_message(tmp_path, capsys, command, options, message):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    with pytest.raises(SystemExit) as exited:
        cli.main([command, str(path), *options])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_plan_into_a_closed_pipe_exits_quietly(tmp_path):
    """`farm plan m.yaml | head -1`: the reader is gone before the table is written; no BrokenPipeError traceback."""
    path = write_manifest(tmp_path, [{"id": f"job{i}", "prompt": "x"} for i in range(50)])
    read, write = os.pipe()
    os.close(read)  # the reader has gone: every write to the pipe fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "farm", "plan", str(path)], cwd=REPO, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")


def test_retry_while_a_submit_renders_the_manifest_names_that_driver(tmp_path, capsys):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    (tmp_path / "out").mkdir()
    where = records.path(tmp_path / "out", "test", lease.LEASE_FILE)
    held = lease.acquire(where, lease.Owner.this_process("run-1", str(path)))
    try:
        assert cli.main(["retry", str(path)]) == 1
    finally:
        held.release()
    err = capsys.readouterr().err
    assert err.startswith(f"error: test in {tmp_path / 'out'} is being rendered by run run-1 (pid {os.getpid()} on ")


def test_status_given_a_manifest_says_it_takes_an_output_root(tmp_path, capsys):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    assert cli.main(["status", str(path)]) == 1
    assert "farm status takes an output root (a manifest's output.root), not a file" in capsys.readouterr().err
