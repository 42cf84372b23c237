"""The worker: runs next to a submission and executes protocol calls for the judge.

    python -m spec_tests.harness.remote.server --impl SPEC --fd N [--ops MODULE_OR_FILE] [--memory-mb M]
        [--max-procs P] [--guard] [--protect DIR ...]

Started by ``remote.py`` (inside ``sandbox.py``'s sandbox when there is one). In order: resource
limits (no core dumps, ``RLIMIT_AS`` when ``--memory-mb`` > 0, ``RLIMIT_NPROC`` when
``--max-procs`` > 0), the socket inherited as fd ``N``, torch with one thread, the model-operation
registry (``--ops``: a module exposing ``OPS: dict[str, callable]``, default
``spec_tests.harness.subject.model_ops``, or a path to a ``.py`` file), the in-process guard (``--guard``),
a ``started`` message (no fields; the judge counts the time until it as the harness's own), and the
implementation. Then a ``hello`` message: the label, the protocol names it defines, the
module attributes ``ROPE_STYLE``, ``FAMILIES``, ``CAPABILITIES`` it declares, whether it declares
``SPEC_XFAILS``; or, when the import failed, the error, after which the worker exits.

Requests (JSON headers, see ``wire.py``; each has an ``id`` and gets one ``reply``):

- ``call`` {name, args, kwargs}: the implementation's protocol function;
- ``op`` {name, args, kwargs}: ``OPS[name](implementation, *args, **kwargs)``;
- ``reset``: drop every handle; ``ping``; ``exit``.

A reply is ``{"ok": value}`` or ``{"error": {type, mro, message, where, not_implemented}}``, plus
``generators``: the state, after the call, of each ``torch.Generator`` the request carried, so that
the judge's generators follow the same stream as they would in-process. Anything a call returns
that is not plain data stays here and is sent as a handle. The submission may print: stdout and
stderr are not the protocol channel (the judge keeps a capped log of them).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import resource
import signal
import socket
import sys
import traceback

from spec_tests.harness.remote import wire
from spec_tests.harness.subject.loading import load_implementation
from spec_tests.harness.text import plain_text
from spec_tests.protocol import PROTOCOL_NAMES

DEFAULT_OPS = "spec_tests.harness.subject.model_ops"
MESSAGE_CAP = 4000
DECLARED_ATTRIBUTES = ("ROPE_STYLE", "FAMILIES", "CAPABILITIES", "PROTOCOL_VERSION")
_MISSING = object()


def limit_resources(memory_mb: int, max_procs: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if max_procs > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))


def die_with_parent() -> None:
    """SIGKILL for this process when its parent dies (Linux ``PR_SET_PDEATHSIG``): a judge that is
    killed does not leave a busy worker behind (the sandbox has its own means; this is for the fallback)."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call
        os._exit(5)


def submission_root(spec: str, impl) -> str | None:
    """The file or folder whose modules are the submission's own (``where``)."""
    if os.path.exists(spec):
        return os.path.realpath(spec)
    module = impl if type(impl).__name__ == "module" else sys.modules.get(spec.partition(":")[0])
    path = getattr(module, "__file__", None) if module is not None else None
    if not isinstance(path, str):
        return None
    path = os.path.realpath(path)
    return os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path


def _inside(path: str, root: str | None) -> bool:
    if root is None or not isinstance(path, str):
        return False
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    return real == root or real.startswith(root + os.sep)


def _where(exc: BaseException, root: str | None) -> str | None:
    where = None
    try:
        for frame in traceback.extract_tb(exc.__traceback__):
            if _inside(frame.filename, root):
                rel = os.path.relpath(os.path.realpath(frame.filename), os.path.dirname(root))
                where = f"{rel}:{frame.lineno} in {frame.name}"
        if where is None and isinstance(exc, SyntaxError) and _inside(exc.filename, root):
            where = f"{os.path.relpath(os.path.realpath(exc.filename), os.path.dirname(root))}:{exc.lineno}"
    except Exception:  # noqa: BLE001 - a broken traceback must not take the worker down
        return None
    return plain_text(where, 500) if where else None


def error_data(exc: BaseException, root: str | None, message: str | None = None) -> dict:
    """An exception as plain data (computed defensively: the exception is the submission's)."""
    kind = type(exc)
    mro = [wire.qualname(c) for c in kind.__mro__ if c is not object][:32]
    if message is None:
        message = _safe_str(exc)  # __str__ may raise anything
    return {
        "type": plain_text(kind.__name__, 200),
        "mro": mro,
        "message": plain_text(message, MESSAGE_CAP),
        "where": _where(exc, root),
        "not_implemented": issubclass(kind, NotImplementedError) and _not_implemented(exc),
        "site": _site(exc, root),
    }


def _not_implemented(exc: BaseException) -> bool:
    """A stub's ``raise NotImplementedError``, not torch refusing the input (``raised_as_not_implemented``)."""
    try:
        from spec_tests.harness.diagnosis.crash_site import raised_as_not_implemented

        return raised_as_not_implemented(exc)
    except Exception:  # noqa: BLE001 - the exception is the submission's: read defensively
        return True


def _site(exc: BaseException, root: str | None) -> dict | None:
    """What the raising line in the submission's own files held (``crash_site.read_site``), for the judge's
    diagnosis; None where it cannot be read."""
    if root is None:
        return None
    try:
        from spec_tests.harness.diagnosis.crash_site import checked_site, read_site

        parent = os.path.dirname(root)
        site = read_site(exc, inside=lambda path: _inside(path, root), shown=lambda path: os.path.relpath(path, parent))
        return checked_site(site)  # plain text only: a lone surrogate or an escape cannot go on the wire
    except Exception:  # noqa: BLE001 - reading the submission's frames must not take the worker down
        return None


class Server:
    def __init__(self, sock: socket.socket, impl, root: str | None, ops: dict, ops_error: str | None):
        self.sock, self.impl, self.root = sock, impl, root
        self.ops, self.ops_error = ops, ops_error
        self.objects: dict[int, object] = {}
        self.ids: dict[int, int] = {}
        self.next_handle = 0

    # handles --------------------------------------------------------------------------------
    def register(self, obj) -> dict:
        key = id(obj)
        handle = self.ids.get(key)
        if handle is None or self.objects.get(handle) is not obj:
            handle = self.next_handle
            self.next_handle += 1
            self.objects[handle] = obj
            self.ids[key] = handle
        return {"$handle": handle, "kind": _kind(obj), "type": wire.qualname(type(obj))}

    def lookup(self, handle: int, kind: str, type_name: str):
        if handle not in self.objects:
            raise wire.WireError(f"handle {handle} ({type_name}) is not held by this worker (reset or restarted?)")
        return self.objects[handle]

    # messages -------------------------------------------------------------------------------
    def send(self, header: dict, blobs=()) -> None:
        wire.send(self.sock, header, blobs)

    def reply(self, rid, *, ok=None, error=None, generators=()) -> None:
        encoder = wire.Encoder(self.register)
        header = {"type": "reply", "id": rid}
        try:
            states = [encoder(_generator_state(g)) for g in generators]
            if error is None:
                header["ok"] = encoder(ok)
            else:
                header["error"] = error
        except BaseException as exc:  # noqa: BLE001 - the result could not be encoded
            encoder = wire.Encoder(self.register)
            states = [encoder(_generator_state(g)) for g in generators]
            header.pop("ok", None)
            header["error"] = error_data(exc, self.root, f"the result could not be sent: {_text(exc)}")
        header["generators"] = states
        self.send(header, encoder.blobs)

    def serve(self) -> None:
        while True:
            _flush()
            try:
                header, blobs = wire.recv(self.sock)
            except wire.WireClosed:
                return
            kind, rid = header.get("type"), header.get("id")
            if type(rid) is not int:
                raise wire.WireError(f"a request without an integer id: {plain_text(str(header)[:200])}")
            if kind in ("call", "op"):
                self.run(kind, rid, header, blobs)
            elif kind == "reset":
                self.restore_handles()
                self.reply(rid, ok=None)
            elif kind == "ping":
                self.reply(rid, ok={"pid": os.getpid(), "handles": len(self.objects)})
            elif kind == "exit":
                self.reply(rid, ok=None)
                return
            else:
                self.reply(rid, error=_plain_error("WireError", f"unknown request type {plain_text(str(kind))}"))

    def run(self, kind: str, rid: int, header: dict, blobs) -> None:
        decoder = wire.Decoder(blobs, self.lookup)
        try:
            if set(header) != {"type", "id", "name", "args", "kwargs"}:
                raise wire.WireError(f"a {kind} request has fields {sorted(header)}")
            name = header["name"]
            args, kwargs = decoder(header["args"]), decoder(header["kwargs"])
            decoder.finish()
            if type(args) not in (list, tuple) or type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
                raise wire.WireError("args must be a list or tuple and kwargs a dict with str keys")
            fn = self.function(kind, name)
        except (wire.WireError, LookupError) as exc:  # nothing ran: no generator states to report
            self.reply(rid, error=error_data(exc, None))
            return
        try:
            result = fn(self.impl, *args, **kwargs) if kind == "op" else fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - whatever the submission raises is reported as data
            error = error_data(exc, self.root)
            del exc
            self.reply(rid, error=error, generators=decoder.generators)
            return
        del args, kwargs
        self.reply(rid, ok=result, generators=decoder.generators)

    def function(self, kind: str, name):
        if type(name) is not str:
            raise LookupError("the name must be a string")
        if kind == "op":
            if name not in self.ops:
                extra = f" ({self.ops_error})" if self.ops_error else ""
                raise LookupError(f"no model operation {plain_text(name, 100)!r}{extra}")
            return self.ops[name]
        if name not in PROTOCOL_NAMES:
            raise LookupError(f"{plain_text(name, 100)!r} is not a protocol v1 name")
        fn = getattr(self.impl, name, None)
        if fn is None:
            raise LookupError(f"the implementation does not provide {name}")
        return fn

    def restore_handles(self) -> None:
        self.objects.clear()
        self.ids.clear()
        gc.collect(0)  # a full collection with torch loaded costs ~80 ms; the youngest generation is enough


def _generator_state(generator):
    import torch

    return torch.Generator.get_state(generator)


def _kind(obj) -> str:
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.nn.Module):
            return "module"
        if isinstance(obj, torch.optim.Optimizer):
            return "optimizer"
    return "callable" if callable(obj) else "object"


def _safe_str(exc: BaseException) -> str:
    try:
        text = str(exc)
        return text if type(text) is str else f"<unprintable {type(exc).__name__}>"
    except BaseException:  # noqa: BLE001
        return f"<unprintable {type(exc).__name__}>"


def _text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001
        return f"<unprintable {type(exc).__name__}>"


def _plain_error(type_name: str, message: str) -> dict:
    return {"type": type_name, "mro": [], "message": message, "where": None, "not_implemented": False}


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the submission may have replaced the streams
            pass


def load_ops(spec: str | None):
    """``(OPS dict, error text or None)``."""
    try:
        if spec and spec.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location("_spec_worker_ops", spec)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec or DEFAULT_OPS)
    except ModuleNotFoundError as exc:
        if spec is None and exc.name is not None and DEFAULT_OPS.startswith(exc.name):
            return {}, f"no model operations: {DEFAULT_OPS} does not exist"
        raise
    ops = getattr(module, "OPS", None)
    if not isinstance(ops, dict):
        raise TypeError(f"the ops module {spec or DEFAULT_OPS} has no OPS dict")
    return dict(ops), None


def hello(impl, label: str) -> dict:
    names = []
    for name in PROTOCOL_NAMES:
        try:
            if getattr(impl, name, None) is not None:
                names.append(name)
        except Exception as exc:  # noqa: BLE001 - a module __getattr__ may raise anything
            print(f"worker: looking up {name} raised {_text(exc)}; treated as not provided", file=sys.stderr)
    attributes = {}
    for attr in DECLARED_ATTRIBUTES:
        try:
            value = getattr(impl, attr, _MISSING)
        except Exception:  # noqa: BLE001
            value = _MISSING
        if value is _MISSING:
            continue
        if isinstance(value, (set, frozenset)):
            value = sorted(value, key=str)
        attributes[attr] = value
    return {
        "type": "hello",
        "label": label,
        "names": names,
        "attributes": attributes,
        "pid": os.getpid(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spec_tests.harness.remote.server")
    parser.add_argument("--impl", required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--ops", default=None)
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--max-procs", type=int, default=0)
    parser.add_argument("--guard", action="store_true")
    parser.add_argument("--protect", action="append", default=[])
    args = parser.parse_args(argv)

    limit_resources(args.memory_mb, args.max_procs)
    die_with_parent()
    sock = socket.socket(fileno=args.fd)
    sock.set_inheritable(False)
    sys.stdin = open(os.devnull)  # for the lifetime of the process

    def fail(error: dict) -> int:
        wire.send(sock, {"type": "hello", "error": error})
        _flush()
        return 3

    try:
        import torch

        torch.set_num_threads(1)
        ops, ops_error = load_ops(args.ops)
    except BaseException as exc:  # noqa: BLE001
        return fail(error_data(exc, None, f"the worker could not start: {_text(exc)}"))
    if args.guard:
        from spec_tests.harness.remote.guard import Guard

        Guard(args.protect, args.impl if os.path.exists(args.impl) else None, on_block=_report_block).install()
    wire.send(sock, {"type": "started"})  # the harness is up; from here on the time is the submission's
    try:
        impl, label = load_implementation(args.impl)
    except BaseException as exc:  # noqa: BLE001 - whatever importing the submission does
        # the loader wraps the submission's own error (its __cause__) in one sentence naming the file
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        root = os.path.realpath(args.impl) if os.path.exists(args.impl) else None
        return fail(error_data(cause, root, _safe_str(exc) if cause is not exc else None))
    root = submission_root(args.impl, impl)
    server = Server(sock, impl, root, ops, ops_error)
    header = hello(impl, label)
    encoder = wire.Encoder(server.register)
    header["attributes"] = encoder(header["attributes"])
    wire.send(sock, header, encoder.blobs)
    try:
        server.serve()
    except wire.WireError as exc:
        print(f"worker: protocol error: {exc}", file=sys.stderr)
        _flush()
        return 2
    _flush()
    return 0


def _report_block(what: str, where: str | None) -> None:
    print(f"worker guard: blocked {what}" + (f" at {where}" if where else ""), file=sys.stderr)


if __name__ == "__main__":
    code = main()
    _flush()
    os._exit(code)
