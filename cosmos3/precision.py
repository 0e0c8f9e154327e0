"""A step's precision at run time: the controller that applies a ``cosmos3.rules.step_precision`` policy to the
model's ``cosmos3.quant.step_precision.StepPrecision``, step by step."""

from __future__ import annotations

from cosmos3.quant.step_precision import StepPrecision
from cosmos3.rules.step_precision import StepPolicy


class StepPrecisionController:
    """Applies a step policy: sets the model's ``StepPrecision`` once per denoising step (``a16``: W8A16 linears
    and BF16 attention). At load it hands every static-FP8 GEN linear its 16-bit method (``w8a16``) beside its
    native one (``w8a8``), and binds the UND linears to the method ``reasoner`` names (the UND tower runs once per
    request). The methods come in as arguments: this module imports no quant method."""

    def __init__(self, state: StepPrecision, gen_linears: list, und_linears: list, policy: StepPolicy, w8a8, w8a16):
        self.state = state
        self._w8a8, self._w8a16 = w8a8, w8a16
        self.policy = policy
        self.gen_linears = gen_linears
        self.step: tuple[int, int] | None = None
        for linear in gen_linears:
            linear.drive_by(state, w8a16)
        und_method = w8a16 if policy.reasoner == "a16" else w8a8
        for linear in und_linears:
            linear.quant_method = und_method

    @property
    def gen_method(self):
        """The method the GEN linears compute with this step."""
        return self._w8a16 if self.state.a16 else self._w8a8

    def set_step(self, step: int, num_steps: int) -> None:
        self.state.a16 = self.policy.is_high_precision(step, num_steps)
        self.step = (step, num_steps)

    def describe(self) -> dict:
        info = self.policy.describe()
        if self.step is not None:
            info["a16_steps"] = self.policy.a16_steps(self.step[1])
        return info
