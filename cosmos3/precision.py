"""A step's precision at run time: the controller that applies a ``cosmos3.rules.step_precision`` policy to the
model, step by step."""

from __future__ import annotations

from cosmos3.rules.step_precision import StepPolicy


class StepPrecisionController:
    """Rebinds static-FP8 linears between W8A8 (``w8a8``, the model's static-FP8 method) and W8A16 (``w8a16``),
    and attention between FP8 and BF16 with them; holds no tensors of its own. ``attention`` is the model's
    AttentionKernels (its ``precise`` flag). The methods come in as arguments: this module imports no quant method."""

    def __init__(self, gen_linears: list, und_linears: list, policy: StepPolicy, w8a8, w8a16, attention=None):
        self._w8a8, self._w8a16 = w8a8, w8a16
        self.policy = policy
        self.gen_linears = gen_linears
        self.attention = attention
        self.step: tuple[int, int] | None = None
        self._precise: bool | None = None  # the mode the linears are bound to (None: not yet bound)
        und_method = w8a16 if policy.reasoner == "a16" else w8a8
        for linear in und_linears:  # once per model: the UND tower is not step-gated
            linear.quant_method = und_method

    def set_step(self, step: int, num_steps: int) -> None:
        precise = self.policy.is_high_precision(step, num_steps)
        # Rebinding ~250 module attributes costs ~0.4 ms of Python, a GPU-idle gap on every graphed step; the
        # mode changes only at the policy's window edges.
        if precise != self._precise:
            method = self._w8a16 if precise else self._w8a8
            for linear in self.gen_linears:
                linear.quant_method = method
            if self.attention is not None:
                self.attention.precise = precise
            self._precise = precise
        self.step = (step, num_steps)

    def describe(self) -> dict:
        info = self.policy.describe()
        if self.step is not None:
            info["a16_steps"] = self.policy.a16_steps(self.step[1])
        return info
