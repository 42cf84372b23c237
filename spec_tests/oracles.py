"""Oracles of relations the protocol states between an implementation's own outputs.

The model-level consumers (the KV cache, generation, evaluation) are judged against the
implementation's own forward pass, because the protocol defines them through it: "positions
continue from the cache", "conditions on the last context_length tokens", "loss = total NLL / number
of predicted tokens". A mistake in the forward pass is then charged to the model once, not again to
every consumer, and a consumer's own mistake is caught whatever the forward pass computes.
"""

from __future__ import annotations

import math

import torch

from .harness.judging.spec import UPSTREAM_CRASHES


def greedy_teacher(
    impl, model, prompt: torch.Tensor, n: int, context_length: int, *, use_cache: bool, pick=None, masked=False
):
    """Greedy continuation by the implementation's own forward: ``[B, T + n]``.

    Each token is the argmax of the last logits over the last ``context_length`` tokens (or ``pick(logits [B, V])``,
    ``[B]``: the implementation's own greedy sampler). With ``use_cache``, the prompt is fed into a fresh cache and
    each new token after it (as the protocol's ``forward(model, ids, cache)`` defines); once the sequence slides
    past the context, the window is fed into a fresh cache again, since every position shifts. ``masked``: every
    call passes an ``attention_mask`` of ones over the tokens so far in the cache (amendment 23's whole mask), as a
    generate that always hands on its mask does; for an unpadded prompt it means no padding.
    """
    ids, cache = prompt, None

    def call(x, held):
        if not masked:
            return impl.forward(model, x, cache) if use_cache else impl.forward(model, x)
        ones = torch.ones(x.shape[0], held, dtype=torch.long, device=x.device)
        return (
            impl.forward(model, x, cache, attention_mask=ones)
            if use_cache
            else impl.forward(model, x, attention_mask=ones)
        )

    for _ in range(n):
        if use_cache and cache is not None and ids.shape[1] <= context_length:
            logits = call(ids[:, -1:], ids.shape[1])
        else:
            cache = impl.new_cache(model, ids.shape[0]) if use_cache else None
            window = ids[:, -context_length:]
            logits = call(window, window.shape[1])
        next_id = logits[:, -1].argmax(dim=-1) if pick is None else pick(logits[:, -1])
        ids = torch.cat((ids, next_id[:, None].to(ids.dtype)), dim=1)
    return ids


def greedy_pick(impl, name: str):
    """How the implementation's own sampling function ``name`` picks greedily from logits ``[B, V]`` (temperature
    0): ``sample`` itself, or the argmax of ``sampling_probs``' one-hot."""
    if name == "sample":
        return lambda logits: impl.sample(logits, temperature=0.0)
    return lambda logits: impl.sampling_probs(logits, temperature=0.0).argmax(dim=-1)


def greedy_pickers(spec):
    """``[(name, pick)]``: the implementation's sampling functions that fail tests of their own (upstream first),
    each as a greedy pick for ``greedy_teacher``."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # its calls are not probed again
    names = spec.failing(("sampling_probs", "sample"))
    return [(name, greedy_pick(raw, name)) for name in names if raw.provides(name)]


def own_sampler_explains(spec, args, kwargs):
    """For a ``generate`` that raised (the ``UPSTREAM_CRASHES`` entry): ``(roots, why)`` where a correct generate
    that picks each token with the implementation's own failing ``sample`` (greedy: or ``sampling_probs``; sampled:
    ``sample`` with the call's options, its result taken as the protocol's ``[B]``) cannot run, while with the
    argmax it runs on the same model and prompt (without the cache, which is judged apart); else None. Weaker
    evidence than "the same crash at the same place" (a generate with a crash of its own beside such a sampler is
    credited too, until the sampler is fixed and the run repeated), so pytest only, as all crash consequences are."""
    names = ("model", "prompt", "max_new_tokens", "temperature", "top_k", "top_p", "generator", "use_cache")
    call = dict(zip(names, args, strict=False)) | dict(kwargs)
    model, prompt, n = call.get("model"), call.get("prompt"), call.get("max_new_tokens")
    built = spec.impl.ledger.models.get(id(model)) if hasattr(spec.impl, "ledger") else None
    if call.get("attention_mask") is not None or built is None:
        return None
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or not isinstance(n, int):
        return None
    raw, ctx = getattr(spec.impl, "_subject", spec.impl), built[1]["context_length"]
    sampled = call.get("temperature", 1.0) != 0
    pickers = greedy_pickers(spec) if not sampled else [("sample", None)] if spec.failing(("sample",)) else []
    if not pickers:
        return None
    try:
        greedy_teacher(raw, model, prompt, n, ctx, use_cache=False)
    except Exception:  # noqa: BLE001 - the model itself does not run: no sampler explains it
        return None
    if sampled:  # a correct sampled generate that draws each token with the implementation's own sample
        options = {k: call[k] for k in ("temperature", "top_k", "top_p") if k in call}
        try:
            draw = torch.Generator(device=prompt.device).manual_seed(0)
            sampled_teacher(raw, model, prompt, n, ctx, draw, strict=True, **options)
        except Exception as exc:  # noqa: BLE001 - whatever a correct generate meets with the sampler's answers
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            return ["sample"], (
                f"a correct generate that draws each token with your own sample(logits [B, V], {options}) cannot run "
                f"either ({why}), and picking the argmax it runs."
            )
        return None
    for name, pick in pickers:
        try:
            greedy_teacher(raw, model, prompt, n, ctx, use_cache=False, pick=pick)
        except Exception as exc:  # noqa: BLE001 - whatever a correct generate meets with the sampler's answers
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            return [name], (
                f"a correct greedy generate that picks each token with your own {name}(logits [B, V], "
                f"temperature=0) cannot run either ({why}), and with the argmax it runs."
            )
    return None


UPSTREAM_CRASHES["generate"] = own_sampler_explains


def sampled_teacher(impl, model, prompt: torch.Tensor, n: int, context_length: int, generator, strict=False, **kw):
    """Sampled continuation by the implementation's own forward and ``sample``: ``[B, T + n]``. Each token is
    ``sample(last logits over the last context_length tokens, generator=generator, **kw)``. ``strict``: a sample
    that returns another shape than the protocol's ``[B]`` raises, as a generate that appends ``ids[:, None]`` does."""
    ids = prompt
    for _ in range(n):
        logits = impl.forward(model, ids[:, -context_length:])
        next_id = impl.sample(logits[:, -1], generator=generator, **kw)
        if strict and tuple(next_id.shape) != (ids.shape[0],):
            raise ValueError(f"sample returned shape {tuple(next_id.shape)} for logits [{ids.shape[0]}, V]")
        ids = torch.cat((ids, next_id.reshape(-1, 1).to(ids.dtype)), dim=1)
    return ids


def windows(n_tokens: int, context_length: int) -> list[tuple[int, int]]:
    """``(start, length)`` of evaluate's windows: consecutive, non-overlapping, from 0, the last shorter."""
    n_pred = n_tokens - 1
    spans = [(s, context_length) for s in range(0, n_pred - n_pred % context_length, context_length)]
    if n_pred % context_length:
        spans.append((n_pred - n_pred % context_length, n_pred % context_length))
    return spans


def evaluate_with_own_loss(
    impl, model, data: torch.Tensor, context_length: int, device: str = "cpu", *, batch_size: int = 8
) -> list[float]:
    """The losses a token-weighted evaluate gets from the implementation's own ``cross_entropy`` on padded batches:
    each batch of ``batch_size`` windows padded (inputs with token 0, targets with ``ignore_index`` -100) to its
    longest window, or to ``context_length``, its ``cross_entropy`` weighted by the batch's predicted tokens; and one
    call over every window padded to ``context_length``. With a correct ``cross_entropy`` each is the protocol's loss,
    so an evaluate that equals one where ``cross_entropy`` fails is that failure's consequence."""
    spans = windows(len(data), context_length)
    n_pred = len(data) - 1

    def padded(group, width):
        x = torch.zeros(len(group), width, dtype=torch.long)
        y = torch.full((len(group), width), -100, dtype=torch.long)
        for row, (start, length) in enumerate(group):
            x[row, :length] = data[start : start + length].long()
            y[row, :length] = data[start + 1 : start + length + 1].long()
        return impl.forward(model, x.to(device)).detach(), y.to(device)

    def loss(logits, y) -> float:
        return float(torch.as_tensor(impl.cross_entropy(logits, y)).detach().double().cpu())

    out = []
    for to_context in (False, True):
        total = 0.0
        for i in range(0, len(spans), batch_size):
            group = spans[i : i + batch_size]
            width = context_length if to_context else max(n for _, n in group)
            total += loss(*padded(group, width)) * sum(n for _, n in group)
        out.append(total / n_pred)
    out.append(loss(*padded(spans, context_length)))
    return out


def batch_perplexities(
    impl, model, data: torch.Tensor, context_length: int, device: str = "cpu", *, batch_size: int = 8, alone: bool
) -> float:
    """The mean over evaluate's batches of exp(the batch's mean NLL): what code that averages per-batch perplexities
    reports as the perplexity. Batches are ``batch_size`` consecutive windows; ``alone``: the short last window is
    a batch of its own (code that cannot stack two lengths), else it joins the last batch."""
    spans = windows(len(data), context_length)
    nll = []
    for start, length in spans:
        x = data[start : start + length][None].long().to(device)
        y = data[start + 1 : start + length + 1].long()
        logits = impl.forward(model, x)[0].detach().double().cpu()
        nll.append(-torch.log_softmax(logits, dim=-1).gather(-1, y[:, None])[:, 0])
    if alone:
        full = [n for n, (_, length) in zip(nll, spans) if length == context_length]
        batches = [torch.cat(full[i : i + batch_size]) for i in range(0, len(full), batch_size)]
        batches += [n for n, (_, length) in zip(nll, spans) if length != context_length]
    else:
        batches = [torch.cat(nll[i : i + batch_size]) for i in range(0, len(nll), batch_size)]
    return float(torch.stack([b.mean().exp() for b in batches]).mean())


def evaluate_teacher(
    impl,
    model,
    data: torch.Tensor,
    context_length: int,
    device: str = "cpu",
    *,
    batch_size: int = 8,
    reduction: str = "tokens",
) -> dict[str, float]:
    """``{"loss", "perplexity"}`` as the protocol defines them, from the model's own logits.

    ``reduction`` other than ``"tokens"`` (the protocol's total NLL / predicted tokens) gives the usual mistakes,
    for diagnosis: ``"window_means"`` (mean of per-window means), ``"batch_means"`` (mean of per-batch means,
    ``batch_size`` full windows to a batch and the short last window on its own, as code that cannot stack windows
    of two lengths does), ``"mixed_batch_means"`` (the same, batches taken in order with the short last window in
    the last one), ``"sorted_batch_means"`` (the same, the windows sorted shortest first before batching, as
    mlx-lm's ``iterate_batches`` does: the short window in the first batch), ``"drop_last"`` (the short last window
    left out), ``"drop_last_batch"`` (the last batch left out where it has fewer than ``batch_size`` windows, as
    ``DataLoader(drop_last=True)`` does), ``"padded_weights"`` (each batch's mean weighted by its windows times
    ``context_length``, as code that counts a short window's padding as predicted tokens does),
    ``"padded_numerator"`` (those weights in the total, but divided by the tokens predicted), ``"full_windows"``
    (the total NLL divided by the windows times ``context_length``: a short window counted as full),
    ``"all_tokens"`` (divided by len(data) instead of the predicted len(data) - 1), ``"chunks"`` (windows
    ``context_length + 1`` apart: the data cut into chunks of inputs and targets, so the token after each chunk is
    never predicted; divided by the tokens predicted), ``"static_batches"`` (divided by every slot of the batches
    padded to a static ``[batch_size, context_length]``, the missing rows too), ``"plus_windows"`` (divided by the
    predicted tokens plus the
    number of windows: each window counted by its input's length or its mask's ones, one more than it predicts),
    ``"padded_sums"`` (each batch's NLL divided by all its padded slots, windows times ``context_length``, as Keras'
    ``sum_over_batch_size`` reduction does, the batches then averaged weighted by their predicted tokens),
    ``"edge_padded"`` (the last batch filled up to ``batch_size`` with copies of its last window, which are scored
    and counted), ``"unshifted"`` (each window's tokens scored as their own targets), ``"zero_ignored"`` (targets
    equal to token 0 left out: a pad id of 0 used as the ignored label), ``"second_half"`` (each window's
    predictions from context_length // 2 on, as llama.cpp's perplexity scores), ``"windows_count"`` and
    ``"batches_count"`` (the total NLL divided by the number of windows, or of batches), ``"batch_means_summed"``
    and ``"mixed_batch_means_summed"`` (each batch's mean added as if it were its sum, the short window alone or in
    the last batch), ``"tail_right_aligned"`` (the short last window made full length, ending at the last token,
    every target of it scored: the tokens it shares with the window before count twice), ``"pad_target"`` and
    ``"pad_targets"`` (a short last window padded with token 0 to ``context_length`` and its first padded target, or
    every one, scored as a prediction of token 0: a loss mask one too long, or none); ``"pad_targets_zero_inputs"``
    (the same, every padded target, with the inputs padded with 0 right after the window: inputs and targets padded
    apart, the targets with 0 instead of ignore_index); ``"zero_counted_out"`` (every target scored, the total divided
    by the padded windows' slots whose label is not 0: the count compares the labels with a pad id of 0 while the
    padding is marked with ignore_index); ``"row_means_rescaled"`` (each window's NLL averaged over its batch's
    padded width and multiplied back by its own length, as GluonNLP's masked loss times ``valid_length``);
    ``"in_window"`` and ``"mixed_in_window"`` (each window's own tokens given as labels that the model shifts inside,
    so its prediction of the token after it is dropped, each batch's mean weighted by its windows' lengths: the short
    window alone or in the last batch).
    """
    nll, targets = [], []
    spans = windows(len(data), context_length)
    if reduction == "chunks":
        step = context_length + 1
        spans = [(s, min(context_length, len(data) - 1 - s)) for s in range(0, len(data) - 1, step)]
    shift = 0 if reduction == "unshifted" else 1
    for start, length in spans:
        x = data[start : start + length][None].long().to(device)
        y = data[start + shift : start + length + shift].long()
        logits = impl.forward(model, x)[0].detach().double().cpu()
        nll.append(-torch.log_softmax(logits, dim=-1).gather(-1, y[:, None])[:, 0])
        targets.append(y)
    if reduction in ("pad_target", "pad_targets", "pad_targets_zero_inputs") and spans[-1][1] < context_length:
        start, length = spans[-1]  # its padding: inputs the window and its last target, then 0s; targets 0s
        pads = 1 if reduction == "pad_target" else context_length - length
        x = torch.cat([data[start : start + length + 1].long(), data.new_zeros(pads - 1).long()])
        if reduction == "pad_targets_zero_inputs":  # inputs and targets padded apart: 0s right after the window
            x = torch.cat([data[start : start + length].long(), data.new_zeros(pads).long()])
        logits = impl.forward(model, x[None].to(device))[0, length:].detach().double().cpu()
        nll.append(-torch.log_softmax(logits, dim=-1)[:, 0])

    def groups(short_alone: bool) -> list[list[int]]:
        """The windows of each batch (indices into ``nll``): full windows batch_size at a time and the short last one
        on its own, or every window in order (the short one in the last batch)."""
        if not short_alone:
            return [list(range(i, min(i + batch_size, len(nll)))) for i in range(0, len(nll), batch_size)]
        full = [i for i, (_, length) in enumerate(spans) if length == context_length]
        short = [[i] for i, (_, length) in enumerate(spans) if length != context_length]
        return [full[i : i + batch_size] for i in range(0, len(full), batch_size)] + short

    def batched(short_alone: bool) -> list[torch.Tensor]:
        """Each batch's NLL, its windows as ``groups`` gives them."""
        return [torch.cat([nll[i] for i in g]) for g in groups(short_alone)]

    if reduction == "zero_ignored":  # targets equal to token 0 left out, as a pad id of 0 used as the ignored label
        kept = torch.cat(targets) != 0
        loss = float(torch.cat(nll)[kept].sum() / kept.sum()) if bool(kept.any()) else math.nan
    elif reduction == "zero_counted_out":  # the total over every target, divided by the slots of the padded
        # windows whose label is not 0: a count of labels != pad id 0, where the padding is marked otherwise
        zeros = int((torch.cat(targets) == 0).sum())
        loss = float(torch.cat(nll).sum() / (len(spans) * context_length - zeros))
    elif reduction == "window_means":
        loss = float(torch.stack([n.mean() for n in nll]).mean())
    elif reduction == "batch_means":  # full windows batch_size at a time, the short last one on its own
        loss = float(torch.stack([b.mean() for b in batched(short_alone=True)]).mean())
    elif reduction == "drop_last":
        kept = [n for n, (_, length) in zip(nll, spans) if length == context_length] or nll
        loss = float(torch.cat(kept).mean())
    elif reduction == "drop_last_batch":  # a DataLoader(drop_last=True): a last batch of fewer windows left out
        kept = nll[: len(nll) // batch_size * batch_size]
        loss = float(torch.cat(kept).mean()) if kept else math.nan
    elif reduction == "mixed_batch_means":  # batches of batch_size windows in order, the short one in the last
        loss = float(torch.stack([b.mean() for b in batched(short_alone=False)]).mean())
    elif reduction == "sorted_batch_means":  # the windows sorted shortest first (stable), then batch_size at a time
        ordered = sorted(nll, key=len)
        batches = [torch.cat(ordered[i : i + batch_size]) for i in range(0, len(ordered), batch_size)]
        loss = float(torch.stack([b.mean() for b in batches]).mean())
    elif reduction in ("batch_means_summed", "mixed_batch_means_summed"):  # each batch's mean (a mean-reduced loss)
        # added up as if it were its sum
        batches = batched(short_alone=reduction == "batch_means_summed")
        loss = float(sum(b.mean() for b in batches) / (len(data) - 1))
    elif reduction == "padded_weights":  # batches of batch_size windows, each weighted by its windows x context
        batches = [nll[i : i + batch_size] for i in range(0, len(nll), batch_size)]
        weights = [len(b) * context_length for b in batches]
        means = [float(torch.cat(b).mean()) for b in batches]
        loss = sum(m * w for m, w in zip(means, weights)) / sum(weights)
    elif reduction == "padded_numerator":  # each batch's mean weighted by its windows x context, over the predictions
        batches = [nll[i : i + batch_size] for i in range(0, len(nll), batch_size)]
        total = sum(float(torch.cat(b).mean()) * len(b) * context_length for b in batches)
        loss = total / (len(data) - 1)
    elif reduction == "padded_sums":  # each batch's NLL over every slot of its padded windows (Keras'
        # sum_over_batch_size), the batches then weighted by their predicted tokens
        batches = [nll[i : i + batch_size] for i in range(0, len(nll), batch_size)]
        total = sum(float(torch.cat(b).sum()) / (len(b) * context_length) * sum(len(n) for n in b) for b in batches)
        loss = total / (len(data) - 1)
    elif reduction == "row_means_rescaled":  # each window's NLL averaged over its batch's padded width (masked
        # slots as 0), then multiplied by its own length to make a sum again: a short window beside full ones shrinks
        batches = [nll[i : i + batch_size] for i in range(0, len(nll), batch_size)]
        total = sum(float(n.sum()) * len(n) / max(len(m) for m in b) for b in batches for n in b)
        loss = total / (len(data) - 1)
    elif reduction == "full_windows":  # every window counted as context_length predictions
        loss = float(torch.cat(nll).sum() / (len(spans) * context_length))
    elif reduction == "static_batches":  # every slot of batches padded to a static [batch_size, context_length]
        loss = float(torch.cat(nll).sum() / (math.ceil(len(spans) / batch_size) * batch_size * context_length))
    elif reduction == "all_tokens":
        loss = float(torch.cat(nll).sum() / len(data))
    elif reduction == "plus_windows":  # each window counted with one token more than it predicts
        loss = float(torch.cat(nll).sum() / (len(data) - 1 + len(spans)))
    elif reduction == "edge_padded":  # the last batch filled up to batch_size with copies of its last window, scored
        copies = -len(spans) % batch_size
        total = torch.cat(nll).sum() + copies * nll[-1].sum()
        loss = float(total / (len(data) - 1 + copies * len(nll[-1])))
    elif reduction == "windows_count":  # the total divided by the number of windows (len() of a [windows, T] batch)
        loss = float(torch.cat(nll).sum() / len(spans))
    elif reduction == "batches_count":  # the total divided by the number of batches
        loss = float(torch.cat(nll).sum() / math.ceil(len(spans) / batch_size))
    elif reduction == "tail_right_aligned" and len(spans) > 1 and spans[-1][1] < context_length:
        # the short last window made full length, ending at the last token: it overlaps the one before, and every
        # one of its targets is scored, so the overlapped tokens count twice
        end = len(data) - 1
        x = data[end - context_length : end][None].long().to(device)
        y = data[end - context_length + 1 : end + 1].long()
        logits = impl.forward(model, x)[0].detach().double().cpu()
        tail = -torch.log_softmax(logits, dim=-1).gather(-1, y[:, None])[:, 0]
        scored = torch.cat([*nll[:-1], tail])
        loss = float(scored.mean())
    elif reduction in ("in_window", "mixed_in_window"):  # each window's own tokens as labels, shifted inside the
        # model: its last prediction (of the token after it) dropped; each batch's mean over what is left, weighted by
        # the predictions the caller meant to score (its windows' lengths)
        batches = groups(short_alone=reduction == "in_window")
        kept = [(torch.cat([nll[i][:-1] for i in g]), sum(len(nll[i]) for i in g)) for g in batches]
        kept = [(b, n) for b, n in kept if b.numel()]
        loss = sum(float(b.mean()) * n for b, n in kept) / sum(n for _, n in kept) if kept else math.nan
    elif reduction == "second_half":  # llama.cpp's perplexity: in each window only the predictions from C // 2 on
        scored = [n[context_length // 2 :] for n in nll]
        kept = torch.cat(scored)
        loss = float(kept.mean()) if kept.numel() else math.nan
    elif reduction in ("chunks", "pad_target", "pad_targets", "pad_targets_zero_inputs"):
        loss = float(torch.cat(nll).mean())
    else:
        loss = float(torch.cat(nll).sum() / (len(data) - 1))
    return {"loss": loss, "perplexity": float(torch.tensor(loss, dtype=torch.float64).exp())}
