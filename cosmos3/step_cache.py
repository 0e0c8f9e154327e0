"""SeaCache for the denoising loop: steps whose input barely moved reuse the decoder stack's residual.

SeaCache (https://huggingface.co/papers/2602.18993), as diffusers applies it to Cosmos3 (hooks/sea_cache.py):

* the indicator: the raw vision latents ``[C, T, H, W]`` as the model gets them (clean conditioning frames
  included), filtered in 3-D frequency by the SEA gain of the step's sigma (a Wiener gain against a ``1/|f|^p``
  clean-signal prior, normalised to unit mean), so that noise the next step removes anyway does not count;
* the gate: the relative L1 change of the indicator from the previous step accumulates; a step is computed once
  the sum reaches ``threshold`` (the sum then restarts), and always in the first ``retention_steps``, the last
  ``end_steps``, after ``max_consecutive`` cached steps, and (ours) on a step-precision edge step, whose W8A16
  arithmetic is the point of running it;
* the residual: the GEN decoder stack's normed output minus its input ``[N_gen, H]`` (sound tokens included),
  kept from the last two computed steps per CFG branch; a cached step adds their linear extrapolation to the
  step's fresh input embedding and reads the velocities from that. The UND tower never depends on GEN (its K/V
  are cached for the whole job), so unlike diffusers' hook there is no UND output to keep.

diffusers gives each CFG branch its own gate; both see the same latents, sigma and step, so they decide alike:
here one gate decides for the step and each branch keeps its own residuals. A branch a step does not run (CFG
off outside the guidance interval) starts its residuals over, as diffusers' non-adjacent steps do.
"""

from __future__ import annotations

import torch

from cosmos3.rules.cache_options import SeaCacheSettings

SIGMA_EPS = 1e-6  # sigma is clamped into (0, 1) so neither the signal nor the noise weight vanishes
POWER_EPS = 1e-16  # keeps the prior finite at frequency 0 and the gain's denominator positive


def sea_gain(grid: tuple[int, int, int], sigma: float, power_exp: float, device: torch.device) -> torch.Tensor:
    """The SEA gain ``[T, H, W, 1]`` over the 3-D frequencies of a ``(T, H, W)`` grid at ``sigma``, normalised to unit
    mean where the mean is finite and positive. Device ops only: no host read, so a job builds every step's gain
    at its first decision and no later step waits on the device for it."""
    sigma = min(max(sigma, SIGMA_EPS), 1.0 - SIGMA_EPS)
    signal, noise = 1.0 - sigma, sigma
    gain = torch.ones((), device=device)
    for axis, size in enumerate(grid):
        prior = 1.0 / (torch.fft.fftfreq(size, device=device).abs().pow(power_exp) + POWER_EPS)
        axis_gain = signal * prior / (signal**2 * prior + noise**2 + POWER_EPS)
        gain = gain * axis_gain.reshape([-1 if a == axis else 1 for a in range(len(grid) + 1)])
    mean = gain.mean()  # unit mean: distances compare across steps of different sigma
    return torch.where(torch.isfinite(mean) & (mean > 0), gain / mean, gain)


def sea_filter(latents: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """The SEA-filtered latents ``[T, H, W, C]`` of ``latents [C, T, H, W]`` under ``gain`` (``sea_gain`` of their
    grid), in their dtype (filtered in fp32)."""
    x = latents.movedim(0, -1).contiguous().float()  # [T, H, W, C]
    axes = (0, 1, 2)
    return torch.fft.ifftn(torch.fft.fftn(x, dim=axes) * gain, dim=axes).real.to(latents.dtype)


def relative_l1(current: torch.Tensor, previous: torch.Tensor) -> float:
    """``mean|current - previous| / mean|previous|`` in fp32 (one host read)."""
    previous = previous.float()
    return float((current.float() - previous).abs().mean() / (previous.abs().mean() + POWER_EPS))


class StepCache:
    """One job's SeaCache over ``sigmas`` (the scheduler's, one a step); ``forced`` steps are always computed.

    Per step: ``decide(step, latents, branches)`` once, then per CFG branch ``residual(branch)`` on a cached step
    (the stack's stand-in) or ``record(branch, stack)`` after a computed pass.
    """

    def __init__(self, settings: SeaCacheSettings, sigmas: list[float], forced: frozenset[int] = frozenset()):
        self.settings = settings
        self.sigmas = sigmas
        self.forced = forced
        self.computed: list[bool] = []  # per step so far: computed (True) or cached
        self._step = -1
        self._gains: list[torch.Tensor] | None = None  # per step, [T, H, W, 1], built at the first decision
        self._previous: torch.Tensor | None = None  # the last step's indicator
        self._accumulated = 0.0
        self._consecutive = 0  # cached steps since the last computed one
        self._history: dict[int, list[tuple[int, torch.Tensor]]] = {}  # branch -> [(step, residual [N_gen, H])]

    def decide(self, step: int, latents: torch.Tensor, branches: tuple[int, ...]) -> bool:
        """Whether ``step`` runs the decoder stack (True) or its cached residual, for the CFG ``branches`` it runs;
        ``latents [C, T, H, W]`` as the model gets them."""
        s, n = self.settings, len(self.sigmas)
        for branch in set(self._history) - set(branches):
            del self._history[branch]  # a branch that skipped a step restarts its trajectory
        if self._gains is None:
            self._gains = [sea_gain(tuple(latents.shape[1:]), sigma, s.power_exp, latents.device)
                           for sigma in self.sigmas]
        indicator = sea_filter(latents, self._gains[step])
        forced = (step < s.retention_steps or step >= n - s.end_steps or step in self.forced
                  or self._previous is None or (s.max_consecutive and self._consecutive >= s.max_consecutive))
        candidate = 0.0
        if forced:
            compute = True
        else:
            candidate = self._accumulated + relative_l1(indicator, self._previous)
            compute = not candidate < s.threshold  # a non-finite distance computes too
        # A cache hit needs residuals for every branch it serves (a branch new to CFG has none yet).
        compute = compute or any(not self._history.get(branch) for branch in branches)
        self._accumulated = 0.0 if compute else candidate
        self._previous = indicator
        self._step = step
        self.computed.append(compute)
        if compute:
            self._consecutive = 0
        else:
            self._consecutive += 1
        return compute

    def record(self, branch: int, stack: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Keep a computed pass's stack residual (output minus input, ``[N_gen, H]``) for ``branch``."""
        stack_in, stack_out = stack
        kept = self._history.setdefault(branch, [])
        kept.append((self._step, stack_out - stack_in))
        del kept[: -(self.settings.residual_order + 1)]

    def residual(self, branch: int) -> torch.Tensor:
        """The stack residual ``[N_gen, H]`` standing in for ``branch``'s stack this step: the last one, or with
        ``residual_order`` 1 its linear extrapolation from the last two computed steps."""
        kept = self._history[branch]
        latest_step, latest = kept[-1]
        if self.settings.residual_order == 0 or len(kept) < 2:
            return latest
        previous_step, previous = kept[-2]
        return latest + (latest - previous) * ((self._step - latest_step) / (latest_step - previous_step))

    def report(self) -> dict:
        """The settings and which steps were computed and which cached (a job's sidecar)."""
        return {**self.settings.describe(),
                "computed": [i for i, c in enumerate(self.computed) if c],
                "cached": [i for i, c in enumerate(self.computed) if not c]}
