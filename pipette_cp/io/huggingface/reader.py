"""Typed reading of one Hugging Face ``config.json``, shared by the family parsers.

Every error names the file and the key (``config.json: hidden_size=None: missing;
required in a 'llama' config``).  The RoPE scaling readers turn ``rope_scaling`` into
the ModelSpec fields that Megatron-LM can rebuild, and refuse the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipette_cp.errors import SpecError, UnsupportedError

#: Keys that give a config experts (transformers' Mixtral, Qwen2-MoE, DeepSeek, ...).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_num_experts")  # fmt: skip
#: The ``rope_scaling`` constants Megatron-Core's Llama 3.1 scaling fixes.
_LLAMA3_SCALING = {"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}  # fmt: skip
#: The YaRN constants both YaRN families (DeepSeek-V2/V3, gpt-oss) use; others are refused.
_YARN_CONSTANTS = {"beta_fast": 32, "beta_slow": 1}
_REQUIRED = object()


class Reader:
    """Typed access to one config.json; errors name the file and the key."""

    def __init__(
        self, data: Mapping[str, Any], where: str, model_type: str, prefix: str = ""
    ) -> None:
        self.data = data
        self.where = where
        self.model_type = model_type
        self.prefix = prefix  # the path of a nested config ("text_config.")

    def field(self, key: str) -> str:
        return f"{self.where}: {self.prefix}{key}"

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        """The raw value; ``default`` when absent or null, an error if required."""
        value = self.data.get(key)
        if value is not None:
            return value
        if default is _REQUIRED:
            raise SpecError(
                self.field(key), None, f"missing; required in a {self.model_type!r} config"
            )
        return default

    def integer(self, key: str, default: Any = _REQUIRED, *, zero: bool = False) -> Any:
        """A positive integer (with ``zero``, 0 too); booleans and floats are refused."""
        if self.data.get(key) is None:
            return self.get(key, default)
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
            expected = "an integer >= 0" if zero else "a positive integer"
            raise SpecError(self.field(key), value, f"expected {expected}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(self.field(key), value, "expected true or false")
        return value

    def text(self, key: str, default: str) -> str:
        """A JSON string."""
        value = self.get(key, default)
        if not isinstance(value, str):
            raise SpecError(self.field(key), value, "expected a string")
        return value

    def number(self, key: str, default: float, *, probability: bool = False, zero: bool = False) -> float:  # fmt: skip
        """A positive JSON number (with ``zero``, 0 too), or with ``probability`` one in [0, 1)."""
        value = self.get(key, default)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if probability:
            ok, expected = numeric and 0 <= value < 1, "a number in [0, 1)"
        else:
            ok, expected = numeric and (value >= 0 if zero else value > 0), "a number >= 0" if zero else "a positive number"  # fmt: skip
        if not ok:
            raise SpecError(self.field(key), value, f"expected {expected}")
        return float(value)

    def dropout(self, *keys: str, default: float) -> float:
        """The first of ``keys`` present (a probability), else ``default``."""
        key = next((k for k in keys if self.data.get(k) is not None), keys[0])
        return self.number(key, default, probability=True)

    def rotary_base(self, key: str, default: int) -> int:
        """``rope_theta``: a whole number, as Megatron's ``--rotary-base`` takes."""
        value = self.number(key, default)
        if value != int(value):
            raise SpecError(self.field(key), value, "expected a whole number (--rotary-base)")
        return int(value)

    def dense_only(self) -> None:
        """Refuse mixture-of-experts keys (:data:`MOE_KEYS`) in a dense family's config."""
        for key in MOE_KEYS:
            value = self.data.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                raise SpecError(
                    self.field(key), value, f"a mixture-of-experts key in a dense "
                    f"{self.model_type!r} config (MoE is not modelled); remove it or fix model_type",
                )  # fmt: skip

    def refuse(self, key: str, rule: str) -> None:
        """Refuse ``key`` when it holds anything but null, false, 0 or an empty list."""
        value = self.data.get(key)
        if value not in (None, False, 0, []):
            raise UnsupportedError(self.field(key), value, rule)


def check_heads(r: Reader, hidden: int, heads: int, kv: int, keys: tuple[str, str, str]) -> None:
    """Head counts must divide as attention needs them; errors use the HF key names."""
    hidden_key, heads_key, kv_key = keys
    if heads % kv:
        raise SpecError(r.field(kv_key), kv, f"{heads_key}={heads} is not divisible by it")
    if hidden % heads and r.data.get("head_dim") is None:
        raise SpecError(
            r.field(heads_key),
            heads,
            f"does not divide {hidden_key}={hidden} and no head_dim is given",
        )


def _whole_factor(r: Reader, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or value != int(value):  # fmt: skip
        raise SpecError(r.field(key), value, "expected a whole number > 0")
    return int(value)


def rope_scaling(r: Reader, *, yarn: bool = False) -> dict[str, int | None]:
    """``rope_scaling`` as ModelSpec fields: None, Llama 3.1's ``llama3`` scaling with the
    constants Megatron-Core fixes (``RotaryEmbedding._apply_scaling`` in
    ``megatron/core/models/common/embeddings/rotary_pos_embedding.py``: frequency factors
    1 and 4, 8192 original positions), or, for the families released with it
    (``yarn``: DeepSeek-V2/V3, gpt-oss), YaRN with beta_fast 32 and beta_slow 1; any
    other scaling is refused."""
    none: dict[str, int | None] = {"rope_scaling_factor": None, "yarn_scaling_factor": None,
                                   "yarn_original_max_seq_length": None}  # fmt: skip
    scaling, key = r.data.get("rope_scaling"), "rope_scaling"
    if scaling is not None and not isinstance(scaling, Mapping):
        raise SpecError(r.field(key), scaling, "expected an object or null")
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if scaling is None or kind in (None, "default"):
        return none
    if kind not in (("llama3", "yarn") if yarn else ("llama3",)):
        modelled = "Llama 3.1's 'llama3' and YaRN ('yarn') RoPE scaling are" if yarn else "Llama 3.1's 'llama3' RoPE scaling is"  # fmt: skip
        raise UnsupportedError(r.field(f"{key}.rope_type"), kind, f"only {modelled} modelled")
    fixed = _LLAMA3_SCALING if kind == "llama3" else _YARN_CONSTANTS
    for name, value in fixed.items():
        if scaling.get(name, value) != value:
            rule = f"Megatron-LM fixes it to {value}" if kind == "llama3" else f"only YaRN with {name} {value} is modelled"  # fmt: skip
            raise UnsupportedError(r.field(f"{key}.{name}"), scaling[name], rule)
    factor = _whole_factor(r, f"{key}.factor", scaling.get("factor"))
    if kind == "llama3":
        return {**none, "rope_scaling_factor": factor}
    original_key = f"{key}.original_max_position_embeddings"
    original = scaling.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
        raise SpecError(r.field(original_key), original, "expected a positive integer")
    return {**none, "yarn_scaling_factor": factor, "yarn_original_max_seq_length": original}


def silu_gated(r: Reader, key: str = "hidden_act") -> str:
    """The MLP activation of the SwiGLU families: SiLU-gated, or refused."""
    act = r.text(key, "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedError(
            r.field(key), act, "only SiLU-gated MLPs (SwiGLU) are modelled for this family"
        )
    return "swiglu"


def llama_biases(r: Reader) -> bool:
    """Llama's ``attention_bias`` (q/k/v/o) and ``mlp_bias`` together are linear_bias;
    either alone is refused (no ModelSpec field, and no Megatron flag, puts biases on
    the attention or the MLP only)."""
    attention_bias, mlp_bias = r.flag("attention_bias", False), r.flag("mlp_bias", False)
    if attention_bias != mlp_bias:
        key = "attention_bias" if attention_bias else "mlp_bias"
        raise UnsupportedError(
            r.field(key), True, "biases on only the attention or only the MLP are not modelled"
        )
    return attention_bias
