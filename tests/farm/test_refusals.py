"""A job the model refuses fails at once, with its whole message, and costs its worker nothing.

A validated manifest cannot produce such jobs (`farm validate` runs the same cosmos3 rules), so the test
builds a good manifest and then puts bad requests into four of its jobs, as a worker would meet them if
the checkpoint changed under a validated manifest. The fake pipeline refuses them with cosmos3's own
`resolve`, exactly as Cosmos3Pipeline does.
"""

from __future__ import annotations

import dataclasses

import pytest

from cosmos3.errors import PipelineError
from cosmos3.rules.request import RequestRules, resolve
from farm import cli, driver, manifest
from tests.farm.helpers import events, local_cluster, output_files, state, write_manifest
from worker import fake

BAD = {  # job id -> what goes wrong in its request
    "seed-past-int64": {"seed": 2**63},
    "i2v-one-frame": {"task": "i2v", "frames": 1, "image": "INPUT"},
    "v2v-five-frames": {"task": "v2v", "frames": 5, "video": "INPUT"},
    "nan-guidance-and-odd-width": {"guidance": float("nan"), "width": 40},  # two problems: a two-line message
}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    with local_cluster(num_gpus=0, num_cpus=2):  # CPU workers, as on a laptop
        yield


def _expected_error(request, rules: RequestRules) -> str:
    with pytest.raises(PipelineError) as caught:
        resolve(request, rules)
    return f"PipelineError: {caught.value}"


def test_refused_jobs_fail_at_once_with_their_whole_message_and_the_worker_renders_the_rest(tmp_path):
    jobs = [{"id": key, "prompt": "a red circle", "priority": 10} for key in BAD]
    jobs += [{"id": "good-clip", "prompt": "a blue square"}, {"id": "good-still", "task": "t2i", "prompt": "a dot"}]
    m = manifest.load(write_manifest(tmp_path, jobs))  # retries: 2 for every job
    bad_jobs = []
    for job in m.jobs:
        if job.key in BAD:
            changes = {k: (str(tmp_path / "test.yaml") if v == "INPUT" else v) for k, v in BAD[job.key].items()}
            job = dataclasses.replace(job, request=dataclasses.replace(job.request, **changes))
        bad_jobs.append(job)
    m = dataclasses.replace(m, jobs=tuple(bad_jobs))
    rules = RequestRules.from_checkpoint(m.model.checkpoint)
    expected = {job.key: _expected_error(job.request, rules) for job in m.jobs if job.key in BAD}
    assert "\n" in expected["nan-guidance-and-odd-width"]

    report = driver.submit(m, driver.SubmitOptions(workers=1, factory=fake.factory, progress=False))
    root = tmp_path / "out"
    log = events(root)

    assert report.counts == {"done": 2, "failed": 4, "pending": 0, "skipped": 0}
    assert output_files(root) == ["test/good-clip_s0.mp4", "test/good-clip_s0.mp4.json",
                                  "test/good-still_s0.png", "test/good-still_s0.png.json"]
    for key, error in expected.items():
        assert (report.outcomes[key].state, report.outcomes[key].attempts) == ("failed", 1)  # no retries
        assert report.outcomes[key].error == error
        assert state(root)["jobs"][key]["error"] == error  # the failure record: there is no sidecar
        assert [e["error"] for e in log if e["event"] == "job_failed" and e["key"] == key] == [error]
    assert not [e for e in log if e["event"] in ("job_retry", "worker_retired", "worker_lost")]
    assert len({e["slot"] for e in log if e["event"] == "job_started"}) == 1

    summary = cli._report_result(report).text
    for key, error in expected.items():
        assert f"  {key} (failed, 1 attempts): " + error.replace("\n", "\n    ") in summary
