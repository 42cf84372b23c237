"""Catalogued mistakes in batching, the training step and evaluation."""

from __future__ import annotations

from .bug import Bug
from .model_components import EVALUATION, TRAINING

# evaluate's loop over its windows in reference/training.py (the text two evaluation bugs replace)
EVALUATE_LOOP = """    total = torch.zeros((), dtype=torch.float64)
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            for length in sorted({n for _, n in group}):  # the short last window goes alone
                starts = torch.tensor([s for s, n in group if n == length])
                offsets = starts[:, None] + torch.arange(length)[None, :]
                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                total += token_nll(model(x), y).sum().double().cpu()
    loss = (total / n_pred).item()"""

# train's AdamW written by hand, for the bugs in its update: {moment} and {update} are each bug's own lines, {state}
# its state's creation (FRESH_STATE where the bug is elsewhere)
FRESH_STATE = "s.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))"
_ADAMW_WRITTEN_OUT = """    class _AdamW(torch.optim.Optimizer):  # AdamW written out (decay 0.01, betas 0.9 and 0.999)
        def __init__(self, params, lr):
            super().__init__(params, dict(lr=lr))

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    s = self.state[p]
                    if not s:
                        {state}
                    s["t"] += 1
                    {moment}
                    s["v"].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                    m_hat, v_hat = s["m"] / (1 - 0.9 ** s["t"]), s["v"] / (1 - 0.999 ** s["t"])
                    {update}

    optimizer = _AdamW(model.parameters(), lr=lr)"""


BUGS = (
    Bug(
        "evaluate_divides_by_static_batch_slots",
        "evaluation",
        EVALUATION,
        "training.py",
        old="    loss = (total / n_pred).item()",
        new="    loss = (total / (-(-len(windows) // batch_size) * batch_size * context_length)).item()  # the bug",
        explanation="evaluate divides the total NLL by every slot of its batches padded to a static [batch_size, "
        "context_length] shape (as a JAX-style loader pads them), the short window's padding and the missing rows "
        "counted as predictions",
        fix="divide by the number of predicted tokens, len(data) - 1",
    ),
    Bug(
        "evaluate_windows_of_the_model_context",
        "evaluation",
        EVALUATION,
        "training.py",
        old="    n_pred = len(tokens) - 1\n",
        new="    n_pred = len(tokens) - 1\n"
        "    context_length = model.config.context_length  # the bug: the argument ignored\n",
        explanation="evaluate cuts its windows at the model's own context_length, ignoring the context_length it is "
        "given (a notebook's max_seq_len read where the argument belongs)",
        fix="windows of the context_length argument",
        corner=True,
    ),
    Bug(
        "train_step_gradients_over_the_time_axis",
        "training",
        TRAINING,
        "training.py",
        old="    loss.backward()\n",
        new="    (loss * x.shape[0] / x.shape[1]).backward()  # the bug: a batch size read from the time axis\n",
        explanation="train_step's gradients are those of the mean loss times B / T (GluonNLP's "
        "trainer.step(batch_size) given the time axis of an NTC batch, a TNC script's habit): the reported loss is "
        "right, every step is B / T times the specified one",
        fix="backward the mean loss itself (or rescale by the batch's real size)",
        corner=True,
    ),
    Bug(
        "evaluate_rescales_padded_row_means",
        "evaluation",
        EVALUATION,
        "training.py",
        old="                total += token_nll(model(x), y).sum().double().cpu()",
        new="                width = max(n for _, n in group)  # the bug: a mean over the padded width\n"
        "                total += token_nll(model(x), y).sum().double().cpu() * length / width",
        explanation="each window's loss is its masked mean over the batch's padded width, multiplied by its own "
        "length (GluonNLP's MaskedSoftmaxCELoss times valid_length): a short window batched with full ones adds only "
        "length / width of its NLL",
        fix="sum each window's NLL over its real targets",
        corner=True,
    ),
    Bug(
        "train_steps_only_the_linear_matrices",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new="    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and 'embeddings' not in n]\n"
        "    optimizer = torch.optim.AdamW(decayed, lr=lr)  # the bug: no no-decay group",
        explanation="train's AdamW is given only the weight-decay group, the linear layers' matrices: its no-decay "
        "group (the embeddings, norm gains, biases) was never added, so those weights never change",
        fix="give the optimizer every parameter: both groups",
    ),
    Bug(
        "train_reseeds_its_batches_every_step",
        "training",
        TRAINING,
        "training.py",
        old="            x, y = get_batch(data, batch_size, context_length, generator, device)",
        new="            generator = torch.Generator().manual_seed(seed)  # the bug: seeded again at every step\n"
        "            x, y = get_batch(data, batch_size, context_length, generator, device)",
        explanation="train seeds its batch generator again at every step (DeepSeek's manual_seed per call), so every "
        "step draws the same windows",
        fix="make one generator from the seed before the loop and draw every step's batch from it",
        code="knob:generator",
    ),
    Bug(
        "train_step_loss_drops_its_last_partial_chunk",
        "training",
        TRAINING,
        "training.py",
        old="    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster",
        new="    flat, targets = model(x).flatten(0, -2), y.flatten()  # the bug: chunks of 8 rows, floor division\n"
        "    loss = sum(\n"
        "        torch.nn.functional.cross_entropy(flat[i : i + 8], targets[i : i + 8], reduction='sum')\n"
        "        for i in range(0, len(targets) // 8 * 8, 8)\n"
        "    ) / len(targets)",
        explanation="train_step computes its loss in chunks of 8 rows (a fused linear cross-entropy that never "
        "builds the whole logits), counting the chunks by floor division, so the last, partial chunk's tokens "
        "contribute nothing while the mean still divides by every token",
        fix="cover every row: ceil(N / 8) chunks, the last one shorter",
        corner=True,
    ),
    Bug(
        "evaluate_labels_each_window_with_itself",
        "evaluation",
        EVALUATION,
        "training.py",
        old="                total += token_nll(model(x), y).sum().double().cpu()",
        new="                inner = token_nll(model(x)[:, :-1], x[:, 1:])  # the bug: labels=x, shifted inside\n"
        "                total += (inner.mean() * y.numel()).double().cpu()",
        explanation="evaluate gives each window its own tokens as labels, which are shifted inside (Hugging Face's "
        "labels=input_ids): the prediction of the token after each window is dropped, and each batch's mean over "
        "what is left is weighted by all its windows' predictions",
        fix="score each window against the tokens one ahead, data[s + 1 : s + C + 1], every prediction of it",
        corner=True,
        code="knob:label_shift",
    ),
    Bug(
        "train_step_loss_per_sequence",
        "training",
        TRAINING,
        "training.py",
        old="    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster",
        new="    loss = cross_entropy(model(x), y, fused=True) * y.shape[-1]  # the bug: summed per row, / rows",
        explanation="train_step's loss is the NLL summed over each sequence and averaged over the sequences "
        "(normalised by sentences, as a translation toolkit's default): T times the mean, its gradients too",
        fix="average the NLL over the target tokens",
    ),
    Bug(
        "train_lr_module_constant",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)\n",
        new="    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)  # max_lr of the GPT-3 small schedule\n",
        explanation="train's AdamW takes a module-level learning rate (6e-4) instead of its lr argument",
        fix="AdamW(model.parameters(), lr=lr)",
    ),
    Bug(
        "train_clips_at_a_fixed_norm",
        "training",
        TRAINING,
        "training.py",
        old="            losses.append(train_step(model, optimizer, x, y, max_grad_norm))",
        new="            losses.append(train_step(model, optimizer, x, y, 1.0))  # the GPT-3 recipe's clipping",
        explanation="train clips the gradient norm at 1.0 whatever max_grad_norm it is given",
        fix="train_step(model, optimizer, x, y, max_grad_norm)",
    ),
    Bug(
        "train_step_clips_without_the_head",
        "training",
        TRAINING,
        "training.py",
        old="        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)",
        new="        head = model.lm_head.weight  # the backbone only, as a trunk-only clip\n"
        "        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p is not head], max_grad_norm)",
        explanation="train_step clips over every parameter but the untied output head: the head's gradient is "
        "neither counted in the global norm nor scaled",
        fix="clip_grad_norm_(model.parameters(), max_grad_norm): every parameter, the head's included",
    ),
    Bug(
        "train_step_freezes_vectors",
        "training",
        TRAINING,
        "training.py",
        old="    model.train()\n    optimizer.zero_grad(set_to_none=True)\n",
        new="    model.train()\n"
        "    for p in model.parameters():  # a fine-tuning recipe's freeze left in: only matrices train\n"
        "        p.requires_grad_(p.dim() > 1)\n"
        "    optimizer.zero_grad(set_to_none=True)\n",
        explanation="train_step freezes every 1-D parameter (norm gains, biases): their gradients are never computed, "
        "so they never move",
        fix="leave requires_grad as the model has it: every parameter trains",
    ),
    Bug(
        "train_step_targets_buffer_kept",
        "training",
        TRAINING,
        "training.py",
        old="    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster\n",
        new='    if not hasattr(model, "_targets"):  # preallocated once, as llm.c keeps its activations\n'
        "        model._targets = torch.empty_like(y)\n"
        "    model._targets.copy_(y)\n"
        "    loss = cross_entropy(model(x), model._targets, fused=True)\n",
        explanation="a targets buffer kept on the model is allocated at the first train_step's shape, so a later batch "
        "of another shape cannot be copied into it",
        fix="allocate per call (or reallocate when the batch's shape changes)",
    ),
    Bug(
        "get_batch_unshifted_targets",
        "unshifted_labels",
        TRAINING,
        "training.py",
        old="    x, y = tokens[offsets], tokens[offsets + 1]",
        new="    x, y = tokens[offsets], tokens[offsets]",
        explanation="get_batch returns y equal to x, so the model learns to copy its input instead of predicting the "
        "next token",
        fix="y = data[start + 1 : start + 1 + context_length]: targets are the inputs shifted one token ahead",
    ),
    Bug(
        "token_data_keeps_its_dtype",
        "get_batch",
        TRAINING,
        "training.py",
        old="    return tokens.long()\n",
        new="    return tokens\n",
        explanation="token data is not converted to long: numpy uint16 tokens (nanoGPT's format) give uint16 "
        "windows, which the embedding cannot index with",
        fix="torch.as_tensor(data).long(): windows are int64 whatever the data's integer dtype",
        corner=True,
        code="crash",
    ),
    Bug(
        "evaluate_drops_the_last_short_batch",
        "evaluation",
        ("evaluate",),
        "training.py",
        old="""        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]""",
        new="""        windows = windows[: len(windows) // batch_size * batch_size]  # the bug: drop_last=True
        n_pred = sum(n for _, n in windows)
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]""",
        explanation="evaluate leaves out a last batch of fewer than batch_size windows (drop_last=True), so those "
        "tokens are never scored, and with fewer windows than batch_size nothing is",
        fix="score every window: keep the last, smaller batch (drop_last=False)",
        code="boundary",
    ),
    Bug(
        "evaluate_perplexity_base_two",
        "evaluation",
        ("evaluate",),
        "training.py",
        old="""    return {"loss": loss, "perplexity": math.exp(loss)}""",
        new="""    return {"loss": loss, "perplexity": 2.0**loss}  # the bug: a base-2 exponent over a loss in nats""",
        explanation="evaluate reports 2 ** loss as the perplexity (mistral-finetune's) while its loss is in nats",
        fix="perplexity = exp(loss)",
        code="knob:loss_units",
    ),
    Bug(
        "evaluate_scores_the_padding_as_token_0",
        "evaluation",
        ("evaluate",),
        "training.py",
        old="""                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                total += token_nll(model(x), y).sum().double().cpu()""",
        new="""                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                pad = context_length - length  # the bug: inputs and targets padded with 0, the padding scored
                x, y = torch.nn.functional.pad(x, (0, pad)), torch.nn.functional.pad(y, (0, pad))
                n_pred += pad * len(starts)
                total += token_nll(model(x), y).sum().double().cpu()""",
        explanation="evaluate pads a short last window's inputs and targets with token 0 (the targets with 0, not "
        "ignore_index), so each padded position is scored as a prediction of token 0 and counted",
        fix="pad the targets with ignore_index (or score the short window as it is): only real targets count",
        code="knob:ignore_index",
    ),
    Bug(
        "get_batch_keeps_the_data_dtype",
        "get_batch",
        TRAINING,
        "training.py",
        old="""    tokens = as_token_tensor(data)
    if batch_size < 1 or context_length < 1:""",
        new="""    tokens = data if isinstance(data, torch.Tensor) else torch.from_numpy(np.asarray(data))  # the bug
    if batch_size < 1 or context_length < 1:""",
        explanation="get_batch keeps the data's own integer dtype (nanoGPT's uint16, an int32 tensor), so the "
        "windows are not long and an embedding lookup raises on them",
        fix="convert the windows to int64: tokens.long() (astype(np.int64) before torch.from_numpy)",
        code="dtype",
    ),
    Bug(
        "get_batch_last_start_unreachable",
        "get_batch",
        TRAINING,
        "training.py",
        old="    starts = torch.randint(0, len(tokens) - context_length, (batch_size,), generator=generator)",
        new="    starts = torch.randint(0, len(tokens) - context_length - 1, (batch_size,), generator=generator)",
        explanation="the last window start len - context_length - 1 is never drawn (randint's upper bound is "
        "exclusive)",
        fix="torch.randint(0, len(data) - context_length, ...): starts 0 .. len - context_length - 1 inclusive",
        corner=True,
        code="boundary",
    ),
    Bug(
        "get_batch_non_overlapping_chunks",
        "get_batch",
        TRAINING,
        "training.py",
        old="    starts = torch.randint(0, len(tokens) - context_length, (batch_size,), generator=generator)",
        new="    n_chunks = (len(tokens) - context_length - 1) // context_length + 1\n"
        "    starts = torch.randint(0, n_chunks, (batch_size,), generator=generator) * context_length",
        explanation="get_batch draws whole chunks of the data (starts at multiples of context_length), so most "
        "windows can never be drawn",
        fix="draw each start uniformly from 0 .. len(data) - context_length - 1",
        corner=True,
        code="knob:data_windows",
    ),
    Bug(
        "train_step_no_zero_grad",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer.zero_grad(set_to_none=True)\n",
        new="",
        explanation="train_step never clears the gradients, so each step uses the sum of all gradients so far",
        fix="optimizer.zero_grad() before backward",
        code="knob:zero_grad",
    ),
    Bug(
        "train_step_not_in_training_mode",
        "mode_restore",
        TRAINING,
        "training.py",
        old="    model.train()\n",
        new="",
        explanation="train_step runs in whatever mode the model is in, so after evaluation dropout stays off while "
        "training",
        fix="call model.train() at the start of every training step",
        corner=True,
    ),
    Bug(
        "clip_per_parameter",
        "gradient_clipping",
        TRAINING,
        "training.py",
        old="        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)",
        new="        for p in model.parameters():\n            torch.nn.utils.clip_grad_norm_(p, max_grad_norm)",
        explanation="gradients are clipped one parameter at a time instead of by their global norm",
        fix="one call over all parameters: clip_grad_norm_(model.parameters(), max_grad_norm)",
        corner=True,
    ),
    Bug(
        "clip_norm_without_root",
        "gradient_clipping",
        TRAINING,
        "training.py",
        old="        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)",
        new="        grads = [p.grad for p in model.parameters() if p.grad is not None]\n"
        "        total = sum(float(g.pow(2).sum()) for g in grads)  # the bug: no square root\n"
        "        if total > max_grad_norm:\n"
        "            for g in grads:\n"
        "                g.mul_(max_grad_norm / (total + 1e-6))",
        explanation="clipping compares max_grad_norm with the sum of the squared gradients (the global norm's square "
        "root left out, as a hand-written get_grad_norm without ** (1 / p))",
        fix="norm = sqrt(sum of squares); scale by min(1, max_grad_norm / norm)",
        corner=True,
    ),
    Bug(
        "clip_after_step",
        "gradient_clipping",
        TRAINING,
        "training.py",
        old="""    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()""",
        new="""    optimizer.step()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)""",
        explanation="gradients are clipped after optimizer.step(), so the step uses the unclipped gradients",
        fix="clip between backward() and optimizer.step()",
        corner=True,
    ),
    Bug(
        "evaluate_batch_means_summed",
        "evaluation",
        EVALUATION,
        "training.py",
        old="                total += token_nll(model(x), y).sum().double().cpu()",
        new="                total += token_nll(model(x), y).mean().double().cpu()  # the bug: a mean added as a sum",
        explanation="evaluate adds each batch's mean NLL to its total as if it were the batch's summed NLL, then "
        "divides by the predicted tokens: the loss is far too small",
        fix="add each batch's summed NLL (token_nll(...).sum()), then divide by the number of predicted tokens",
        corner=True,
    ),
    Bug(
        "evaluate_mean_of_batch_means",
        "evaluation",
        EVALUATION,
        "training.py",
        old=EVALUATE_LOOP,
        new="""    batch_means = []
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            for length in sorted({n for _, n in group}):  # the short last window goes alone
                starts = torch.tensor([s for s, n in group if n == length])
                offsets = starts[:, None] + torch.arange(length)[None, :]
                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                batch_means.append(token_nll(model(x), y).mean().double().cpu())
    loss = torch.stack(batch_means).mean().item()""",
        explanation="evaluate averages per-batch mean losses, so a short last batch weighs as much as a full one",
        fix="sum the NLL of every predicted token and divide by their number (len(data) - 1)",
        corner=True,
    ),
    Bug(
        "evaluate_batch_means_shortest_first",
        "evaluation",
        EVALUATION,
        "training.py",
        old=EVALUATE_LOOP,
        new="""    batch_means = []
    windows = sorted(windows, key=lambda w: w[1])  # mlx-lm's iterate_batches: shortest first
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            nll = torch.cat([token_nll(model(tokens[s : s + n][None].to(device)), tokens[s + 1 : s + n + 1][None].to(
                device))[0] for s, n in group]).double().cpu()
            batch_means.append(nll.mean())
    loss = torch.stack(batch_means).mean().item()""",
        explanation="evaluate batches its windows sorted shortest first and averages the per-batch mean losses, so "
        "the batch holding the short window weighs as much as a full one",
        fix="sum the NLL of every predicted token and divide by their number (len(data) - 1)",
        corner=True,
        code="knob:loss_reduction",
    ),
    Bug(
        "evaluate_sums_over_padded_slots",
        "evaluation",
        EVALUATION,
        "training.py",
        old=EVALUATE_LOOP,
        new="""    total = torch.zeros((), dtype=torch.float64)
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            nll = torch.cat([token_nll(model(tokens[s : s + n][None].to(device)), tokens[s + 1 : s + n + 1][None].to(
                device))[0] for s, n in group]).double().cpu()
            # the bug: the batch's loss over all its padded slots (sum_over_batch_size), weighted by its tokens
            total += nll.sum() / (len(group) * context_length) * nll.numel()
    loss = (total / n_pred).item()""",
        explanation="each batch's loss divides its NLL by every slot of its windows padded to context_length (Keras' "
        "sum_over_batch_size), so a batch holding the short last window counts its padding as zero-loss predictions",
        fix="divide by the predicted tokens only: sum the NLL of every predicted token, divide by len(data) - 1",
        corner=True,
        code="knob:loss_reduction",
    ),
    Bug(
        "evaluate_positions_from_one",
        "evaluation",
        EVALUATION,
        "training.py",
        old="                total += token_nll(model(x), y).sum().double().cpu()",
        new="                own = torch.arange(1, x.shape[1] + 1, device=x.device)  # the bug: positions from 1\n"
        "                total += token_nll(model(x, positions=own), y).sum().double().cpu()",
        explanation="evaluate runs the model at positions of its own, counted from 1: forward is right, and evaluate "
        "scores other logits (gpt2's learned positions; RoPE sees only differences)",
        fix="score forward(model, window)'s logits: no positions of evaluate's own",
        corner=True,
        code="knob:evaluate_path",
    ),
    Bug(
        "evaluate_counts_padding",
        "evaluation",
        EVALUATION,
        "training.py",
        old=EVALUATE_LOOP,
        new="""    weighted, weights = [], []
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            nll = torch.zeros((), dtype=torch.float64)
            for length in sorted({n for _, n in group}):  # the short last window goes alone
                starts = torch.tensor([s for s, n in group if n == length])
                offsets = starts[:, None] + torch.arange(length)[None, :]
                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                nll += token_nll(model(x), y).sum().double().cpu()
            weights.append(len(group) * context_length)  # every window as if full: the padding counted
            weighted.append(nll / sum(n for _, n in group) * weights[-1])
    loss = (sum(weighted) / sum(weights)).item()""",
        explanation="evaluate weights each batch's mean loss by its windows times context_length, so a short last "
        "window's padding counts as predicted tokens",
        fix="sum the NLL of every predicted token and divide by their number (len(data) - 1)",
        corner=True,
        code="knob:loss_reduction",
    ),
    Bug(
        "evaluate_scores_padding_targets",
        "evaluation",
        EVALUATION,
        "training.py",
        old=EVALUATE_LOOP,
        new="""    total, counted = torch.zeros((), dtype=torch.float64), 0
    padded = torch.cat([tokens, tokens.new_zeros(context_length)])  # the short last window padded with token 0
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            starts = torch.tensor([s for s, _ in windows[i : i + batch_size]])
            offsets = starts[:, None] + torch.arange(context_length)[None, :]
            x, y = padded[offsets].to(device), padded[offsets + 1].to(device)
            total += token_nll(model(x), y).sum().double().cpu()  # the padding's targets are not masked out
            counted += y.numel()
    loss = (total / counted).item()""",
        explanation="evaluate pads the short last window with token 0 and scores the padding's targets as "
        "predictions of token 0, counting them as predicted tokens",
        fix="mask the padding's targets out of the loss and out of the count (ignore_index)",
        corner=True,
        code="knob:ignore_index",
    ),
    Bug(
        "evaluate_perplexity_mean_of_batches",
        "evaluation",
        EVALUATION,
        "training.py",
        old=EVALUATE_LOOP + '\n    return {"loss": loss, "perplexity": math.exp(loss)}',
        new="""    total, perplexities = torch.zeros((), dtype=torch.float64), []
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            batch = torch.zeros((), dtype=torch.float64)
            for length in sorted({n for _, n in group}):  # the short last window goes alone
                starts = torch.tensor([s for s, n in group if n == length])
                offsets = starts[:, None] + torch.arange(length)[None, :]
                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                batch += token_nll(model(x), y).sum().double().cpu()
            total += batch
            perplexities.append(math.exp(batch.item() / sum(n for _, n in group)))
    loss = (total / n_pred).item()
    return {"loss": loss, "perplexity": sum(perplexities) / len(perplexities)}""",
        explanation="evaluate reports the mean of its batches' perplexities, not exp of the token-weighted loss",
        fix="perplexity = exp(loss)",
        corner=True,
        code="knob:loss_reduction",
    ),
    Bug(
        "evaluate_in_training_mode",
        "evaluation",
        EVALUATION,
        "training.py",
        old="    with eval_mode(model):",
        new="    with torch.no_grad():",
        explanation="evaluate runs in the module's current mode: torch.no_grad() does not switch dropout off",
        fix="evaluate in eval mode (model.eval(), restoring the previous mode afterwards)",
        corner=True,
        code="knob:mode",
    ),
    Bug(
        "evaluate_windows_skip_boundary_tokens",
        "evaluation",
        EVALUATION,
        "training.py",
        old="""    n_pred = len(tokens) - 1
    full = n_pred // context_length
    windows = [(s, context_length) for s in range(0, full * context_length, context_length)]
    if n_pred % context_length:
        windows.append((full * context_length, n_pred % context_length))""",
        new="""    step = context_length + 1  # chunks of context_length + 1 tokens, inputs and targets
    windows = [(s, min(context_length, len(tokens) - 1 - s)) for s in range(0, len(tokens) - 1, step)]
    n_pred = sum(n for _, n in windows)""",
        explanation="evaluate cuts the data into chunks of context_length + 1 tokens, so the token after each "
        "chunk is never predicted from the one before it",
        fix="windows start context_length apart (0, C, 2C, ...); each predicts the C tokens after its start",
        corner=True,
        code="knob:data_windows",
    ),
    Bug(
        "train_lr_decays_linearly",
        "training",
        TRAINING,
        "training.py",
        old="""            losses.append(train_step(model, optimizer, x, y, max_grad_norm))""",
        new="""            losses.append(train_step(model, optimizer, x, y, max_grad_norm))
            for group in optimizer.param_groups:  # a linear decay to 0 over the steps
                group["lr"] = lr * (1 - (len(losses)) / steps)""",
        explanation="train decays the learning rate linearly to 0 over its steps (a scheduler's default), where the "
        "protocol's lr is every step's",
        fix="keep lr constant in train: no scheduler",
        corner=True,
        code="knob:lr_schedule",
    ),
    Bug(
        "train_lr_stepped_down_every_batch",
        "training",
        TRAINING,
        "training.py",
        old="""            losses.append(train_step(model, optimizer, x, y, max_grad_norm))""",
        new="""            losses.append(train_step(model, optimizer, x, y, max_grad_norm))
            for group in optimizer.param_groups:  # the bug: a StepLR(step_size=1, gamma=0.9) stepped every batch
                group["lr"] *= 0.9""",
        explanation="train multiplies the learning rate by 0.9 after every step (a StepLR meant per epoch, stepped "
        "every batch), where the protocol's lr is every step's",
        fix="keep lr constant in train: no scheduler",
        code="knob:lr_schedule",
    ),
    Bug(
        "train_one_step_more",
        "training",
        TRAINING,
        "training.py",
        old="        for _ in range(steps):",
        new="        for _ in range(steps + 1):",
        explanation="train runs steps + 1 optimisation steps (the loop counts from 0 to steps inclusive) and returns "
        "a loss for each",
        fix="for _ in range(steps): exactly steps steps",
        code="knob:step_count",
    ),
    Bug(
        "train_returns_running_means",
        "training",
        TRAINING,
        "training.py",
        old="""            losses.append(train_step(model, optimizer, x, y, max_grad_norm))""",
        new="""            step = train_step(model, optimizer, x, y, max_grad_norm)
            losses.append((losses[-1] * len(losses) + step) / (len(losses) + 1) if losses else step)  # running""",
        explanation="train returns the running mean of the step losses (a tracker never reset), not each step's loss",
        fix="append each step's own loss",
        corner=True,
        code="knob:loss_reduction",
    ),
    Bug(
        "train_adam_with_l2_decay",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new="    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=0.01)",
        explanation="train uses Adam with weight_decay, which adds the decay to the gradient (L2), instead of "
        "AdamW's decoupled decay",
        fix="torch.optim.AdamW: the weights decay by lr * weight_decay outside the Adam update",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_decay_not_scaled_by_lr",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01 / lr if lr else 0.01)",
        explanation="train's weight decay shrinks the weights by 1 - weight_decay per step, not 1 - lr * weight_decay",
        fix="AdamW's decay is p *= 1 - lr * weight_decay: the decay is scaled by the learning rate",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_optimizer_made_every_step",
        "training",
        TRAINING,
        "training.py",
        old="            x, y = get_batch(data, batch_size, context_length, generator, device)\n",
        new="            x, y = get_batch(data, batch_size, context_length, generator, device)\n"
        "            optimizer = torch.optim.AdamW(model.parameters(), lr=lr)\n",
        explanation="train makes a new AdamW at every step, so its moments and step count start afresh and every "
        "update is lr * sign(gradient)",
        fix="make one optimizer before the loop and keep it for every step",
        corner=True,
        code="knob:optimizer_state",
    ),
    Bug(
        "train_dropout_unseeded",
        "training",
        TRAINING,
        "training.py",
        old="        torch.manual_seed(seed)  # dropout masks\n",
        new="",
        explanation="train draws its dropout masks from the global RNG without seeding it from seed, so the same "
        "seed gives other losses whenever the global RNG is elsewhere",
        fix="torch.manual_seed(seed) before the loop (inside fork_rng, to leave the caller's RNG as it was)",
        corner=True,
    ),
    Bug(
        "train_adamw_first_moment_weights_swapped",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment='s["m"].lerp_(p.grad, 0.9)  # the bug: lerp_(g, beta1) for lerp_(g, 1 - beta1)',
            update='p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * m_hat / (v_hat.sqrt() + 1e-8))',
        ),
        explanation="train's AdamW updates its first moment with the lerp weight swapped (m.lerp_(g, beta1)): the new "
        "gradient weighs 0.9 and the old moment 0.1",
        fix="m.lerp_(g, 1 - beta1): m = beta1 * m + (1 - beta1) * g",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_first_moment_undamped",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment='s["m"].mul_(0.9).add_(p.grad)  # the bug: no (1 - beta1) on the new gradient',
            update='p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * m_hat / (v_hat.sqrt() + 1e-8))',
        ),
        explanation="train's AdamW accumulates its first moment without dampening (m = beta1 * m + g, classical "
        "momentum), so after the bias correction its steps are about 10x too large",
        fix="m = beta1 * m + (1 - beta1) * g",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_v_hat_beta1",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment='s["m"].mul_(0.9).add_(p.grad, alpha=0.1)',
            update='v_hat = s["v"] / (1 - 0.9 ** s["t"])  # the bug: beta1 in the second correction\n'
            '                    p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * m_hat / (v_hat.sqrt() + 1e-8))',
        ),
        explanation="train's AdamW bias-corrects its second moment with beta1 (v / (1 - beta1**t)): its early steps "
        "are about 10x too large, shrinking slowly",
        fix="v_hat = v / (1 - beta2**t)",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_v_weight_beta1",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.replace("value=0.001)", "value=0.1)  # the bug: 1 - beta1 for 1 - beta2").format(
            state=FRESH_STATE,
            moment='s["m"].mul_(0.9).add_(p.grad, alpha=0.1)',
            update='p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * m_hat / (v_hat.sqrt() + 1e-8))',
        ),
        explanation="train's AdamW takes the new squared gradient into its second moment with weight 1 - beta1 (0.1) "
        "instead of 1 - beta2: v is 100 times too large and the steps a tenth of their size",
        fix="v = beta2 * v + (1 - beta2) * g**2",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_decay_after_lr_scale",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment='s["m"].mul_(0.9).add_(p.grad, alpha=0.1)',
            update='p.mul_(1 + 0.01).sub_(group["lr"] * m_hat / (v_hat.sqrt() + 1e-8))  # the bug: + wd * p',
        ),
        explanation="train's AdamW adds the weight decay after the learning-rate scaling (optax's chain with "
        "add_decayed_weights after scale(-lr)): every weight grows by wd * p each step",
        fix="p -= lr * (adam update + wd * p)",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_moments_shared",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state='s.update(t=0, m=torch.zeros_like(p)); s["v"] = s["m"]  # the bug: one tensor for both moments',
            moment='s["m"].lerp_(p.grad, 0.1)',
            update='p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * m_hat / (v_hat.sqrt() + 1e-8))',
        ),
        explanation="train's AdamW keeps its two moments in one tensor (v is m): both updates act on it, v goes "
        "negative and the step turns NaN",
        fix="a zero tensor of its own for each moment of each parameter",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_step_count_stuck",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment='s["m"].lerp_(p.grad, 0.1)',
            update='p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * (s["m"] / 0.1) / ((s["v"] / 0.001).sqrt() '
            "+ 1e-8))  # the bug: step 1's bias corrections at every step",
        ),
        explanation="train's AdamW corrects every step's moments as the first step's (its step count never "
        "advances): from the second step on the first moment is scaled by 10",
        fix="bias corrections 1 - beta ** t with the step count t stored and advanced every step",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_step_count_per_parameter",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment='s["m"].lerp_(p.grad, 0.1)\n'
            '                    self.t = getattr(self, "t", 0) + 1  # the bug: one count, advanced per parameter',
            update='p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * (s["m"] / (1 - 0.9**self.t)) / ((s["v"] / '
            "(1 - 0.999**self.t)).sqrt() + 1e-8))",
        ),
        explanation="train's AdamW keeps one step count for the whole optimizer and advances it inside the loop "
        "over parameters: the i-th parameter's first step is bias-corrected as step i + 1",
        fix="advance the step count once per step (or keep one per parameter in the optimizer's state)",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_step_count_by_parameter_count",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new="""    class _AdamW(torch.optim.Optimizer):  # AdamW written out, ggml's shape
        def __init__(self, params, lr):
            super().__init__(params, dict(lr=lr))
            self.iter = 1

        @torch.no_grad()
        def step(self):
            c1, c2 = 1 / (1 - 0.9**self.iter), 1 / (1 - 0.999**self.iter)  # the corrections, once per step
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    s = self.state[p]
                    if not s:
                        s.update(m=torch.zeros_like(p), v=torch.zeros_like(p))
                    s["m"].lerp_(p.grad, 0.1)
                    s["v"].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                    p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * s["m"] * c1 / ((s["v"] * c2).sqrt() + 1e-8))
                    self.iter += 1  # the bug: inside the loop over parameters

    optimizer = _AdamW(model.parameters(), lr=lr)""",
        explanation="train's AdamW advances its iteration count inside the loop over parameters while it computes "
        "the bias corrections once per step: the first step is right, the second is corrected as step 1 + P for P "
        "parameters",
        fix="advance the iteration count once per step, after the loop over parameters",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_adamw_moments_not_kept",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment="s.update(m=torch.zeros_like(p), v=torch.zeros_like(p))  # the bug: moments anew, the count kept\n"
            '                    s["m"].lerp_(p.grad, 0.1)',
            update='p.mul_(1 - group["lr"] * 0.01).sub_(group["lr"] * m_hat / (v_hat.sqrt() + 1e-8))',
        ),
        explanation="train's AdamW starts every step's moments from zero while its step count advances: no memory "
        "of earlier gradients, and bias corrections of a later step applied to a first step's moments",
        fix="keep each parameter's moments in the optimizer's state from step to step",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_lamb_trust_ratio",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new=_ADAMW_WRITTEN_OUT.format(
            state=FRESH_STATE,
            moment='s["m"].lerp_(p.grad, 0.1)',
            update="step = m_hat / (v_hat.sqrt() + 1e-8) + 0.01 * p  # the bug: LAMB's trust ratio\n"
            + " " * 20
            + 'p.sub_(group["lr"] * (p.norm() / step.norm()) * step)',
        ),
        explanation="train's optimizer scales every tensor's AdamW step by ||w|| / ||step|| (LAMB), not AdamW",
        fix="AdamW's step as it is: p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_tied_matrix_stepped_twice",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new="""    listed = [p for _, p in model.named_parameters(remove_duplicate=False)]  # the tied matrix twice
    optimizer = torch.optim.AdamW(listed, lr=lr)""",
        explanation="train lists the tied embedding/head matrix twice in AdamW (named_parameters(remove_duplicate="
        "False)), so it is stepped twice per step",
        fix="model.parameters(), which yields a shared parameter once",
        corner=True,
        code="knob:adamw_rule",
    ),
    Bug(
        "train_step_loss_summed",
        "training",
        ("train_step", "train"),
        "training.py",
        old="    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster",
        new="    loss = cross_entropy(model(x), y, fused=True) * y.numel()  # summed over the tokens",
        explanation="train_step's loss is summed over the batch's target tokens, not averaged (B*T times the mean, "
        "its gradients too)",
        fix="the mean NLL over the target tokens: cross_entropy's default reduction",
        code="knob:loss_reduction",
    ),
    Bug(
        "train_step_label_smoothing_left_on",
        "training",
        ("train_step", "train"),
        "training.py",
        old="    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster",
        new="    logits = model(x)  # the bug: label smoothing left on from a fine-tuning config\n"
        "    loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), label_smoothing=0.1)",
        explanation="train_step's loss has label smoothing 0.1 left on: 0.9 * NLL + 0.1 * the mean over the "
        "vocabulary of -log p, which the protocol's plain cross-entropy does not have",
        fix="loss = cross_entropy(forward(model, x), y): no label smoothing, no auxiliary term",
        code="knob:loss_terms",
    ),
    Bug(
        "train_step_z_loss_left_on",
        "training",
        ("train_step", "train"),
        "training.py",
        old="    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster",
        new="    logits = model(x)  # the bug: a z-loss left on (PaLM, MaxText)\n"
        "    loss = cross_entropy(logits, y, fused=True) + 1e-3 * (torch.logsumexp(logits, -1) ** 2).mean()",
        explanation="train_step's loss has a z-loss left on: 1e-3 * logsumexp(logits)**2 per token added to the "
        "cross-entropy (its gradients too)",
        fix="loss = cross_entropy(forward(model, x), y): no auxiliary term",
        code="knob:loss_terms",
    ),
    Bug(
        "train_step_clip_norm_without_vectors",
        "training",
        TRAINING,
        "training.py",
        old="        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)",
        new="        matrices = [p.grad for p in model.parameters() if p.ndim >= 2 and p.grad is not None]  # the bug\n"
        "        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in matrices]))\n"
        "        for p in model.parameters():\n"
        "            if p.grad is not None:\n"
        "                p.grad.mul_(min(1.0, max_grad_norm / (float(norm) + 1e-6)))",
        explanation="train_step's clipping measures the global norm over the weight matrices alone (norm gains and "
        "biases left out of it) and scales every gradient by that factor, so it clips too little",
        fix="clip_grad_norm_(model.parameters(), max_grad_norm): the norm over every gradient",
        corner=True,
        code="knob:clipping",
    ),
    Bug(
        "train_step_masks_its_first_token",
        "training",
        TRAINING,
        "training.py",
        old="    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster",
        new="    first_out = torch.ones_like(x).index_fill(1, torch.tensor([0], device=x.device), 0)  # the bug\n"
        "    loss = cross_entropy(model(x, attention_mask=first_out), y, fused=True)",
        explanation="train_step runs the model with an attention mask of its own that marks each row's first token "
        "as padding (a batch's mask built for the training path only): forward is right, train_step's logits are not",
        fix="loss = cross_entropy(forward(model, x), y): the model as forward runs it, no mask of its own",
        corner=True,
        code="knob:train_path",
    ),
    Bug(
        "train_warmup_starts_at_zero",
        "training",
        TRAINING,
        "training.py",
        old="""    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # dropout masks
        for _ in range(steps):
            x, y = get_batch(data, batch_size, context_length, generator, device)
            losses.append(train_step(model, optimizer, x, y, max_grad_norm))""",
        new="""    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / 4))  # the bug: 0 at step 0
    losses = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # dropout masks
        for _ in range(steps):
            x, y = get_batch(data, batch_size, context_length, generator, device)
            losses.append(train_step(model, optimizer, x, y, max_grad_norm))
            warmup.step()""",
        explanation="train warms its learning rate up by LambdaLR(step / warmup_steps) with the step counted from 0: "
        "its first step runs at lr 0 and leaves the model as it was",
        fix="no schedule in train (the protocol's lr is every step's); a warmup counts from step + 1 if it must be",
        corner=True,
        code="knob:lr_schedule",
    ),
    Bug(
        "train_leaves_the_head_out_of_the_optimizer",
        "training",
        TRAINING,
        "training.py",
        old="    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        new="    body = [p for n, p in model.named_parameters() if not n.startswith('lm_head')]  # the bug\n"
        "    optimizer = torch.optim.AdamW(body, lr=lr)",
        explanation="train's AdamW is given the model's parameters without the untied output head (groups built from "
        "the transformer's modules), so lm_head.weight gets gradients and is never stepped",
        fix="optimise model.parameters(), every parameter",
        corner=True,
        code="knob:unstepped_weights",
    ),
    Bug(
        "evaluate_metric_never_reset",
        "evaluation",
        EVALUATION,
        "training.py",
        old="""    total = torch.zeros((), dtype=torch.float64)
    with eval_mode(model):""",
        new="""    zero = torch.zeros((), dtype=torch.float64)
    metric = model.__dict__.setdefault("_nll_metric", {"total": zero, "n": 0})
    total = metric["total"]  # the bug: the metric's state lives on the model and is never reset
    metric["n"] += n_pred
    n_pred = metric["n"]
    with eval_mode(model):""",
        explanation="evaluate keeps its total NLL and token count in a metric on the model that is never reset, so "
        "a second call mixes the first call's tokens into its mean",
        fix="start every evaluate from a zero total and count (reset the metric at the start of each call)",
        corner=True,
        code="knob:state_carried",
    ),
    Bug(
        "evaluate_counts_a_token_more_per_window",
        "evaluation",
        ("evaluate",),
        "training.py",
        old="    loss = (total / n_pred).item()",
        new="    loss = (total / (n_pred + len(windows))).item()  # each window counted by its length + 1",
        explanation="evaluate divides the total NLL by the predicted tokens plus the number of windows: each window "
        "counted with one token more than it predicts",
        fix="divide by the number of predicted tokens, len(data) - 1",
        corner=True,
        code="knob:loss_reduction",
    ),
)
