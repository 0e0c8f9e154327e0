"""How csrc/ becomes a loadable library: one definition for the wheel build (setup.py) and the JIT build.

Torch-free at import: setup.py loads this file by path, before the package exists, and the runtime loader
(``cosmos3.ops.loader``) uses the same sources, flags and arch rules, so a prebuilt library and a JIT-built
one are the same code compiled the same way.

A wheel build writes a *build record* (``BUILD_RECORD``, JSON) beside the library: the torch, CUDA and C++
ABI it was compiled against and the GPU archs it holds code for. The loader compares it with the running
torch before it imports the library: an extension built against another torch can crash on import or on
its first call, so a mismatch is reported, never loaded.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
EXTENSION = "cosmos3.ops._cuda_ops"  # the prebuilt library: cosmos3/ops/_cuda_ops.<python ABI>.so in the wheel
JIT_NAME = "cosmos3_cuda_ops"  # the JIT-built module (torch.utils.cpp_extension.load's name)
BUILD_RECORD = "_cuda_ops_build.json"  # beside the prebuilt library
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3"]

# H200 (sm_90) and B200 (sm_100) as cubins, plus compute_100 PTX that the driver compiles for any newer GPU.
# The kernels use nothing arch-specific (no sm_90a / sm_100a instructions), so the plain targets suffice.
DEFAULT_ARCH_LIST = "9.0;10.0+PTX"
ARCH_LIST_ENV = "TORCH_CUDA_ARCH_LIST"
REQUIRE_ENV = "COSMOS3_REQUIRE_CUDA_BUILD"  # "1": a package build that cannot compile csrc/ fails


def sources() -> list[Path]:
    """Every translation unit of the extension: the torch-free kernels, then the one binding file."""
    return [*sorted(CSRC.glob("*.cu")), CSRC / "torch_bindings.cpp"]


@dataclass(frozen=True)
class Archs:
    """What a build holds code for: cubins (``sm``, with ``a`` for arch-specific ones) and PTX (``ptx``)."""
    sm: tuple[str, ...]  # e.g. ("90", "100", "100a")
    ptx: tuple[str, ...]  # e.g. ("100",)

    def gencode_flags(self) -> list[str]:
        cubins = [f"-gencode=arch=compute_{sm},code=sm_{sm}" for sm in self.sm]
        return cubins + [f"-gencode=arch=compute_{sm},code=compute_{sm}" for sm in self.ptx]

    def runs_on(self, sm: int) -> bool:
        """Whether a GPU of SM version ``sm`` (10 * major + minor) can run this build: a cubin of its major
        version and an equal or lower minor (an ``a`` cubin only on its exact version), or PTX of an equal
        or lower version (the driver compiles it)."""
        for target in self.sm:
            version = int(target.rstrip("a"))
            if version == sm if target.endswith("a") else (version // 10 == sm // 10 and version <= sm):
                return True
        return any(int(p.rstrip("a")) <= sm and not p.endswith("a") for p in self.ptx)

    def describe(self) -> str:
        return ", ".join([f"sm_{sm}" for sm in self.sm] + [f"compute_{sm} PTX" for sm in self.ptx])


_ARCH = re.compile(r"(\d+)\.(\d)(a?)(\+PTX)?")


def parse_arch_list(arch_list: str) -> Archs:
    """``TORCH_CUDA_ARCH_LIST`` syntax ("9.0;10.0+PTX", spaces also separate; "10.0a" is sm_100a) -> Archs."""
    sm, ptx = [], []
    for entry in arch_list.replace(";", " ").split():
        match = _ARCH.fullmatch(entry)
        if match is None:
            raise ValueError(f"{ARCH_LIST_ENV}: cannot read {entry!r} in {arch_list!r}; write versions as "
                             f"major.minor, optionally with 'a' and '+PTX', e.g. {DEFAULT_ARCH_LIST!r}")
        major, minor, suffix, with_ptx = match.groups()
        sm.append(f"{major}{minor}{suffix}")
        if with_ptx:
            ptx.append(f"{major}{minor}{suffix}")
    if not sm:
        raise ValueError(f"{ARCH_LIST_ENV} names no GPU arch (got {arch_list!r}); e.g. {DEFAULT_ARCH_LIST!r}")
    return Archs(tuple(sm), tuple(ptx))


def wheel_archs() -> Archs:
    """The archs a package build compiles for: ``TORCH_CUDA_ARCH_LIST`` if set, else DEFAULT_ARCH_LIST."""
    return parse_arch_list(os.environ.get(ARCH_LIST_ENV) or DEFAULT_ARCH_LIST)


@dataclass(frozen=True)
class TorchABI:
    """What a compiled extension depends on: the exact torch build, its CUDA and its C++ ABI."""
    torch: str  # torch.__version__, e.g. "2.11.0+cu130"
    cuda: str | None  # torch.version.cuda, e.g. "13.0"
    cxx11_abi: bool  # torch.compiled_with_cxx11_abi()

    def describe(self) -> str:
        return f"torch {self.torch} (CUDA {self.cuda}, CXX11 ABI {int(self.cxx11_abi)})"


def running_abi() -> TorchABI:
    import torch

    return TorchABI(torch.__version__, torch.version.cuda, torch.compiled_with_cxx11_abi())


def build_record(abi: TorchABI, archs: Archs) -> dict:
    """The JSON a wheel build writes beside the library (read back by read_record)."""
    return {"abi": asdict(abi), "archs": {"sm": list(archs.sm), "ptx": list(archs.ptx)}}


def read_record(record: dict) -> tuple[TorchABI, Archs]:
    return TorchABI(**record["abi"]), Archs(tuple(record["archs"]["sm"]), tuple(record["archs"]["ptx"]))


def why_not_build() -> str | None:
    """Why a package build here cannot compile csrc/ (None: it can): it needs a CUDA build of torch and nvcc."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return "torch is not importable in the build environment (build with --no-build-isolation)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    home = cpp_extension.CUDA_HOME
    if home is None or not Path(home, "bin", "nvcc").exists():
        return f"nvcc was not found (CUDA_HOME={home!r}); install the CUDA toolkit {torch.version.cuda}"
    return None


if __name__ == "__main__":  # scripts/compile_csrc.sh: the wheel's -gencode flags, one a line
    print("\n".join(wheel_archs().gencode_flags()))
