"""The rules room imports without torch: a CPU-only head node runs ``farm validate`` with these same modules."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import cosmos3.rules

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
