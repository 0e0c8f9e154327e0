"""The driver-worker contract (farm/job.py): a leaf the worker imports without the YAML resolver."""

from __future__ import annotations

import subprocess
import sys

from tests.farm.helpers import write_manifest

# Importing the manifest (and the contract) must not need torch: the driver's machine may have none.
# A meta-path finder that refuses `torch` makes any import of it, however indirect, fail loudly.
_NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this test, yet {name} was imported")
sys.meta_path.insert(0, NoTorch())
import farm.manifest, farm.job, farm.storage
m = farm.manifest.load(sys.argv[1])
print(len(m.jobs), "torch" in sys.modules)
"""


def test_the_manifest_validates_through_cosmos3_without_torch(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}, {"id": "b", "task": "t2i", "prompt": "y"}])
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "False"]


def test_the_blocker_does_block_torch():
    """The check above can fail: the same blocker stops a module that does import torch."""
    code = _NO_TORCH.split("import farm.manifest")[0] + "import cosmos3.checkpoint.loader\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "torch is blocked" in done.stderr


def test_worker_and_storage_never_import_the_yaml_resolver():
    code = ("import sys, worker.actor, farm.storage, farm.job\n"
            "print(*(name in sys.modules for name in ('farm.manifest', 'farm.document', 'farm.fields', 'farm.job')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False", "True"]
