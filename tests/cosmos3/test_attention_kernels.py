"""The ``attention`` option: its validation, the kernel choice, the FP8 recipe's math and (GPU) each kernel.

Error bounds (relative L2 against fp32 attention, on q/k after RMSNorm + RoPE):
  BF16 kernels        1%  (bf16 output rounding is ~0.2%)
  FP8 (any)           5%  (the per-layer budget; FP8 O rounding alone is ~2.5%)
  (on the H200 at 44,672 keys: cuDNN FP8 2.0% with K and V smoothed, 31% without V smoothing; FlashInfer FA3 FP8 1.6%)

GPU tests of a library kernel skip when its package is not installed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cosmos3.errors import ConfigError
from cosmos3.layers.attention_kernels import (
    AttentionKernels,
    SdpaKernel,
    bf16_kernel_names,
    exact_attention,
    fp8_attention_reference,
    fp8_kernel_names,
    power_of_two_scale,
    smooth_keys,
)
from cosmos3.layers.rope import MRoPE, grid_positions
from cosmos3.ops import cpu as ops_cpu
from cosmos3.rules.attention_choice import ATTENTION_CHOICES, check_attention

BF16_BOUND, FP8_BOUND = 0.01, 0.05


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def layer_qkv(sq: int, sk: int, *, heads=8, kv_heads=2, hd=64, key_offset=0.0, device="cpu", seed=0):
    """q ``[sq, heads, hd]``, k/v ``[sk, kv_heads, hd]`` bf16: projections of hidden states, RMSNorm with
    log-normal weights, mRoPE on a (T, H, W) grid; ``key_offset`` then adds a bias every key shares."""
    g = torch.Generator(device).manual_seed(seed)
    rope = MRoPE(hd, 5e6, (hd // 8 * 3 // 2, hd // 8 * 5 // 4, hd // 8 * 5 // 4)).to(device)

    def tower(n, heads_out):
        x = torch.randn(n, 256, generator=g, device=device) + torch.randn(256, generator=g, device=device)
        w = torch.randn(256, heads_out * hd, generator=g, device=device) / 16
        return (x @ w).view(n, heads_out, hd)

    def normed_and_roped(t):  # the model's QK norm and RoPE: the kernel's CPU twin (q and k differ in length here)
        weight = torch.exp(torch.randn(hd, generator=g, device=device) * 0.5 + 0.3)
        cos, sin = rope(grid_positions((t.shape[0], 1, 1), 100.0, fps=None, base_fps=24.0, temporal_compression=4),
                        torch.float32)
        return ops_cpu.rms_norm_rope(t, weight, 1e-6, cos, sin)  # plain torch ops: CPU or CUDA tensors

    q = normed_and_roped(tower(sq, heads))
    k = normed_and_roped(tower(sk, kv_heads)) + key_offset * torch.randn(1, kv_heads, hd, generator=g, device=device)
    v = tower(sk, kv_heads)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


# ------------------------------------------------------------------ the option

@pytest.mark.parametrize("value", ATTENTION_CHOICES)
def test_every_choice_is_accepted(value):
    assert check_attention(value) == value


@pytest.mark.parametrize("value", ["FP8", "fp16", "int8", "", None, 8, ["fp8"]])
def test_bad_choice_is_refused_with_the_field_named(value):
    with pytest.raises(ConfigError, match=r"model\.attention: must be one of auto, bf16, fp8, fp8-all-steps, got"):
        check_attention(value, "model.attention")


def test_attention_choice_module_needs_no_torch():
    import subprocess
    import sys

    code = ("import sys, cosmos3.rules.attention_choice as a; a.check_attention('fp8'); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ which kernel

@pytest.mark.parametrize("device_type, capability, cudnn, flashinfer, fa3, expected", [
    ("cpu", None, True, True, True, ["sdpa"]),
    ("cuda", (9, 0), True, True, False, ["flashinfer-fa3", "sdpa-cudnn", "sdpa-flash"]),
    ("cuda", (9, 0), True, True, True, ["fa3", "flashinfer-fa3", "sdpa-cudnn", "sdpa-flash"]),
    ("cuda", (9, 0), True, False, True, ["fa3", "sdpa-cudnn", "sdpa-flash"]),
    ("cuda", (9, 0), True, False, False, ["sdpa-cudnn", "sdpa-flash"]),
    ("cuda", (10, 0), True, True, True, ["sdpa-cudnn", "sdpa-flash"]),  # FA3 is Hopper-only
    ("cuda", (8, 0), True, True, True, ["sdpa-flash"]),
    ("cuda", (9, 0), False, False, False, ["sdpa-flash"]),
])
def test_auto_prefers_the_fastest_bf16_kernel_of_the_device(device_type, capability, cudnn, flashinfer, fa3,
                                                            expected):
    assert bf16_kernel_names(device_type, capability, cudnn, flashinfer, fa3=fa3) == expected


@pytest.mark.parametrize("device_type, capability, frontend, flashinfer, fa3, expected", [
    ("cpu", None, False, False, False, ["fp8-reference"]),
    ("cuda", (9, 0), True, True, False, ["flashinfer-fa3-fp8", "cudnn-fp8"]),
    ("cuda", (9, 0), True, True, True, ["fa3-fp8", "flashinfer-fa3-fp8", "cudnn-fp8"]),
    ("cuda", (9, 0), False, False, True, ["fa3-fp8"]),
    ("cuda", (9, 0), True, False, False, ["cudnn-fp8"]),
    ("cuda", (9, 0), False, True, False, ["flashinfer-fa3-fp8"]),
    ("cuda", (10, 0), True, True, True, ["cudnn-fp8"]),
])
def test_fp8_kernels_of_the_device(device_type, capability, frontend, flashinfer, fa3, expected):
    assert fp8_kernel_names(device_type, capability, frontend, flashinfer, fa3=fa3) == expected


def test_fp8_refused_on_a_gpu_before_hopper():
    with pytest.raises(ConfigError, match=r"needs an sm_90\+ .*compute capability \(8, 9\).*attention='auto'"):
        fp8_kernel_names("cuda", (8, 9), True, True)


def test_fp8_refused_without_a_library_for_the_device():
    with pytest.raises(ConfigError, match=r"FA3's FP8 attention \(Hopper: fa3-fwd or flashinfer-python\) or "
                                          r"cuDNN's \(nvidia-cudnn-frontend\), and none is installed: "
                                          r"pip install 'cosmos3-farm\[fa3\]' \(Hopper\) or "
                                          r"'cosmos3-farm\[fp8-attention\]'"):
        fp8_kernel_names("cuda", (10, 0), False, True, fa3=True)  # FA3 does not serve Blackwell


def test_a_kernel_that_cannot_build_here_is_passed_over_and_recorded():
    """FlashInfer's FA3 cannot run on this device (not installed on CPU CI; CUDA-only where it is): the next
    kernel is used, and describe() says which one was passed over and why."""
    kernels = AttentionKernels("auto")
    kernel = kernels._first_that_runs(["flashinfer-fa3", "sdpa"], torch.device("cpu"))
    assert kernel.name == "sdpa"
    assert "flashinfer-fa3" in kernels.describe("cpu")["passed_over"]
    with pytest.raises(ConfigError, match=r"attention='fp8': no kernel runs on cpu: flashinfer-fa3-fp8: \w+Error"):
        AttentionKernels("fp8")._first_that_runs(["flashinfer-fa3-fp8"], torch.device("cpu"))


def test_an_fa3_build_that_cannot_skip_rows_still_runs_and_says_so(monkeypatch):
    """A kernel of FA3's family whose row-skipping call fails at load is kept (the fastest), runs without
    skipping (graphs then hold one prompt length each), and describe() names what it passed over and why."""
    from cosmos3.layers import attention_kernels

    class NoVarlen(attention_kernels._Fa3Family):
        head_dims, fp8, name, skips_rows = (128,), False, "fa3", True

        def _bf16(self, q, k, v, causal):  # [S, heads, hd], as FA3 returns it
            return exact_attention(q, k, v, causal=causal).view(q.shape)

        def skipping(self, q, k, v, skip):
            raise RuntimeError("this build has no varlen kernels\nsecond line")

    monkeypatch.setattr(attention_kernels, "_make_kernel", lambda name: NoVarlen())
    kernels = AttentionKernels("auto")
    assert kernels.describe("cpu")["passed_over"] == {
        "fa3 row skipping": "RuntimeError: this build has no varlen kernels"}
    assert not kernels.gen_skips_rows("cpu", 256)


def test_precise_steps_run_bf16_attention():
    kernels = AttentionKernels("fp8")
    assert kernels.gen_kernel("cpu", 64) == "fp8-reference"
    kernels.precise = True  # what the step controller sets on a W8A16 edge step
    assert kernels.gen_kernel("cpu", 64) == "sdpa"
    bf16 = AttentionKernels("bf16")
    assert bf16.gen_kernel("cpu", 64) == "sdpa" and "fp8_kernel" not in bf16.describe("cpu")


def test_fp8_all_steps_keeps_fp8_attention_on_precise_steps():
    kernels = AttentionKernels("fp8-all-steps")
    for precise in (False, True, False):
        kernels.precise = precise
        assert kernels.gen_kernel("cpu", 64) == "fp8-reference"
    assert kernels.describe("cpu")["fp8_kernel"] == "fp8-reference"


def test_short_gen_passes_run_bf16_attention(monkeypatch):
    from cosmos3.layers import attention_kernels

    monkeypatch.setattr(attention_kernels.Fp8ReferenceKernel, "min_queries", 100)  # cuDNN's is 16,384
    kernels = AttentionKernels("fp8")
    assert kernels.gen_kernel("cpu", 99) == "sdpa" and kernels.gen_kernel("cpu", 100) == "fp8-reference"


def test_und_attention_stays_bf16_under_fp8():
    q, k, v = layer_qkv(48, 48)
    kernels = AttentionKernels("fp8")
    assert torch.equal(kernels.und(q, k, v), SdpaKernel(None)(q, k, v, causal=True))


# ------------------------------------------------------------------ the FP8 recipe's math

def test_exact_attention_maps_query_heads_to_kv_groups_like_sdpa():
    q, k, v = layer_qkv(40, 72)
    expected = F.scaled_dot_product_attention(*(t.float().transpose(0, 1)[None] for t in (q, k, v)),
                                              enable_gqa=True)[0].transpose(0, 1).reshape(40, -1)
    torch.testing.assert_close(exact_attention(q, k, v, causal=False), expected, atol=1e-5, rtol=1e-5)


def test_smoothing_keys_leaves_attention_unchanged():
    q, k, v = layer_qkv(64, 96, key_offset=3.0)
    q, k, v = q.float(), k.float(), v.float()
    smoothed, plain = exact_attention(q, smooth_keys(k), v, causal=True), exact_attention(q, k, v, causal=True)
    torch.testing.assert_close(smoothed, plain, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_value_smoothing_gives_each_head_its_own_mean_back(causal):
    q, k, v = layer_qkv(96, 96)
    v = v + 6.0 * torch.randn(1, v.shape[1], v.shape[2], generator=torch.Generator().manual_seed(7)).bfloat16()
    ref = exact_attention(q, k, v, causal=causal)
    smoothed = fp8_attention_reference(q, k, v, causal=causal, fp8_output=True, smooth_v=True)
    assert rel_l2(smoothed, ref) < FP8_BOUND  # a mean added under the wrong heads would be ~100% off


def test_scales_are_powers_of_two_that_fit_fp8():
    x = torch.randn(1000) * 37.0
    scale = power_of_two_scale(x)
    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert float(torch.log2(scale)) == round(float(torch.log2(scale)))
    assert 224.0 < float(x.abs().max() / scale) <= 448.0


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_reference_is_within_the_error_budget(causal):
    q, k, v = layer_qkv(256, 256 if causal else 640)
    ref = exact_attention(q, k, v, causal=causal)
    error = rel_l2(fp8_attention_reference(q, k, v, causal=causal, fp8_output=True), ref)
    assert 0.005 < error < FP8_BOUND  # it does quantize (a no-op would be ~0.2%), and within budget


def test_smoothing_cuts_the_error_when_keys_share_a_direction():
    q, k, v = layer_qkv(128, 512, key_offset=4.0)
    ref = exact_attention(q, k, v, causal=False)
    errors = {smooth: rel_l2(fp8_attention_reference(q, k, v, causal=False, fp8_output=False, smooth_k=smooth), ref)
              for smooth in (True, False)}
    assert errors[True] < errors[False] / 2, errors


def test_reference_rows_use_the_whole_tensors_scales():
    q, k, v = layer_qkv(64, 64)
    rows = torch.tensor([3, 17, 40])
    full = fp8_attention_reference(q, k, v, causal=False, fp8_output=True)
    assert torch.equal(fp8_attention_reference(q, k, v, causal=False, fp8_output=True, rows=rows), full[rows])


# ------------------------------------------------------------------ GPU: each kernel

def _gpu_qkv(causal: bool):
    return layer_qkv(2048, 2048 if causal else 2560, heads=32, kv_heads=8, hd=128, device="cuda")


def _library_kernel(name: str):
    """A kernel of ``_make_kernel``'s names, built for head_dim 128; skipped without its package."""
    from cosmos3.layers.attention_kernels import _make_kernel

    library = {"flashinfer": "flashinfer", "fa3": "fa3_fwd_interface"}.get(name.split("-")[0], "cudnn")
    pytest.importorskip(library)
    kernel = _make_kernel(name)
    if hasattr(kernel, "prepare"):
        kernel.prepare(torch.device("cuda"), 128)
    return kernel


FP8_KERNELS = ["cudnn-fp8", "flashinfer-fa3-fp8", "fa3-fp8"]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "CUDNN_ATTENTION"])
def test_bf16_kernels_match_fp32(backend, causal):
    from torch.nn.attention import SDPBackend

    q, k, v = _gpu_qkv(causal)
    out = SdpaKernel(getattr(SDPBackend, backend), pinned=True)(q, k, v, causal=causal)
    assert rel_l2(out, exact_attention(q, k, v, causal=causal)) < BF16_BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["flashinfer-fa3", "fa3"])
def test_fa3_bf16_kernels_match_fp32(name, causal):
    q, k, v = _gpu_qkv(causal)
    out = _library_kernel(name)(q, k, v, causal=causal)
    assert rel_l2(out, exact_attention(q, k, v, causal=causal)) < BF16_BOUND


@pytest.mark.gpu
def test_fa3_skips_the_rows_the_device_names_in_a_graph():
    """One graph over 1,536 K/V rows serves any prompt up to 512 rows right-aligned before the 1,024 GEN rows: it
    equals the kernel over exactly the rows kept, whatever the skipped rows hold."""
    kernel = _library_kernel("fa3")
    assert kernel.skips_rows
    q, k, v = layer_qkv(1024, 512 + 1024, heads=32, kv_heads=8, hd=128, device="cuda")
    static_k, static_v = (torch.full_like(t, 1e4) for t in (k, v))  # unskipped, these rows would swamp the softmax
    skip = torch.zeros(1, dtype=torch.int32, device="cuda")
    kernel.skipping(q, static_k, static_v, skip)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.skipping(q, static_k, static_v, skip)
    for prompt in (512, 300, 7):
        start = 512 - prompt
        static_k[start:], static_v[start:] = k[start:], v[start:]
        skip.fill_(start)
        graph.replay()
        assert torch.equal(out, kernel(q, k[start:], v[start:], causal=False)), prompt


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", FP8_KERNELS)
def test_fp8_kernels_match_fp32_at_image_lengths(name, causal):
    """Within budget at 2,048-2,560 keys (cuDNN: 4.2% / 3.8% measured on the H200); see below for video."""
    q, k, v = _gpu_qkv(causal)
    out = _library_kernel(name)(q, k, v, causal=causal)
    assert rel_l2(out, exact_attention(q, k, v, causal=causal)) < FP8_BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("name", FP8_KERNELS)
def test_fp8_kernels_are_within_budget_at_video_length(name):
    """bench_attention.py's 44,160 x 44,672 inputs and error rows (cuDNN 2.0% measured, 31% without V
    smoothing; FlashInfer 1.6%)."""
    from testbed.attention_inputs import ERROR_ROWS, realistic_qkv

    q, k, v = realistic_qkv(44160)
    rows = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(1))[:ERROR_ROWS].cuda()
    out = _library_kernel(name)(q, k, v, causal=False)[rows]
    assert rel_l2(out, exact_attention(q[rows], k, v, causal=False)) < FP8_BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("name", FP8_KERNELS)
def test_fp8_kernels_in_a_cuda_graph_rescale_every_replay(name):
    """The scales are computed inside the graph: a replay on new inputs equals an eager call on them."""
    kernel = _library_kernel(name)
    first, second = layer_qkv(1024, 1536, heads=32, kv_heads=8, hd=128, device="cuda"), None
    second = tuple(t * 3.0 for t in layer_qkv(1024, 1536, heads=32, kv_heads=8, hd=128, device="cuda", seed=1))
    static = tuple(t.clone() for t in first)
    kernel(*static, causal=False)  # warm-up: builds cuDNN's plan outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(*static, causal=False)
    for inputs in (first, second):
        for buffer, value in zip(static, inputs, strict=True):
            buffer.copy_(value)
        graph.replay()
        assert torch.equal(out, kernel(*inputs, causal=False))


# ------------------------------------------------------------------ the model's option

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY
    from testbed.fp8_checkpoints import make_bf16, make_fp8

    root = tmp_path_factory.mktemp("attention")
    bf16 = make_bf16(root / "bf16")
    return bf16, make_fp8(bf16, root / "fp8", step_policy=PUBLISHED_STEP_POLICY)


def _velocity(model, step=None):
    from testbed.fp8_checkpoints import PROMPTS

    if step is not None:
        model.set_denoising_step(*step)
    latents = torch.randn(4, 2, 4, 4, generator=torch.Generator().manual_seed(3)).bfloat16()
    return model.velocity(PROMPTS[1], latents, 500.0, fps=24.0)


def test_load_transformer_refuses_a_bad_attention_choice_by_name(ckpts):
    from cosmos3 import load_transformer

    with pytest.raises(ConfigError, match=r"attention: must be one of auto, bf16, fp8, fp8-all-steps, got 'int8'"):
        load_transformer(ckpts[0], attention="int8")


def test_fp8_attention_changes_the_velocity_within_budget(ckpts):
    from cosmos3 import load_transformer

    bf16 = _velocity(load_transformer(ckpts[0], dtype=torch.bfloat16, attention="bf16"))
    fp8 = _velocity(load_transformer(ckpts[0], dtype=torch.bfloat16, attention="fp8"))
    assert 0.0 < rel_l2(fp8, bf16) < FP8_BOUND


def test_w8a16_edge_steps_run_bf16_attention(ckpts):
    from cosmos3 import load_transformer

    def model(attention):
        return load_transformer(ckpts[1], dtype=torch.bfloat16, attention=attention)  # published policy: 3 / 3

    fp8_attention, bf16_attention = model("fp8"), model("bf16")
    edge, middle = (0, 35), (17, 35)
    assert torch.equal(_velocity(fp8_attention, edge), _velocity(bf16_attention, edge))
    assert not torch.equal(_velocity(fp8_attention, middle), _velocity(bf16_attention, middle))
    assert fp8_attention.attention.gen_kernel("cpu", 8) == "fp8-reference"


# A model small enough for a test, with Nano's head_dim (the kernels the GPU tests above build; FA3 and
# cuDNN FP8 want a multiple of 16).
SMALL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=128, vocab_size=128, latent_channel=16, latent_patch_size=2, patch_latent_dim=64, rope_theta=5e6,
             rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"})


def _small_model(attention="auto"):
    from cosmos3.checkpoint.loader import build_transformer
    from cosmos3.checkpoint.weights import TensorDict
    from cosmos3.rules.config import Cosmos3Config
    from testbed.random_weights import random_checkpoint

    return build_transformer(Cosmos3Config.from_dict(SMALL), TensorDict(random_checkpoint(SMALL, "cuda")),
                             device="cuda", attention=attention)


def test_the_random_checkpoint_of_the_gpu_tests_loads_strictly():
    from cosmos3.checkpoint.loader import build_transformer
    from cosmos3.checkpoint.weights import TensorDict
    from cosmos3.rules.config import Cosmos3Config
    from testbed.random_weights import random_checkpoint

    model = build_transformer(Cosmos3Config.from_dict(SMALL), TensorDict(random_checkpoint(SMALL, "cpu")))
    assert model.layers[0].self_attn.head_dim == 128  # loading is strict: a missing or extra tensor raises


@pytest.mark.gpu
def test_where_attention_skips_rows_one_graph_serves_every_prompt_length_of_its_bucket():
    """FA3's BF16 kernel skips the rows before a prompt: in a job, prompts of 5 to 128 tokens replay the graphs of
    one bucket (K/V rows 128), 129 tokens another's (256); a length that ran in each of the last jobs gets a graph
    of its own, which keeps replaying once the length stops recurring, while it is held; every replay equals the
    eager pass over that prompt's own K/V."""
    pytest.importorskip("fa3_fwd_interface")
    from cosmos3.cuda_graphs import RECURRING_JOBS, enable_cuda_graphs

    torch.manual_seed(0)
    model = _small_model()
    latents = torch.randn(16, 1, 32, 32, device="cuda").bfloat16()  # 256 GEN tokens
    assert model.attention.gen_skips_rows("cuda", 256)
    caches = [model.encode_text(torch.randint(0, 128, (n,), device="cuda")) for n in (5, 100, 37, 128, 129)]
    eager = [model.velocity(None, latents, 500.0, und_cache=cache) for cache in caches]
    enable_cuda_graphs(model)
    for order in (range(5), reversed(range(5))):
        for i in order:
            assert torch.equal(model.velocity(None, latents, 500.0, und_cache=caches[i]), eager[i]), i
    # two graphs of the 128-row bucket (a CFG branch each; here the prompts take turns), one of the 256-row one
    buckets = [(128, True), (128, True), (256, True)]
    assert sorted((key[0].und_len, key[2]) for key in model.cuda_graphs._graphs) == buckets
    for _ in range(RECURRING_JOBS - 1):  # jobs of 100 tokens (the first job ran it too): they replay the bucket
        model.prepare_gen(tuple(latents.shape), None)
        assert torch.equal(model.velocity(None, latents, 500.0, und_cache=caches[1]), eager[1])
    assert len(model.cuda_graphs._graphs) == 3
    model.prepare_gen(tuple(latents.shape), None)  # the next job: 100 tokens ran in each of the last jobs, 64 never
    new = model.encode_text(torch.randint(0, 128, (64,), device="cuda"))
    assert torch.equal(model.velocity(None, latents, 500.0, und_cache=caches[1]), eager[1])
    assert torch.equal(model.velocity(None, latents, 500.0, und_cache=new),
                       _eager_velocity(model, latents, new))
    assert torch.equal(model.velocity(None, latents, 500.0, und_cache=caches[2]), eager[2])
    assert sorted((key[0].und_len, key[2]) for key in model.cuda_graphs._graphs) == [(100, False)] + buckets
    for _ in range(RECURRING_JOBS):  # jobs of 37 tokens only, until no recent job ran 100
        model.prepare_gen(tuple(latents.shape), None)
        assert torch.equal(model.velocity(None, latents, 500.0, und_cache=caches[2]), eager[2])
    assert torch.equal(model.velocity(None, latents, 500.0, und_cache=caches[1]), eager[1])
    last = next(reversed(model.cuda_graphs._graphs))  # the graph replayed last
    assert (last[0].und_len, last[2]) == (100, False)  # 100's exact graph is still held: it replays, not the bucket
    model.prepare_gen(tuple(latents.shape), None)  # a job of 150 tokens: caches[4] holds the 256-row graph, so
    gone = model.encode_text(torch.randint(0, 128, (150,), device="cuda"))  # it captures the bucket's second
    assert torch.equal(model.velocity(None, latents, 500.0, und_cache=gone), _eager_velocity(model, latents, gone))
    held = set(model.cuda_graphs._graphs)
    del gone  # its job is over: the next prompt of the bucket takes its graph, capturing none
    model.prepare_gen(tuple(latents.shape), None)
    later = model.encode_text(torch.randint(0, 128, (200,), device="cuda"))
    assert torch.equal(model.velocity(None, latents, 500.0, und_cache=later), _eager_velocity(model, latents, later))
    assert set(model.cuda_graphs._graphs) == held


def test_recent_forgets_a_round_once_as_many_newer_ones_came():
    from cosmos3.cuda_graphs import Recent

    recent = Recent(2)
    recent.add({"a", "b"})
    recent.add(set())
    assert "a" in recent and "b" in recent and "c" not in recent
    recent.add({"c"})
    assert "a" not in recent and "b" not in recent and "c" in recent


def _eager_velocity(model, latents, cache):
    graphs, model.cuda_graphs = model.cuda_graphs, None
    try:
        return model.velocity(None, latents, 500.0, und_cache=cache)
    finally:
        model.cuda_graphs = graphs


@pytest.mark.gpu
def test_graphed_steps_equal_eager_steps_with_each_attention_kernel():
    """A graph per kernel: FP8 steps and BF16 (edge) steps replay what eager computes, in any order."""
    from cosmos3.cuda_graphs import enable_cuda_graphs

    torch.manual_seed(0)
    model = _small_model()
    model.attention.use("fp8")
    ids = torch.arange(64, device="cuda")
    latents = torch.randn(16, 1, 256, 256, device="cuda").bfloat16()  # 16,384 GEN tokens: FP8 attention runs
    cache = model.encode_text(ids)
    eager = {}
    for precise in (False, True):
        model.attention.precise = precise
        eager[precise] = model.velocity(ids, latents, 500.0, und_cache=cache)
    assert not torch.equal(eager[False], eager[True])
    enable_cuda_graphs(model)
    for precise in (False, True, False, True):
        model.attention.precise = precise
        assert torch.equal(model.velocity(ids, latents, 500.0, und_cache=cache), eager[precise])
    assert len(model.cuda_graphs._graphs) == 2
