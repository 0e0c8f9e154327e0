"""Checkpoint tensors from safetensors shards to a device, read by threads in the order the loader takes them.

safetensors' own reader maps a shard and copies each tensor out of the mapping: a cold disk then sees one
reader's page-fault readahead, a warm page cache still costs a fault per 4 KiB page, and the copy to the GPU
starts from pageable memory. Here READERS threads ``preadv`` CHUNK-byte pieces of the tensors into pinned
buffers, so the disk has READERS requests in flight, and each piece is copied to its tensor on the device as
it lands. ``PlannedRead`` reads a list of tensors in the loader's order, at most AHEAD bytes in front of what
the loader has taken; ``read_tensor`` reads one, in the calling thread.

benchmarks/bench_read.py, a Nano FP8 checkpoint (16.5 GB) to the H200: from the page cache 14.9-19.6 GB/s vs
safetensors' 4.0-4.2 (3.7-4.6x); from the disk 1.49-1.55 GB/s vs 1.25-1.35, the disk's own ``cat`` 1.44-1.58
(benchmarks/results/h200-read.md).
"""

from __future__ import annotations

import math
import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from cosmos3.errors import CheckpointError

# 8 x 16 MiB streamed the page cache at 14.9 GB/s where 4 x 4 and 2 x 16 MiB managed 9.4-9.8; all settings read the
# disk at its own speed (bench_read.py --settings).
READERS = 8  # pieces in flight: requests the disk sees at once
CHUNK = 16 << 20  # bytes per piece
AHEAD = 2 << 30  # bytes read (on the device) that the loader has not taken yet


@dataclass(frozen=True)
class Stored:
    """Where one tensor's bytes lie: ``nbytes`` from ``offset`` of ``file``, little-endian, row-major."""

    key: str
    file: Path
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def read_tensor(stored: Stored, device: torch.device) -> torch.Tensor:
    """One tensor, read in this thread."""
    with _Files() as files:
        buffers = _Buffers(device, 1)
        tensor, pieces = _allocate(stored, device)
        for start, length in pieces:
            _read_piece(files.fd(stored.file), stored, start, length, tensor, buffers)
        return tensor


class PlannedRead:
    """Reads ``plan`` (tensors in the order ``take`` will ask for them) with READERS threads, ahead of the taker.

    ``take`` must follow the plan's order: the reader stays at most AHEAD bytes ahead, so a tensor asked for
    out of order could wait behind tensors nobody takes. ``close`` stops it early (an error while loading).
    """

    def __init__(self, plan: list[Stored], device: torch.device):
        self._device = device
        self._order = [stored.key for stored in plan]
        self._taken = 0
        self._untaken = set(self._order)
        self._ready: dict[str, tuple[torch.Tensor, list[Future]]] = {}
        self._ahead = 0  # bytes fed and not taken
        self._closed = False
        self._failed: BaseException | None = None
        self._changed = threading.Condition()
        self._files = _Files()
        self._buffers = _Buffers(device, READERS)
        self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="checkpoint-read")
        self._feeder = threading.Thread(target=self._feed, args=(plan,), name="checkpoint-plan", daemon=True)
        self._feeder.start()

    def holds(self, key: str) -> bool:
        """Whether ``key`` is planned and not taken yet."""
        return key in self._untaken

    def take(self, key: str) -> torch.Tensor:
        if self._taken >= len(self._order) or self._order[self._taken] != key:
            expected = self._order[self._taken] if self._taken < len(self._order) else "nothing"
            raise RuntimeError(f"checkpoint tensors taken out of plan: asked for {key}, the plan has {expected} next")
        with self._changed:
            self._changed.wait_for(lambda: key in self._ready or self._failed is not None or self._closed)
            if key not in self._ready:
                raise self._failed or RuntimeError(f"checkpoint read closed before {key} was read")
            tensor, pieces = self._ready.pop(key)
        try:
            for piece in pieces:
                piece.result()  # a read's error surfaces here, naming the file
        except BaseException:
            self.close()
            raise
        self._taken += 1
        self._untaken.discard(key)
        with self._changed:
            self._ahead -= tensor.nbytes
            self._changed.notify_all()
        if self._taken == len(self._order):
            self.close()
        return tensor

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._files.close()

    def _feed(self, plan: list[Stored]) -> None:
        try:
            for stored in plan:
                with self._changed:  # the first tensor past the budget goes when all before it are taken
                    self._changed.wait_for(
                        lambda n=stored.nbytes: self._closed or self._ahead == 0 or self._ahead + n <= AHEAD)
                    if self._closed:
                        return
                    self._ahead += stored.nbytes
                    fd = self._files.fd(stored.file)  # under the lock: close() cannot have closed the files yet
                tensor, pieces = _allocate(stored, self._device)
                futures = [self._pool.submit(_read_piece, fd, stored, start, length, tensor, self._buffers)
                           for start, length in pieces]
                with self._changed:
                    self._ready[stored.key] = (tensor, futures)
                    self._changed.notify_all()
        except BaseException as err:  # an allocation or open that failed: the taker raises it
            with self._changed:
                self._failed = err
                self._changed.notify_all()


def _allocate(stored: Stored, device: torch.device) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The empty tensor and its pieces, ``(byte offset in the tensor, length)``."""
    tensor = torch.empty(stored.shape, dtype=stored.dtype, device=device)
    return tensor, [(start, min(CHUNK, stored.nbytes - start)) for start in range(0, stored.nbytes, CHUNK)]


def _read_piece(fd: int, stored: Stored, start: int, length: int, tensor: torch.Tensor, buffers: _Buffers) -> None:
    target = tensor.view(-1).view(torch.uint8)[start:start + length]  # [length] bytes of the tensor
    if tensor.device.type == "cpu":  # straight into the tensor's memory
        _pread(fd, stored, start, target.numpy())
        return
    buffer, stream = buffers.get()
    try:
        _pread(fd, stored, start, buffer[:length].numpy())
        with torch.cuda.stream(stream):
            target.copy_(buffer[:length], non_blocking=True)
        stream.synchronize()  # the buffer is free again, and the piece is on the device
    finally:
        buffers.put((buffer, stream))


def _pread(fd: int, stored: Stored, start: int, into) -> None:
    view, done = memoryview(into).cast("B"), 0
    while done < len(view):
        try:
            got = os.preadv(fd, [view[done:]], stored.offset + start + done)
        except OSError as err:
            raise CheckpointError(f"{stored.file}: reading {stored.key} failed: {err}") from None
        if got == 0:
            raise CheckpointError(f"{stored.file}: the file ends inside {stored.key}'s data (at byte "
                                  f"{stored.offset + start + done}): truncated since it was opened; re-download it")
        done += got


class _Buffers:
    """Pinned host buffers of CHUNK bytes, each with the CUDA stream that copies out of it (none on the CPU)."""

    def __init__(self, device: torch.device, count: int):
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        if device.type == "cuda":
            for _ in range(count):
                self._free.put((torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True), torch.cuda.Stream(device)))

    def get(self) -> tuple[torch.Tensor, torch.cuda.Stream]:
        return self._free.get()

    def put(self, item) -> None:
        self._free.put(item)


class _Files:
    """Read-only descriptors, one per shard, opened on first use."""

    def __init__(self):
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: Path) -> int:
        with self._lock:
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY)
            return self._fds[path]

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
