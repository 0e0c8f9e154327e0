"""Compiles csrc/ into the package (``cosmos3/ops/_cuda_ops*.so``) when a CUDA build of torch and nvcc are here.

Everything else is declared in pyproject.toml. Without a CUDA torch or nvcc (a CPU dev machine, CI, or the
default isolated build environment, which has no torch) the package is pure Python and builds in seconds;
GPU nodes then JIT-build the kernels on first use (cosmos3/ops/loader.py). Build a wheel with kernels:

    TORCH_CUDA_ARCH_LIST="9.0;10.0+PTX" pip wheel --no-deps --no-build-isolation .   (scripts/build_wheel.sh)

``COSMOS3_REQUIRE_CUDA_BUILD=1`` turns "cannot compile here" into an error instead of a kernel-less package.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def _ops_build():
    """cosmos3/ops/build.py by path: the package is not importable while it is being built."""
    spec = importlib.util.spec_from_file_location("cosmos3_ops_build", ROOT / "cosmos3" / "ops" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def cuda_extension() -> dict:
    build = _ops_build()
    why_not = build.why_not_build()
    if why_not is not None:
        if os.environ.get(build.REQUIRE_ENV) == "1":
            sys.exit(f"cosmos3: {build.REQUIRE_ENV}=1, but csrc/ cannot be compiled here: {why_not}")
        print(f"cosmos3: not compiling the CUDA kernels ({why_not}); GPU nodes will JIT-build them")
        return {}

    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    archs = build.wheel_archs()
    print(f"cosmos3: compiling the CUDA kernels for {archs.describe()}")
    extension = CUDAExtension(
        build.EXTENSION, sources=[str(p.relative_to(ROOT)) for p in build.sources()],
        extra_compile_args={"cxx": build.CXX_FLAGS, "nvcc": [*build.NVCC_FLAGS, *archs.gencode_flags()]})

    class BuildWithRecord(BuildExtension):
        """Writes the build record beside the library: what the runtime loader checks before loading it."""

        def run(self):
            super().run()
            library = Path(self.get_ext_fullpath(build.EXTENSION))
            record = build.build_record(build.running_abi(), archs)
            library.with_name(build.BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")

    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildWithRecord}}


setup(**cuda_extension())
