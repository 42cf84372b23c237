"""A Llama causal LM in the style of Hugging Face's modeling_llama: its own RMSNorm class, a rotary
embedding module with float32 tables, eager attention with a float32 softmax, and a simple cache."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .functional import STATS, apply_rotary


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(STATS)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        head_dim = config["d_model"] // config["n_heads"]
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(STATS) / head_dim
        inv_freq = 1.0 / (config["rope_theta"] ** exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        # x.to() may have cast the buffer; the table itself is always computed in float32
        inv_freq = self.inv_freq.to(device=x.device, dtype=STATS)
        freqs = position_ids.to(STATS)[:, None] * inv_freq[None, :]  # [T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class KVCache:
    """Per-layer key/value lists, grown along the sequence axis (dim 2)."""

    def __init__(self, batch_size):
        self.batch_size = batch_size
        self.key_cache: list[torch.Tensor] = []
        self.value_cache: list[torch.Tensor] = []

    def get_seq_length(self) -> int:
        return self.key_cache[0].shape[-2] if self.key_cache else 0

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.hidden_size = config["d_model"]
        self.num_heads = config["n_heads"]
        self.head_dim = self.hidden_size // self.num_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config["dropout"]
        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=False)

    def forward(self, hidden_states, position_embeddings, past_key_value=None):
        bsz, q_len, _ = hidden_states.shape
        hidden_shape = (bsz, q_len, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states = apply_rotary(query_states, cos, sin)
        key_states = apply_rotary(key_states, cos, sin)

        if past_key_value is not None:
            key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx)

        kv_len = key_states.shape[-2]
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        # bottom-right causal: query i sits at absolute position i + (kv_len - q_len)
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=hidden_states.device).tril(kv_len - q_len)
        attn_weights = attn_weights.to(STATS).masked_fill(~mask, float("-inf"))
        attn_weights = F.softmax(attn_weights, dim=-1).to(query_states.dtype)
        attn_weights = F.dropout(attn_weights, p=self.attention_dropout, training=self.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)


class LlamaMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config["d_model"], config["d_ff"], bias=False)
        self.up_proj = nn.Linear(config["d_model"], config["d_ff"], bias=False)
        self.down_proj = nn.Linear(config["d_ff"], config["d_model"], bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config["d_model"], eps=config["norm_eps"])
        self.post_attention_layernorm = LlamaRMSNorm(config["d_model"], eps=config["norm_eps"])

    def forward(self, hidden_states, position_embeddings, past_key_value=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, position_embeddings, past_key_value)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["d_model"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config["n_layers"]))
        self.norm = LlamaRMSNorm(config["d_model"], eps=config["norm_eps"])
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, input_ids, past_key_values=None):
        past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        hidden_states = self.embed_tokens(input_ids)
        position_ids = torch.arange(past_seen, past_seen + input_ids.shape[1], device=input_ids.device)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, past_key_values)
        return self.norm(hidden_states)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = dict(config)
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config["d_model"], config["vocab_size"], bias=False)
        self._init_weights()
        if config["tie_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _init_weights(self):
        std = 0.02
        residual_std = std / math.sqrt(2 * self.config["n_layers"])
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_residual = name.endswith(("o_proj", "down_proj"))
                module.weight.data.normal_(mean=0.0, std=residual_std if is_residual else std)
            elif isinstance(module, nn.Embedding):
                module.weight.data.normal_(mean=0.0, std=std)
            elif isinstance(module, LlamaRMSNorm):
                module.weight.data.fill_(1.0)

    def forward(self, input_ids, past_key_values=None):
        ctx = self.config["context_length"]
        seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        if seen + input_ids.shape[1] > ctx:
            raise ValueError(
                f"sequence length {seen + input_ids.shape[1]} ({seen} cached) exceeds context_length {ctx}"
            )
        return self.lm_head(self.model(input_ids, past_key_values))

    def loss(self, input_ids, labels):
        """Mean next-token loss for pre-shifted labels, in float32 (the training entry point)."""
        logits = self.lm_head(self.model(input_ids))
        return F.cross_entropy(logits.to(STATS).reshape(-1, logits.shape[-1]), labels.reshape(-1)).to(logits.dtype)
