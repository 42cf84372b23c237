"""Catalogued mistakes in the Gemma-style model options (protocol v2, amendment 26): ``norm_offset``,
``embed_scale``, ``geglu`` and ``post_norms``."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, FORWARD, GENERATION, INIT

MODEL = (*FORWARD, *CACHE, *GENERATION)
NORM_FIX = "with norm_offset every RMSNorm of the model multiplies by 1 + weight (weights are offsets, fresh ones 0)"
SCALE_FIX = "multiply the looked-up input embeddings by sqrt(d_model) (in their dtype); the tied LM head is not scaled"
GEGLU_FIX = "(gelu_tanh(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T: the tanh-approximate GELU, on the gate only"
POST_FIX = "x = x + attn_post_norm(attn(attn_norm(x))); x = x + mlp_post_norm(mlp(mlp_norm(x)))"

BUGS = (
    Bug(
        "norm_offset_weight_only",
        "norm_offset",
        MODEL,
        "model.py",
        old="            return rmsnorm(x, 1.0 + self.weight.to(torch.promote_types(x.dtype, torch.float32)), "
        "self.eps)\n",
        new="            return rmsnorm(x, self.weight, self.eps)\n",
        explanation="with norm_offset the RMSNorm gain is the stored weight, not 1 + weight: fresh (zero) weights "
        "zero every normalised activation",
        fix=NORM_FIX,
    ),
    Bug(
        "norm_offset_not_on_final_norm",
        "norm_offset",
        MODEL,
        "model.py",
        old="        self.final_norm = Norm(cfg.d_model, cfg.norm_eps)\n",
        new="        self.final_norm = (RMSNorm if llama else Norm)(cfg.d_model, cfg.norm_eps)\n",
        explanation="the blocks' norms take 1 + weight but the final norm uses its weight as the gain",
        fix=NORM_FIX + ", the final norm included",
        corner=True,
    ),
    Bug(
        "norm_offset_fresh_weights_one",
        "norm_offset",
        INIT,
        "model.py",
        old="        if isinstance(module, RMSNorm) and module.offset:\n            module.weight.zero_()\n",
        new="        if isinstance(module, RMSNorm) and module.offset:\n            module.weight.fill_(1.0)\n",
        explanation="fresh norm offsets are initialised to 1 (as plain norm weights), a gain of 2 instead of 1",
        fix=NORM_FIX,
    ),
    Bug(
        "norm_offset_on_qk_norm",
        "norm_offset",
        MODEL,
        "model.py",
        old='            normed = {"q_norm": self.q_norm.weight, "k_norm": self.k_norm.weight, '
        '"norm_eps": cfg.norm_eps}\n',
        new="            gain = (lambda w: 1 + w) if cfg.norm_offset else (lambda w: w)\n"
        '            normed = {"q_norm": gain(self.q_norm.weight), "k_norm": gain(self.k_norm.weight), '
        '"norm_eps": cfg.norm_eps}\n',
        explanation="with norm_offset the per-head q and k norms take 1 + weight too (as litgpt's add_unit_offset "
        "does), though amendment 26 keeps their gains plain",
        fix=NORM_FIX + "; q_norm and k_norm keep their weights as gains",
        corner=True,
    ),
    Bug(
        "embed_scale_by_d_model",
        "embed_scale",
        MODEL,
        "model.py",
        old="            x = x * torch.tensor(self.config.d_model**0.5, dtype=x.dtype, device=x.device)\n",
        new="            x = x * torch.tensor(self.config.d_model, dtype=x.dtype, device=x.device)\n",
        explanation="the input embeddings are multiplied by d_model instead of sqrt(d_model)",
        fix=SCALE_FIX,
    ),
    Bug(
        "embed_scale_on_tied_head",
        "embed_scale",
        MODEL,
        "model.py",
        old="        return linear(self.final_norm(x), self.lm_head.weight)\n",
        new="        head = self.lm_head.weight\n"
        "        if self.config.embed_scale and self.config.tie_embeddings:  # the scaled matrix reused as the head\n"
        "            head = head * self.config.d_model**0.5\n"
        "        return linear(self.final_norm(x), head)\n",
        explanation="the tied LM head uses the scaled embedding matrix (the scale folded into the shared weight), "
        "so the logits are sqrt(d_model) times too large",
        fix=SCALE_FIX,
    ),
    Bug(
        "geglu_exact_gelu",
        "geglu",
        MODEL,
        "mlp.py",
        old="    return linear(gelu_tanh(linear(x, w_gate)) * linear(x, w_up), w_down)\n",
        new="    return linear(torch.nn.functional.gelu(linear(x, w_gate)) * linear(x, w_up), w_down)\n",
        explanation="GeGLU uses the exact (erf) GELU instead of the tanh approximation Gemma uses (gelu_pytorch_tanh)",
        fix=GEGLU_FIX,
    ),
    Bug(
        "geglu_gelu_on_up",
        "geglu",
        MODEL,
        "mlp.py",
        old="    return linear(gelu_tanh(linear(x, w_gate)) * linear(x, w_up), w_down)\n",
        new="    return linear(linear(x, w_gate) * gelu_tanh(linear(x, w_up)), w_down)\n",
        explanation="GeGLU applies the GELU to the up projection instead of the gate",
        fix=GEGLU_FIX,
    ),
    Bug(
        "post_norms_after_residual",
        "post_norms",
        MODEL,
        "model.py",
        old="        x = x + self.drop(self.attn_post_norm(h))\n",
        new="        x = self.attn_post_norm(x + self.drop(h))  # after the residual add (post-LN)\n",
        explanation="the attention's post-norm normalises the residual stream after the add (post-LN) instead of "
        "the attention output before it",
        fix=POST_FIX,
    ),
    Bug(
        "post_norms_swapped",
        "post_norms",
        MODEL,
        "model.py",
        old="        x = x + self.drop(self.attn_post_norm(h))\n        h = self.mlp(self.mlp_norm(x))\n"
        "        return x + self.drop(self.mlp_post_norm(h))\n",
        new="        x = x + self.drop(self.mlp_post_norm(h))\n        h = self.mlp(self.mlp_norm(x))\n"
        "        return x + self.drop(self.attn_post_norm(h))\n",
        explanation="the attention output is normalised with mlp_post_norm's weight and the MLP output with "
        "attn_post_norm's",
        fix=POST_FIX,
        corner=True,
    ),
)
