"""The denoising loop's scheduler step: diffusers' own arithmetic, queued without waiting for the device."""

from __future__ import annotations

import pytest
import torch

from cosmos3.rules.sampling import SamplingRecipe
from cosmos3.scheduler import make_scheduler, scheduler_step

UNIPC = SamplingRecipe("UniPCMultistepScheduler", {"prediction_type": "flow_prediction", "use_flow_sigmas": True})


def _run(step, device: str, steps: int = 12):
    """Latents after ``steps`` UniPC updates with fixed pseudo-velocities; ``step(scheduler, v, t, x)``."""
    scheduler = make_scheduler(UNIPC, steps=steps, flow_shift=3.0, device=torch.device(device))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 8, 8, generator=g).to(device)
    for t in scheduler.timesteps:
        v = (torch.randn(4, 2, 8, 8, generator=g).to(device) + x) * 0.5
        x = step(scheduler, v, t, x)
    return x


def _diffusers_step(scheduler, v, t, x):
    return scheduler.step(v.unsqueeze(0), t, x.unsqueeze(0), return_dict=False)[0].squeeze(0)


def test_the_step_is_diffusers_own_bit_for_bit_and_its_corrector_solves(monkeypatch):
    solved = []
    solve_ex = torch.linalg.solve_ex

    def counting(*args, **kwargs):
        solved.append(kwargs.get("check_errors"))
        return solve_ex(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "solve_ex", counting)
    ours = _run(lambda s, v, t, x: scheduler_step(s, v, t, x, torch.Generator()), "cpu")
    assert solved and set(solved) == {False}  # every corrector solve ran, unchecked
    assert torch.equal(ours, _run(_diffusers_step, "cpu"))


def test_the_unchecked_solve_holds_only_inside_the_step():
    a = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    b = torch.tensor([1.0, 2.0])
    scheduler = make_scheduler(UNIPC, steps=4, flow_shift=3.0, device=torch.device("cpu"))
    x = torch.zeros(4, 1, 2, 2)
    scheduler_step(scheduler, x, scheduler.timesteps[0], x, torch.Generator())
    with pytest.raises(RuntimeError, match="singular"):  # outside the step, torch checks as ever
        torch.linalg.solve(torch.zeros(2, 2), b)
    assert torch.allclose(torch.linalg.solve(a, b), torch.tensor([0.2, 0.6]))


@pytest.mark.gpu
def test_a_unipc_schedule_on_the_device_never_waits_for_it():
    expected = _run(lambda s, v, t, x: scheduler_step(s, v, t, x, torch.Generator()), "cpu")
    scheduler = make_scheduler(UNIPC, steps=12, flow_shift=3.0, device=torch.device("cuda"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 8, 8, generator=g).cuda()
    noise = [torch.randn(4, 2, 8, 8, generator=g).cuda() for _ in scheduler.timesteps]
    steps = list(zip(scheduler.timesteps, noise, strict=True))
    # diffusers finds its place in the schedule on the first step (a read of the device, once a job)
    x = scheduler_step(scheduler, (noise[0] + x) * 0.5, steps[0][0], x, torch.Generator())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # from here any host sync raises
    try:
        for t, n in steps[1:]:
            x = scheduler_step(scheduler, (n + x) * 0.5, t, x, torch.Generator())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(x.cpu(), expected, rtol=1e-5, atol=1e-5)


# -- the distilled builds' recipe -----------------------------------------------------------------

SIGMAS = [0.999, 0.75, 0.5, 0.25]


def _distilled_root(tmp_path, where: str):
    """A checkpoint's scheduler files as a distilled build ships them: the fixed list in the scheduler's
    ``fixed_step_sampler_config.t_list``, or only in ``modular_model_index.json``'s ``distilled_sigmas``."""
    import json

    from toy.layout import DISTILLED_SCHEDULER

    config = dict(DISTILLED_SCHEDULER)
    if where == "modular_model_index":
        config.pop("fixed_step_sampler_config")
        (tmp_path / "modular_model_index.json").write_text(json.dumps({"is_distilled": True,
                                                                       "distilled_sigmas": SIGMAS}))
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("where", ["t_list", "modular_model_index"])
def test_the_distilled_schedule_and_its_noise_are_what_diffusers_runs(tmp_path, where):
    """Our recipe from the checkpoint's files against diffusers' modular distilled pipeline's own steps (its
    ``Cosmos3DistilledSetTimestepsStep``: ``set_timesteps(sigmas=distilled_sigmas)``; its loop: ``step(...,
    generator=...)``), and both against the SDE update written out: ``x' = (1 - s') (x - s v) + s' noise``."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from cosmos3.rules.sampling import load_recipe

    root = _distilled_root(tmp_path, where)
    recipe = load_recipe(root)
    assert recipe.is_distilled and recipe.fixed_sigmas == tuple(SIGMAS)
    ours = make_scheduler(recipe, steps=4, flow_shift=None, device=torch.device("cpu"))
    theirs = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    theirs.set_timesteps(sigmas=SIGMAS, device="cpu")
    assert torch.equal(ours.timesteps, theirs.timesteps) and torch.equal(ours.sigmas, theirs.sigmas)
    assert ours.sigmas.tolist() == pytest.approx([*SIGMAS, 0.0])

    start = torch.randn(4, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    x_ours, x_theirs, x_formula = start.clone(), start.clone(), start.clone()
    g_ours, g_theirs, g_formula = (torch.Generator().manual_seed(7) for _ in range(3))
    for i, t in enumerate(ours.timesteps):
        v = 0.3 * x_ours + 0.1
        x_ours = scheduler_step(ours, v, t, x_ours, g_ours)
        x_theirs = theirs.step(v.unsqueeze(0), t, x_theirs.unsqueeze(0), generator=g_theirs,
                               return_dict=False)[0].squeeze(0)
        sigma, after = SIGMAS[i], ([*SIGMAS, 0.0])[i + 1]
        noise = torch.randn((1, *start.shape), generator=g_formula).squeeze(0)
        x_formula = (1 - after) * (x_formula - sigma * v) + after * noise
        assert torch.equal(x_ours, x_theirs), i
        torch.testing.assert_close(x_ours, x_formula, rtol=1e-5, atol=1e-6)
