"""The KubeRay recipe in docs/deploy/ behaves as KubeRay's operator runs it, and agrees with itself and the farm.

No Kubernetes runs here. These are the checks a cluster would otherwise fail late on, each from what KubeRay's
operator (v1.7.0, `ray-operator/controllers/ray/`) does with the documents:
- the token reaches the operator itself only through `spec.authOptions` (it then also sets it on the head,
  the workers, the autoscaler and the RayJob's submitter): a token set by hand leaves the operator's job-status
  polls unauthenticated, and the RayJob is marked Failed while the render goes on;
- `minReplicas`/`maxReplicas` change nothing without `enableInTreeAutoscaling`, and the farm asks the autoscaler
  for exactly the GPUs the groups can grow to (`--max-workers`);
- the operator sizes `/dev/shm` to the container's memory; a pod's own smaller one leaves Ray's object store on
  disk unless `object-store-memory` fits it;
- GPU pods land on GPU nodes, every pod says how much node disk it writes, every pod runs as the image's non-root
  user, the Prometheus operator's PodMonitor finds the cluster's pods on the port KubeRay names `metrics`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from farm import cli, manifest
from tests.deploy.image import final_stage_user

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"
TOY = REPO / "checkpoints" / "toy" / "bf16"
SECRET, SECRET_KEY = "cosmos3-farm-ray-token", "auth_token"  # KubeRay reads the token under this key
AUTH_VARIABLES = {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"}
KUBERAY_MIN_RAY_FOR_TOKEN_AUTH = Version("2.52.0")  # the operator refuses authOptions.mode token below it
SHM = "/dev/shm"


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


def _containers(cluster: dict, job: dict) -> list[dict]:
    return [container for pod in _pods(cluster, job) for container in pod["containers"]]


def _mounts(pod: dict) -> dict[str, str]:
    """Persistent volume claim -> the path the pod's Ray container mounts it at."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", [])
              if "persistentVolumeClaim" in v}
    return {claims[m["name"]]: m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])
            if m["name"] in claims}


def _entrypoint(job: dict) -> list[str]:
    return shlex.split(job["spec"]["entrypoint"])


def _submit_args(job: dict):
    return cli.build_parser().parse_args(_entrypoint(job)[3:])


def _share_path(cluster: dict) -> Path:
    (path,) = set(_mounts(_groups(cluster)[0][1]).values())
    return Path(path)


def _gpus(params: dict) -> int:
    return int(params.get("num-gpus", 0))


def _quantity(text: str) -> float:
    """A Kubernetes quantity in bytes (the binary and decimal suffixes the recipe uses)."""
    number, suffix = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text)).groups()
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return float(number) * scale[suffix]


def test_each_pod_offers_ray_exactly_the_gpus_kubernetes_gives_it(cluster):
    for params, pod in _groups(cluster):
        (container,) = pod["containers"]
        resources = container["resources"]
        gpus = int(resources.get("limits", {}).get("nvidia.com/gpu", 0))
        assert _gpus(params) == gpus, container["name"]
        assert int(resources.get("requests", {}).get("nvidia.com/gpu", gpus)) == gpus
    workers = cluster["spec"]["workerGroupSpecs"]
    assert workers and all(_gpus(group["rayStartParams"]) == 8 for group in workers)
    assert _gpus(cluster["spec"]["headGroupSpec"]["rayStartParams"]) == 0  # no render on the head


def test_token_auth_is_kuberays_authoptions_with_the_secret_and_no_pod_sets_it_by_hand(cluster, job):
    """With authOptions the operator authenticates its own dashboard calls (the RayJob's status polls) and puts
    the token on every container it makes; a variable set by hand wins over the operator's (it adds its own
    only where the name is missing), so none may be."""
    assert cluster["spec"].get("authOptions") == {"mode": "token", "secretName": SECRET}
    assert Version(cluster["spec"]["rayVersion"]) >= KUBERAY_MIN_RAY_FOR_TOKEN_AUTH
    for container in _containers(cluster, job):
        hand_set = {e["name"] for e in container.get("env", [])} & AUTH_VARIABLES
        assert not hand_set, f"{container['name']} sets {sorted(hand_set)}: leave them to authOptions"
    readme = (DEPLOY / "README.md").read_text()
    assert f"kubectl create secret generic {SECRET} --from-literal={SECRET_KEY}=" in readme


def test_groups_whose_replicas_can_change_are_autoscaled_and_the_farm_asks_for_all_their_gpus(cluster, job):
    spec = cluster["spec"]
    scaled = [g for g in spec["workerGroupSpecs"] if g.get("minReplicas", 0) != g.get("maxReplicas", 0)]
    assert scaled, "no worker group can grow with the queue"
    assert spec.get("enableInTreeAutoscaling") is True, "min/maxReplicas do nothing without the autoscaler"
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
    args = _submit_args(job)
    most = sum(g["maxReplicas"] * _gpus(g["rayStartParams"]) for g in spec["workerGroupSpecs"])
    assert args.max_workers == most, "--max-workers must ask for every GPU the worker groups can grow to"
    assert args.workers is None


def test_the_object_store_fits_its_shared_memory(cluster):
    """KubeRay mounts its own /dev/shm sized to the container's memory; a pod that mounts a smaller one must cap
    Ray's object store (30% of memory by default) to fit it, or Ray puts the store on disk."""
    for params, pod in _groups(cluster):
        (container,) = pod["containers"]
        shm = [m["name"] for m in container.get("volumeMounts", []) if m["mountPath"] == SHM]
        if not shm:
            continue  # the operator's /dev/shm, as large as the pod's memory
        (volume,) = [v for v in pod["volumes"] if v["name"] == shm[0]]
        size = volume.get("emptyDir", {}).get("sizeLimit")
        assert "object-store-memory" in params, f"{container['name']}: own {SHM} without object-store-memory"
        assert size is None or int(params["object-store-memory"]) <= _quantity(size), container["name"]


def test_gpu_pods_select_gpu_nodes_and_every_pod_requests_its_node_disk(cluster, job):
    for params, pod in _groups(cluster):
        if _gpus(params):
            assert pod.get("nodeSelector"), f"{pod['containers'][0]['name']}: no nodeSelector for GPU nodes"
    for container in _containers(cluster, job):
        requests = container["resources"].get("requests", {})
        assert "ephemeral-storage" in requests, f"{container['name']}: Ray's logs and spills go to node disk"


def test_every_pod_runs_as_the_images_non_root_user(cluster, job):
    uid, _ = final_stage_user()
    assert uid != 0
    for pod in _pods(cluster, job):
        context = pod.get("securityContext", {})
        assert context.get("runAsNonRoot") is True and context.get("runAsUser") == uid, pod["containers"][0]["name"]
    autoscaler = cluster["spec"].get("autoscalerOptions", {}).get("securityContext", {})
    assert autoscaler.get("runAsNonRoot") is True  # the sidecar KubeRay adds to the head pod


def test_every_pod_runs_one_image_by_a_tag_of_its_own(cluster, job):
    """One image everywhere (its Ray is the cluster's rayVersion: test_image.py), by a tag that names one build:
    a reused tag under IfNotPresent leaves each node on whichever build it pulled first."""
    images = {container["image"] for container in _containers(cluster, job)}
    assert len(images) == 1
    (image,) = images
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    assert tag and tag != "latest", f"{image}: tag each build once (README.md, image tags)"


def test_every_pod_mounts_the_shared_claim_at_one_path(cluster):
    claim = _load("share.yaml")
    assert claim["kind"] == "PersistentVolumeClaim" and "ReadWriteMany" in claim["spec"]["accessModes"]
    mounts = [_mounts(pod) for _, pod in _groups(cluster)]
    assert all(m == {claim["metadata"]["name"]: str(_share_path(cluster))} for m in mounts), mounts


def test_the_rayjob_runs_farm_submit_on_the_cluster_with_options_the_cli_accepts(cluster, job):
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    argv = _entrypoint(job)
    assert argv[:4] == ["python", "-m", "farm", "submit"]
    args = _submit_args(job)
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


def test_the_podmonitor_scrapes_the_clusters_pods_on_kuberays_metrics_port(cluster):
    monitors = [d for d in yaml.safe_load_all((DEPLOY / "podmonitor.yaml").read_text()) if d]
    assert [m["kind"] for m in monitors] == ["PodMonitor"]
    spec = monitors[0]["spec"]
    assert spec["selector"]["matchLabels"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"  # the container port KubeRay adds (metrics-export-port 8080)
    relabel = [r for r in endpoint.get("relabelings", []) if r.get("targetLabel") == "ray_io_cluster"]
    assert relabel and relabel[0]["sourceLabels"] == ["__meta_kubernetes_pod_label_ray_io_cluster"]
