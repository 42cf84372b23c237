"""Position-wise feed-forward blocks: SwiGLU (llama family) and the GELU MLP (gpt2 family).

Both act on each token independently: ``[..., d_model] -> [..., d_model]`` through a hidden
width ``d_ff``. Weights are ``[out_features, in_features]``, as everywhere.
"""

from __future__ import annotations

import torch


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Gated MLP: ``(silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T``.

    Shapes::

        x:            [..., d_model]
        w_gate, w_up: [d_ff, d_model]
        w_down:       [d_model, d_ff]
        return:       [..., d_model]

    Classic bugs to avoid:
    - SiLU goes on the gate branch only, not on ``up`` and not on the product;
    - swapping ``w_gate`` and ``w_up`` (the function is not symmetric in them);
    - no biases in the llama family.
    """
    raise NotImplementedError("swiglu")


def gelu_mlp(
    x: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor, w_proj: torch.Tensor, b_proj: torch.Tensor
) -> torch.Tensor:
    """The GPT-2 MLP: ``gelu(x @ w_fc.T + b_fc) @ w_proj.T + b_proj``.

    Shapes::

        x:      [..., d_model]
        w_fc:   [d_ff, d_model],  b_fc:   [d_ff]
        w_proj: [d_model, d_ff],  b_proj: [d_model]
        return: [..., d_model]

    GELU here is the tanh approximation GPT-2 uses:
    ``gelu(u) = 0.5 * u * (1 + tanh(sqrt(2/pi) * (u + 0.044715 * u**3)))``
    (``F.gelu(u, approximate="tanh")``).

    Classic bug to avoid: the exact erf GELU (``F.gelu``'s default) differs by up to ~5e-4 -- close,
    but not GPT-2, and loaded GPT-2 weights will not reproduce its logits.
    """
    raise NotImplementedError("gelu_mlp")
