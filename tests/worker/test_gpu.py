"""A worker holds exactly the one GPU Ray gave it, and records the device's UUID."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from farm.errors import WorkerConfigError
from worker import gpu
from worker.gpu import check_assignment, cuda_device_facts

ASSIGNMENTS_REFUSED = [  # Ray's ids, CUDA_VISIBLE_DEVICES, words of the error
    pytest.param(["0", "1"], "0,1", "Ray assigned this one 2 (0, 1); create it with num_gpus=1", id="two-gpus"),
    pytest.param(["3"], None, "GPU 3, but it sees CUDA_VISIBLE_DEVICES=None", id="variable-unset"),
    pytest.param(["3"], "0,1,2,3", "GPU 3, but it sees CUDA_VISIBLE_DEVICES='0,1,2,3'", id="sees-the-node"),
    pytest.param(["3"], "2", "GPU 3, but it sees CUDA_VISIBLE_DEVICES='2'", id="another-gpu"),
]


@pytest.mark.parametrize(("ids", "visible"), [([], None), ([], "0,1"), (["3"], "3"),
                                              (["GPU-8f6e"], "GPU-8f6e")])
def test_a_worker_that_sees_its_one_gpu_or_none_passes(ids, visible):
    check_assignment(ids, visible)


@pytest.mark.parametrize(("ids", "visible", "words"), ASSIGNMENTS_REFUSED)
def test_a_worker_that_sees_other_gpus_is_refused(ids, visible, words):
    with pytest.raises(WorkerConfigError, match="exactly one GPU|must see that GPU alone") as error:
        check_assignment(ids, visible)
    assert words in str(error.value)


def test_the_device_facts_are_its_uuid_name_and_sm(monkeypatch):
    props = SimpleNamespace(uuid="8f6e1c2a-0b1d-4c8e-9d3f-5a7b9c1d2e3f", name="NVIDIA H200", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props if index == 0 else None)
    assert cuda_device_facts() == {"gpu_uuid": props.uuid, "gpu_name": "NVIDIA H200", "sm": 90}


@pytest.mark.parametrize("count", [0, 2, 8])
def test_a_process_that_sees_other_than_one_cuda_device_is_refused(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(WorkerConfigError, match=f"must see exactly one CUDA device, it sees {count}"):
        cuda_device_facts()


def test_a_gpu_worker_sets_expandable_allocator_segments_unless_the_node_says_otherwise(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)  # restored after the test
    gpu.configure_cuda_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    gpu.configure_cuda_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def test_a_gpu_worker_gives_cublaslt_no_workspace_unless_the_node_says_otherwise(monkeypatch):
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    gpu.configure_cuda_allocator()
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == "0"
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "32768")
    gpu.configure_cuda_allocator()
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == "32768"
