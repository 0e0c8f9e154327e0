"""Output templates never lead out of output.root nor into its records, for any job."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm import cli, manifest, template
from tests.farm.helpers import write_manifest

JOBS = [{"id": "a", "prompt": "x", "steps": 1}, {"id": "b", "prompt": "y", "steps": 2, "seeds": [3, 7]}]

# (template, the message of its one error at `output -> path`); the first four write outside the root, into
# .farm/, or crash a validator that checks only one sample job with steps=1
REFUSED = [
    ("{id:.>{steps}.0}/{id:.>{steps}.0}/escaped/{id}_s{seed}",
     "{id:.>{steps}.0}: format specs and conversions are not supported"),
    ("{id:/>{seed}.0}tmp/{id}", "{id:/>{seed}.0}: format specs and conversions are not supported"),
    ("{id:.>{seed}.0}farm/{id}", "{id:.>{seed}.0}: format specs and conversions are not supported"),
    ("{id}/..", "'{id}/..' leaves output.root; use a relative path such as {name}/{id}_s{seed}"),
    ("{id!r}", "{id!r}: format specs and conversions are not supported"),
    ("/tmp/{id}", "'/tmp/{id}' leaves output.root"),
    ("a/../../{id}", "'a/../../{id}' leaves output.root"),
    (".farm/x/{id}", "'.farm/x/{id}' writes into a folder named .farm/, the farm's own records"),
    ("{task}/.farm/{id}", "'{task}/.farm/{id}' writes into a folder named .farm/, the farm's own records (a folder "
                          "holding one is an output root)"),
    ("{name}/", "'{name}/' names a folder, not a file"),
    ("{id}_{", "'{id}_{' is not a template: "),
    ("{id}}", "'{id}}' is not a template: Single '}' encountered"),
    ("{0}", "unknown field {0} (use {name}, {id}, {seed}, {task}, {width}, {height}, {steps})"),
    ("{id.real}", "unknown field {id.real}"),
    ("a\tb/{id}", "holds \\t, which no file name should hold"),
]


def _errors(path: Path, capsys) -> list[str]:
    assert cli.main(["validate", str(path)]) == 1
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("text, message", [pytest.param(*case, id=case[0]) for case in REFUSED])
def test_a_template_that_could_leave_the_root_is_refused_with_its_line(tmp_path, capsys, text, message):
    path = write_manifest(tmp_path, JOBS, output={"path": text})
    err = _errors(path, capsys)
    assert err[0] == "error: 1 error in test.yaml"
    line = next(n for n, row in enumerate(path.read_text().splitlines(), 1) if row.lstrip().startswith("path:"))
    assert err[1].startswith(f"test.yaml:{line}: output -> path: ") and message in err[1], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "tmp").exists()


def test_a_folder_symlinked_out_of_the_root_is_refused_for_every_job_that_writes_there(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "test").symlink_to(tmp_path / "elsewhere")
    path = write_manifest(tmp_path, JOBS)
    err = _errors(path, capsys)
    assert err[0] == "error: 3 errors in test.yaml"
    for row, key in zip(err[1:], ["jobs[0] (id=a)", "jobs[1] (id=b)", "jobs[1] (id=b)"], strict=True):
        assert f": {key}: output path: " in row and " through the symlink " in row
        assert f"{tmp_path / 'out' / 'test'} -> {tmp_path / 'elsewhere'}, outside output.root" in row


def test_a_path_only_some_jobs_render_into_the_records_is_refused_for_those_jobs(tmp_path, capsys):
    jobs = [{"id": "m", "prompt": "x"}, {"id": "n", "prompt": "y"}]
    path = write_manifest(tmp_path, jobs, output={"path": ".far{id}/{seed}"})
    err = _errors(path, capsys)
    assert err[0] == "error: 1 error in test.yaml"
    assert ": jobs[0] (id=m): output path: " in err[1] and "the farm's own records" in err[1]


def test_plain_fields_render_every_job_inside_the_root(tmp_path):
    path = write_manifest(tmp_path, JOBS, output={"path": "{task}/{width}x{height}/{id}-{steps}_s{seed}"})
    media = sorted(Path(job.media).relative_to(tmp_path / "out").as_posix() for job in manifest.load(path).jobs)
    assert media == ["t2v/32x32/a-1_s0.mp4", "t2v/32x32/b-2_s3.mp4", "t2v/32x32/b-2_s7.mp4"]


def test_a_path_only_some_jobs_render_into_records_below_the_root_is_refused_for_those_jobs(tmp_path, capsys):
    """`.{id}` is `.farm` for the job `farm`: its file would make `t2v/` an output root whose records hold a PNG, and
    every manifest meeting `t2v/` (this one too) would be refused from then on."""
    jobs = [{"id": "farm", "prompt": "x"}, {"id": "n", "prompt": "y"}]
    path = write_manifest(tmp_path, jobs, output={"path": "{task}/.{id}/{seed}"})
    err = _errors(path, capsys)
    assert err[0] == "error: 1 error in test.yaml"
    assert ": jobs[0] (id=farm): output path: " in err[1] and f"inside {tmp_path / 'out' / 't2v' / '.farm'}, " in err[1]


def test_the_same_check_runs_at_publish(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(template.OutputPathError, match="the farm's own records"):
        template.check_target(tmp_path / "out", tmp_path / "out" / ".farm" / "x.mp4", ".farm")
