"""The mixture-of-experts fields of :class:`~pipette_cp.specs.model.ModelSpec` and their
checks against a dense model (``num_experts`` 1)."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from pipette_cp.specs.model_hybrid import HybridFields

#: The expert settings and the value each has on a dense model (``num_experts`` 1).
_DENSE_VALUES: dict[str, object] = {
    "moe_ffn_hidden_size": None, "num_shared_experts": 0, "shared_expert_ffn_hidden_size": None,
    "shared_expert_gate": False, "moe_layer_freq": 1, "first_k_dense_layers": 0,
    "moe_router_aux_loss_coeff": 0.0, "moe_z_loss_coeff": 0.0, "moe_capacity_factor": None,
    "moe_router_expert_bias": False,
}  # fmt: skip


#: Most routed experts a layer may have: 2^20, the million experts of PEER (He, "Mixture
#: of A Million Experts", 2024).
MAX_EXPERTS = 2**20


class MoeFields(HybridFields):
    """The experts of a mixture-of-experts model (see ``ModelSpec``)."""

    num_experts: int = Field(
        default=1,
        gt=0,
        le=MAX_EXPERTS,
        description="Routed experts of each mixture-of-experts layer (Megatron --num-experts; "
        "Hugging Face num_local_experts, num_experts, n_routed_experts); 1 = dense; at most "
        f"{MAX_EXPERTS:,}.",
    )
    moe_top_k: int = Field(
        default=1,
        gt=0,
        description="Routed experts each token goes to (Megatron --moe-router-topk; Hugging Face "
        "num_experts_per_tok); at most num_experts.",
    )
    moe_ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        description="Inner width of one routed expert (Megatron --moe-ffn-hidden-size; Hugging "
        "Face moe_intermediate_size); None: ffn_hidden_size.",
    )
    num_shared_experts: int = Field(
        default=0,
        ge=0,
        description="Experts every token goes through besides its routed ones (DeepSeek "
        "n_shared_experts; Llama 4 and Qwen2-MoE have one).",
    )
    shared_expert_ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        description="Total inner width of the shared experts, built as one MLP (Megatron "
        "--moe-shared-expert-intermediate-size; Hugging Face shared_expert_intermediate_size); "
        "None: num_shared_experts x the routed experts' width.",
    )
    shared_expert_gate: bool = Field(
        default=False,
        description="A sigmoid gate of h weights on the shared experts' output (Qwen2-MoE's "
        "shared_expert_gate).",
    )
    moe_layer_freq: int = Field(
        default=1,
        gt=0,
        description="Every k-th layer from the first after first_k_dense_layers is a "
        "mixture-of-experts layer, the others dense (Megatron --moe-layer-freq: layer i is "
        "MoE when (i - first_k_dense_layers) % k == 0); 1: every layer.",
    )
    first_k_dense_layers: int = Field(
        default=0,
        ge=0,
        description="Leading layers that are dense (DeepSeek first_k_dense_replace: 3 for "
        "DeepSeek-V3); below num_layers.",
    )
    moe_router_aux_loss_coeff: float = Field(
        default=0.0,
        ge=0,
        description="Weight of the load-balancing loss, dimensionless (Megatron "
        "--moe-aux-loss-coeff; Hugging Face router_aux_loss_coef, aux_loss_alpha); 0: none.",
    )
    moe_z_loss_coeff: float = Field(
        default=0.0,
        ge=0,
        description="Weight of the router z-loss, dimensionless (Megatron --moe-z-loss-coeff); "
        "0: none.",
    )
    moe_capacity_factor: float | None = Field(
        default=None,
        gt=0,
        description="Tokens an expert takes, as a dimensionless multiple of its even share "
        "(Megatron --moe-expert-capacity-factor); the rest are dropped; None: dropless.",
    )
    moe_router_expert_bias: bool = Field(
        default=False,
        description="A per-expert bias the router adds to pick the top k, for load balancing "
        "without an auxiliary loss (DeepSeek-V3's e_score_correction_bias, Megatron "
        "--moe-router-enable-expert-bias): a buffer, counted as the checkpoint stores it.",
    )

    @field_validator("moe_top_k")
    @classmethod
    def _top_k_within_experts(cls, value: int, info: ValidationInfo) -> int:
        experts = info.data.get("num_experts")
        if experts is not None and value > experts:
            raise ValueError(f"exceeds num_experts={experts}: a token goes to at most every expert")
        return value

    @field_validator(*_DENSE_VALUES)
    @classmethod
    def _experts_needed(cls, value: object, info: ValidationInfo) -> object:
        assert info.field_name is not None
        if value != _DENSE_VALUES[info.field_name] and info.data.get("num_experts") == 1:
            raise ValueError(
                "an expert setting on a dense model (num_experts=1); give num_experts > 1 or drop it"
            )
        shared = info.data.get("num_shared_experts")
        if (
            info.field_name.startswith("shared_expert")
            and value not in (None, False)
            and not shared
        ):
            raise ValueError("needs num_shared_experts > 0")
        layers = info.data.get("num_layers")
        if info.field_name == "first_k_dense_layers" and layers is not None and value >= layers:  # type: ignore[operator]
            raise ValueError(f"must be below num_layers={layers}: at least one layer has experts")
        return value
