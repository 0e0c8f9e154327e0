"""The one GPU a render worker holds: Ray's assignment checked against what the process sees, and its identity.

Ray gives each worker actor one GPU (`num_gpus=1`) and sets `CUDA_VISIBLE_DEVICES` to it, so the worker's
`cuda:0` is that GPU and no other worker's. A process that sees another set (Ray told not to set the variable,
or a variable inherited from a launcher) would render on someone else's GPU, or on several; it is refused at
start. The device's UUID goes into the log and every sidecar, so a render can be traced to the physical GPU.
"""

from __future__ import annotations

import os
from typing import Any

import structlog

from cosmos3.rules.memory_plan import GIB
from farm.errors import WorkerConfigError
from farm.job import PlannedMemory

log = structlog.get_logger(__name__)


def check_assignment(gpu_ids: list[str], visible: str | None) -> None:
    """`gpu_ids`: Ray's accelerator ids for this actor; `visible`: its CUDA_VISIBLE_DEVICES. No GPU: no check."""
    if not gpu_ids:
        return
    if len(gpu_ids) != 1:
        raise WorkerConfigError(f"a render worker holds exactly one GPU; Ray assigned this one {len(gpu_ids)} "
                                f"({', '.join(gpu_ids)}); create it with num_gpus=1")
    if visible is None or [d.strip() for d in visible.split(",")] != gpu_ids:
        raise WorkerConfigError(f"Ray assigned this worker GPU {gpu_ids[0]}, but it sees CUDA_VISIBLE_DEVICES="
                                f"{visible!r}; it must see that GPU alone (is RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_"
                                f"DEVICES set on this node?)")


# A GPU worker's CUDA caching allocator grows segments instead of caching fixed-size blocks: the Wan VAE's
# decode of a 720p clip allocates blocks of many sizes, and with fixed segments the reserved memory ran 12 GiB
# above the allocated peak on the H200 (benchmarks/results/h200-render.md).
CUDA_ALLOC_CONF = "expandable_segments:True"
# cuBLASLt gets no workspace (KiB; torch reads it at its first cuBLASLt call). With one, at a still's 1,024 tokens
# cuBLAS runs the MLP's gate and up GEMMs ([1024, 4096] x [4096, 12288], FP8) as a kernel that needs its workspace
# zeroed first: a memset node before each, 72 a forward, whose dependency gaps (~5 us each) cost more than the
# kernel gains over the one picked without a workspace. A clip's forwards take the same time either way.
# benchmarks/bench_cublas_workspace.py measures both in one run.
CUBLASLT_WORKSPACE_KIB = "0"


def configure_cuda_allocator() -> None:
    """Sets this process's device memory use (before CUDA starts): the caching allocator's segments and
    cuBLASLt's workspace. A value the node's environment sets is kept."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)
    os.environ.setdefault("CUBLASLT_WORKSPACE_SIZE", CUBLASLT_WORKSPACE_KIB)


def cuda_device_facts() -> dict[str, Any]:
    """The visible CUDA device (exactly one) as recorded in sidecars: UUID, name and SM version."""
    import torch  # here: the driver imports this module's callers and may have no torch

    count = torch.cuda.device_count()
    if count != 1:
        raise WorkerConfigError(f"a render worker must see exactly one CUDA device, it sees {count}; "
                                f"CUDA_VISIBLE_DEVICES should name the one GPU Ray assigned")
    props = torch.cuda.get_device_properties(0)
    facts = {"gpu_uuid": str(props.uuid), "gpu_name": props.name, "sm": 10 * props.major + props.minor}
    log.info("worker GPU", **facts)
    return facts


def check_gpu_memory(gpu_id: str, planned: PlannedMemory | None) -> None:
    """Refuses the GPU Ray assigned (`gpu_id`: its index or UUID) when it has less memory than the manifest's largest
    job needs (`farm.memory`), before the worker reads a byte of its weights. Read through NVML, so neither torch nor
    a CUDA context is needed yet. No plan (a pipeline built outside the farm) or no NVML (a test's logical GPU): no
    check."""
    if planned is None:
        return
    try:
        import pynvml  # nvidia-ml-py, NVIDIA's own NVML binding

        pynvml.nvmlInit()
        handle = (pynvml.nvmlDeviceGetHandleByUUID(gpu_id) if gpu_id.startswith(("GPU-", "MIG-"))
                  else pynvml.nvmlDeviceGetHandleByIndex(int(gpu_id)))
        total, name = pynvml.nvmlDeviceGetMemoryInfo(handle).total, pynvml.nvmlDeviceGetName(handle)
    except Exception as err:  # noqa: BLE001 - no NVML: the pipeline's allocation is the check
        log.warning("gpu_memory_unknown", reason=f"{type(err).__name__}: {err}", need_gib=planned.need / GIB)
        return
    refuse_small_gpu(name if isinstance(name, str) else name.decode(), total, planned)


def refuse_small_gpu(name: str, total: int, planned: PlannedMemory) -> None:
    """# Raises: WorkerConfigError naming the GPU's memory, the need and the job when ``total`` bytes are too few."""
    if total < planned.need:
        raise WorkerConfigError(
            f"this GPU ({name}, {total / GIB:.1f} GiB) cannot hold job {planned.job} of this manifest, which needs "
            f"{planned.detail}; render it on a GPU with more memory (docs/farm.md, \"GPU memory\"), or lower the "
            "job's size or frames")
