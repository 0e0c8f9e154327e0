"""A render is tied to the weights that made it: one list of a checkpoint's files for the loader and the fingerprint,
each opened as a bounded regular file, a worker that refuses weights other than the ones the driver fingerprinted,
and no output inside a checkpoint."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from cosmos3.errors import CheckpointError
from cosmos3.rules import checkpoint_header, checkpoint_identity
from farm import cli, driver, manifest, storage
from farm.errors import ManifestError
from tests.farm.helpers import (
    local_cluster,
    output_files,
    publish,
    render_and_publish,
    scale_one_tensor_in_place,
    write_manifest,
)
from worker import fake
from worker.actor import RenderWorker

SHARD = Path("transformer") / "diffusion_pytorch_model.safetensors"
JOB = [{"id": "clip", "prompt": "a red circle"}]
ROOT = Path(__file__).resolve().parents[2]


def _shard_in_subfolder(checkpoint: Path, shard: str) -> Path:
    """The transformer's weights moved to `transformer/<shard>`, named by an index's weight_map."""
    source = checkpoint / SHARD
    keys = checkpoint_header.read_header(source)
    target = checkpoint / "transformer" / shard
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(source, target)
    (checkpoint / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {key: shard for key in keys}}))
    return target


# -- one list of files: what the loader reads is what the fingerprint hashes ---------------------------------------


def test_a_shard_the_index_names_in_a_subfolder_is_part_of_the_fingerprint(tmp_path):
    path = write_manifest(tmp_path, JOB)
    shard = _shard_in_subfolder(tmp_path / "ckpt", "shards/part-1.safetensors")
    before = manifest.load(path)
    assert shard in checkpoint_header.listed_files(tmp_path / "ckpt")
    assert {t.file for t in checkpoint_header.read_tensors(tmp_path / "ckpt" / "transformer").values()} == {shard}
    for job in before.jobs:
        publish(job, run="earlier")
    scale_one_tensor_in_place(shard)
    after = manifest.load(path)
    assert after.model.fingerprint != before.model.fingerprint
    assert not any(storage.is_done(job) for job in after.jobs)  # renders of the old shard are not done


def test_a_distilled_schedules_index_is_part_of_the_fingerprint(tmp_path):
    """`modular_model_index.json` holds the sigmas a distilled checkpoint samples with: the loader reads it."""
    checkpoint = write_manifest(tmp_path, JOB).parent / "ckpt"
    before = checkpoint_identity.fingerprint(checkpoint).sha256
    (checkpoint / "modular_model_index.json").write_text(json.dumps({"distilled_sigmas": [1.0, 0.5]}))
    assert checkpoint_identity.fingerprint(checkpoint).sha256 != before


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/outside.safetensors",
                                   "shards/../../outside.safetensors"])
def test_a_shard_outside_the_transformer_folder_is_refused_by_validate_and_the_loader(tmp_path, capsys, shard):
    path = write_manifest(tmp_path, JOB)
    checkpoint = tmp_path / "ckpt"
    _shard_in_subfolder(checkpoint, "shards/part-1.safetensors")
    index = checkpoint / "transformer" / "diffusion_pytorch_model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    index.write_text(json.dumps({"weight_map": {key: shard for key in weight_map}}))

    assert cli.main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{index}: shard files outside transformer/: ['{shard}']" in err, err
    with pytest.raises(CheckpointError, match="shard files outside transformer/"):
        checkpoint_header.read_tensors(checkpoint / "transformer")


# -- every file a bounded regular file: nothing hangs validate or fills its memory --------------------------------


PLANTED = ["model_index.json", "transformer/config.json", "scheduler/scheduler_config.json",
           "text_tokenizer/tokenizer.json", "text_tokenizer/tokenizer_config.json", "vae/config.json",
           "transformer/diffusion_pytorch_model.safetensors.index.json", str(SHARD),
           "vae/diffusion_pytorch_model.safetensors", "README.md"]  # the last: the model card, which says the tasks


def _limited_memory() -> None:  # the child may not take the machine down if it reads /dev/zero whole
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("planted", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("name", PLANTED)
def test_a_fifo_or_dev_zero_in_the_checkpoint_is_refused_by_validate_naming_it(tmp_path, planted, name):
    """In a child with a time and memory limit: a farm that blocks on the FIFO or reads /dev/zero whole fails the
    test instead of hanging it."""
    path = write_manifest(tmp_path, JOB)
    target = tmp_path / "ckpt" / name
    if name.endswith(".index.json"):
        _shard_in_subfolder(tmp_path / "ckpt", "part-1.safetensors")
    target.unlink(missing_ok=True)
    os.mkfifo(target) if planted == "fifo" else target.symlink_to("/dev/zero")
    run = subprocess.run([sys.executable, "-m", "farm", "validate", str(path)], capture_output=True, text=True,
                         timeout=120, preexec_fn=_limited_memory, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1, run.stderr
    kind = "a FIFO" if planted == "fifo" else "a device"
    assert f"{target}: is {kind}, not a file of the checkpoint" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_a_json_file_larger_than_the_limit_is_refused_unread(tmp_path, capsys):
    path = write_manifest(tmp_path, JOB)
    config = tmp_path / "ckpt" / "scheduler" / "scheduler_config.json"
    with open(config, "r+b") as handle:  # sparse: 65 MiB that take no disk
        handle.truncate(65 << 20)
    assert cli.main(["validate", str(path)]) == 1
    assert f"{config}: larger than 64 MiB" in capsys.readouterr().err


def test_a_special_file_beside_the_components_files_is_refused(tmp_path, capsys):
    """The tokenizer library may read any file of its folder: one that is not a regular file is no checkpoint."""
    path = write_manifest(tmp_path, JOB)
    os.mkfifo(tmp_path / "ckpt" / "text_tokenizer" / "vocab.txt")
    assert cli.main(["validate", str(path)]) == 1
    assert "vocab.txt: is a FIFO" in capsys.readouterr().err


# -- no output inside a checkpoint --------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["ckpt/transformer/{id}", "ckpt/{id}", "alias/{id}"])
def test_a_job_path_into_a_checkpoint_inside_the_root_is_refused(tmp_path, template):
    """The root holds the checkpoint; `alias` is a folder link into it."""
    (tmp_path / "alias").symlink_to(tmp_path / "ckpt" / "vae")
    path = write_manifest(tmp_path, JOB, output={"root": ".", "path": template})
    with pytest.raises(ManifestError, match=r"output path: .* is inside the checkpoint .*ckpt; renders belong outside"):
        manifest.load(path)


def test_a_checkpoint_inside_the_root_with_outputs_beside_it_is_fine(tmp_path):
    manifest.load(write_manifest(tmp_path, JOB, output={"root": ".", "path": "renders/{id}"}))


# -- the worker checks that what it loaded is what the driver fingerprinted ---------------------------------------


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(num_gpus=1, num_cpus=2):
        yield


def _worker(m: manifest.Manifest, factory=fake.factory):
    origin = {"run": "run-1", "path": "/m.yaml", "sha256": "abc", "name": "test", "root": m.output_root}
    Path(m.output_root).mkdir(exist_ok=True)
    return ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0).remote(m.model, factory, origin, 0)


def test_a_worker_refuses_weights_changed_since_the_driver_fingerprinted_them(cluster, tmp_path):
    m = manifest.load(write_manifest(tmp_path, JOB))
    scale_one_tensor_in_place(tmp_path / "ckpt" / SHARD)
    worker = _worker(m)
    with pytest.raises(ray.exceptions.ActorDiedError, match=r"changed since farm submit fingerprinted it \("
                                                            r"transformer/diffusion_pytorch_model.safetensors differ"):
        ray.get(worker.ready.remote())
    assert output_files(tmp_path / "out") == []


def test_a_worker_keeps_the_weights_it_loaded_and_one_started_after_a_change_refuses_the_new_ones(cluster, tmp_path):
    """A restart mid-run (after a job's timeout, a lost node) loads the files as they are then: refused."""
    m = manifest.load(write_manifest(tmp_path, JOB))
    worker = _worker(m)
    try:
        ray.get(worker.ready.remote())
        scale_one_tensor_in_place(tmp_path / "ckpt" / SHARD)  # after its load: its weights are the fingerprinted ones
        render_and_publish(worker, m.jobs[0])
    finally:
        ray.kill(worker)
    assert storage.is_done(m.jobs[0])
    restarted = _worker(m)
    with pytest.raises(ray.exceptions.ActorDiedError, match="changed since farm submit fingerprinted it"):
        ray.get(restarted.ready.remote())


def test_weights_changed_while_a_worker_loads_are_refused(cluster, tmp_path):
    """The change lands between the worker's look at the files and the end of its load (the renderer's build)."""
    m = manifest.load(write_manifest(tmp_path, JOB))
    shard = tmp_path / "ckpt" / SHARD

    def changing_factory(model, gpu):
        renderer = fake.factory(model, gpu)
        scale_one_tensor_in_place(shard)
        return renderer

    worker = _worker(m, changing_factory)
    with pytest.raises(ray.exceptions.ActorDiedError, match="changed since farm submit fingerprinted it"):
        ray.get(worker.ready.remote())


def test_a_touched_checkpoint_of_the_same_bytes_still_renders_and_the_sidecar_names_the_fingerprint(cluster, tmp_path):
    m = manifest.load(write_manifest(tmp_path, JOB))
    worker = _worker(m)
    try:
        ray.get(worker.ready.remote())
        os.utime(tmp_path / "ckpt" / SHARD)  # another mtime and ctime, the same bytes
        render_and_publish(worker, m.jobs[0])
    finally:
        ray.kill(worker)
    job = m.jobs[0]
    assert storage.is_done(job)
    assert storage.read_sidecar(job.media)["checkpoint"] == {"path": m.model.checkpoint,
                                                             "fingerprint": m.model.fingerprint}


def test_a_run_whose_checkpoint_changed_after_validation_publishes_nothing_and_says_why(tmp_path):
    """The driver fingerprinted the old weights; every worker finds others, so no render is published under the
    old weights' config hash (after a rollback it would count done with bytes of other weights)."""
    m = manifest.load(write_manifest(tmp_path, JOB))
    scale_one_tensor_in_place(tmp_path / "ckpt" / SHARD)
    report = driver.submit(m, driver.SubmitOptions(workers=1, factory=fake.factory, progress=False))
    assert not report.ok and output_files(tmp_path / "out") == []
    events = (tmp_path / "out" / ".farm" / "test" / "events.jsonl").read_text()
    assert "changed since farm submit fingerprinted it" in events
    scale_one_tensor_in_place(tmp_path / "ckpt" / SHARD)  # rolled back: the fingerprinted weights again
    assert not any(storage.is_done(job) for job in m.jobs)


def test_a_sidecar_written_before_the_fingerprint_identity_still_counts_done(tmp_path, capsys):
    """Its `checkpoint` holds the old identity (`sha256` of the config and index): only the config hash decides."""
    path = write_manifest(tmp_path, JOB)
    job = manifest.load(path).jobs[0]
    media = storage.publish(Path(job.media), lambda out: out.write(b"an earlier render"))
    storage.write_json(storage.sidecar_path(job.media), storage.sidecar_record(
        job, "earlier", 1, media, checkpoint={"path": "/ckpt", "sha256": "0" * 64}))
    assert cli.main(["plan", str(path)]) == 0
    assert "1 renders, 0 to do, 1 done" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["transformer/config.json", "vae/diffusion_pytorch_model.safetensors"])
def test_a_checkpoint_json_nested_too_deep_is_refused_naming_it(tmp_path, capsys, name):
    """A config or a safetensors header of `[[[[...` 100,000 deep: inside every size bound, deeper than Python's
    decoder recurses."""
    path = write_manifest(tmp_path, JOB)
    target = tmp_path / "ckpt" / name
    nested = b"[" * 100_000 + b"]" * 100_000
    target.write_bytes(len(nested).to_bytes(8, "little") + nested if name.endswith(".safetensors") else nested)
    assert cli.main(["validate", str(path)]) == 1
    assert str(target) in capsys.readouterr().err
