"""``vanilla``: the pre-LN residual stream ``h ← h + a + m`` (no stack is kept)."""

from __future__ import annotations

from typing import Any

from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import BlockIO, BlockOut, Mixer, State


class VanillaMixer(Mixer):
    """The plain residual sum in its recursive form: one running tensor."""

    layers: Any = None

    @classmethod
    def init(cls, cfg: ModelConfig, *, key=None) -> VanillaMixer:
        return cls()

    @classmethod
    def from_trunk(cls, trunk) -> VanillaMixer:
        return cls()

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        return 0

    def param_count(self) -> int:
        return 0

    def start(self, x_LxD, n_layers):
        return State(None, x_LxD)

    def read(self, p, state, t):
        return BlockIO(q=state.carry)

    def write(self, p, state: State, t, io: BlockIO, out: BlockOut) -> State:
        return State(None, state.carry + out.a + out.m)

    def output(self, state):
        return state.carry
