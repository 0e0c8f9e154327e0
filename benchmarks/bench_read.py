"""Checkpoint read speed to the GPU: safetensors' own reader vs ours (cosmos3/checkpoint/tensor_reader.py).

On one ``transformer/`` directory (e.g. the Nano checkpoint ``bench_render.py write`` makes), every tensor is
read to the GPU three ways, each from a cold page cache (``--drop-caches``, needs root) and again warm:
  cat          ``cat`` of the shards to /dev/null: what the disk streams to one reader
  safetensors  ``safe_open(device="cuda").get_tensor`` per key, after a WILLNEED hint per shard
  ours RxC     ``CheckpointFiles.plan`` + ``get`` in file order: R threads, C-MiB pieces, pinned buffers; one row
               per ``--settings`` entry (the first is the default, tensor_reader.READERS x CHUNK)

    python -m benchmarks.bench_read /tmp/nano/fp8/transformer --drop-caches --settings 4x4 8x16 2x16
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import torch
from safetensors import safe_open

from benchmarks.common import drop_page_cache
from cosmos3.checkpoint import tensor_reader
from cosmos3.checkpoint.weights import CheckpointFiles


def by_file(files: CheckpointFiles) -> list[str]:
    return sorted(files.keys(), key=lambda k: (str(files.headers[k].file), files.headers[k].offset))


def read_cat(files: CheckpointFiles) -> int:
    shards = sorted({h.file for h in files.headers.values()})
    subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)
    return sum(shard.stat().st_size for shard in shards)


def read_safetensors(files: CheckpointFiles) -> int:
    handles, total = {}, 0
    for key in by_file(files):
        header = files.headers[key]
        if header.file not in handles:
            fd = os.open(header.file, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            os.close(fd)
            handles[header.file] = safe_open(header.file, framework="pt", device="cuda")
        tensor = handles[header.file].get_tensor(header.key)
        total += tensor.numel() * tensor.element_size()
        del tensor
    torch.cuda.synchronize()
    return total


def read_ours(files: CheckpointFiles, readers: int, chunk_mib: int) -> int:
    tensor_reader.READERS, tensor_reader.CHUNK = readers, chunk_mib << 20
    keys = by_file(files)
    files.plan(keys)
    before = files.bytes_read
    for key in keys:
        files.get(key)  # dropped at once, as the loader drops each once it is in the model
    torch.cuda.synchronize()
    return files.bytes_read - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transformer", type=Path, help="a transformer/ directory of sharded safetensors")
    parser.add_argument("--drop-caches", action="store_true", help="read each cold first (needs root)")
    default = f"{tensor_reader.READERS}x{tensor_reader.CHUNK >> 20}"
    parser.add_argument("--settings", nargs="+", default=[default], help="readers x MiB per piece, e.g. 8x16")
    args = parser.parse_args()
    settings = [tuple(map(int, s.split("x"))) for s in args.settings]
    files = CheckpointFiles(args.transformer, device="cuda")
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}; {len(files.keys())} tensors in {len({h.file for h in files.headers.values()})} shards; "
          f"ours: readers x MiB pieces as named, {tensor_reader.AHEAD >> 30} GiB ahead; {os.cpu_count()} CPUs")
    print("| reader | page cache | GB | s | GB/s | vs safetensors |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for cache in (["cold"] if args.drop_caches else []) + ["warm"]:
        readers = [("cat", read_cat), ("safetensors", read_safetensors)]
        readers += [(f"ours {r}x{c}", lambda files, r=r, c=c: read_ours(files, r, c)) for r, c in settings]
        for name, read in readers:
            state = drop_page_cache() if cache == "cold" else "kept"
            start = time.perf_counter()
            nbytes = read(files)
            seconds = time.perf_counter() - start
            rows[name, cache] = nbytes / seconds / 1e9
            base = rows.get(("safetensors", cache))
            ratio = f"{rows[name, cache] / base:.2f}x" if base else ""
            print(f"| {name} | {cache} ({state}) | {nbytes / 1e9:.2f} | {seconds:.2f} | {rows[name, cache]:.2f} "
                  f"| {ratio} |", flush=True)


if __name__ == "__main__":
    main()
