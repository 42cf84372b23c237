"""Catalogued mistakes in Mixtral's sparse mixture-of-experts MLP and its load-balancing loss (protocol v2, ``moe``,
amendment 28)."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, FORWARD, GENERATION

FIX = (
    "softmax(x @ router.T) over the experts (the last axis, in at least float32), the top_k largest kept and "
    "renormalised to sum 1, output sum_e g_e * swiglu(x, w_gate[e], w_up[e], w_down[e])"
)
LOSS_FIX = (
    "E * sum_e f_e * P_e: P_e the mean over tokens of softmax(router_logits)[:, e] (every probability), f_e the "
    "fraction of tokens whose top_k experts include e"
)
MOE_MLP = ("moe_mlp", *FORWARD, *CACHE, *GENERATION)
LOSS = ("moe_load_balancing_loss",)

BUGS = (
    Bug(
        "moe_weights_not_renormalised",
        "moe",
        MOE_MLP,
        "moe.py",
        old="    top = top / top.sum(dim=-1, keepdim=True)\n",
        new="",
        explanation="the chosen experts are weighted by their raw softmax probabilities, which sum to less than 1",
        fix=FIX,
    ),
    Bug(
        "moe_router_softmax_over_tokens",
        "moe",
        (*MOE_MLP, *LOSS),
        "moe.py",
        old="    return softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)",
        new="    return softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-2)",
        explanation="the router's softmax runs over the tokens (axis -2) instead of over the experts",
        fix=FIX,
    ),
    Bug(
        "moe_top_k_plus_one",
        "moe",
        MOE_MLP,
        "moe.py",
        old="    top, chosen = torch.topk(probs, top_k, dim=-1)\n",
        new="    top, chosen = torch.topk(probs, min(top_k + 1, probs.shape[-1]), dim=-1)\n",
        explanation="each token keeps one expert more than top_k (an off-by-one in the count), all of them when "
        "top_k = n_experts - 1",
        fix=FIX,
    ),
    Bug(
        "moe_every_expert_mixed",
        "moe",
        MOE_MLP,
        "moe.py",
        old="    gates = routing_weights(router_probs(linear(x, router)), top_k)  # [..., E]\n",
        new="    gates = router_probs(linear(x, router))  # [..., E]\n",
        explanation="top_k is ignored: every expert runs, weighted by the full softmax (a dense mixture, not sparse)",
        fix=FIX,
    ),
    Bug(
        "moe_experts_reversed",
        "moe",
        (*FORWARD, *CACHE, *GENERATION),
        "model.py",
        old="        w_gate = torch.stack([expert.w_gate.weight for expert in self.experts])  # [E, d_ff, d_model]\n"
        "        w_up = torch.stack([expert.w_up.weight for expert in self.experts])  # [E, d_ff, d_model]\n"
        "        w_down = torch.stack([expert.w_down.weight for expert in self.experts])  # [E, d_model, d_ff]\n",
        new="        w_gate = torch.stack([expert.w_gate.weight for expert in self.experts[::-1]])\n"
        "        w_up = torch.stack([expert.w_up.weight for expert in self.experts[::-1]])\n"
        "        w_down = torch.stack([expert.w_down.weight for expert in self.experts[::-1]])\n",
        explanation="the experts' weights are stacked in reverse, so router row e sends its tokens to expert "
        "E - 1 - e (a loaded checkpoint's experts mixed up)",
        fix="stack the experts in index order: router row e belongs to mlp.experts.{e}",
    ),
    Bug(
        "moe_loss_without_n_experts",
        "moe",
        LOSS,
        "moe.py",
        old="    return n_experts * (fraction * prob).sum()",
        new="    return (fraction * prob).sum()",
        explanation="the load-balancing loss lacks the factor n_experts: sum_e f_e * P_e (a uniform router gives "
        "top_k / E, not top_k)",
        fix=LOSS_FIX,
    ),
    Bug(
        "moe_loss_chosen_weights",
        "moe",
        LOSS,
        "moe.py",
        old='    prob = reduce(probs, "n e -> e", "mean")',
        new='    prob = reduce(routing_weights(probs, top_k), "n e -> e", "mean")',
        explanation="P_e averages the renormalised top-k weights (0 for unchosen experts) instead of every softmax "
        "probability",
        fix=LOSS_FIX,
    ),
    Bug(
        "moe_output_left_in_float32",
        "half_precision",
        MOE_MLP,
        "moe.py",
        old="w_down[e]), 0.0).to(x.dtype)\n",
        new="w_down[e]), 0.0)\n",
        explanation="the experts' outputs are weighted by the float32 routing weights and not cast back: a bfloat16 "
        "model's MLP returns float32, and the next layer's bfloat16 weights meet float32 activations",
        fix="cast the weighted expert output back to x's dtype (Mixtral: .to(hidden_states.dtype))",
        corner=True,
    ),
)
