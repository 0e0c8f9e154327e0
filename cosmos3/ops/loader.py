"""Loads the CUDA kernels of csrc/: the library prebuilt into the wheel, else a JIT build, else a clear error.

1. Prebuilt (``cosmos3/ops/_cuda_ops*.so``, compiled by ``pip wheel .`` / ``scripts/build_wheel.sh`` where a CUDA
   torch and nvcc are present): loaded when its build record matches the running torch (version, CUDA,
   C++ ABI) and holds code for every visible GPU; a node needs neither nvcc nor ninja, and it loads in well
   under a second.
2. JIT: ``torch.utils.cpp_extension.load`` builds csrc/ for the visible archs into a cache directory (about
   a minute the first time, needs nvcc and ninja), under an exclusive file lock, so the workers of one node
   that start together build it once and the others load the cached result.
3. Neither: an error that says why the prebuilt library was not used and names both ways out.

Loading the library registers the CUDA kernels (``TORCH_LIBRARY_IMPL(cosmos3, CUDA, m)`` in
csrc/torch_bindings.cpp) under the schemas ``cosmos3.ops`` defines, then each device's launch parameters are
handed to it from ``cosmos3.ops.launch_table``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal

import structlog
import torch
from filelock import FileLock

from cosmos3.ops import build, launch_table, schemas  # noqa: F401 - schemas: the schemas the kernels register under

log = structlog.get_logger(__name__)

Source = Literal["prebuilt", "jit-cache", "jit-build"]
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class CudaOps:
    """The loaded extension and where it came from (logged, and recorded in every render's sidecar)."""
    module: ModuleType
    source: Source
    seconds: float  # from the call of load_cuda_ops until the kernels were ready
    path: str  # the shared library loaded

    def facts(self) -> dict[str, str | float]:
        return {"source": self.source, "seconds": round(self.seconds, 3), "path": self.path}


_loaded: CudaOps | None = None
_lock = threading.Lock()


def load_cuda_ops() -> CudaOps:
    """Loads the kernels once per process (prebuilt, else JIT) and sets every visible device's launch
    parameters. Safe to call again and from several threads."""
    global _loaded
    with _lock:
        if _loaded is None:
            if not torch.cuda.is_available():
                raise RuntimeError("cosmos3 CUDA ops: no CUDA device is visible (torch.cuda.is_available() is False)")
            start = time.perf_counter()
            sms = visible_sms()
            module, source, path = _load(sms)
            for sm in sms:
                set_launch_params(module, sm, launch_table.launch_params(sm))
            set_launch_params(module, 0, launch_table.DEFAULT)  # the kernels' fallback for any other device
            _loaded = CudaOps(module, source, time.perf_counter() - start, str(path))
            log.info("cosmos3 CUDA ops loaded", **_loaded.facts())
    return _loaded


def is_loaded() -> bool:
    return _loaded is not None


def set_launch_params(module: ModuleType, sm: int, row: dict[str, launch_table.LaunchParams]) -> None:
    """Sets the launch parameters the CUDA kernels use on SM version ``sm`` (0: any version without a row)."""
    for op, params in row.items():
        module.set_launch_params(sm, op, params.threads, params.vectors_per_thread)


def sm_version(device: int) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def visible_sms() -> list[int]:
    return sorted({sm_version(i) for i in range(torch.cuda.device_count())})


def _load(sms: list[int]) -> tuple[ModuleType, Source, Path]:
    prebuilt = find_prebuilt()
    refusal = prebuilt_refusal(prebuilt, sms)
    if refusal is None:
        return _import_library(build.EXTENSION, prebuilt), "prebuilt", prebuilt
    problem = toolchain_problem()
    if problem is not None:
        raise RuntimeError(no_kernels_message(refusal, problem))
    if prebuilt is not None:  # a wheel for another torch or GPU: worth a warning, the JIT build takes a minute
        log.warning("not loading the prebuilt cosmos3 CUDA ops; building them instead", reason=refusal)
    return _jit_build(sms)


def find_prebuilt(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The prebuilt library in the installed package, for this Python (its extension suffix), if any."""
    stem = build.EXTENSION.rsplit(".", 1)[1]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (path := package_dir / f"{stem}{suffix}").exists():
            return path
    return None


def prebuilt_refusal(prebuilt: Path | None, sms: list[int]) -> str | None:
    """Why the prebuilt library cannot be loaded here (None: it can)."""
    if prebuilt is None:
        return "no prebuilt kernels are installed (this cosmos3 was built without a CUDA torch and nvcc)"
    record_path = prebuilt.with_name(build.BUILD_RECORD)
    if not record_path.exists():
        return f"the prebuilt kernels {prebuilt} have no build record ({record_path.name}); rebuild the wheel"
    abi, archs = build.read_record(json.loads(record_path.read_text()))
    running = build.running_abi()
    if abi != running:
        return f"the prebuilt kernels were built for {abi.describe()}, and this is {running.describe()}"
    missing = [sm for sm in sms if not archs.runs_on(sm)]
    if missing:
        return (f"the prebuilt kernels hold code for {archs.describe()}, not for this GPU's "
                f"{', '.join(f'sm_{sm}' for sm in missing)} (add it to {build.ARCH_LIST_ENV} and rebuild)")
    return None


def toolchain_problem() -> str | None:
    """What the JIT build lacks here (None: nvcc and ninja are both present)."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home is None or not Path(home, "bin", "nvcc").exists():
        return f"building them needs nvcc, which was not found (CUDA_HOME={home!r})"
    if not cpp_extension.is_ninja_available():
        return "building them needs ninja (pip install ninja)"
    return None


def no_kernels_message(refusal: str, problem: str) -> str:
    running = build.running_abi()
    return (f"cosmos3 has no CUDA kernels it can load: {refusal}; {problem}. Either install the cosmos3-farm wheel "
            f"built for {running.describe()} (scripts/build_wheel.sh on a machine with this torch and the CUDA "
            f"toolkit; docs/gpu-nodes.md), or install the CUDA toolkit {running.cuda} (nvcc on PATH or "
            f"CUDA_HOME set) and ninja, and cosmos3 builds its kernels on first use.")


def _import_library(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_dir(sms: list[int]) -> Path:
    """The JIT cache for this torch and these archs (``COSMOS3_BUILD_DIR``, else ~/.cache/cosmos3)."""
    tag = f"torch{torch.__version__}-cuda{torch.version.cuda}-sm{'-'.join(map(str, sms))}".replace("+", "_")
    return Path(os.environ.get("COSMOS3_BUILD_DIR", Path.home() / ".cache" / "cosmos3")) / tag


def build_lock(directory: Path) -> FileLock:
    """Exclusive across the processes of a node. filelock's lock is an flock on Linux, not torch's own lock file:
    the kernel releases it when its holder dies, so a worker killed mid-build never leaves the others waiting."""
    directory.mkdir(parents=True, exist_ok=True)
    return FileLock(directory / "cosmos3.lock")


def _jit_build(sms: list[int]) -> tuple[ModuleType, Source, Path]:
    from torch.utils import cpp_extension

    directory = build_dir(sms)
    library = directory / f"{build.JIT_NAME}.so"
    archs = build.Archs(sm=tuple(map(str, sms)), ptx=())  # cubins for the visible GPUs only
    with build_lock(directory):
        before = library.stat().st_mtime_ns if library.exists() else None
        log.info("loading cosmos3 CUDA ops through a JIT build (about a minute the first time, then cached)",
                 build_dir=str(directory))
        module = cpp_extension.load(
            name=build.JIT_NAME, sources=[str(p) for p in build.sources()],
            extra_cflags=build.CXX_FLAGS, extra_cuda_cflags=[*build.NVCC_FLAGS, *archs.gencode_flags()],
            build_directory=str(directory))
        after = library.stat().st_mtime_ns
    return module, "jit-cache" if before == after else "jit-build", library
