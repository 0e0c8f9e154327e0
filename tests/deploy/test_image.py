"""The node image (docs/deploy/Dockerfile): what goes into its build, what it installs, who it runs as.

No image is built here (no Docker in CI); these check the Dockerfile, its ignore file and the pins against what
Docker and pip do with them: the build context is what docker-py's implementation of the .dockerignore rules
leaves (the rules Docker applies), the pins are checked against every requirement that names them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from docker.utils.build import exclude_paths
from packaging.utils import canonicalize_name

from tests.deploy import pins
from tests.deploy.image import final_stage_user, stages

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"
# BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile before the context's own .dockerignore.
IGNORE = DEPLOY / "Dockerfile.dockerignore"
KUBERAY_UID = 1000  # the user KubeRay's own images (rayproject/ray) run as
# What must stay out of the build context: gigabytes of venv, history, weights and outputs, and stale builds
# whose compiled kernels would otherwise end up in the wheel.
LEFT_OUT = [".venv/bin/python", ".git/HEAD", "checkpoints/toy/fp8/transformer/model.safetensors",
            "renders/demo/t2i/a.png", "build/lib/cosmos3/ops/_cuda_ops.so", "dist/cosmos3_farm-0.1.0.whl",
            "cosmos3/ops/_cuda_ops.cpython-312-x86_64-linux-gnu.so", "cosmos3/ops/_cuda_ops_build.json",
            "farm/__pycache__/cli.cpython-311.pyc", "cosmos3_farm.egg-info/PKG-INFO", "tests/farm/test_cli.py"]


def _runs(stage: list[tuple[str, str]]) -> list[str]:
    return [arguments for instruction, arguments in stage if instruction == "RUN"]


def _pip_installs(stage) -> list[str]:
    return [part.strip() for run in _runs(stage) for part in run.split("&&") if "pip install" in part]


def _context_needs() -> list[str]:
    """Every file the wheel build reads: the packaging files and the packages' tracked source."""
    needed = ["pyproject.toml", "setup.py", "scripts/build_wheel.sh", "docs/deploy/constraints.txt"]
    for package in ("farm", "worker", "cosmos3", "toy"):
        needed += [str(p.relative_to(REPO)) for p in (REPO / package).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".so", ".pyc")
                   and p.name != "_cuda_ops_build.json"]
    return needed


def test_the_image_builds_the_wheel_with_kernels_and_runs_the_cli():
    build, final = stages()[0], stages()[-1]
    (script,) = [m for run in _runs(build) for m in re.findall(r"PYTHON=python (\S+) /wheels", run)]
    assert (REPO / script).is_file()
    assert any("/wheels/cosmos3_farm-*.whl" in install for install in _pip_installs(final))
    (entry,) = [arguments for instruction, arguments in final if instruction == "ENTRYPOINT"]
    assert yaml.safe_load(entry) == ["python", "-m", "farm"]


def test_the_image_runs_as_kuberays_non_root_uid_in_a_workdir_off_the_shared_volume():
    assert final_stage_user()[0] == KUBERAY_UID
    cluster = yaml.safe_load((DEPLOY / "raycluster.yaml").read_text())
    share = {m["mountPath"] for m in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
             ["volumeMounts"]}
    workdirs = [arguments for instruction, arguments in stages()[-1] if instruction == "WORKDIR"]
    assert workdirs and not any(Path(workdirs[-1]).is_relative_to(m) for m in share), workdirs


@pytest.mark.parametrize("stage", [0, -1], ids=["build", "final"])
def test_every_pip_install_of_the_image_takes_the_pinned_constraints(stage):
    installs = _pip_installs(stages()[stage])
    assert installs
    for install in installs:
        assert re.search(r"(-c|--constraint) /\S*constraints\.txt", install), install
    copies = [arguments for instruction, arguments in stages()[stage] if instruction == "COPY"]
    assert any(c.startswith("docs/deploy/constraints.txt ") for c in copies), copies


def test_the_constraints_pin_every_package_the_image_installs_once():
    pinned = pins.read()
    needed = set(pins.closure(pinned)) - pins.UNPINNED
    assert sorted(needed - set(pinned)) == [], "unpinned: regenerate with `python -m tests.deploy.pins`"
    assert sorted(set(pinned) - set(pins.closure())) == [], "pinned but never installed"
    assert not pins.UNPINNED & set(pinned)


def test_every_pin_satisfies_each_requirement_that_names_it():
    pinned = pins.read()
    wrong = [f"{name}=={pinned[name]} vs {req}" for name, reqs in pins.closure(pinned).items() for req in reqs
             if name in pinned and not req.specifier.contains(pinned[name], prereleases=True)]
    assert wrong == []


def test_the_clusters_ray_is_the_pinned_ray():
    cluster = yaml.safe_load((DEPLOY / "raycluster.yaml").read_text())
    assert pins.read()[canonicalize_name("ray")] == cluster["spec"]["rayVersion"]


def test_the_build_context_leaves_out_venv_git_checkpoints_renders_and_builds(tmp_path):
    """docker-py applies Docker's .dockerignore rules to a context holding each kind of file."""
    for name in LEFT_OUT + _context_needs():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    patterns = [line.strip() for line in IGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sent = set(exclude_paths(str(tmp_path), patterns))
    assert sorted(set(LEFT_OUT) & sent) == []
    assert sorted(set(_context_needs()) - sent) == []
