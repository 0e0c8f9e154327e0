"""The rules room imports without torch: a CPU-only head node runs ``farm validate`` with these same modules."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import cosmos3.rules
from cosmos3.rules import values

ROOT = Path(__file__).resolve().parents[2]
# What a head node may lack; None in sys.modules makes an import of it raise ImportError.
BLOCKED = ("torch", "numpy", "safetensors", "diffusers", "transformers", "ray")


def rules_modules() -> list[str]:
    return sorted(f"cosmos3.rules.{info.name}" for info in pkgutil.iter_modules(cosmos3.rules.__path__))


def test_every_rules_module_imports_with_torch_blocked():
    modules = rules_modules()
    assert {"cosmos3.rules.config", "cosmos3.rules.request", "cosmos3.rules.load_options"} <= set(modules)
    code = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in BLOCKED) + "".join(
        f"import {module}\n" for module in modules) + "print(sorted(m for m in sys.modules if m.startswith('cosmos3')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout))
    outside = sorted(m for m in loaded if not m.startswith("cosmos3.rules") and m not in ("cosmos3", "cosmos3.errors"))
    assert outside == [], f"the rules imported modules of other rooms: {outside}"


def test_the_check_sees_a_torch_import(tmp_path):
    (tmp_path / "uses_torch.py").write_text("import torch\n")
    code = "import sys\nsys.modules['torch'] = None\nimport uses_torch\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and "torch" in done.stderr


@pytest.mark.parametrize("value, is_int_, is_number_", [
    (3, True, True), (True, False, False), (2.5, False, True), (float("nan"), False, False),
    (float("inf"), False, False), (10**400, True, True), ("3", False, False), (None, False, False),
])
def test_a_bool_is_no_number_and_nan_is_none(value, is_int_, is_number_):
    assert (values.is_int(value), values.is_number(value)) == (is_int_, is_number_)


def test_yaml_off_reads_false_as_off_and_nothing_else():
    assert [values.yaml_off(v) for v in (False, "off", 0, None, "seacache")] == ["off", "off", 0, None, "seacache"]
