"""DeepSeek-V3's published config.json widths, written out (not read from the cost model),
for the hand counts of the latent-attention and multi-token-prediction tests."""

from __future__ import annotations

from pipette_cp.io.model_file import load_model

#: the bundled model file the hand counts are checked against
DS = load_model("deepseek-v3")
# h, heads, q_lora, kv_lora, nope, rope, v, vocab
H, A, QL, KVL, NOPE, ROPE, V, VOCAB = 7168, 128, 1536, 512, 128, 64, 128, 129280
# dense and expert FFN widths, routed experts, experts a token goes to, shared experts
DENSE_FFN, EXPERT_FFN, EXPERTS, TOP_K, SHARED = 18432, 2048, 256, 8, 1
# layers, of which the first DENSE_LAYERS are dense
LAYERS, DENSE_LAYERS = 61, 3
