"""Meta-Llama style model (also serves the GPT-2 family), with a preallocated KV cache."""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from .functional import _stat_dtype, apply_rotary, precompute_freqs_cis


@dataclass
class ModelArgs:
    vocab_size: int
    context_length: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    family: str = "llama"

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @classmethod
    def from_config(cls, config):
        c = dict(config)
        n_heads = c["n_heads"]
        n_kv = c.get("n_kv_heads") or n_heads
        args = cls(
            vocab_size=c["vocab_size"],
            context_length=c["context_length"],
            d_model=c["d_model"],
            n_layers=c["n_layers"],
            n_heads=n_heads,
            n_kv_heads=n_kv,
            d_ff=c["d_ff"],
            rope_theta=c.get("rope_theta", 10000.0),
            norm_eps=c.get("norm_eps", 1e-5),
            tie_embeddings=c.get("tie_embeddings", True),
            dropout=c.get("dropout", 0.0),
            family=c.get("family", "llama"),
        )
        if args.family not in ("llama", "gpt2"):
            raise ValueError(f"unknown family {args.family!r}")
        if args.d_model % args.n_heads != 0:
            raise ValueError(f"d_model={args.d_model} is not divisible by n_heads={args.n_heads}")
        if args.n_heads % args.n_kv_heads != 0:
            raise ValueError(f"n_heads={args.n_heads} is not divisible by n_kv_heads={args.n_kv_heads}")
        if args.family == "llama" and args.head_dim % 2 != 0:
            raise ValueError(
                f"RoPE needs an even head dim: d_model={args.d_model} / n_heads={args.n_heads} = {args.head_dim}"
            )
        return args


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.to(_stat_dtype(x.dtype))).type_as(x) * self.weight


class LayerNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.to(_stat_dtype(x.dtype))
        mu = xf.mean(-1, keepdim=True)
        var = (xf - mu).pow(2).mean(-1, keepdim=True)
        return ((xf - mu) * torch.rsqrt(var + self.eps)).type_as(x) * self.weight + self.bias


class KVCache:
    """Preallocated per-layer buffers [B, n_kv_heads, context_length, d_head]."""

    def __init__(self, n_layers, batch_size, n_kv_heads, max_len, head_dim, dtype, device):
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_len = max_len
        self.pos = 0  # tokens cached (committed after a full forward)

    def update(self, layer, start, xk, xv):
        t = xk.shape[2]
        self.k[layer][:, :, start : start + t] = xk
        self.v[layer][:, :, start : start + t] = xv
        return self.k[layer][:, :, : start + t], self.v[layer][:, :, : start + t]

    def get(self, layer):
        return self.k[layer][:, :, : self.pos], self.v[layer][:, :, : self.pos]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        bias = args.family == "gpt2"
        self.layer_id = layer_id
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.n_rep = args.n_heads // args.n_kv_heads
        self.head_dim = args.head_dim
        self.use_rope = args.family == "llama"
        self.wq = nn.Linear(args.d_model, args.n_heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(args.d_model, args.n_kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(args.d_model, args.n_kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.d_model, bias=bias)
        self.attn_dropout = nn.Dropout(args.dropout)
        self.resid_dropout = nn.Dropout(args.dropout)

    def forward(self, x, start_pos, freqs_cis, mask, cache):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.use_rope:
            xq = apply_rotary(xq, freqs_cis)
            xk = apply_rotary(xk, freqs_cis)
        if cache is not None:
            keys, values = cache.update(self.layer_id, start_pos, xk, xv)
        else:
            keys, values = xk, xv
        if self.n_rep > 1:
            b, h, t, d = keys.shape
            keys = keys[:, :, None].expand(b, h, self.n_rep, t, d).reshape(b, h * self.n_rep, t, d)
            values = values[:, :, None].expand(b, h, self.n_rep, t, d).reshape(b, h * self.n_rep, t, d)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + mask
        scores = torch.softmax(scores.to(_stat_dtype(scores.dtype)), dim=-1).type_as(xq)
        scores = self.attn_dropout(scores)
        out = torch.matmul(scores, values)
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.resid_dropout(self.wo(out))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.w3 = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.w2 = nn.Linear(args.d_ff, args.d_model, bias=False)
        self.dropout = nn.Dropout(args.dropout)

    def forward(self, x):
        g = self.w1(x)
        return self.dropout(self.w2(g * torch.sigmoid(g) * self.w3(x)))


class GPT2MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.c_fc = nn.Linear(args.d_model, args.d_ff, bias=True)
        self.c_proj = nn.Linear(args.d_ff, args.d_model, bias=True)
        self.dropout = nn.Dropout(args.dropout)

    def forward(self, x):
        h = self.c_fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))
        return self.dropout(self.c_proj(h))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id, args: ModelArgs):
        super().__init__()
        Norm = RMSNorm if args.family == "llama" else LayerNorm
        self.attention = Attention(args, layer_id)
        self.feed_forward = FeedForward(args) if args.family == "llama" else GPT2MLP(args)
        self.attention_norm = Norm(args.d_model, eps=args.norm_eps)
        self.ffn_norm = Norm(args.d_model, eps=args.norm_eps)

    def forward(self, x, start_pos, freqs_cis, mask, cache):
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params: ModelArgs):
        super().__init__()
        self.params = params
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.d_model)
        if params.family == "gpt2":
            self.wpe = nn.Embedding(params.context_length, params.d_model)
        self.emb_dropout = nn.Dropout(params.dropout)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = (RMSNorm if params.family == "llama" else LayerNorm)(params.d_model, eps=params.norm_eps)
        if params.tie_embeddings:
            self.output = None
        else:
            self.output = nn.Linear(params.d_model, params.vocab_size, bias=False)

    def output_weight(self):
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def init_weights(self):
        std_res = 0.02 / math.sqrt(2 * self.params.n_layers)
        with torch.no_grad():
            for name, mod in self.named_modules():
                if isinstance(mod, (nn.Linear, nn.Embedding)):
                    std = std_res if name.split(".")[-1] in ("wo", "w2", "c_proj") else 0.02
                    mod.weight.normal_(0.0, std)
                    if getattr(mod, "bias", None) is not None:
                        mod.bias.zero_()
                elif isinstance(mod, (RMSNorm, LayerNorm)):
                    mod.weight.fill_(1.0)
                    if isinstance(mod, LayerNorm):
                        mod.bias.zero_()

    def forward(self, tokens, start_pos=0, cache=None):
        bsz, seqlen = tokens.shape
        if start_pos + seqlen > self.params.context_length:
            raise ValueError(
                f"{start_pos} cached + {seqlen} new tokens exceed context_length={self.params.context_length}"
            )
        h = self.tok_embeddings(tokens)
        positions = torch.arange(start_pos, start_pos + seqlen, device=tokens.device)
        if self.params.family == "gpt2":
            h = h + self.wpe(positions)
            freqs_cis = None
        else:
            freqs_cis = precompute_freqs_cis(
                self.params.head_dim, positions, self.params.rope_theta, dtype=_stat_dtype(h.dtype)
            )
        h = self.emb_dropout(h)
        mask = torch.full((seqlen, start_pos + seqlen), float("-inf"), device=tokens.device, dtype=h.dtype)
        mask = torch.triu(mask, diagonal=start_pos + 1)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask, cache)
        h = self.norm(h)
        return h @ self.output_weight().t()

    def loss(self, x, y):
        """Mean next-token cross-entropy on pre-shifted targets."""
        logits = self.forward(x)
        lf = logits.to(_stat_dtype(logits.dtype)).reshape(-1, logits.shape[-1])
        return torch.nn.functional.cross_entropy(lf, y.reshape(-1))


# ------------------------------------------------------------- canonical names
def _name_map(args: ModelArgs):
    """canonical name -> Meta-style name."""
    m = {"tok_embeddings.weight": "tok_embeddings.weight", "final_norm.weight": "norm.weight"}
    gpt2 = args.family == "gpt2"
    if gpt2:
        m["pos_embeddings.weight"] = "wpe.weight"
        m["final_norm.bias"] = "norm.bias"
    if not args.tie_embeddings:
        m["lm_head.weight"] = "output.weight"
    mlp = {"w_fc": "c_fc", "w_proj": "c_proj"} if gpt2 else {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}
    for i in range(args.n_layers):
        p = f"layers.{i}."
        suffixes = ("weight", "bias") if gpt2 else ("weight",)
        for s in suffixes:
            m[f"{p}attn_norm.{s}"] = f"{p}attention_norm.{s}"
            m[f"{p}mlp_norm.{s}"] = f"{p}ffn_norm.{s}"
            for w in ("wq", "wk", "wv", "wo"):
                m[f"{p}attn.{w}.{s}"] = f"{p}attention.{w}.{s}"
            for c, meta in mlp.items():
                m[f"{p}mlp.{c}.{s}"] = f"{p}feed_forward.{meta}.{s}"
    return m


def build_model(config, state_dict=None):
    args = ModelArgs.from_config(config)
    model = Transformer(args)
    if state_dict is None:
        model.init_weights()
        return model
    names = _name_map(args)
    missing = sorted(set(names) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(names))
    if missing or unexpected:
        raise KeyError(f"state_dict mismatch: missing {missing}, unexpected {unexpected}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for canon, meta in names.items():
            src = state_dict[canon]
            p = params[meta]
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"{canon}: expected shape {tuple(p.shape)}, got {tuple(src.shape)}")
            if src.dtype != p.dtype:
                p.data = torch.empty_like(p, dtype=src.dtype)
            p.copy_(src)
    return model


def canonical_state_dict(model):
    params = dict(model.named_parameters(remove_duplicate=False))
    return {canon: params[meta] for canon, meta in _name_map(model.params).items()}


def forward(model, ids, cache=None):
    if cache is None:
        return model(ids)
    logits = model(ids, start_pos=cache.pos, cache=cache)
    cache.pos += ids.shape[1]
    return logits


def new_cache(model, batch_size):
    p = model.params
    w = model.tok_embeddings.weight
    return KVCache(p.n_layers, batch_size, p.n_kv_heads, p.context_length, p.head_dim, w.dtype, w.device)


def cache_kv(cache, layer):
    return cache.get(layer)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(config, batch_size, seq_len, dtype=torch.float32):
    n_kv = config.get("n_kv_heads") or config["n_heads"]
    d_head = config["d_model"] // config["n_heads"]
    elsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config["n_layers"] * n_kv * d_head * seq_len * batch_size * elsize
