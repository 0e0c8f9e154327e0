"""Which CUDA graph a short GEN pass replays, and when one is captured, over a farm's stream of jobs: the rule of
``cosmos3.cuda_graphs.GenGraphs`` on the CPU, the capture itself faked (the GPU tests check what graphs compute)."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
import torch

from cosmos3.cuda_graphs import RECURRING_JOBS, GenGraphs, JobGraphs, _Captured, _CapturedUnd
from cosmos3.transformer import GenLayout, GenOutput, LayoutKey, UndCache

TOKENS, HEAD_DIM, NEGATIVE = 16, 4, 7  # GEN tokens of the fake still; the negative prompt's length


def _layout(length: int) -> GenLayout:
    key = LayoutKey((1, 1, 4, 4), length, None, (), None)
    table = torch.zeros(TOKENS, HEAD_DIM)
    return GenLayout(key, (1, 1, 4, 4), (1, 4, 4), torch.zeros(1, dtype=torch.long), table, table.clone())


def _cache(length: int) -> UndCache:
    return UndCache([torch.zeros(length, 1, HEAD_DIM)], [torch.zeros(length, 1, HEAD_DIM)], length)


def _fake_capture(captures: list):
    """GenGraphs._capture without CUDA: the static buffers a real capture makes, a graph that does nothing."""
    def capture(key, layout, latents, step_t, cache, sound, skipping):
        captures.append(key)
        rows = key[0].und_len
        skip = torch.zeros(1, dtype=torch.int32) if skipping else None
        static = UndCache([torch.zeros(rows, 1, HEAD_DIM)], [torch.zeros(rows, 1, HEAD_DIM)], rows, skip)
        return _Captured(SimpleNamespace(replay=lambda: None), latents.clone(), step_t.clone(), static, layout, None,
                         GenOutput(torch.zeros(1)), weakref.ref(cache))
    return capture


class Farm:
    """A worker's GenGraphs fed jobs as the pipeline feeds them: ``prepare`` at each job's start, then passes of
    both CFG branches in two modes, as a step policy's edge and middle steps are (here the mode's attention flag
    tells them apart; no step controller)."""

    def __init__(self, monkeypatch, **options):
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
        self.attention = SimpleNamespace(fp8_active=False, gen_skips_rows=lambda device, tokens: True)
        model = SimpleNamespace(device=torch.device("cpu"), step_controller=None, attention=self.attention)
        self.graphs = GenGraphs(model, **options)
        self.captures: list[tuple] = []
        self.counted: list[JobGraphs] = []  # each job's counts, as its sidecar carries them
        monkeypatch.setattr(self.graphs, "_capture", _fake_capture(self.captures))
        self.negative = _cache(NEGATIVE)

    def job(self, length: int) -> list[tuple]:
        """One still with a prompt of ``length`` tokens; returns the keys it captured."""
        before = len(self.captures)
        self.graphs.prepare(TOKENS)
        prompt = _cache(length)
        for fp8 in (False, True, False):  # edge steps, middle steps, edge steps
            self.attention.fp8_active = fp8
            for cache in (prompt, self.negative):
                self.graphs.run(_layout(cache.length), torch.zeros(1), torch.zeros(1), cache, None)
        assert len(self.graphs._graphs) <= self.graphs.max_graphs
        self.counted.append(self.graphs.job)
        return self.captures[before:]


def test_one_prompt_seed_after_seed_captures_its_own_graphs_once_it_recurs(monkeypatch):
    """One prompt, seed after seed: its stills replay the bucket's graphs (captured by the first) until it and the
    negative prompt have run in each of the last RECURRING_JOBS jobs; the next still captures their exact graphs,
    and every still after replays them."""
    farm = Farm(monkeypatch)
    captured = [farm.job(40) for _ in range(RECURRING_JOBS + 2)]
    assert [(key[0].und_len, key[2]) for key in captured[0]] == [(128, True)] * 4  # a bucket graph a mode a branch
    assert captured[1:RECURRING_JOBS] == [[]] * (RECURRING_JOBS - 1)
    assert sorted((key[0].und_len, key[2]) for key in captured[RECURRING_JOBS]) == [(NEGATIVE, False)] * 2 + [
        (40, False)] * 2
    assert captured[-1] == []
    # What each still's sidecar says: (GEN graphs captured, passes on exact-length graphs, on a bucket's, eager)
    assert [(c.gen_captured, c.gen_exact, c.gen_bucket, c.gen_eager) for c in farm.counted] == [
        (4, 0, 6, 0)] + [(0, 0, 6, 0)] * (RECURRING_JOBS - 1) + [(4, 6, 0, 0), (0, 6, 0, 0)]


def test_the_two_cfg_branches_keep_their_k_v_in_a_bucket_graph_each(monkeypatch):
    """Prompt and negative prompt in one bucket: each replays a graph of its own, which holds its K/V from its first
    pass on. A pass copies its latents and timestep in; K/V (and RoPE tables) only where the graph held other ones:
    never in the first job (the captures hold them), in the next once for the new prompt in each mode."""
    farm = Farm(monkeypatch)
    copied = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda static, live: copied.append(len(static)) or real(static, live))
    passes = []
    for _ in range(2):
        farm.job(40)
        passes.append(copied[len(passes) * 6:])
    inputs, with_kv = 2, 2 + 2 + 2  # latents and timestep; plus one layer's K and V and the cos/sin tables
    # the passes of a job: (prompt, negative) in edge steps, middle steps, edge steps again
    assert passes == [[inputs] * 6, [with_kv, inputs, with_kv, inputs, inputs, inputs]]


def test_a_prompt_alone_in_its_bucket_replays_the_graph_an_earlier_prompt_left(monkeypatch):
    """Prompts past 128 tokens share the 256-row bucket, where the negative prompt never runs: the first captures
    a graph a mode; a later one replays them (their K/V belong to a finished job), capturing none."""
    farm = Farm(monkeypatch)
    captured = [len(farm.job(n)) for n in (40, 200, 40, 210, 230)]
    assert captured == [4, 2, 0, 0, 0]
    assert sorted((key[0].und_len, key[3]) for key in farm.captures) == [(128, 0)] * 2 + [(128, 1)] * 2 + [
        (256, 0)] * 2


def test_a_studio_batch_of_a_few_seeds_a_prompt_captures_no_prompts_graphs(monkeypatch):
    """Six prompts, three seeds each, back to back: past the first still (the bucket's graphs) only the negative
    prompt, which every job runs, earns graphs of its own. Under a looser rule (exact graphs for a length any of the
    last 4 jobs ran) each prompt's second still would capture two, each ~0.06 s, for ~0.007 s saved a still after."""
    lengths = [length for length in range(10, 40, 5) for _ in range(3)]
    farm = Farm(monkeypatch)
    assert [len(farm.job(n)) for n in lengths] == [4] + [0] * (RECURRING_JOBS - 1) + [2] + [0] * (
        len(lengths) - RECURRING_JOBS - 1)
    a_recent_job = Farm(monkeypatch, recurring_jobs=1, recent_jobs=4)
    assert [len(a_recent_job.job(n)) for n in lengths] == [4, 4, 0] + [0, 2, 0] * 5


def test_a_jobs_und_passes_are_counted_as_they_ran(monkeypatch):
    """A length's UND pass runs eagerly, is captured the next time it comes within the recent passes, then
    replays; each job's counts start from zero."""
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    model = SimpleNamespace(device=torch.device("cpu"), und=lambda ids: _cache(ids.numel()))
    graphs = GenGraphs(model)

    def capture_und(ids):  # GenGraphs._capture_und without CUDA
        cache = _cache(ids.numel())
        graphs._und_graphs[ids.numel()] = _CapturedUnd(SimpleNamespace(replay=lambda: None), ids.clone(), None, cache)
        return cache

    monkeypatch.setattr(graphs, "_capture_und", capture_und)
    counted = []
    for lengths in ([5, 9], [5, 9], [5, 12]):  # one job's two branches each
        graphs.prepare(TOKENS)
        for length in lengths:
            assert graphs.und(torch.zeros(length, dtype=torch.long)).length == length
        counted.append((graphs.job.und_captured, graphs.job.und_replayed, graphs.job.und_eager))
    assert counted == [(0, 0, 2), (2, 0, 0), (0, 1, 1)]


@pytest.mark.parametrize("prompts", [5, 12])
def test_varied_prompts_whose_lengths_come_back_capture_only_the_negative_prompts_graphs(monkeypatch, prompts):
    """A farm of varied prompts: every length comes back, after ``prompts - 1`` other jobs. Past the first job (the
    bucket's graphs) only the negative prompt's own are captured, once it ran in each of the last RECURRING_JOBS
    jobs. Under the rule that gave every length an earlier job ran its own graphs, every still of the second pass
    captured two."""
    lengths = [10 + 5 * i for i in range(prompts)]
    farm = Farm(monkeypatch)
    captured = [len(farm.job(n)) for n in lengths * 3]
    assert captured == [4] + [0] * (RECURRING_JOBS - 1) + [2] + [0] * (3 * prompts - RECURRING_JOBS - 1)

    every_earlier = Farm(monkeypatch, recurring_jobs=1, recent_jobs=10**9)
    second_pass = [len(every_earlier.job(n)) for n in lengths * 2][prompts:]
    assert second_pass == [2] * prompts
