"""Catalogued mistakes in Gemma 2's logit soft-capping (protocol v2, ``logit_softcap``, amendment 25)."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, EVALUATION, FORWARD, GENERATION, TRAINING

FIX = "cap * tanh(x / cap): on the attention scores after the 1/sqrt(d) scaling, before the mask, and on the logits"
ATTENTION = ("scaled_dot_product_attention", "multihead_self_attention", *FORWARD, *CACHE, *GENERATION)
_CAP = (
    "    if softcap is not None:  # protocol v2 (logit_softcap, amendment 25): after the scaling, before the mask\n"
    "        scores = softcap * torch.tanh(scores / softcap)\n"
)

_MASK = '    if mask is not None:\n        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))\n'

BUGS = (
    Bug(
        "final_softcap_in_place",
        "training",
        TRAINING,
        "model.py",
        old="            return cap * torch.tanh(linear(self.final_norm(x), self.lm_head.weight) / cap)",
        new="            return torch.tanh(linear(self.final_norm(x), self.lm_head.weight) / cap).mul_(cap)",
        explanation="the final soft-cap multiplies tanh's output in place: the same logits, but autograd saved that "
        "output for tanh's gradient, so every backward pass through a capped model raises",
        fix="cap * tanh(logits / cap) out of place",
        code="crash",
    ),
    Bug(
        "final_softcap_on_the_tied_head_only",
        "logit_softcap",
        FORWARD,
        "model.py",
        old="        if cap is not None:  # protocol v2 (amendment 25; Gemma 2): the logits soft-capped, "
        "cap * tanh(logits / cap)",
        new="        if cap is not None and self.config.tie_embeddings:  # the cap lives in the tied head's attend()",
        explanation="the final soft-cap is applied only when the head is the embedding: an untied head's logits are "
        "not capped",
        fix="cap * tanh(logits / cap) on the logits whichever weight the head uses",
    ),
    Bug(
        "softcap_after_mask",
        "logit_softcap",
        ATTENTION,
        "attention.py",
        old=_CAP + _MASK,
        new=_MASK + _CAP,
        explanation="the scores are soft-capped after the mask: tanh turns a masked key's -inf into -cap, so masked "
        "(future) keys get attention weight",
        fix=FIX,
    ),
    Bug(
        "softcap_without_division",
        "logit_softcap",
        ATTENTION,
        "attention.py",
        old="        scores = softcap * torch.tanh(scores / softcap)\n",
        new="        scores = softcap * torch.tanh(scores)\n",
        explanation="the attention cap is applied as cap * tanh(scores), without dividing the scores by the cap: "
        "scores are squashed to (-1, 1) and then stretched",
        fix=FIX,
    ),
    Bug(
        "softcap_before_scaling",
        "logit_softcap",
        ATTENTION,
        "attention.py",
        old='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1])\n' + _CAP,
        new='    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk")\n'
        "    if softcap is not None:  # capped before the scaling\n"
        "        scores = softcap * torch.tanh(scores / softcap)\n"
        "    scores = scores / math.sqrt(q.shape[-1])\n",
        explanation="the attention cap is applied to q k^T before the division by sqrt(d_head), so it bends scores "
        "sqrt(d_head) times larger and the result is sqrt(d_head) times smaller",
        fix=FIX,
    ),
    Bug(
        "softcap_dropped_in_cached_path",
        "logit_softcap",
        (*CACHE, *GENERATION),
        "model.py",
        old='        capped = {} if cap is None else {"softcap": cap}\n',
        new='        capped = {} if cap is None or cache is not None else {"softcap": cap}\n',
        explanation="with a cache the attention scores are not soft-capped, so cached (and generated) logits differ "
        "from the uncached forward's",
        fix=FIX + ", on the cached path as on the uncached one",
        corner=True,
    ),
    Bug(
        "final_softcap_missing",
        "logit_softcap",
        (*FORWARD, *CACHE, *GENERATION, *EVALUATION),
        "model.py",
        old="            return cap * torch.tanh(linear(self.final_norm(x), self.lm_head.weight) / cap)\n",
        new="            return linear(self.final_norm(x), self.lm_head.weight)\n",
        explanation="final_logit_softcap is ignored: the logits are not capped (greedy decoding cannot tell, since "
        "tanh keeps the order)",
        fix=FIX,
    ),
    Bug(
        "final_softcap_outside_the_loss",
        "logit_softcap",
        EVALUATION,
        "training.py",
        old="                total += token_nll(model(x), y).sum().double().cpu()\n",
        new="                logits, cap = model(x), model.config.final_logit_softcap\n"
        "                logits = logits if cap is None else cap * torch.atanh(logits / cap)  # the cap undone\n"
        "                total += token_nll(logits, y).sum().double().cpu()\n",
        explanation="evaluate's loss is taken on the uncapped logits (as when the cap is applied in the forward "
        "function but not in the model the loss runs), while forward returns capped ones",
        fix=FIX + "; inside the model, so that the loss sees the capped logits",
        corner=True,
    ),
)
