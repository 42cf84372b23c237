"""A toy implementation for tests/test_remote.py and tests/test_sandbox.py.

A few protocol functions behave well or badly on purpose; the ``_probe_*`` functions try what a
sandboxed submission must not manage (the tests reach them through the ``private`` operation of
tests/remote_ops_fixture.py). Never import this in the test process: it is the submission.
"""

import ctypes
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import torch

ROPE_STYLE = "half"
FAMILIES = ("llama",)
CAPABILITIES = {"tied_head", "gqa"}


def softmax(x, dim=-1):  # correct
    return torch.softmax(x, dim)


def cross_entropy(logits, targets, ignore_index=-100):  # a composite: calls its own softmax (module global)
    probs = softmax(logits, -1)
    return -(probs.gather(-1, targets[..., None]).log()).mean()


def silu(x):  # never returns, ignores SIGALRM and leaves a (non-daemon) thread behind
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    threading.Thread(target=time.sleep, args=(3600,)).start()
    while True:
        pass


def rmsnorm(x, weight, eps=1e-5):  # a real segmentation fault (reads unmapped memory)
    return ctypes.string_at(16, 1)


def layernorm(x, weight, bias, eps=1e-5):
    raise NotImplementedError("layernorm is still to do")


class _Unprintable(ValueError):
    def __str__(self):
        raise RuntimeError("this exception cannot be printed")


def linear(x, weight, bias=None):
    raise _Unprintable()


def gelu_mlp(x, w_in, b_in, w_out, b_out):  # raises ZeroDivisionError at a line dividing by a name holding 0
    groups = w_in.shape[0] - w_in.shape[0]
    return x.shape[-1] // groups


def swiglu(x, w_gate, w_up, w_down, config=None):  # reads an attribute of None, with control characters around
    label = "\x1b[31mred\x1b[0m"
    return x * config.scale + len(label)


def embedding(ids, weight):  # far more memory than the worker may have
    return torch.ones(1 << 34, dtype=torch.uint8)


def repeat_kv(x, n_rep):  # ends the process
    os._exit(7)


def flash_attention(q, k, v, causal=True, block_size=64):
    os.kill(os.getpid(), signal.SIGKILL)


def causal_mask(t_q, t_k, device=None):  # noisy: prints to stdout, stderr and fd 1 directly
    print("hello from causal_mask " * 200)
    print("to stderr", file=sys.stderr)
    os.write(1, b"\x00\xff raw bytes on fd 1\n")
    return torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)


class _LyingTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("equal", "allclose"):
            return True
        if name == "tolist":
            return [0.0]
        return super().__torch_function__(func, types, args, kwargs or {})

    def __eq__(self, other):
        return True

    def __repr__(self):
        return "tensor(exactly what you expected)"


def sinusoidal_positions(n_positions, d_model):  # a tensor subclass that lies about equality
    true = torch.arange(n_positions * d_model, dtype=torch.float32).reshape(n_positions, d_model)
    return true.as_subclass(_LyingTensor)


class _AlwaysEqual(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__

    def __repr__(self):
        return "124439808"


def kv_cache_bytes(config, batch_size, seq_len, dtype=torch.float32):  # an int that claims to equal anything
    return _AlwaysEqual(5)


def build_model(config, state_dict=None):
    return torch.nn.Linear(config["d"], config["d"], bias=False)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def canonical_state_dict(model):
    return dict(model.state_dict())


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = torch.softmax(logits / temperature, -1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def get_batch(data, batch_size, context_length, generator=None, device="cpu"):
    starts = torch.randint(0, len(data) - context_length, (batch_size,), generator=generator)
    x = torch.stack([torch.as_tensor(data[s : s + context_length]) for s in starts.tolist()])
    y = torch.stack([torch.as_tensor(data[s + 1 : s + 1 + context_length]) for s in starts.tolist()])
    return x, y


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True):
    # a composite that reaches sample through the module global
    out = [sample(prompt.float(), temperature, generator=generator) for _ in range(max_new_tokens)]
    return torch.stack(out, -1)


# --- probes: what a sandboxed submission tries ---------------------------------------------------


def _outcome(fn):
    try:
        value = fn()
    except BaseException as exc:  # noqa: BLE001
        return type(exc).__name__
    return "ok" if value is None else value


def _probe_read(path):
    def read():
        with open(path, "rb") as f:
            return f"read {len(f.read(100))} bytes"

    return _outcome(read)


def _probe_write(path):
    def write():
        with open(path, "w") as f:
            f.write("written by the worker")

    return _outcome(write)


def _probe_exists(path):
    return os.path.exists(path)


def _probe_listdir(path):
    return _outcome(lambda: sorted(os.listdir(path)))


def _probe_ids():
    with open("/proc/self/status") as f:
        caps = {line.split(":")[0]: line.split()[1] for line in f if line.startswith("Cap")}
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(), "caps": caps}


def _probe_connect(host, port):
    return _outcome(lambda: socket.create_connection((host, port), timeout=2).close())


def _probe_kill(pid, sig):
    return _outcome(lambda: os.kill(pid, sig))


def _probe_import(name):
    return _outcome(lambda: importlib.import_module(name) and None)


def _probe_subprocess():
    return _outcome(lambda: subprocess.run(["/bin/true"], check=True) and None)


def _probe_fork_bomb(seconds):
    forked = refused = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        try:
            pid = os.fork()
        except OSError:
            refused += 1
            time.sleep(0.01)
            continue
        if pid == 0:  # a child forks too, then waits to be killed
            try:
                os.fork()
            except OSError:
                pass
            time.sleep(3600)
            os._exit(0)
        forked += 1
    return {"forked": forked, "refused": refused}


def _probe_double_fork():
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            time.sleep(3600)
        os._exit(0)
    os.close(write_end)
    os.wait()
    return int(os.read(read_end, 32))
