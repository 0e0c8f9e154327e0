"""The step cache (SeaCache) against diffusers' own: on tiny random checkpoints our loop with ``cache: seacache``
and diffusers' ``Cosmos3OmniPipeline`` with ``transformer.enable_cache(SeaCacheConfig(...))`` compute and cache
the same steps and end within the uncached parity tolerance, for T2V with CFG, I2V and a clip with sound; one
decision flipped breaks both checks. Plus the gate's rules on a synthetic trajectory, the option's validation,
and the composition with step precision and CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos3.errors import ConfigError
from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest
from cosmos3.rules.cache_options import SeaCacheSettings, cache_problems, parse_cache
from cosmos3.rules.step_precision import StepPolicy
from cosmos3.step_cache import StepCache, sea_filter, sea_gain
from tests.cosmos3.test_pipeline import PROMPT, ROUND_TRIP_TOLERANCE, rng_pixels
from tests.tiny_checkpoint import make_tiny_checkpoint

STEPS = 10
SIZE = (48, 32, 9)  # width, height, frames
CACHE = {"method": "seacache", "threshold": 0.25, "max_consecutive": 2}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def sound_root(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("sound"), sound=True)


def pipe_of(root, cache=CACHE) -> Cosmos3Pipeline:
    return Cosmos3Pipeline.from_pretrained(root, device="cpu", dtype=torch.float32, cache=cache)


def request(task: str, **fields) -> RenderRequest:
    width, height, frames = SIZE
    return RenderRequest(task=task, prompt=PROMPT, negative_prompt="blurry", width=width, height=height,
                         frames=frames, steps=STEPS, seed=11, **fields)


def diffusers_render(root, pipe, *, sound: bool = False, **inputs) -> tuple[np.ndarray, list[bool]]:
    """diffusers' pipeline with its SeaCache on ``CACHE``'s settings: uint8 frames and, per step, whether its
    decoder stack ran (seen by a hook on the first decoder layer)."""
    from diffusers import SeaCacheConfig

    from testbed.reference import diffusers_pipeline

    reference = diffusers_pipeline(root, pipe, sound=sound)
    reference.transformer.enable_cache(SeaCacheConfig(threshold=CACHE["threshold"],
                                                      max_consecutive_cached=CACHE["max_consecutive"]))
    stack_runs: list[int] = [0]
    reference.transformer.layers[0].register_forward_hook(lambda *_: stack_runs.__setitem__(-1, stack_runs[-1] + 1))

    def next_step(pipeline, i, t, kwargs):
        stack_runs.append(0)
        return kwargs

    width, height, frames = SIZE
    out = reference(
        prompt=PROMPT, negative_prompt="blurry", num_frames=frames, height=height, width=width, fps=24.0,
        num_inference_steps=STEPS, guidance_scale=6.0, generator=torch.Generator().manual_seed(11),
        output_type="np", enable_safety_check=False, enable_sound=sound, callback_on_step_end=next_step, **inputs,
    )
    runs = stack_runs[:STEPS]
    assert set(runs) <= {0, 2}, f"the CFG branches decided apart: stack runs per step {runs}"
    return np.round(out.video * 255).astype(np.uint8), [r == 2 for r in runs]


def ours_decisions(ours) -> list[bool]:
    computed = set(ours.info["cache"]["computed"])
    return [i in computed for i in range(STEPS)]


def parity_problems(ours, theirs_frames: np.ndarray, theirs_computed: list[bool]) -> list[str]:
    """What differs between our cached render and diffusers': the per-step decisions, the frames beyond the
    uncached parity tolerance."""
    decisions = ours_decisions(ours)
    found = []
    if decisions != theirs_computed:
        found.append(f"computed steps: ours {decisions}, diffusers' {theirs_computed}")
    gap = int(np.abs(ours.frames.astype(int) - theirs_frames.astype(int)).max())
    if gap > ROUND_TRIP_TOLERANCE:
        found.append(f"frames differ by up to {gap} levels (tolerance {ROUND_TRIP_TOLERANCE})")
    return found


def i2v_image() -> np.ndarray:
    width, height, _ = SIZE
    return rng_pixels((height, width, 3), seed=5)  # the render's size: no resampling on either side


CASES = {
    "t2v-cfg": (False, {}, {}),
    "i2v": (False, {"image": i2v_image()}, {"image": i2v_image()}),
    "t2v-sound": (True, {}, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_seacache_decides_and_renders_as_diffusers(root, sound_root, case):
    sound, ours_inputs, theirs_inputs = CASES[case]
    ckpt = sound_root if sound else root
    pipe = pipe_of(ckpt)
    task = "i2v" if "image" in ours_inputs else "t2v"
    ours = pipe(request(task, **ours_inputs))
    frames, computed = diffusers_render(ckpt, pipe, sound=sound, **theirs_inputs)
    assert not all(computed) and any(computed[1:-1]), f"the case must cache some steps and compute others: {computed}"
    assert parity_problems(ours, frames, computed) == []


def test_one_flipped_decision_breaks_the_parity_check(root, monkeypatch):
    pipe = pipe_of(root)
    frames, computed = diffusers_render(root, pipe)
    flip = computed.index(False)  # the first cached step computes instead
    decide = StepCache.decide

    def flipped(self, step, latents, branches):
        answer = decide(self, step, latents, branches)
        if step == flip:
            self.computed[-1] = True
            self._accumulated, self._consecutive = 0.0, 0
            return True
        return answer

    monkeypatch.setattr(StepCache, "decide", flipped)
    ours = pipe(request("t2v"))
    # The decisions tell it; the tiny model's frames move less than a level for one step's residual.
    assert parity_problems(ours, frames, computed) == [f"computed steps: ours {ours_decisions(ours)}, "
                                                       f"diffusers' {computed}"]
    assert ours_decisions(ours)[flip] and ours_decisions(ours)[:flip] == computed[:flip]


# -- the gate's rules -------------------------------------------------------------------------------


def gate_trajectory(cache: StepCache, moves: list[float]) -> list[bool]:
    """Decisions over latents that move by ``moves[i]`` (relative, in every frequency) before step i; a stack
    residual of ones is recorded on each computed step."""
    latents = torch.ones(2, 3, 4, 4)
    decisions = []
    for step, move in enumerate(moves):
        latents = latents * (1 + move)
        compute = cache.decide(step, latents, (0,))
        if compute:
            cache.record(0, (torch.zeros(5, 2), torch.full((5, 2), float(step))))
        decisions.append(compute)
    return decisions


def test_the_gate_accumulates_the_indicator_change_until_the_threshold():
    settings = SeaCacheSettings(threshold=0.25, max_consecutive=0, retention_steps=1, end_steps=1)
    # a uniform scale moves the filtered indicator by the same relative L1: 0.1 a step, then 0.3 once
    cache = StepCache(settings, [0.9] * 8)
    assert gate_trajectory(cache, [0, 0.1, 0.1, 0.1, 0.3, 0.1, 0.1, 0.1]) == [
        True,  # retained
        False, False,  # 0.1, 0.2 < 0.25
        True,  # 0.3 >= 0.25; the sum restarts
        True,  # 0.3 alone
        False, False,  # 0.1, 0.2
        True,  # the last step
    ]


def test_the_gate_caps_consecutive_cached_steps_and_keeps_edge_steps():
    settings = SeaCacheSettings(threshold=10.0, max_consecutive=2, retention_steps=2, end_steps=2)
    cache = StepCache(settings, [0.5] * 10, forced=frozenset({5}))
    assert gate_trajectory(cache, [0.01] * 10) == [True, True, False, False, True, True, False, False, True, True]


@pytest.mark.parametrize("order,expected", [(1, 3.0), (0, 2.0)])
def test_a_cached_step_extrapolates_the_last_two_residuals_linearly(order, expected):
    settings = SeaCacheSettings(threshold=10.0, max_consecutive=0, retention_steps=3, residual_order=order)
    cache = StepCache(settings, [0.5] * 6)
    assert gate_trajectory(cache, [0.01] * 4) == [True, True, True, False]  # residuals 0, 1, 2 kept; step 3 cached
    # order 1: 2 + (2 - 1) * (3 - 2) / (2 - 1); order 0: the last one
    torch.testing.assert_close(cache.residual(0), torch.full((5, 2), expected))


def test_a_branch_that_skipped_a_step_computes_before_it_is_cached_again():
    """CFG off for a step (outside a guidance interval) drops the uncond branch's residuals, as diffusers' gate
    restarts a trajectory with a gap; the next step running it computes."""
    cache = StepCache(SeaCacheSettings(threshold=10.0, max_consecutive=0), [0.5] * 6)
    stack = (torch.zeros(5, 2), torch.ones(5, 2))
    latents = torch.ones(2, 3, 4, 4)
    decisions = []
    for step, branches in enumerate([(0, 1), (0, 1), (0,), (0, 1), (0, 1)]):
        compute = cache.decide(step, latents, branches)
        for branch in branches:
            if compute:
                cache.record(branch, stack)
        decisions.append(compute)
    assert decisions == [True, False, False, True, False]


def test_the_sea_filter_is_unit_mean_and_keeps_a_constant_field():
    latents = torch.full((2, 3, 4, 5), 0.7)
    filtered = sea_filter(latents, sea_gain((3, 4, 5), 0.6, 3.0, latents.device))
    assert filtered.shape == (3, 4, 5, 2)
    # only frequency 0 is present: its gain over the mean gain scales the field uniformly
    assert torch.allclose(filtered, filtered[0, 0, 0, 0].expand_as(filtered))


# -- the option -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,field,message", [
    pytest.param("teacache", "cache", "must be one of off, seacache", id="unknown-method"),
    pytest.param({"method": "tea"}, "cache.method", "names its method: seacache", id="mapping-method"),
    pytest.param({"method": "seacache", "threshold": -0.1}, "cache.threshold", "a budget of relative change",
                 id="threshold"),
    pytest.param({"method": "seacache", "threshold": 1e11}, "cache.threshold", "a budget of relative change",
                 id="threshold-huge"),
    pytest.param({"method": "seacache", "max_consecutive": 99999999999}, "cache.max_consecutive",
                 "not a whole number in",
                 id="consecutive-huge"),
    pytest.param({"method": False, "threshold": 0.3}, "cache.method", "alone for no step cache",
                 id="off-with-params"),
    pytest.param({"method": "seacache", "threshold": float("nan")}, "cache.threshold", "not a finite", id="nan"),
    pytest.param({"method": "seacache", "max_consecutive": 1.5}, "cache.max_consecutive", "whole number",
                 id="max-consecutive"),
    pytest.param({"method": "seacache", "residual_order": 2}, "cache.residual_order", "not 0 or 1", id="order"),
    pytest.param({"method": "seacache", "power_exp": 0}, "cache.power_exp", "not > 0", id="power"),
    pytest.param({"method": "seacache", "thresold": 0.3}, "cache.thresold", "unknown parameter", id="typo"),
])
def test_bad_cache_options_are_refused_naming_the_field(value, field, message):
    found = cache_problems(value)
    assert [f for f, _ in found] == [field] and message in found[0][1]
    with pytest.raises(ConfigError, match=f"{field}: .*{message}"):
        parse_cache(value)


def test_cache_options_read_off_seacache_and_parameters():
    assert parse_cache("off") is None and parse_cache(False) is None  # YAML 1.1's bare off
    assert parse_cache("seacache") == SeaCacheSettings()
    assert parse_cache({"method": "seacache", "threshold": 0.4}) == SeaCacheSettings(threshold=0.4)


def test_a_bad_cache_option_fails_from_pretrained_before_loading(root):
    with pytest.raises(ConfigError, match="cache.threshold"):
        Cosmos3Pipeline.from_pretrained(root / "missing", cache={"method": "seacache", "threshold": "high"})


# -- composition --------------------------------------------------------------------------------------


def test_stills_and_clips_run_the_cache_and_the_sidecar_info_lists_the_steps(root):
    pipe = pipe_of(root)
    clip = pipe(request("t2v"))
    info = clip.info["cache"]
    assert info["method"] == "seacache" and info["threshold"] == 0.25
    assert sorted(info["computed"] + info["cached"]) == list(range(STEPS)) and info["cached"]
    pipe.cache = SeaCacheSettings(threshold=10.0, max_consecutive=0)  # a budget nothing reaches: all but the ends
    still = pipe(RenderRequest(task="t2i", prompt=PROMPT, width=32, height=32, steps=6)).info["cache"]
    assert (still["computed"], still["cached"]) == ([0, 5], [1, 2, 3, 4])


def test_step_precision_edge_steps_are_always_computed(root):
    pipe = pipe_of(root, {"method": "seacache", "threshold": 10.0, "max_consecutive": 0})
    baseline = pipe(request("t2v")).info["cache"]
    assert baseline["computed"] == [0, STEPS - 1]  # a budget nothing reaches: only the retained and end steps

    class Controller:  # a step policy's W8A16 steps, without FP8 weights to switch
        policy = StepPolicy(first=3, last=2, reasoner="native", source="override")

        def set_step(self, step, num_steps):
            pass

        def describe(self):
            return self.policy.describe()

    pipe.model.step_controller = Controller()
    try:
        cached = pipe(request("t2v")).info["cache"]
    finally:
        pipe.model.step_controller = None
    assert cached["computed"] == [0, 1, 2, STEPS - 2, STEPS - 1]


@pytest.mark.gpu
def test_cuda_cached_render_with_graphs_equals_eager(root):
    """A computed step replays its graph and hands the cache the graph's stack tensors; a cached step replays its
    own graph: the same decisions and frames as an eager render."""
    cache = {"method": "seacache", "threshold": 0.25, "max_consecutive": 2}
    req = request("t2v")
    eager = Cosmos3Pipeline.from_pretrained(root, device="cuda", cuda_graphs=False, cache=cache)(req)
    graphed = Cosmos3Pipeline.from_pretrained(root, device="cuda", cache=cache)(req)
    assert graphed.info["cache"] == eager.info["cache"] and eager.info["cache"]["cached"]
    assert graphed.info["cuda_graphs"]["gen_captured"] > 0
    assert graphed.info["cuda_graphs"]["gen_cached"] >= len(eager.info["cache"]["cached"])  # a pass a branch
    assert np.array_equal(graphed.frames, eager.frames)


@pytest.mark.gpu
def test_the_indicator_reads_nothing_back_to_the_host():
    """Every step's gain is built on the device at the job's first decision, and filtering reads nothing back: the
    one host read a cached step makes is its decision's distance."""
    latents = torch.randn(48, 3, 16, 16, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sea_filter(latents, sea_gain((3, 16, 16), 0.6, 3.0, latents.device))
    finally:
        torch.cuda.set_sync_debug_mode("default")
