"""Where the CUDA kernels come from: the prebuilt library, a JIT build, or an error naming both ways out.

CPU tests of the loader's decisions. The machine probes (a visible GPU and its SM version, the toolchain, the
compiler itself) are monkeypatched; the build records, the arch rules, the library import and the lock are
the real ones. ``-m gpu`` on an H200 loads the real thing (tests/cosmos3/test_ops.py).
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.machinery
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from cosmos3.ops import build as ops_build
from cosmos3.ops import launch_table
from cosmos3.ops import loader as ops_loader

# A stand-in for the compiled library: the one function the loader calls on it, recording its calls.
FAKE_LIBRARY = """
calls = []

def set_launch_params(sm, op, threads, vectors_per_thread):
    calls.append((sm, op, threads, vectors_per_thread))
"""

ARCH_CASES = [  # arch list, SM version of the GPU, whether the build runs there
    pytest.param("9.0;10.0+PTX", 90, True, id="sm90-cubin"),
    pytest.param("9.0;10.0+PTX", 100, True, id="sm100-cubin"),
    pytest.param("9.0;10.0+PTX", 103, True, id="sm103-on-sm100-cubin"),
    pytest.param("9.0;10.0+PTX", 120, True, id="sm120-on-compute100-ptx"),
    pytest.param("9.0;10.0+PTX", 89, False, id="sm89-older"),
    pytest.param("9.0", 100, False, id="sm90-cubin-not-on-sm100"),
    pytest.param("10.0a", 100, True, id="sm100a-on-sm100"),
    pytest.param("10.0a", 103, False, id="sm100a-only-on-sm100"),
]


@pytest.fixture
def gpu_node(monkeypatch, tmp_path):
    """A process that sees one sm_90 GPU and has not loaded the kernels yet; the JIT cache under tmp_path."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ops_loader, "visible_sms", lambda: [90])
    monkeypatch.setattr(ops_loader, "_loaded", None)
    monkeypatch.setenv("COSMOS3_BUILD_DIR", str(tmp_path / "jit"))
    events = []
    monkeypatch.setattr(ops_loader, "log", SimpleNamespace(
        info=lambda event, **kw: events.append(("info", event, kw)),
        warning=lambda event, **kw: events.append(("warning", event, kw))))
    return events


def _library(directory: Path, name: str = "_cuda_ops.py") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(FAKE_LIBRARY)
    return path


def _prebuilt(monkeypatch, directory: Path, *, abi: ops_build.TorchABI | None = None, arch_list="9.0;10.0+PTX",
              record=True) -> Path:
    """A prebuilt library in `directory` with the build record a wheel build writes (for `abi`, default: ours)."""
    library = _library(directory)
    if record:
        built = ops_build.build_record(abi or ops_build.running_abi(), ops_build.parse_arch_list(arch_list))
        (directory / ops_build.BUILD_RECORD).write_text(json.dumps(built))
    monkeypatch.setattr(ops_loader, "find_prebuilt", lambda: library)
    return library


def _no_jit(*_):
    raise AssertionError("the JIT build was attempted")


def _toolchain(monkeypatch, problem: str | None) -> list[list[int]]:
    """The toolchain probe answers `problem`; with a toolchain, the JIT build 'builds' a stand-in library."""
    monkeypatch.setattr(ops_loader, "toolchain_problem", lambda: problem)
    builds = []

    def jit_build(sms):
        builds.append(sms)
        library = _library(ops_loader.build_dir(sms), "jit_library.py")
        return ops_loader._import_library("jit_library", library), "jit-build", library

    monkeypatch.setattr(ops_loader, "_jit_build", jit_build if problem is None else _no_jit)
    return builds


def test_a_matching_prebuilt_library_is_loaded_without_a_toolchain(gpu_node, monkeypatch, tmp_path):
    library = _prebuilt(monkeypatch, tmp_path / "site" / "cosmos3")
    monkeypatch.setattr(ops_loader, "toolchain_problem", lambda: "building them needs nvcc, which was not found")
    monkeypatch.setattr(ops_loader, "_jit_build", _no_jit)
    loaded = ops_loader.load_cuda_ops()

    assert (loaded.source, loaded.path) == ("prebuilt", str(library)) and loaded.seconds >= 0
    rows = ((90, launch_table.launch_params(90)), (0, launch_table.DEFAULT))
    expected = [(sm, op, p.threads, p.vectors_per_thread) for sm, row in rows for op, p in row.items()]
    assert loaded.module.calls == expected  # the H200 row, then the fallback row
    assert gpu_node == [("info", "cosmos3 CUDA ops loaded", loaded.facts())]
    assert ops_loader.load_cuda_ops() is loaded  # once per process


def test_a_prebuilt_library_for_another_torch_is_not_loaded_and_the_jit_build_runs(gpu_node, monkeypatch, tmp_path):
    other = ops_build.TorchABI("2.9.0+cu128", "12.8", True)
    _prebuilt(monkeypatch, tmp_path / "site" / "cosmos3", abi=other)
    builds = _toolchain(monkeypatch, None)
    loaded = ops_loader.load_cuda_ops()

    assert loaded.source == "jit-build" and builds == [[90]]
    [(level, event, fields)] = [e for e in gpu_node if e[0] == "warning"]
    assert "not loading the prebuilt" in event
    assert fields["reason"] == (f"the prebuilt kernels were built for torch 2.9.0+cu128 (CUDA 12.8, CXX11 ABI 1), "
                                f"and this is {ops_build.running_abi().describe()}")


@pytest.mark.parametrize("field", ["torch", "cuda", "cxx11_abi"])
def test_each_abi_field_alone_is_a_mismatch(gpu_node, monkeypatch, tmp_path, field):
    running = ops_build.running_abi()
    changed = {"torch": running.torch + ".post1", "cuda": "99.9", "cxx11_abi": not running.cxx11_abi}[field]
    library = _prebuilt(monkeypatch, tmp_path, abi=dataclasses.replace(running, **{field: changed}))
    assert "were built for" in ops_loader.prebuilt_refusal(library, [90])


def test_an_abi_mismatch_without_a_toolchain_names_both_ways_out(gpu_node, monkeypatch, tmp_path):
    _prebuilt(monkeypatch, tmp_path, abi=ops_build.TorchABI("2.9.0+cu128", "12.8", False))
    _toolchain(monkeypatch, "building them needs nvcc, which was not found (CUDA_HOME=None)")
    with pytest.raises(RuntimeError) as error:
        ops_loader.load_cuda_ops()
    message = str(error.value)
    assert message.startswith("cosmos3 has no CUDA kernels it can load: the prebuilt kernels were built for "
                              "torch 2.9.0+cu128 (CUDA 12.8, CXX11 ABI 0), and this is torch ")
    assert "building them needs nvcc, which was not found (CUDA_HOME=None)" in message
    assert f"install the cosmos3-farm wheel built for {ops_build.running_abi().describe()}" in message
    assert "scripts/build_wheel.sh" in message and f"install the CUDA toolkit {torch.version.cuda}" in message
    assert not ops_loader.is_loaded()


def test_no_prebuilt_library_and_no_toolchain_is_a_clear_error(gpu_node, monkeypatch):
    monkeypatch.setattr(ops_loader, "find_prebuilt", lambda: None)
    _toolchain(monkeypatch, "building them needs ninja (pip install ninja)")
    with pytest.raises(RuntimeError, match=r"no prebuilt kernels are installed .*; building them needs ninja "
                                           r"\(pip install ninja\)\. Either install the cosmos3-farm wheel"):
        ops_loader.load_cuda_ops()


def test_no_prebuilt_library_with_a_toolchain_builds_quietly(gpu_node, monkeypatch):
    monkeypatch.setattr(ops_loader, "find_prebuilt", lambda: None)
    builds = _toolchain(monkeypatch, None)
    assert ops_loader.load_cuda_ops().source == "jit-build" and builds == [[90]]
    assert [e for e in gpu_node if e[0] == "warning"] == []  # the normal path of a source checkout


def test_a_prebuilt_library_without_code_for_this_gpu_is_refused(gpu_node, monkeypatch, tmp_path):
    monkeypatch.setattr(ops_loader, "visible_sms", lambda: [80])
    _prebuilt(monkeypatch, tmp_path)
    _toolchain(monkeypatch, "building them needs nvcc, which was not found (CUDA_HOME=None)")
    with pytest.raises(RuntimeError, match=r"the prebuilt kernels hold code for sm_90, sm_100, compute_100 PTX, not "
                                           r"for this GPU's sm_80 \(add it to TORCH_CUDA_ARCH_LIST and rebuild\)"):
        ops_loader.load_cuda_ops()


def test_a_prebuilt_library_without_its_build_record_is_refused(monkeypatch, tmp_path):
    library = _prebuilt(monkeypatch, tmp_path, record=False)
    assert ops_loader.prebuilt_refusal(library, [90]) == (
        f"the prebuilt kernels {library} have no build record (_cuda_ops_build.json); rebuild the wheel")


def test_the_prebuilt_library_is_found_by_this_pythons_extension_suffix(tmp_path):
    assert ops_loader.find_prebuilt(tmp_path) is None
    (tmp_path / "_cuda_ops.cpython-39-x86_64-linux-gnu.so").touch()  # another Python's build: not ours
    assert ops_loader.find_prebuilt(tmp_path) is None
    ours = tmp_path / f"_cuda_ops{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ours.touch()
    assert ops_loader.find_prebuilt(tmp_path) == ours


def test_the_jit_build_holds_the_node_lock_and_tells_a_build_from_the_cache(gpu_node, monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    compiles = []

    def load(name, sources, extra_cflags, extra_cuda_cflags, build_directory):
        directory = Path(build_directory)
        with open(directory / "cosmos3.lock") as other:  # another process of the node, trying the lock
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        library = directory / f"{name}.so"
        if not library.exists():  # what ninja does: compile only when there is nothing up to date
            library.write_bytes(b"\x7fELF")
            compiles.append((sources, extra_cuda_cflags))
        return ModuleType(name)

    monkeypatch.setattr(cpp_extension, "load", load)
    module, source, library = ops_loader._jit_build([90])
    assert source == "jit-build" and library == ops_loader.build_dir([90]) / "cosmos3_cuda_ops.so"
    assert ops_loader._jit_build([90])[1] == "jit-cache"
    [(sources, flags)] = compiles
    assert sources == [str(p) for p in ops_build.sources()] and "-gencode=arch=compute_90,code=sm_90" in flags
    with open(library.parent / "cosmos3.lock") as after:  # released
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_toolchain_probe_names_what_is_missing(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert ops_loader.toolchain_problem() == "building them needs nvcc, which was not found (CUDA_HOME=None)"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").touch()
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert ops_loader.toolchain_problem() == "building them needs ninja (pip install ninja)"
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    assert ops_loader.toolchain_problem() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_load_cuda_ops_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        ops_loader.load_cuda_ops()


@pytest.mark.parametrize(("arch_list", "sm", "runs"), ARCH_CASES)
def test_which_gpus_a_build_runs_on(arch_list, sm, runs):
    assert ops_build.parse_arch_list(arch_list).runs_on(sm) is runs


def test_the_default_arch_list_is_h200_and_b200_cubins_plus_ptx(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert ops_build.wheel_archs().gencode_flags() == [
        "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_100,code=sm_100",
        "-gencode=arch=compute_100,code=compute_100"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0 10.0a")
    assert ops_build.wheel_archs() == ops_build.Archs(sm=("90", "100a"), ptx=())


@pytest.mark.parametrize("arch_list", ["9", "sm_90", "9.0;ten", ""])
def test_a_bad_arch_list_is_refused_with_its_variable_named(arch_list):
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST"):
        ops_build.parse_arch_list(arch_list)


def test_a_build_record_reads_back_as_written():
    abi, archs = ops_build.running_abi(), ops_build.parse_arch_list("9.0;10.0+PTX")
    assert ops_build.read_record(json.loads(json.dumps(ops_build.build_record(abi, archs)))) == (abi, archs)
