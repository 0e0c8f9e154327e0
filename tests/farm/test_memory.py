"""GPU memory planned before anything starts: `farm plan` shows it, `--gpu-memory` refuses what no GPU holds, a worker
refuses a GPU too small, and on a cluster whose nodes name their GPU memory two models render side by side, each
only where it fits (fake GPUs of two sizes, fake renderers)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3.rules.memory_plan import DEVICE_OVERHEAD, GIB
from farm import cli, memory
from farm import manifest as manifests
from farm.errors import FarmError, WorkerConfigError
from farm.job import PlannedMemory
from tests.farm.helpers import write_manifest
from worker.gpu import refuse_small_gpu

REPO = Path(__file__).parents[2]
# A clip of 33 frames at 1024x1024 is 9,216 GEN tokens a pass: on Super's widths its steps take 1.66 GiB (5.7 GiB
# with the device's overhead: more than a 5 GiB GPU, even with the decode tiled), on the test checkpoint's own
# (Nano's intermediate size) 0.74 GiB. The defaults' 32x32 clips need little beyond the overhead (~4.0 GiB).
BIG = {"size": [1024, 1024], "frames": 33}
SUPER_WIDTHS = {"hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64}


def super_manifest(folder: Path, jobs: list[dict], **kwargs) -> Path:
    """`write_manifest`'s manifest, its checkpoint's config given Super's widths (the weights stay tiny)."""
    path = write_manifest(folder, jobs, **kwargs)
    config = folder / "ckpt" / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **SUPER_WIDTHS}))
    return path


def test_plan_shows_each_jobs_need_and_refuses_what_a_smaller_gpu_cannot_hold(tmp_path, capsys):
    path = super_manifest(tmp_path, [{"id": "small", "prompt": "a"}, {"id": "big", "prompt": "b", **BIG}])
    assert cli.main(["plan", str(path), "--output", "json"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)["jobs"]}
    assert rows["small"]["gpu_gib"] == pytest.approx(DEVICE_OVERHEAD / GIB, abs=0.1)
    assert rows["big"]["gpu_gib"] > rows["small"]["gpu_gib"] + 1

    assert cli.main(["plan", str(path), "--gpu-memory", "5"]) == 1
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "the largest job, big, needs" in out and "1 job(s) need more than --gpu-memory 5 GiB: big" in out


def test_submit_refuses_a_job_no_gpu_holds_before_anything_starts(tmp_path, capsys):
    path = super_manifest(tmp_path, [{"id": "small", "prompt": "a"}, {"id": "big", "prompt": "b", **BIG}])
    code = cli.main(["submit", str(path), "--gpu-memory", "5", "--pipeline", "worker.fake:factory"])
    err = capsys.readouterr().err
    assert code == 1
    assert "1 job(s) need more GPU memory than --gpu-memory 5 has (5.0 GiB)" in err
    assert "  big: needs 6.6 GiB (2.6 GiB peak: steps 2.6, tiled decode" in err
    assert not (tmp_path / "out" / ".farm").exists()  # no lease, no records, no cluster


def test_a_worker_refuses_a_gpu_too_small_naming_its_memory_the_need_and_the_job():
    planned = PlannedMemory(80 * GIB, "clip", "80.0 GiB (76.0 GiB peak: ...)")
    with pytest.raises(WorkerConfigError) as refused:
        refuse_small_gpu("NVIDIA H100 80GB HBM3", 85_031_714_816, planned)
    assert str(refused.value).startswith("this GPU (NVIDIA H100 80GB HBM3, 79.2 GiB) cannot hold job clip of this "
                                         "manifest, which needs 80.0 GiB (76.0 GiB peak")
    refuse_small_gpu("NVIDIA H200", 150_754_820_096, planned)  # room: no error


def test_memory_classes_come_from_the_nodes_and_fit_the_largest_job(tmp_path):
    nodes = [{"Alive": True, "Resources": {"GPU": 2.0, "gpu_memory_gib:5": 1.0}},
             {"Alive": True, "Resources": {"GPU": 1.0, "gpu_memory_gib:12": 1.0}},
             {"Alive": False, "Resources": {"GPU": 8.0, "gpu_memory_gib:180": 1.0}},
             {"Alive": True, "Resources": {"GPU": 4.0}}]
    classes = memory.memory_classes(nodes)
    assert classes == {5: 2, 12: 1}
    small = manifests.load(write_manifest(tmp_path / "s", [{"id": "a", "prompt": "a", **BIG}]))  # Nano's widths
    big = manifests.load(super_manifest(tmp_path / "b", [{"id": "a", "prompt": "a", **BIG}]))
    assert memory.eligible_classes(memory.plan_manifest(small, 0), classes) == {"gpu_memory_gib:5": 2,
                                                                                "gpu_memory_gib:12": 1}
    assert memory.eligible_classes(memory.plan_manifest(big, 0), classes) == {"gpu_memory_gib:12": 1}
    with pytest.raises(FarmError, match=r"need more GPU memory than the cluster's largest GPUs \(gpu_memory_gib:5\)"):
        memory.eligible_classes(memory.plan_manifest(big, 0), {5: 2})


def _nodes_of(root: Path, name: str) -> set[str]:
    return {json.loads(p.read_text())["worker"]["node"] for p in (root / name).glob("*.json")}


@pytest.mark.slow
def test_two_models_on_one_cluster_both_finish_and_the_larger_only_on_gpus_that_hold_it(nodes, tmp_path):
    """One node has a 12 GiB GPU, the other two 5 GiB GPUs: the Super-wide manifest's workers go to the first only,
    the Nano-wide one's anywhere; both are submitted at once and both finish."""
    nodes.start_head()
    large = nodes.add_node("large", gpus=1, cpus=2, resources={"gpu_memory_gib:12": 1})
    small = nodes.add_node("small", gpus=2, cpus=2, resources={"gpu_memory_gib:5": 1})
    # ~1 s a job (100 fake steps): long enough for every worker to start before the queue drains
    nano = write_manifest(tmp_path / "nano", [{"id": f"s{i}", "prompt": f"shot {i}"} for i in range(8)], name="nano",
                          defaults={"steps": 100})
    wide = super_manifest(tmp_path / "super", [{"id": f"b{i}", "prompt": f"shot {i}", **BIG} for i in range(2)],
                          name="super")
    command = [sys.executable, "-m", "farm", "submit", "--address", nodes.address, "--pipeline", "worker.fake:factory",
               "--no-progress", "--start-timeout", "120"]
    runs = [subprocess.Popen([*command, str(path)], cwd=REPO, env=nodes.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for path in (nano, wide)]
    try:
        results = [run.communicate(timeout=300) for run in runs]
    finally:
        for run in runs:
            run.kill()
    for run, (_, err) in zip(runs, results, strict=True):
        assert run.returncode == 0, err[-3000:]
    assert _nodes_of(tmp_path / "super" / "out", "super") == {large.node_id()}
    assert small.node_id() in _nodes_of(tmp_path / "nano" / "out", "nano")
    assert len(list((tmp_path / "nano" / "out" / "nano").glob("*.mp4"))) == 8
    assert len(list((tmp_path / "super" / "out" / "super").glob("*.mp4"))) == 2


@pytest.mark.gpu
def test_a_worker_reads_its_gpus_memory_through_nvml_and_refuses_a_need_above_it():
    import pynvml

    from worker.gpu import check_gpu_memory

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    total, name = pynvml.nvmlDeviceGetMemoryInfo(handle).total, pynvml.nvmlDeviceGetName(handle)
    name = name if isinstance(name, str) else name.decode()
    check_gpu_memory("0", PlannedMemory(total, "fits", "all of it"))  # exactly the GPU's memory: accepted
    refusal = rf"this GPU \({re.escape(name)}, {total / GIB:.1f} GiB\) cannot hold job big of this manifest"
    with pytest.raises(WorkerConfigError, match=refusal):
        check_gpu_memory("0", PlannedMemory(total + 1, "big", "one byte more"))
