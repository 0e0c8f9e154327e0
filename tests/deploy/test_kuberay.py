"""The KubeRay recipe in docs/deploy/ agrees with itself and with the farm: GPUs per pod, the shared volume's path,
the token on every pod, the image's Ray and entry point, and a RayJob entrypoint our CLI accepts.

No Kubernetes runs here: these are the checks a cluster would otherwise fail late on (a pod with 8 GPUs that Ray
thinks has 4, a manifest whose root is off the shared volume, a node refused for want of the token).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from farm import cli, manifest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"
TOY = REPO / "checkpoints" / "toy" / "bf16"


def _load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.fixture(scope="module")
def cluster() -> dict:
    return _load("raycluster.yaml")


@pytest.fixture(scope="module")
def job() -> dict:
    return _load("rayjob.yaml")


def _groups(cluster: dict) -> list[tuple[dict, dict]]:
    """(rayStartParams, pod spec) of the head and of each worker group."""
    spec = cluster["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [(group["rayStartParams"], group["template"]["spec"]) for group in groups]


def _pods(cluster: dict, job: dict) -> list[dict]:
    """Every pod spec the recipe makes: head, worker groups, and the RayJob's submitter."""
    return [pod for _, pod in _groups(cluster)] + [job["spec"]["submitterPodTemplate"]["spec"]]


def _mounts(pod: dict) -> dict[str, str]:
    """Persistent volume claim -> the path the pod's Ray container mounts it at."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", [])
              if "persistentVolumeClaim" in v}
    return {claims[m["name"]]: m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])
            if m["name"] in claims}


def _entrypoint(job: dict) -> list[str]:
    return shlex.split(job["spec"]["entrypoint"])


def _share_path(cluster: dict) -> Path:
    (path,) = set(_mounts(_groups(cluster)[0][1]).values())
    return Path(path)


def test_each_pod_offers_ray_exactly_the_gpus_kubernetes_gives_it(cluster):
    for params, pod in _groups(cluster):
        (container,) = pod["containers"]
        resources = container["resources"]
        gpus = int(resources.get("limits", {}).get("nvidia.com/gpu", 0))
        assert int(params["num-gpus"]) == gpus, container["name"]
        assert int(resources.get("requests", {}).get("nvidia.com/gpu", gpus)) == gpus
    workers = cluster["spec"]["workerGroupSpecs"]
    assert workers and all(int(group["rayStartParams"]["num-gpus"]) == 8 for group in workers)
    assert int(cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"]) == 0  # no render on the head


def test_every_pod_mounts_the_shared_claim_at_one_path(cluster):
    claim = _load("share.yaml")
    assert claim["kind"] == "PersistentVolumeClaim" and "ReadWriteMany" in claim["spec"]["accessModes"]
    mounts = [_mounts(pod) for _, pod in _groups(cluster)]
    assert all(m == {claim["metadata"]["name"]: str(_share_path(cluster))} for m in mounts), mounts


def test_every_pod_carries_token_auth_from_one_secret(cluster, job):
    for pod in _pods(cluster, job):
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "cosmos3-farm-ray-token",
                                                                       "key": "auth_token"}


def test_every_pod_runs_the_image_of_the_dockerfile_with_the_clusters_ray(cluster, job):
    images = {pod["containers"][0]["image"] for pod in _pods(cluster, job)}
    assert len(images) == 1
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.findall(r"^ARG RAY=(\S+)$", dockerfile, re.M) == [cluster["spec"]["rayVersion"]]
    assert '"ray[default]==${RAY}"' in dockerfile


def test_the_image_builds_the_wheel_with_kernels_and_runs_the_cli():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    (script,) = re.findall(r"^RUN PYTHON=python (\S+) /wheels$", dockerfile, re.M)
    assert (REPO / script).is_file()
    assert "pip install --no-cache-dir /wheels/cosmos3_farm-*.whl" in dockerfile
    (entry,) = re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.M)
    assert yaml.safe_load(entry) == ["python", "-m", "farm"]


def test_the_rayjob_runs_farm_submit_on_the_cluster_with_options_the_cli_accepts(cluster, job):
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    argv = _entrypoint(job)
    assert argv[:4] == ["python", "-m", "farm", "submit"]
    args = cli.build_parser().parse_args(argv[3:])
    assert args.func is cli.do_submit and args.wait  # a second job of the manifest waits rather than fails


def test_the_manifest_lies_on_the_shared_volume_and_writes_there(cluster, job):
    share = _share_path(cluster)
    submitted = Path(_entrypoint(job)[4])
    doc = _load(submitted.name)  # the docs' copy of what the user puts on the volume
    assert submitted.is_relative_to(share)
    assert Path(doc["output"]["root"]).is_relative_to(share)
    assert Path(doc["model"]["checkpoint"]).is_relative_to(share)


def test_the_manifest_validates_with_a_checkpoint_and_root_that_exist_here(tmp_path):
    doc = _load("city.yaml")
    doc["model"]["checkpoint"], doc["output"]["root"] = str(TOY), str(tmp_path / "renders")
    path = tmp_path / "city.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = manifest.load(path)
    assert [job.key for job in loaded.jobs] == [j["id"] for j in _load("city.yaml")["jobs"]]
