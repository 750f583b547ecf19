"""The toy Llama of the course: one decoder layer, 1024 wide, with Llama-7B's MLP width and random weights.

Nothing is downloaded: the model is built from a config with weights drawn from a fixed seed, so
every student (and every test) gets the same numbers. Lesson 06 fuses its RMSNorm + MLP block.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


def toy_config(small: bool = False) -> LlamaConfig:
    """The lesson's config (hidden 1024, MLP 11008), or a small one that runs quickly on a CPU."""
    hidden, intermediate, vocab, positions = (128, 344, 512, 256) if small else (1024, 11008, 32000, 2048)
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,  # 11008 is Llama-7B's MLP width
        vocab_size=vocab,
        max_position_embeddings=positions,
        num_hidden_layers=1,
        num_attention_heads=4,  # head_dim = hidden / 4
        num_key_value_heads=4,  # as many K/V heads as query heads: plain multi-head attention
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )


def toy_llama(
    small: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaForCausalLM:
    """A `LlamaForCausalLM` with random weights from `seed`, in eval mode.

    The weights are drawn on the CPU in fp32 and then moved, so they are the same on every device
    (up to the rounding of `dtype`). The global RNG state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(toy_config(small))
    return model.to(device=device, dtype=dtype).eval()


class RMSNormMLP(nn.Module):
    """mlp(norm(x)): the second half of a Llama decoder layer, without the residual add.

    With W_gate, W_up of shape (intermediate, hidden) and W_down of shape (hidden, intermediate):
        h = x / sqrt(mean(x**2, -1) + eps) * norm.weight
        out = (silu(h @ W_gate.T) * (h @ W_up.T)) @ W_down.T
    """

    def __init__(self, norm: nn.Module, mlp: nn.Module):
        super().__init__()
        self.norm = norm
        self.mlp = mlp
        self.train(mlp.training)  # a new Module starts in training mode: follow the wrapped one

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, hidden)
        return self.mlp(self.norm(x))  # (B, T, hidden)


def mlp_block(model: LlamaForCausalLM) -> RMSNormMLP:
    """The first layer's post-attention RMSNorm and MLP; the parameters are shared with `model`."""
    layer = model.model.layers[0]
    return RMSNormMLP(layer.post_attention_layernorm, layer.mlp)


class LogitsOnly(nn.Module):
    """Calls the model without a KV cache and returns only the logits.

    The ONNX exporter cannot trace the `DynamicCache` that a Hugging Face model returns by default,
    so the export sees a function from token ids to a single tensor.
    """

    def __init__(self, model: LlamaForCausalLM):
        super().__init__()
        self.model = model
        self.train(model.training)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # input_ids: (B, T) int64
        return self.model(input_ids=input_ids, use_cache=False).logits  # (B, T, vocab)
