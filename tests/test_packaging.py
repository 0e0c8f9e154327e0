"""The package builds on a machine without CUDA: pure Python, csrc/ inside cosmos3/ops, nothing compiled.

A real ``pip wheel`` of a copy of this checkout (the files git tracks), with this environment's CPU torch
visible to setup.py (``--no-build-isolation``), which is the case where setup.py must decide to compile nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory) -> Path:
    """The tracked files of the checkout, so the build writes its build/ and egg-info there, not here."""
    copy = tmp_path_factory.mktemp("src")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "setup.py", "pyproject.toml",
                             "README.md", "cosmos3", "farm", "worker", "toy", "testbed", "benchmarks"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the build on a machine with a CPU torch")
def test_the_cpu_build_is_pure_python_with_csrc_inside_cosmos3_ops(source_copy, tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(tmp_path), str(source_copy)],
                           capture_output=True, text=True, check=True)
    assert f"not compiling the CUDA kernels (torch {torch.__version__} is a CPU build)" in built.stdout + built.stderr
    [wheel] = tmp_path.glob("*.whl")
    assert wheel.name == "cosmos3_farm-0.1.0-py3-none-any.whl"  # no compiled code: any platform
    names = zipfile.ZipFile(wheel).namelist()
    kernels = sorted(n for n in names if n.startswith("cosmos3/ops/csrc/"))
    assert kernels == sorted(f"cosmos3/ops/csrc/{p.name}" for p in (ROOT / "cosmos3" / "ops" / "csrc").iterdir())
    assert not [n for n in names if n.startswith("csrc/") or n.endswith((".so", ".o"))]
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n} == {"cosmos3", "farm", "worker"}


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the build on a machine with a CPU torch")
def test_a_build_that_must_compile_the_kernels_fails_here_with_the_reason(source_copy):
    env = {**os.environ, "COSMOS3_REQUIRE_CUDA_BUILD": "1"}
    built = subprocess.run([sys.executable, "setup.py", "--version"], cwd=source_copy, env=env,
                           capture_output=True, text=True)
    assert built.returncode != 0
    assert (f"COSMOS3_REQUIRE_CUDA_BUILD=1, but csrc/ cannot be compiled here: torch {torch.__version__} is a "
            f"CPU build") in built.stderr
