"""A manifest's GPU memory, planned before anything starts (`cosmos3.rules.memory_plan` per job), and the GPU memory
classes of a Ray cluster's nodes.

A node says how much memory each of its GPUs has with a custom resource `gpu_memory_gib:<N>` (N: a GPU's total
memory in GiB, rounded down; `ray start --resources '{"gpu_memory_gib:79": 1}'` on a node of H100s), as Ray marks a
node's GPU type with `accelerator_type:<T>`. A worker asks for a sliver of the class it is placed in, so Ray puts
it only on nodes of that class; the driver picks the classes whose GPUs hold the manifest's largest job
(docs/farm.md, "GPU memory").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cosmos3.rules.cache_options import parse_cache
from cosmos3.rules.memory_plan import GIB, JobMemory, ModelMemory, plan_request
from cosmos3.rules.request import RequestRules
from farm.errors import FarmError
from farm.job import PlannedMemory
from farm.manifest import Manifest

CLASS_PREFIX = "gpu_memory_gib:"
CLASS_SLIVER = 0.001  # what a worker asks of its class, as Ray's accelerator_type option does


@dataclass(frozen=True)
class ManifestMemory:
    model: ModelMemory
    jobs: dict[str, JobMemory]  # job key -> its plan

    def largest(self) -> tuple[str, JobMemory]:
        return max(self.jobs.items(), key=lambda item: item[1].need)

    def planned(self) -> PlannedMemory:
        key, job = self.largest()
        return PlannedMemory(job.need, key, job.describe())

    def over(self, gpu_memory: int) -> list[tuple[str, JobMemory]]:
        """The jobs a GPU of ``gpu_memory`` bytes cannot hold."""
        return [(key, job) for key, job in self.jobs.items() if job.need > gpu_memory]


def plan_manifest(manifest: Manifest, gpu_memory: int | None = None) -> ManifestMemory:
    """Every job's plan on a GPU of ``gpu_memory`` bytes (None: one with room for the untiled decode; 0: the least
    each job can need). Reads the checkpoint's headers and text tokenizer, no weights."""
    root = manifest.model.checkpoint
    model = ModelMemory.from_checkpoint(root)
    rules = RequestRules.from_checkpoint(root)
    cache = parse_cache(manifest.model.options.cache) is not None
    return ManifestMemory(model, {job.key: plan_request(model, rules, job.request, cache=cache, gpu_memory=gpu_memory)
                                  for job in manifest.jobs})


def with_plan(manifest: Manifest, least: ManifestMemory) -> Manifest:
    """The manifest whose model carries its largest job's least need (``least``: ``plan_manifest(manifest, 0)``),
    which each worker checks its GPU against."""
    return dataclasses.replace(manifest, model=dataclasses.replace(manifest.model, memory=least.planned()))


def refuse_unplaceable(least: ManifestMemory, gpu_memory: int, where: str) -> None:
    """Raises FarmError listing every job no GPU of ``gpu_memory`` bytes holds, the decode tiled where that helps
    (``least``: ``plan_manifest(manifest, 0)``; ``where`` says whose GPUs)."""
    over = least.over(gpu_memory)
    if over:
        lines = "\n".join(f"  {key}: needs {job.describe()}" for key, job in over)
        raise FarmError(f"{len(over)} job(s) need more GPU memory than {where} has ({gpu_memory / GIB:.1f} GiB); "
                        f"lower their size or frames, or run them on larger GPUs:\n{lines}")


def memory_classes(nodes: list[dict]) -> dict[int, int]:
    """GiB -> GPUs of that class on the alive nodes of ``ray.nodes()`` that name one."""
    classes: dict[int, int] = {}
    for node in nodes:
        resources = node.get("Resources", {})
        if not node.get("Alive"):
            continue
        for name in resources:
            if name.startswith(CLASS_PREFIX) and name.removeprefix(CLASS_PREFIX).isdigit():
                gib = int(name.removeprefix(CLASS_PREFIX))
                classes[gib] = classes.get(gib, 0) + int(resources.get("GPU", 0))
    return classes


def eligible_classes(least: ManifestMemory, classes: dict[int, int]) -> dict[str, int]:
    """Class resource -> its GPUs, for the classes whose GPUs hold every job (``least``: ``plan_manifest(manifest,
    0)``), smallest first; FarmError naming the jobs when even the largest does not."""
    need = least.planned().need
    fit = {f"{CLASS_PREFIX}{gib}": classes[gib] for gib in sorted(classes) if gib * GIB >= need}
    if not fit:
        refuse_unplaceable(least, max(classes) * GIB, f"the cluster's largest GPUs ({CLASS_PREFIX}{max(classes)})")
    return fit
