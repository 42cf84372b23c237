"""``sampling_probs`` written from scratch (a per-row loop over sorted probabilities) with one
mistake: the token whose probability carries the mass past top_p is dropped, not kept.
Nothing here comes from ``reference``; every other protocol name is absent.
"""

import torch


def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """logits [..., V] -> the probabilities sampled from, [..., V]."""
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"bad sampling arguments: temperature={temperature}, top_k={top_k}, top_p={top_p}")
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    scaled = logits / temperature
    if top_k is not None:
        threshold = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
        scaled = torch.where(scaled < threshold, float("-inf"), scaled)
    if top_p is not None:
        flat = scaled.reshape(-1, scaled.shape[-1]).clone()
        for row in flat:
            probs = torch.softmax(row, dim=-1)
            order = torch.argsort(probs, descending=True)
            total = 0.0
            for token in order.tolist():
                total += probs[token].item()
                if total >= top_p:  # the mistake: checks the mass *including* this token
                    row[token] = float("-inf")
        scaled = flat.reshape(scaled.shape)
    return torch.softmax(scaled, dim=-1)
