"""GEN steps replayed from CUDA graphs equal eager steps, across branches, timesteps and step precision."""

from __future__ import annotations

import pytest
import torch

from cosmos3 import load_transformer
from cosmos3.cuda_graphs import enable_cuda_graphs
from cosmos3.fp8_export import PUBLISHED_STEP_POLICY
from tests.cosmos3.fp8_checkpoints import make_bf16, make_fp8

pytestmark = pytest.mark.gpu

COND, UNCOND, OTHER = torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6]), torch.tensor([2, 7, 1, 8, 2])


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    bf16 = make_bf16(root / "bf16")
    return bf16, make_fp8(bf16, root / "fp8", step_policy=PUBLISHED_STEP_POLICY)


def run_steps(model, latents, steps=8):  # policy 3/3 of 8: W8A16 steps 0-2 and 5-7, W8A8 steps 3-4
    caches = [model.encode_text(ids.cuda()) for ids in (COND, UNCOND, OTHER)]
    outs = []
    for i, t in enumerate(torch.linspace(999, 1, steps).tolist()):
        model.set_denoising_step(i, steps)
        for cache in caches:  # OTHER has COND's length: it replays COND's graph with its own K/V
            outs.append(model.velocity(None, latents, t, fps=24.0, condition_frames=(0,), und_cache=cache))
    return outs


@pytest.mark.parametrize("which", ["bf16", "fp8"])
def test_graph_replay_equals_eager(ckpts, which):
    path = ckpts[0] if which == "bf16" else ckpts[1]
    latents = torch.randn(4, 3, 4, 4, generator=torch.Generator().manual_seed(0)).cuda().bfloat16()
    eager = run_steps(load_transformer(path, device="cuda", dtype=torch.bfloat16), latents)
    model = load_transformer(path, device="cuda", dtype=torch.bfloat16)
    enable_cuda_graphs(model)
    graphed = run_steps(model, latents)
    for i, (a, b) in enumerate(zip(eager, graphed, strict=True)):
        assert torch.equal(a, b), i
    # One graph per (UND length, step-precision mode): COND and OTHER share one.
    modes = 2 if which == "fp8" else 1
    assert len(model.cuda_graphs._graphs) == 2 * modes


def test_a_replay_copies_the_und_cache_only_when_the_graph_holds_another(ckpts, monkeypatch):
    model = load_transformer(ckpts[0], device="cuda", dtype=torch.bfloat16)
    enable_cuda_graphs(model)
    latents = torch.randn(4, 3, 4, 4, generator=torch.Generator().manual_seed(0)).cuda().bfloat16()
    copied = []
    real_copy = torch._foreach_copy_

    def counting_copy(static, live):
        copied.append(len(static))
        return real_copy(static, live)

    monkeypatch.setattr(torch, "_foreach_copy_", counting_copy)
    cond, other = (model.encode_text(ids.cuda()) for ids in (COND, OTHER))  # one length: one graph
    layers = len(model.layers)

    def step(cache, t=500.0):
        copied.clear()
        out = model.velocity(None, latents, t, und_cache=cache)
        return out, copied[0]

    first, n = step(cond)  # captured from cond: its buffers hold cond
    assert n == 2  # latents and timestep only
    again, n = step(cond, 400.0)
    assert n == 2
    swapped, n = step(other)
    assert n == 2 + 2 * layers  # every layer's K and V
    back, n = step(cond)
    assert n == 2 + 2 * layers and torch.equal(back, first)
    del cond
    fresh = model.encode_text(COND.cuda())  # the same K/V in a new cache object: copied, never assumed
    _, n = step(fresh)
    assert n == 2 + 2 * layers
    eager = load_transformer(ckpts[0], device="cuda", dtype=torch.bfloat16)
    assert torch.equal(swapped, eager.velocity(None, latents, 500.0, und_cache=eager.encode_text(OTHER.cuda())))
    assert torch.equal(again, eager.velocity(None, latents, 400.0, und_cache=eager.encode_text(COND.cuda())))
