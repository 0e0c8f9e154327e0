"""GEN steps replayed from CUDA graphs equal eager steps, across branches, timesteps and step precision; graphed
W8A16 steps read the GEN weights dequantized once, and a job too long for graphs gets their memory back. UND
passes replayed from a graph per prompt length equal eager ones."""

from __future__ import annotations

import pytest
import torch

import cosmos3.quant.w8a16 as w8a16
from cosmos3 import load_transformer
from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY
from cosmos3.cuda_graphs import DEQUANTIZED_HEADROOM, GRAPH_MAX_TOKENS, enable_cuda_graphs
from testbed.fp8_checkpoints import make_bf16, make_fp8

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


def _latents():
    return torch.randn(4, 3, 4, 4, generator=torch.Generator().manual_seed(0)).cuda().bfloat16()


def _graphed(path):
    model = load_transformer(path, device="cuda", dtype=torch.bfloat16)
    enable_cuda_graphs(model)
    return model


# "fp8-no-room": the device reports too little free memory to hold the dequantized weights beside its headroom,
# so the W8A16 graphs dequantize per call, as eager passes do.
@pytest.mark.parametrize("which", ["bf16", "fp8", "fp8-no-room"])
def test_graph_replay_equals_eager(ckpts, which, monkeypatch):
    path = ckpts[0] if which == "bf16" else ckpts[1]
    latents = _latents()
    eager = run_steps(load_transformer(path, device="cuda", dtype=torch.bfloat16), latents)
    if which == "fp8-no-room":
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (DEQUANTIZED_HEADROOM, 2 << 40))
    model = _graphed(path)
    graphed = run_steps(model, latents)
    for i, (a, b) in enumerate(zip(eager, graphed, strict=True)):
        assert torch.equal(a, b), i
    # One graph per (UND length, step-precision mode): COND and OTHER share one.
    modes = 1 if which == "bf16" else 2
    assert len(model.cuda_graphs._graphs) == 2 * modes
    assert (model.cuda_graphs.dequantized is not None) == (which == "fp8")


def test_graphed_w8a16_steps_dequantize_each_weight_once(ckpts, monkeypatch):
    model = _graphed(ckpts[1])
    gen = model.step_controller.gen_linears
    calls = []
    real = w8a16.ops.dequantize_fp8
    monkeypatch.setattr(w8a16.ops, "dequantize_fp8", lambda w, s, dtype: calls.append(w) or real(w, s, dtype))
    run_steps(model, _latents())  # six W8A16 steps x three branches, two graphs (warm-up and capture each)
    # Each GEN weight once; every W8A16 forward (captures included) read them instead of dequantizing. (The UND
    # tower's encode_text, reasoner a16, dequantizes its own weights per call: not counted.)
    gen_weights = sorted(id(linear.weight) for linear in gen)
    assert sorted(i for i in map(id, calls) if i in set(gen_weights)) == gen_weights
    assert all(linear.dequantized is not None for linear in gen)


def test_a_job_too_long_for_graphs_gets_the_dequantized_weights_memory_back(ckpts):
    model = _graphed(ckpts[1])
    latents = _latents()
    first = run_steps(model, latents)
    graphs, gen = model.cuda_graphs, model.step_controller.gen_linears
    held = torch.cuda.memory_allocated()
    w8a16_graphs = [key for key in graphs._graphs if key[1].linears == ("W8A16LinearMethod",)]
    assert len(w8a16_graphs) == 2 and graphs.dequantized is not None

    model.prepare_gen((4, 3, 4, 4), None)  # a job of the same short length keeps them
    assert graphs.dequantized is not None and len(graphs._graphs) == 4
    side = int((GRAPH_MAX_TOKENS + 1) ** 0.5) + 1  # a square just past the graphs' length, patch size 2
    model.prepare_gen((4, 1, 2 * side, 2 * side), None)
    assert graphs.dequantized is None and all(linear.dequantized is None for linear in gen)
    assert not set(w8a16_graphs) & set(graphs._graphs) and len(graphs._graphs) == 2  # the W8A8 graphs stay
    freed = w8a16.DequantizedWeights.nbytes(gen, torch.bfloat16)
    assert held - torch.cuda.memory_allocated() >= freed

    again = run_steps(model, latents)  # short again: held anew (another address), the W8A16 graphs recaptured
    assert graphs.dequantized is not None and len(graphs._graphs) == 4
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_a_replay_copies_the_und_cache_only_when_the_graph_holds_another(ckpts, monkeypatch):
    model = _graphed(ckpts[0])
    latents = _latents()
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


def _und_passes(model):
    """Two rounds over three prompts, OTHER of COND's length: the caches' K and V, in order."""
    return [[*cache.keys, *cache.values] for _ in range(2) for cache in map(model.encode_text, (
        COND.cuda(), UNCOND.cuda(), OTHER.cuda()))]


@pytest.mark.parametrize("which", ["bf16", "fp8"])
def test_und_graph_replay_equals_eager(ckpts, which, monkeypatch):
    path = ckpts[0] if which == "bf16" else ckpts[1]
    eager = _und_passes(load_transformer(path, device="cuda", dtype=torch.bfloat16))
    model = _graphed(path)
    captures = []
    real_capture = model.cuda_graphs._capture_und
    monkeypatch.setattr(model.cuda_graphs, "_capture_und", lambda ids: captures.append(ids.numel()) or
                        real_capture(ids))
    graphed = _und_passes(model)
    # A length's first pass runs eagerly, its second captures (OTHER's in round 1, UNCOND's in round 2), every
    # later one replays into a cache of its own: COND's of round 2, taken before OTHER replayed the same graph,
    # still holds COND's K/V.
    assert captures == [len(OTHER), len(UNCOND)]
    for i, (a, b) in enumerate(zip(eager, graphed, strict=True)):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), i


def test_a_job_too_long_for_graphs_runs_its_und_pass_eagerly(ckpts):
    model = _graphed(ckpts[1])
    graphs = model.cuda_graphs
    first = model.encode_text(COND.cuda())  # a length's first pass: eager, nothing captured
    assert not graphs._und_graphs
    model.encode_text(COND.cuda())  # its second: captured
    assert len(graphs._und_graphs) == 1
    side = int((GRAPH_MAX_TOKENS + 1) ** 0.5) + 1
    model.prepare_gen((4, 1, 2 * side, 2 * side), None)  # a long job: the UND graphs go, nothing is captured
    assert not graphs._und_graphs
    long_job = model.encode_text(COND.cuda())
    assert not graphs._und_graphs
    model.prepare_gen((4, 3, 4, 4), None)  # short again: a length seen before is captured anew
    again = model.encode_text(COND.cuda())
    assert len(graphs._und_graphs) == 1
    for cache in (long_job, again):
        assert all(torch.equal(x, y) for x, y in zip([*first.keys, *first.values], [*cache.keys, *cache.values],
                                                      strict=True))
