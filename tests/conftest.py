"""One rule for GPU tests: a test marked ``gpu`` is skipped when no CUDA device is visible."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch  # only when a GPU test was collected: the farm's tests stay torch-free

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in gpu_items:
        item.add_marker(skip)


_EXIT_STATUS = pytest.StashKey[int]()


# Ray's core worker can segfault while the interpreter finalizes after many ray.init/ray.shutdown cycles in one
# process (ray-project/ray#31145: its background threads outlive the freed core worker). The suite starts and
# stops a Ray cluster per test module (about ten in one process), and once in ~8 full runs the pytest process died
# with SIGSEGV *after* printing an all-passed summary, which turned CI red. Once pytest has reported, the process
# leaves without finalizing, carrying pytest's own status.
def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    import os
    import sys

    if _EXIT_STATUS in config.stash and "ray" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[_EXIT_STATUS])

