"""CUDA graphs of the GEN tower: capture a step once, replay it every step.

A Nano GEN step at 1,024 tokens is a few thousand small kernels; launching them from Python costs
more than the maths. A graph is captured per (layout, UND K/V rows, step-precision mode): the inputs
that change between calls — latents, timestep, the UND K/V of the branch (and, in a bucket's graph below,
the GEN tokens' RoPE, which starts after the prompt) — are copied into the graph's static buffers before each
replay (K/V are small: ``[S_und, nkv, hd]`` per layer), so the cond and uncond branches of a render, and later
renders of the same shape, reuse the graphs. The K/V copy is skipped while the graph's buffers already hold
the cache passed in.

Where the attention kernel reads from the device how many leading K/V rows to skip (FA3's BF16 kernel), a
prompt length replays a bucket's graph (``prefix_rows``): the prompt's K/V sit right-aligned in its UND rows and
the rows before are skipped, so one graph serves every prompt length of its bucket, and a farm rendering stills of
ever new prompts replays graphs instead of capturing two a still (two extra forwards each). A bucket keeps a graph
per CFG branch (``BUCKET_SLOTS``), so that each keeps its branch's K/V between passes. A length that ran in
each of the last ``RECURRING_JOBS`` jobs (a negative prompt's, a prompt template's, a long batch of one prompt)
gets graphs of its exact length, as every length does with other kernels: FA3's skipping kernel is its varlen
build, ~8% slower a call at a still's size (benchmarks/results/h200-graphs.md), ~0.007 s a still.
Capturing them costs ~0.06 s a graph, two a branch (W8A16 and W8A8 steps), so only a length that keeps coming pays
them back; a prompt rendered with a few seeds replays its bucket throughout (h200-graphs.md). A
length's exact graphs, once captured, replay while they are held. All GEN graphs share one memory pool; they never
run concurrently and outputs are cloned out.

The W8A16 steps of a step policy dequantize every GEN weight each forward; at a still's length that is a
fifth of the forward. Graphed W8A16 passes instead read the weights dequantized once
(``w8a16.DequantizedWeights``, a 16-bit copy of the GEN tower: 13.8 GB for Nano) where the device has room
for it: a still's nine W8A16 forwards then dequantize once. The copy lives while jobs stay graphed (its
address is in their graphs); ``prepare`` drops it, and the graphs that read it, before a job whose passes are
too long for graphs, which would gain nothing from it (a clip's W8A16 forward is ~1.9 s).

A step cache's cached pass (``Cosmos3Transformer.cached_gen``: the GEN stream's embedding, the stack's stand-in
residual added, the readout) is a few dozen small kernels, launched right after the step's decision has read the
device: eager, the GPU idles while the host launches them. It replays a graph of its own per layout and mode
(``CACHED_GRAPHS`` held, in their own pool), its inputs copied in as a computed pass's are.

A job's UND pass (once per CFG branch) is launch-bound too: ~1,700 small kernels a branch for a prompt of ~50
tokens, 0.04 s of host time for 0.02 s of GPU work (benchmarks/results/h200-graphs.md). In short
jobs, a prompt length's pass is captured when the length ran in one of the last ``UND_RECENT_PASSES`` UND passes
(that eager pass is the call's answer) and replayed after: a negative prompt's length repeats in every job, and so
does a prompt template's, while a length seen once, or only now and then (most prompts), never pays for a capture.
UND graphs have no buckets: a bucket's rows would change the GEMMs' row count, and cuBLAS's BF16 GEMMs (the
published policy's W8A16 UND linears) give other bits at some row counts (h200-not-kept.md), so a
prompt's K/V would depend on the graph that served it. A UND graph has its own pool (its W8A16 passes'
dequantized weights, one at a time), given back with the dequantized GEN weights before a long job.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from cosmos3.quant import W8A16
from cosmos3.quant.w8a16 import DequantizedWeights
from cosmos3.transformer import Cosmos3Transformer, GenLayout, GenOutput, UndCache

# Above this many GEN tokens a step is bound by its maths, not its launches: on the H200 a graphed Nano
# step at 44,160 tokens (720p, 189 frames) is as fast as an eager one (benchmarks/results/h200-transformer.md),
# while each capture costs two extra forwards (warm-up + capture, ~2.6 s each in FP8) and keeps the step's
# activations (~5 GiB) reserved in the graph pool. Such steps run eagerly.
GRAPH_MAX_TOKENS = 16384
# Free device memory the dequantized GEN weights must leave: what a graphed pass (up to GRAPH_MAX_TOKENS tokens)
# and a still's VAE decode may still allocate beside them.
DEQUANTIZED_HEADROOM = 8 << 30
# Layouts whose cached pass stays captured (least recently used dropped first): a job's passes share one layout.
CACHED_GRAPHS = 4
# Prompt lengths whose UND pass stays captured (least recently used dropped first).
UND_GRAPHS = 8
# The fewest UND K/V rows of a graph whose kernel skips rows. Buckets are powers of two: a graph per doubling of
# prompt length, and the skipped rows (which attention_inputs copies with the prompt's, per layer) are fewer than
# the prompt's own.
MIN_PREFIX_ROWS = 128
# GEN graphs held at once (least recently used dropped first).
MAX_GRAPHS = 16
# Graphs a bucket keeps for a mode: one per CFG branch, whose prompts often share a bucket. A graph that holds the
# other branch's K/V copies them in before each pass, 2 x layers small copies (~0.005 s a Nano still on the H200,
# benchmarks/results/h200-graphs.md).
BUCKET_SLOTS = 2
# A prompt length gets GEN graphs of its exact length once it ran in each of the last this many jobs (see the
# module's docstring): the exact graphs of a still's two branches (4) fit in MAX_GRAPHS beside the buckets'.
RECURRING_JOBS = 8
# A prompt length's UND pass is captured when the length ran in one of the last this many UND passes (two a job).
UND_RECENT_PASSES = 8


def prefix_rows(length: int) -> int:
    """The UND K/V rows of the graph that serves a prompt of ``length`` tokens, where attention skips rows."""
    return max(MIN_PREFIX_ROWS, 1 << max(length - 1, 0).bit_length())


class Recent:
    """The keys of the last ``rounds`` rounds (jobs, or UND passes), in bounded memory."""

    def __init__(self, rounds: int):
        self._rounds: deque[frozenset] = deque(maxlen=rounds)

    def add(self, keys: Iterable[Hashable]) -> None:
        """One round's keys; the oldest round is forgotten."""
        self._rounds.append(frozenset(keys))

    def __contains__(self, key: Hashable) -> bool:
        return any(key in keys for keys in self._rounds)

    def count(self, key: Hashable) -> int:
        """In how many of the remembered rounds ``key`` was."""
        return sum(key in keys for keys in self._rounds)


def enable_cuda_graphs(model: Cosmos3Transformer, max_graphs: int = MAX_GRAPHS, **rule: int) -> None:
    """Replay each GEN step of ``model`` from a CUDA graph: at small token counts launches, not maths, bound a step.
    ``rule``: ``GenGraphs``'s ``recurring_jobs``/``recent_jobs``/``bucket_slots`` (benchmarks compare rules).

    A function here rather than a model method, so the model never imports this module (one direction only).
    """
    if model.device.type != "cuda":
        raise ValueError(f"CUDA graphs need the model on a CUDA device, it is on {model.device}")
    model.cuda_graphs = GenGraphs(model, max_graphs=max_graphs, **rule)


class Mode(NamedTuple):
    """What a graph was captured for, beside its layout: W8A16 and W8A8 steps, and FP8 and BF16 attention, are
    different graphs, and a W8A16 graph reads the dequantized weights it was captured with."""

    linears: tuple[str, ...]  # the GEN linears' quant method (empty without a step policy)
    fp8_attention: bool
    reads: int | None  # which DequantizedWeights (GenGraphs._held at their making); None: it dequantizes itself


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    latents: torch.Tensor  # static inputs ...
    step_t: torch.Tensor
    cache: UndCache  # [rows, nkv, hd] a layer; ``skip`` set where the kernel skips rows
    layout: GenLayout  # its cos/sin (written in a bucket's graph)
    sound: torch.Tensor | None
    out: GenOutput  # ... and outputs, owned by the graph's pool
    holds: weakref.ref  # the UndCache whose K/V ``cache`` holds now (a weak reference: never kept alive)


@dataclass
class _CapturedCached:
    graph: torch.cuda.CUDAGraph
    latents: torch.Tensor  # static inputs ...
    step_t: torch.Tensor
    residual: torch.Tensor  # [N_gen, H]
    sound: torch.Tensor | None
    layout: GenLayout  # kept alive: the graph reads its noisy-frame index
    out: GenOutput  # ... and outputs, owned by the graph's pool


@dataclass
class _CapturedUnd:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # static input [S] ...
    rotary: tuple[torch.Tensor, torch.Tensor]  # ... its RoPE tables, read by the graph
    out: UndCache  # owned by the graph's pool


@dataclass
class JobGraphs:
    """What one job's passes ran, counted a pass (the sidecar's ``cuda_graphs``): a slow still in a farm says
    whether it paid for captures (two extra forwards each) or ran on graphs it found."""

    gen_captured: int = 0  # GEN graphs captured in the job (its passes then replay them)
    gen_exact: int = 0  # GEN passes replayed from a graph of the prompt's exact length
    gen_bucket: int = 0  # GEN passes replayed from a bucket's graph (its kernel skips the rows before the prompt)
    gen_eager: int = 0  # GEN passes too long for graphs
    gen_cached: int = 0  # a step cache's cached passes replayed from a graph (a capture counts in gen_captured)
    und_captured: int = 0  # UND passes captured (each runs eagerly too: its answer)
    und_replayed: int = 0
    und_eager: int = 0  # UND passes run eagerly and not captured


def warmed_capture(run, pool=None) -> tuple[torch.cuda.CUDAGraph, object]:
    """Runs ``run`` once on a side stream (lazy cuBLAS/extension init must not happen during capture), then captures
    it into a graph in ``pool`` (None: a pool of its own); returns the graph and the captured call's outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


class GenGraphs:
    """A model's CUDA graphs. A prompt length gets GEN graphs of its exact length once it ran in ``recurring_jobs``
    of the last ``recent_jobs`` jobs (by default each of the last RECURRING_JOBS); other rules exist to be measured
    against (benchmarks/bench_graphs.py stream)."""

    def __init__(self, model, *, max_graphs: int = MAX_GRAPHS, recurring_jobs: int = RECURRING_JOBS,
                 recent_jobs: int | None = None, bucket_slots: int = BUCKET_SLOTS):
        self.model = model
        self._bucket_slots = bucket_slots
        self.max_graphs = max_graphs
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()
        self._cached_graphs: OrderedDict[tuple, _CapturedCached] = OrderedDict()  # (layout, mode) -> cached pass
        self._cached_pool = torch.cuda.graph_pool_handle()
        self._und_graphs: OrderedDict[int, _CapturedUnd] = OrderedDict()  # prompt length -> its UND pass
        self._und_recent = Recent(UND_RECENT_PASSES)  # prompt lengths of the last UND passes (a length in it captures)
        self._gen_recent = Recent(recent_jobs or recurring_jobs)  # GEN layouts of the last jobs
        self._recurring_jobs = recurring_jobs  # in how many of them a layout ran gets it graphs of its exact length
        self._gen_now: dict[tuple, bool] = {}  # this job's GEN layouts: whether each runs graphs of its exact length
        self._short_job = True  # whether the job prepare() last announced runs graphed
        self.job = JobGraphs()  # the passes of the job prepare() last announced
        self.dequantized: DequantizedWeights | None = None  # the GEN weights W8A16 passes read, while held
        self._held = 0  # how many DequantizedWeights were made: a graph's key names the one it reads

    def _gen_method(self):
        """The GEN linears' method this step (what the model's step precision selects), or None without a policy."""
        controller = self.model.step_controller
        return None if controller is None else controller.gen_method

    def _w8a16(self) -> bool:
        """Whether the step runs W8A16 now."""
        return self._gen_method() is W8A16

    def _mode(self) -> Mode:
        """What the step runs now (a graph per mode)."""
        method = self._gen_method()
        reads = self._held if method is W8A16 and self.dequantized is not None else None
        linears = () if method is None else (type(method).__name__,)
        return Mode(linears, self.model.attention.fp8_active, reads)

    def _hold_dequantized(self) -> None:
        """Dequantize the GEN weights once for W8A16 passes, where the device has room for them."""
        linears, dtype = self.model.step_controller.gen_linears, self.model.dtype
        free, _ = torch.cuda.mem_get_info(self.model.device)
        if free - DequantizedWeights.nbytes(linears, dtype) >= DEQUANTIZED_HEADROOM:
            self.dequantized = DequantizedWeights(self.model.step_precision, linears, dtype)
            self._held += 1

    def prepare(self, tokens: int) -> None:
        """Before a job whose GEN passes hold ``tokens`` tokens. Passes too long for graphs run eagerly, and so
        does such a job's UND pass: the dequantized weights, the graphs that read them and the UND graphs are
        dropped for it, and their memory goes back to the device before the job starts (its peak is its own)."""
        self._gen_recent.add(self._gen_now)
        self._gen_now = {}
        self.job = JobGraphs()
        self._short_job = tokens <= GRAPH_MAX_TOKENS
        if self._short_job or (self.dequantized is None and not self._und_graphs):
            return
        for graphs in (self._graphs, self._cached_graphs):
            for key in [key for key in graphs if key[1].reads is not None]:
                del graphs[key]
        if self.dequantized is not None:
            self.dequantized.release()
            self.dequantized = None
        self._und_graphs.clear()
        torch.cuda.empty_cache()

    def und(self, ids: torch.Tensor) -> UndCache:
        """The UND pass over device ids ``[S]``: replayed from its length's graph, else eager (captured as well
        when the length ran lately)."""
        length = ids.numel()
        recent = length in self._und_recent
        self._und_recent.add((length,))
        captured = self._und_graphs.get(length)
        if captured is None:
            if self._short_job and recent and length > 0:
                self.job.und_captured += 1
                return self._capture_und(ids)
            self.job.und_eager += 1
            return self.model.und(ids)
        self.job.und_replayed += 1
        self._und_graphs.move_to_end(length)
        captured.ids.copy_(ids)
        captured.graph.replay()
        # The next replay of this length overwrites the graph's K/V: the cache gets its own, in one copy kernel.
        out = captured.out
        keys, values = [torch.empty_like(k) for k in out.keys], [torch.empty_like(v) for v in out.values]
        torch._foreach_copy_(keys + values, out.keys + out.values)
        return UndCache(keys, values, length)

    def run(self, layout: GenLayout, latents: torch.Tensor, step_t: torch.Tensor, cache: UndCache,
            sound: torch.Tensor | None) -> GenOutput:
        tokens = layout.cos.shape[0]
        if tokens > GRAPH_MAX_TOKENS:
            self.job.gen_eager += 1
            return self.model.gen(layout, latents, step_t, cache, sound)
        if self.dequantized is None and self._w8a16():
            self._hold_dequantized()
        # A bucket's graph, where the kernel skips rows, unless the prompt length recurs (or its exact graphs are
        # held). The layout's first pass in a job decides for the job.
        exact = self._gen_now.get(layout.key)
        if exact is None:
            recurs = self._gen_recent.count(layout.key) >= self._recurring_jobs
            exact = self._gen_now[layout.key] = recurs or self._has_exact(layout.key)
        skipping = not exact and self.model.attention.gen_skips_rows(self.model.device, tokens)
        rows = prefix_rows(cache.length) if skipping else cache.length
        base = (layout.key._replace(und_len=rows), self._mode(), skipping)
        key = self._bucket_slot(base, cache) if skipping else (*base, 0)
        captured = self._graphs.get(key)
        if captured is None:
            if len(self._graphs) >= self.max_graphs:
                self._graphs.popitem(last=False)
            captured = self._graphs[key] = self._capture(key, layout, latents, step_t, cache, sound, skipping)
            self.job.gen_captured += 1
        self._graphs.move_to_end(key)
        if skipping:
            self.job.gen_bucket += 1
        else:
            self.job.gen_exact += 1
        # One foreach copy: a few multi-tensor kernels for the inputs and every layer's UND K/V, not 2 + 2 x layers
        static, live = [captured.latents, captured.step_t], [latents, step_t]
        if captured.holds() is not cache:  # caches are never written after encode_text
            held, start = captured.cache, rows - cache.length  # the prompt's rows are the last ones
            static += [t[start:] for t in held.keys + held.values]
            live += [*cache.keys, *cache.values]
            if held.skip is not None:  # a bucket's graph: maybe another prompt length, so another RoPE start
                static += [captured.layout.cos, captured.layout.sin]
                live += [layout.cos, layout.sin]
                held.skip.fill_(start)  # no host sync: a fill kernel queued before the replay
            captured.holds = weakref.ref(cache)
        if sound is not None:
            static.append(captured.sound)
            live.append(sound)
        torch._foreach_copy_(static, live)
        captured.graph.replay()
        out = captured.out
        # The stack's tensors stay the graph's: a step cache takes their difference before the next replay.
        return GenOutput(out.vision.clone(), None if out.sound is None else out.sound.clone(), out.stack)

    def run_cached(self, layout: GenLayout, latents: torch.Tensor, step_t: torch.Tensor, residual: torch.Tensor,
                   sound: torch.Tensor | None) -> GenOutput:
        """A cached step's pass (``Cosmos3Transformer.cached_gen``), replayed from its layout's graph where a
        computed pass of that layout would be."""
        if layout.cos.shape[0] > GRAPH_MAX_TOKENS:
            return self.model.cached_gen(layout, latents, step_t, residual, sound)
        key = (layout.key._replace(und_len=0), self._mode())  # the embedding and readout never read the UND K/V
        captured = self._cached_graphs.get(key)
        if captured is None:
            if len(self._cached_graphs) >= CACHED_GRAPHS:
                self._cached_graphs.popitem(last=False)
            captured = self._cached_graphs[key] = self._capture_cached(layout, latents, step_t, residual, sound)
            self.job.gen_captured += 1
        self._cached_graphs.move_to_end(key)
        self.job.gen_cached += 1
        static, live = [captured.latents, captured.step_t, captured.residual], [latents, step_t, residual]
        if sound is not None:
            static.append(captured.sound)
            live.append(sound)
        torch._foreach_copy_(static, live)
        captured.graph.replay()
        out = captured.out
        return GenOutput(out.vision.clone(), None if out.sound is None else out.sound.clone())

    def _capture_cached(self, layout, latents, step_t, residual, sound) -> _CapturedCached:
        inputs = (latents.clone(), step_t.clone(), residual.clone(), None if sound is None else sound.clone())
        graph, out = warmed_capture(lambda: self.model.cached_gen(layout, *inputs), self._cached_pool)
        return _CapturedCached(graph, *inputs, layout, out)

    def _bucket_slot(self, base: tuple, cache: UndCache) -> tuple:
        """The key of the bucket graph that serves ``cache``: the one holding its K/V; else one whose K/V's prompt
        is gone (its job is over); else one not captured yet; else the one used least recently (the other branch
        ran the last). A capture costs two forwards, so a branch takes a new slot only while the others' are live."""
        keys = [(*base, slot) for slot in range(self._bucket_slots)]
        held = [key for key in self._graphs if key in keys]  # least recently used first
        for wanted in (cache, None):  # its own K/V's slot, else the least recently used of the gone prompts'
            for key in held:
                if self._graphs[key].holds() is wanted:
                    return key
        if len(held) < self._bucket_slots:
            return next(key for key in keys if key not in self._graphs)
        return held[0]

    def _has_exact(self, layout_key) -> bool:
        """Whether a graph of ``layout_key``'s exact prompt length is still held (from when the length recurred)."""
        return any(key[0] == layout_key and not key[2] for key in self._graphs)

    def _capture(self, key, layout, latents, step_t, cache, sound, skipping: bool) -> _Captured:
        rows = key[0].und_len
        start = rows - cache.length

        def right_aligned(t: torch.Tensor) -> torch.Tensor:  # [S_und, nkv, hd] -> [rows, nkv, hd]
            held = t.new_zeros((rows, *t.shape[1:]))
            held[start:] = t
            return held

        skip = torch.full((1,), start, dtype=torch.int32, device=self.model.device) if skipping else None
        static = UndCache([right_aligned(k) for k in cache.keys], [right_aligned(v) for v in cache.values], rows, skip)
        static_layout = dataclasses.replace(layout, cos=layout.cos.clone(), sin=layout.sin.clone())
        inputs = (latents.clone(), step_t.clone(), static, None if sound is None else sound.clone())
        graph, out = warmed_capture(lambda: self.model.gen(static_layout, *inputs), self.pool)
        return _Captured(graph, inputs[0], inputs[1], static, static_layout, inputs[3], out, weakref.ref(cache))

    def _capture_und(self, ids: torch.Tensor) -> UndCache:
        """Runs the UND pass eagerly (also the warm-up a capture needs: lazy library init must not happen in
        one), then captures it for this length's next calls; returns the eager pass's cache."""
        if len(self._und_graphs) >= UND_GRAPHS:
            self._und_graphs.popitem(last=False)
        static, rotary = ids.clone(), self.model.und_rotary(ids.numel())
        cache = self.model.und(static, rotary)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # a pool of its own, freed with it
            out = self.model.und(static, rotary)
        self._und_graphs[ids.numel()] = _CapturedUnd(graph, static, rotary, out)
        return cache
