"""A small model-operation registry for tests/test_remote.py and tests/test_sandbox.py (the worker's
``--ops``; the real one is ``spec_tests.harness.subject.model_ops``). Each operation gets the implementation
first."""

import os

import torch


def build(impl, config, dtype=torch.float32):
    return impl.build_model(config).to(dtype)


def parameter_facts(impl, model):
    return {name: (tuple(p.shape), p.dtype, p.requires_grad) for name, p in model.named_parameters()}


def echo(impl, *args, **kwargs):
    return args, kwargs


def manual_seed(impl, seed):
    torch.manual_seed(seed)
    return torch.rand(3)


def private(impl, name, *args):
    """Call one of the implementation's own ``_probe_*`` functions (what submission code can do)."""
    return getattr(impl, f"_probe_{name}")(*args)


def worker_pid(impl):
    return os.getpid()


OPS = {
    "build": build,
    "parameter_facts": parameter_facts,
    "echo": echo,
    "manual_seed": manual_seed,
    "private": private,
    "worker_pid": worker_pid,
}
