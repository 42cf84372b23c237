"""Operations on an implementation's models that tests need beyond the protocol's own calls.

Each operation is a plain function ``op(impl, *args)`` where ``impl`` gives attribute access to
the implementation's protocol functions. The same code runs in the test process (local subjects)
and in the grading worker next to the submission (``worker.py`` dispatches on ``OPS``), so what a
test learns about a module comes back as plain data (tensors, numbers, lists, dicts) or opaque
handles, never as a verdict computed beside the submission.
"""

from __future__ import annotations

import contextlib
import itertools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _dtype(dtype) -> torch.dtype:
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


# in-place fills that only set values: on the meta device there are none to set, and torch's first meta call of
# several of these (normal_, clamp_, erfinv_) takes about a second to set up its Python kernels
_VALUE_FILLS = frozenset(
    ("normal_", "uniform_", "erfinv_", "clamp_", "exponential_", "log_normal_", "cauchy_", "bernoulli_")
)


class _MetaFillsSkipped(TorchFunctionMode):
    """Value fills on meta tensors return the tensor unchanged (a meta tensor has a shape and no values)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by keyword
        if getattr(func, "__name__", None) in _VALUE_FILLS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def build(impl, config: dict, state_dict=None, dtype="float64", device="cpu", seed=None, training=False):
    """``build_model(config, state_dict)`` created under the weights' dtype and device (protocol amendment 1).

    Then ``.to(device, dtype)`` and eval mode (training mode with ``training=True``). With ``seed``,
    the global RNG is seeded first (fresh initialisation). ``device="meta"`` builds without memory
    and skips the move.
    """
    dtype = _dtype(dtype)
    if seed is not None:
        seed_global_rng(seed)
    # torch.device(...) as a context routes every torch call through a Python mode; on the default device
    # it changes nothing and costs a quarter of a small model's build
    on_device = contextlib.nullcontext() if torch.device(device) == torch.get_default_device() else torch.device(device)
    skipped = _MetaFillsSkipped() if torch.device(device).type == "meta" else contextlib.nullcontext()
    with default_dtype(dtype), on_device, skipped:
        model = impl.build_model(config, state_dict)
    if device != "meta":
        model = model.to(device=device, dtype=dtype)
    return model.train(training)


def set_training(impl, model, training: bool | list[bool]) -> None:
    """``model.train(training)``; a list of flags sets each module's own, in ``model.modules()`` order (as
    ``training_flags`` reads them)."""
    if isinstance(training, bool):
        model.train(training)
        return
    modules = list(model.modules())
    if len(training) != len(modules):
        raise ValueError(f"set_training: {len(training)} flags for {len(modules)} modules")
    for module, flag in zip(modules, training, strict=True):
        module.training = bool(flag)


def training_flags(impl, model) -> list[bool]:
    """``module.training`` of every submodule, in ``model.modules()`` order."""
    return [bool(m.training) for m in model.modules()]


def manual_seed(impl, seed: int) -> None:
    """Seed the global RNG (dropout masks, samplers that ignore the protocol's generator)."""
    seed_global_rng(seed)


def seed_global_rng(seed: int) -> None:
    """``torch.manual_seed(seed)`` for the devices the suite runs on: the CPU generator and, where
    CUDA is present, every CUDA one.

    ``torch.manual_seed`` also queues a seed for CUDA, XPU and MTIA when they are not initialised,
    each recording the caller's formatted stack: about 1 ms per call under pytest, paid ~600 times
    by a run of the suite on a machine without them.
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


# the correct AdamW formulations besides PyTorch's: (eps, whether only weights of two or more dims decay)
EPS_HAT = {"adamw_paper": (1e-8, False), "adamw_keras": (1e-7, True)}
# PyTorch's AdamW with the hyperparameters the protocol leaves open set as training code often sets them:
# (beta2, weight decay); GPT-style training takes beta2 0.95 and decay 0 or 0.1
ADAMW_SETTINGS = {"adamw_beta2_0.95": (0.95, 0.01), "adamw_gpt": (0.95, 0.1), "adamw_no_decay": (0.95, 0.0)}


def make_optimizer(impl, model, kind: str, lr: float, eps: float = 1e-8):
    """A fresh ``SGD`` or ``AdamW`` over ``model.parameters()``; ``adamw_paper`` and ``adamw_keras``: AdamW in Kingma
    and Ba's form (``bookkeeping.AdamWRule(eps_hat=True)``) as fairseq (eps 1e-8, every weight decayed) and Keras
    (eps 1e-7, biases and norm gains not decayed) write it."""
    params = list(model.parameters())
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, eps=eps)
    if kind in ADAMW_SETTINGS:
        beta2, decay = ADAMW_SETTINGS[kind]
        return torch.optim.AdamW(params, lr=lr, eps=eps, betas=(0.9, beta2), weight_decay=decay)
    if kind in EPS_HAT:
        eps, matrices_only = EPS_HAT[kind]
        groups = [
            {"params": [p for p in params if p.ndim >= 2 or not matrices_only], "weight_decay": 0.01},
            {"params": [p for p in params if p.ndim < 2 and matrices_only], "weight_decay": 0.0},
        ]
        from ..diagnosis.bookkeeping import AdamWRule

        return AdamWRule([g for g in groups if g["params"]], lr=lr, eps=eps, eps_hat=True)
    known = ", ".join(["sgd", "adamw", *EPS_HAT, *ADAMW_SETTINGS])
    raise ValueError(f"make_optimizer: unknown optimizer {kind!r}; known: {known}")


def _storage_ids(tensors) -> list[int]:
    """Small integers naming each tensor's storage (the same number for shared storage)."""
    ids: dict[tuple, int] = {}
    return [ids.setdefault((t.untyped_storage().data_ptr(), t.device.type), len(ids)) for t in tensors]


# The largest integer each dtype holds exactly (codes 1..n must survive the round trip).
_EXACT_INTEGERS = {torch.float64: 2**53, torch.float32: 2**24, torch.float16: 2**11, torch.bfloat16: 2**8}


def _offsets(params) -> list[int]:
    """Where each parameter starts in the concatenation of all of them, flattened."""
    return [0, *itertools.accumulate(p.numel() for p in params)][:-1]


def canonical_sources(impl, model) -> dict:
    """Where each canonical weight comes from: ``{name: flat indices into the concatenated parameters}``.

    The protocol does not say whether ``canonical_state_dict`` returns the parameters themselves,
    views of them (a slice of a fused qkv matrix, a transpose) or copies. So every parameter element
    is set to its own integer code, ``canonical_state_dict`` is read, and the parameters are restored:
    each canonical element names the element it came from, however it was routed. Where the codes
    cannot tell (a weight transformed on the way out, a dtype that cannot hold the codes exactly), a
    name sharing storage and shape with one parameter maps to that parameter; otherwise to ``None``.
    """
    params = list(model.parameters())
    starts = _offsets(params)
    total = sum(p.numel() for p in params)
    codes = {}
    if params and all(total <= _EXACT_INTEGERS.get(p.dtype, 0) for p in params):
        saved = [p.detach().clone() for p in params]
        try:
            with torch.no_grad():
                for p, start in zip(params, starts):
                    p.copy_(torch.arange(start + 1, start + 1 + p.numel(), dtype=torch.float64).view(p.shape))
                canonical = impl.canonical_state_dict(model)
                codes = {k: v.detach().to("cpu", torch.float64).clone() for k, v in canonical.items()}
        finally:
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
    canonical = impl.canonical_state_dict(model)
    storages = _storage_ids([*params, *canonical.values()])
    sources = {}
    for j, (name, value) in enumerate(canonical.items()):
        c = codes.get(name)
        if c is not None and c.numel() > 0 and bool(((c >= 1) & (c <= total) & (c == c.round())).all()):
            sources[name] = c.long() - 1
            continue
        shared = [
            i
            for i, p in enumerate(params)
            if storages[i] == storages[len(params) + j] and tuple(p.shape) == tuple(value.shape)
        ]
        start = starts[shared[0]] if len(shared) == 1 else None
        sources[name] = None if start is None else torch.arange(start, start + value.numel()).view(value.shape)
    return sources


def parameter_facts(impl, model) -> dict:
    """Shapes and storage of every parameter, and which one holds ``tok_embeddings.weight``.

    ``storage`` numbers tell shared parameters apart without leaking addresses; ``embedding`` is the
    index of the parameter that every element of the canonical token embedding comes from (found through
    ``canonical_sources``: the whole parameter, or a slice of it, as a vocabulary padded to a multiple of 128
    holds it; amendment 16), None if no one parameter does; ``embedding_copies``: the other parameters holding its
    values.
    """
    params = list(model.parameters())
    found = _embedding_source(impl, model, params)
    emb = None if found is None else params[found[0]]
    return {
        "shapes": [list(p.shape) for p in params],
        "storage": _storage_ids(params),
        "embedding": None if found is None else found[0],
        "n_embedding_matches": 0 if found is None else 1,
        # other parameters holding the embedding parameter's values (a head copied from it)
        "embedding_copies": [
            i
            for i, p in enumerate(params)
            if emb is not None and p is not emb and p.shape == emb.shape and torch.equal(p.detach(), emb.detach())
        ],
    }


def parameter_order(impl, model) -> list[list[str]]:
    """The canonical names grouped by the model's own parameters, in their order (``model.parameters()``): each name
    with the parameter its first element comes from, names sharing one parameter (a fused qkv) in one group in
    canonical order; names the sources cannot place come last, one group each. What an optimizer looping over the
    model's parameters meets first, and how many it meets (an order- or count-dependent slip follows it)."""
    params = list(model.parameters())
    starts = _offsets(params)
    sources = canonical_sources(impl, model)

    def owner(name):
        source = sources.get(name)
        if source is None or source.numel() == 0:
            return None
        first = int(source.reshape(-1)[0])
        return max(i for i, start in enumerate(starts) if start <= first)

    groups: dict = {}
    for i, name in enumerate(sources):
        key = owner(name)
        groups.setdefault(len(params) + i if key is None else key, []).append(name)
    return [groups[key] for key in sorted(groups)]


def _embedding_source(impl, model, params) -> tuple[int, torch.Tensor] | None:
    """``(index, local)``: the parameter every element of the canonical token embedding comes from, and each
    element's flat index within it (shaped as the canonical weight); None where no one parameter holds them all."""
    source = canonical_sources(impl, model).get("tok_embeddings.weight")
    if source is None or source.numel() == 0:
        return None
    for i, start in enumerate(_offsets(params)):
        local = source - start
        if int(local.min()) >= 0 and int(local.max()) < params[i].numel():
            return i, local
    return None


def embedding_grad(impl, model, ids):
    """The gradient reaching the token embedding's elements (shaped as ``tok_embeddings.weight``) from
    ``forward(model, ids).pow(2).mean()``, read from the parameter that holds them."""
    params = list(model.parameters())
    found = _embedding_source(impl, model, params)
    impl.forward(model, ids).pow(2).mean().backward()
    if found is None or params[found[0]].grad is None:
        return None
    index, local = found
    return params[index].grad.reshape(-1)[local.reshape(-1).to(params[index].grad.device)].reshape(local.shape)


def grads_present(impl, model) -> int:
    """How many parameters hold a ``.grad``."""
    return sum(p.grad is not None for p in model.parameters())


def observe_modes(impl, model, name: str, args: list, kwargs: dict) -> dict:
    """Call ``impl.<name>(*args, **kwargs)`` and record ``training`` of every submodule each time one runs.

    Hooks sit on every submodule, so the observation holds however the code routes its calls
    (``model(x)``, ``forward(model, x)``, a method): as long as some submodule runs as a module.
    """
    seen: list[bool] = []
    hooks = [m.register_forward_pre_hook(lambda mod, _: seen.append(bool(mod.training))) for m in model.modules()]
    try:
        result = getattr(impl, name)(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return {"result": result, "modes": seen}


def input_grads(impl, name: str, args: list, kwargs: dict, cotangent=None) -> list:
    """The gradients of ``sum(impl.<name>(*args, **kwargs) * cotangent)`` (``cotangent`` None: 1) with respect to each
    floating-point tensor of ``args`` (None for the others, and for an input the output does not depend on): the
    backward pass as the code defines it (a fused kernel's ``autograd.Function`` included), computed where the code
    runs."""
    leaves = [
        a.detach().clone().requires_grad_(True) if torch.is_tensor(a) and a.is_floating_point() else a for a in args
    ]
    out = getattr(impl, name)(*leaves, **kwargs)
    total = (out * (1.0 if cotangent is None else cotangent.to(out))).sum()
    wanted = [leaf for leaf in leaves if torch.is_tensor(leaf) and leaf.requires_grad]
    grads = iter(torch.autograd.grad(total, wanted, allow_unused=True)) if wanted else iter(())
    return [next(grads) if torch.is_tensor(leaf) and leaf.requires_grad else None for leaf in leaves]


def cross_entropy_grads(impl, model, x, y) -> dict:
    """Loss and gradients of ``cross_entropy(forward(model, x), y)`` under canonical names.

    The relation ``train_step`` must satisfy on the implementation's own model (used to tell a
    training failure caused by a failing model from one of the training step itself).
    """
    for p in model.parameters():
        p.grad = None
    logits = impl.forward(model, x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    params = list(model.parameters())
    flat = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).detach().reshape(-1) for p in params])
    has_grad = torch.cat([torch.full((p.numel(),), p.grad is not None) for p in params])
    grads = {}
    for name, index in canonical_sources(impl, model).items():
        picked = None if index is None else flat[index.reshape(-1).to(flat.device)].view(index.shape)
        grads[name] = picked.clone() if picked is not None and has_grad[index].all() else None
    for p in params:
        p.grad = None
    return {"loss": float(loss.item()), "grads": grads}


def keeps_given_tensors(impl, config: dict, state_dict: dict, dtype="float64", device="cpu") -> dict:
    """``{"edited": names, "kept": names}``: the canonical names whose given tensor building a model from
    ``state_dict`` changed, and those whose tensor the model keeps as its own memory (every parameter of the model is
    changed in place and the given tensors are read again: ``load_state_dict(assign=True)`` or ``nn.Parameter(t)``
    keeps the caller's tensor, so training the model writes into it)."""
    given = {k: v.clone() for k, v in state_dict.items()}
    before = {k: v.clone() for k, v in given.items()}
    model = build(impl, config, given, dtype, device)
    edited = [k for k in given if not torch.equal(given[k], before[k])]
    before = {k: v.clone() for k, v in given.items()}
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.add_(1.0)
    return {"edited": edited, "kept": [k for k in given if not torch.equal(given[k], before[k])]}


def shared_canonical_names(impl, model) -> list[list[str]]:
    """The canonical names that share an element of the model's parameters, in groups (canonical order): one
    parameter behind several names, where each canonical weight should have its own (a module put in several places).
    Names whose sources cannot be traced share nothing here."""
    sources = canonical_sources(impl, model)
    order = {name: i for i, name in enumerate(sources)}
    groups: list[tuple[set, list[str]]] = []  # (elements, names)
    for name, index in sources.items():
        if index is None or index.numel() == 0:
            continue
        elements = set(index.reshape(-1).tolist())
        met = [g for g in groups if g[0] & elements]
        groups = [g for g in groups if not g[0] & elements]
        groups.append((elements.union(*(g[0] for g in met)), [n for g in met for n in g[1]] + [name]))
    return [sorted(names, key=order.get) for _, names in groups if len(names) > 1]


def parameter_count(impl, model) -> int:
    """The number of elements of the model's unique parameters (``model.parameters()`` yields a shared one once):
    what ``count_parameters`` counts, on the implementation's own model."""
    return sum(p.numel() for p in model.parameters())


def correct_steps(
    impl,
    model,
    kind: str,
    lr: float,
    eps: float,
    x,
    y,
    max_grad_norm=None,
    steps: int = 2,
    adamw=None,
    clip_each=False,
    zero_unused=False,
) -> list:
    """``steps`` optimisation steps as the protocol's ``train_step`` takes them, on the implementation's own model:
    in training mode, ``cross_entropy(forward(model, x), y)`` backward, clipping by the global norm when asked, one
    step of one fresh ``make_optimizer`` over ``model.parameters()`` (``adamw``: ``{"weight_decay", "betas"}`` of an
    AdamW instead). The losses; the model is updated in place. ``clip_each`` (a mistake, for diagnosis): each of the
    model's own parameter tensors clipped alone, however it lays them out (a fused qkv is one tensor); ``"sum"``:
    clipped by the sum of the tensors' norms instead of their global (2-)norm. ``zero_unused``: a parameter the loss
    does not reach gets a zero gradient (as a functional step's gradient of every parameter has), so the optimizer
    decays it, where PyTorch's skips a parameter without a gradient: the protocol leaves an unused weight's step open.

    What a correct ``train_step`` does with the implementation's own model, however its parameters are laid out
    or shared (used to tell a training failure caused by a failing model from one of the step itself)."""
    params = list(model.parameters())
    if adamw is None:
        opt = make_optimizer(impl, model, kind, lr, eps)
    else:
        opt = torch.optim.AdamW(
            params, lr=lr, eps=eps, weight_decay=float(adamw["weight_decay"]), betas=tuple(adamw["betas"])
        )
    model.train(True)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        logits = impl.forward(model, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        for p in params if zero_unused else ():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if max_grad_norm is not None and clip_each == "sum":
            total = sum(float(p.grad.norm()) for p in params if p.grad is not None)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(min(1.0, max_grad_norm / (total + 1e-6)))
        elif max_grad_norm is not None:
            for group in [[p] for p in params] if clip_each else [params]:
                torch.nn.utils.clip_grad_norm_(group, max_grad_norm)
        opt.step()
        losses.append(float(loss.item()))
    opt.zero_grad(set_to_none=True)
    return losses


OPS = {
    fn.__name__: fn
    for fn in (
        build,
        set_training,
        training_flags,
        manual_seed,
        make_optimizer,
        parameter_facts,
        parameter_order,
        embedding_grad,
        grads_present,
        observe_modes,
        cross_entropy_grads,
        input_grads,
        parameter_count,
        shared_canonical_names,
        keeps_given_tensors,
        correct_steps,
    )
}
# The protocol names each operation calls (a test using an operation needs them provided).
OP_USES = {
    "build": ("build_model",),
    "parameter_facts": ("canonical_state_dict",),
    "parameter_order": ("canonical_state_dict",),
    "shared_canonical_names": ("canonical_state_dict",),
    "keeps_given_tensors": ("build_model",),
    "embedding_grad": ("canonical_state_dict", "forward"),
    "cross_entropy_grads": ("forward", "canonical_state_dict"),
    "correct_steps": ("forward",),
}
