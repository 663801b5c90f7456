"""LNLSTM's variants: the options that say where the gates' LayerNorm sits,
which cell state is carried and which biases exist, their defaults (the
paper's cell), and what each variant is to the engine (its cell, the layout
of its parameters and those it goes without). fastln.rnn.LNLSTM and
fastln.torch.LNLSTM share them."""
from __future__ import annotations

from typing import Any, Dict, FrozenSet, NamedTuple

from .. import _validate

# gate_norm -> the suffix of its engine cell
GATE_NORMS = {"pair": "", "sum": "_sum", "per_gate": "_per_gate"}
CARRIES = ("raw", "normalized")
DEFAULTS = {"gate_norm": "pair", "carry": "raw", "gate_bias": True, "ln_bias": True}
_LN_BIASES = frozenset(("ln_ih_bias", "ln_hh_bias", "ln_bias", "ln_c_bias"))


class Variant(NamedTuple):
    """One variant's options (checked by :func:`variant`)."""
    gate_norm: str
    carry: str
    gate_bias: bool
    ln_bias: bool

    def cell(self) -> str:
        """The engine's cell (fastln.rnn.functional's name)."""
        return "lstm" + GATE_NORMS[self.gate_norm] + (
            "_carry_ln" if self.carry == "normalized" else "")

    def kind(self) -> str:
        """The key of its parameters' layout (fastln/rnn/_params.py's LAYOUTS)."""
        return "lstm" if self.gate_norm == "pair" else "lstm_sum"

    def omitted(self) -> FrozenSet[str]:
        """The layout's names of the biases it goes without (the engine adds
        zeros in their place)."""
        return (frozenset() if self.gate_bias else frozenset({"bias"})) | (
            frozenset() if self.ln_bias else _LN_BIASES)

    def changed(self) -> Dict[str, Any]:
        """The options that differ from the paper cell's."""
        return {name: value for name, value in self._asdict().items()
                if value != DEFAULTS[name]}


def variant(gate_norm: Any, carry: Any, gate_bias: Any, ln_bias: Any) -> Variant:
    """The options checked, else a TypeError or ValueError naming the argument."""
    return Variant(_validate.choice(gate_norm, "gate_norm", tuple(GATE_NORMS)),
                   _validate.choice(carry, "carry", CARRIES),
                   _validate.flag(gate_bias, "gate_bias"), _validate.flag(ln_bias, "ln_bias"))
