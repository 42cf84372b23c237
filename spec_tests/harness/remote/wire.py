"""Plain data between the judge and a worker, without pickle.

A message is a JSON header (a dict) plus binary blobs, framed on a stream socket:

    b"TSW1" | header length (u32) | blob count (u32) | blob sizes (u64 each) | header | blobs

Values inside a header are *encoded*: JSON's own ``null``, ``true``/``false``, integers, finite
floats, strings and arrays stand for ``None``, ``bool``, ``int``, ``float``, ``str`` and ``list``;
everything else is an object with exactly one ``$`` key naming its kind:

    {"$tuple": [...]}                  {"$dict": [[key, value], ...]}   (keys str or int)
    {"$float": "nan" | "inf" | "-inf"} {"$bytes": blob}
    {"$tensor": blob, "dtype": "float32", "shape": [2, 3], "device": "cpu", "grad": false}
    {"$ndarray": blob, "dtype": "<f8", "shape": [4]}
    {"$dtype": "bfloat16"}             {"$device": "cuda:0"}
    {"$generator": blob, "device": "cpu", "index": 0}   {"$genref": 0}  (the same generator again)
    {"$handle": 3, "kind": "module", "type": "pkg.Model"}

Encoding turns subclasses into their plain base type through the base type's own slots
(``int.__int__``, ``float.__float__``, ``str.__str__``, ``list.__iter__``, ...), so an override of
``__eq__``, ``__repr__``, ``__iter__`` or ``__torch_function__`` cannot change what arrives; a
tensor is sent as the raw bytes of a detached, contiguous CPU copy made with torch functions
disabled. Decoding is strict: an unknown tag, a missing or extra field, a blob referenced twice or
never, a blob whose size does not match its dtype and shape, a header or message above the caps:
each is a ``WireError`` that names what was wrong. Strings are sanitised both ways (lone surrogates
replaced, control characters other than newline and tab removed) and capped with a marker.

Nothing here uses pickle, ``torch.load`` or ``eval``.
"""

from __future__ import annotations

import json
import math
import re
import select
import socket
import struct
import sys
import time
from dataclasses import dataclass

from spec_tests.harness.text import plain_text

MAGIC = b"TSW1"
_PREFIX = struct.Struct("!4sII")


class WireError(ValueError):
    """A value that cannot be sent, or a message that is not a well-formed one."""


class WireClosed(WireError):
    """The other side closed the stream between messages."""


class WireTimeout(WireError, TimeoutError):
    """The message did not arrive (completely) in time; the stream is no longer usable."""


@dataclass(frozen=True)
class Limits:
    """Caps on one message. The receiver checks them from the frame's prefix, before reading or
    allocating anything the sender declared, and a message above one is a ``WireError`` (the judge
    treats it as the worker breaking the protocol: that call fails, the worker is restarted).

    ``max_header``: 8 MiB of JSON. Headers carry only the encoded tree (tensors and bytes travel as
    blobs), and the suite's largest is a few kB; parsing JSON builds Python objects of 10-20 times
    the text's size, so this bounds a header to ~160 MiB of the judge's memory (a 48 MiB header made
    the judge run out of memory while parsing). ``max_message``: 1 GiB of header and blobs together;
    the suite's largest tensor is a few MB, and the judge's address space is the worker's limit plus
    2 GiB, so one message cannot take more than half of that.
    """

    max_message: int = 1 << 30  # header + blobs, bytes
    max_header: int = 8 << 20  # bytes of JSON
    max_blobs: int = 100_000
    max_str: int = 100_000  # characters; longer strings are cut with a marker
    max_bytes: int = 256 << 20  # one bytes value
    max_depth: int = 100  # nesting of lists, tuples, dicts
    max_items: int = 2_000_000  # encoded nodes in one message
    max_dims: int = 32


DEFAULT_LIMITS = Limits()

# torch dtypes a tensor may have on the wire (the suite uses bool, int32/64, float16/bfloat16/32/64).
TENSOR_DTYPES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
_NDARRAY_KINDS = "biufc"
_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|meta)(:[0-9]{1,4})?$")
_DTYPE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_NP_DTYPE = re.compile(r"^[<>|=][biufc][0-9]{1,2}$")
_TAGS = {
    "$tuple": frozenset(),
    "$dict": frozenset(),
    "$float": frozenset(),
    "$bytes": frozenset(),
    "$tensor": frozenset({"dtype", "shape", "device", "grad"}),
    "$ndarray": frozenset({"dtype", "shape"}),
    "$dtype": frozenset(),
    "$device": frozenset(),
    "$generator": frozenset({"device", "index"}),
    "$genref": frozenset(),
    "$handle": frozenset({"kind", "type"}),
}
_MARKER_ROOM = 64
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def qualname(obj_type: type) -> str:
    try:
        name = f"{type.__getattribute__(obj_type, '__module__')}.{type.__getattribute__(obj_type, '__qualname__')}"
    except Exception:  # noqa: BLE001 - a metaclass may do anything
        name = "<unknown type>"
    return plain_text(name if isinstance(name, str) else "<unknown type>", 300)


def _torch():
    return sys.modules.get("torch")


def _numpy():
    return sys.modules.get("numpy")


# ---------------------------------------------------------------------------------------------
# encoding


class Encoder:
    """Turns values into an encoded tree plus blobs (call it on each field of one message).

    ``on_object(value)`` is asked for anything that is not plain data: it returns a handle dict
    ``{"$handle": id, "kind": str, "type": str}`` (the worker keeps the object) or raises. Without
    it such a value is a ``WireError``. ``generators`` lists the ``torch.Generator`` objects encoded,
    in index order, so that the sender can take over their states from the receiver's reply.
    """

    def __init__(self, on_object=None, *, limits: Limits | None = None):
        self.on_object = on_object
        self.limits = limits or DEFAULT_LIMITS
        self.blobs: list = []
        self.generators: list = []
        self._generator_index: dict[int, int] = {}
        self._nodes = 0
        self._size = 0

    def __call__(self, value):
        return self._encode(value, 0)

    # blobs ------------------------------------------------------------------------------------
    def _blob(self, data) -> int:
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
            view = memoryview(view.tobytes())
        self._size += view.nbytes
        if self._size > self.limits.max_message:
            raise WireError(f"the message would exceed the cap of {self.limits.max_message} bytes")
        self.blobs.append(view)
        return len(self.blobs) - 1

    # values -------------------------------------------------------------------------------------
    def _encode(self, value, depth: int):
        self._nodes += 1
        if self._nodes > self.limits.max_items:
            raise WireError(f"more than {self.limits.max_items} values in one message")
        if depth > self.limits.max_depth:
            raise WireError(f"values nested more than {self.limits.max_depth} levels deep")
        kind = type(value)
        if value is None or kind is bool:
            return value
        if kind is int:
            return value
        if kind is float:
            return _float(value)
        if kind is str:
            return plain_text(value, self.limits.max_str)
        if kind is list:
            return [self._encode(item, depth + 1) for item in list.__iter__(value)]
        if kind is tuple:
            return {"$tuple": [self._encode(item, depth + 1) for item in tuple.__iter__(value)]}
        if kind is dict:
            return self._dict(value, depth)
        torch = _torch()
        if torch is not None:
            if issubclass(kind, torch.Tensor):
                return self._tensor(value, torch)
            if kind is torch.dtype:
                return {"$dtype": str(value).removeprefix("torch.")}
            if kind is torch.device:
                return {"$device": str(value)}
            if issubclass(kind, torch.Size):
                return {"$tuple": [int.__int__(s) for s in tuple.__iter__(value)]}
            if issubclass(kind, torch.Generator):
                return self._generator(value, torch)
        np = _numpy()
        if np is not None:
            if issubclass(kind, np.ndarray):
                return self._ndarray(value, np)
            if issubclass(kind, np.generic):
                scalar = self._numpy_scalar(value, np)
                if scalar is not NotImplemented:
                    return scalar
        if issubclass(kind, bool):  # not possible in CPython; kept for clarity
            return bool(int.__int__(value))
        if issubclass(kind, int):
            return int.__int__(value)
        if issubclass(kind, float):
            return _float(float.__float__(value))
        if issubclass(kind, str):
            return plain_text(str.__str__(value), self.limits.max_str)
        if issubclass(kind, (bytes, bytearray, memoryview)):
            data = memoryview(value).tobytes()
            if len(data) > self.limits.max_bytes:
                raise WireError(f"a bytes value of {len(data)} bytes exceeds the cap of {self.limits.max_bytes}")
            return {"$bytes": self._blob(data)}
        if issubclass(kind, list):
            return [self._encode(item, depth + 1) for item in list.__iter__(value)]
        if issubclass(kind, tuple):
            return {"$tuple": [self._encode(item, depth + 1) for item in tuple.__iter__(value)]}
        if issubclass(kind, dict):
            return self._dict(value, depth)
        return self._object(value)

    def _dict(self, value, depth: int):
        items = []
        for key, item in dict.items(value):
            key_type = type(key)
            if key_type is str or key_type is int or key_type is bool:
                pass
            elif issubclass(key_type, bool):
                key = bool(int.__int__(key))
            elif issubclass(key_type, int):
                key = int.__int__(key)
            elif issubclass(key_type, str):
                key = str.__str__(key)
            else:
                return self._object(value)
            if type(key) is str:
                key = plain_text(key, self.limits.max_str)
            items.append([key, self._encode(item, depth + 1)])
        return {"$dict": items}

    def _object(self, value):
        if self.on_object is None:
            raise WireError(f"a value of type {qualname(type(value))} cannot be sent (not plain data)")
        handle = self.on_object(value)
        if (
            type(handle) is not dict
            or set(handle) != {"$handle", "kind", "type"}
            or type(handle["$handle"]) is not int
            or handle["$handle"] < 0
        ):
            raise WireError(f"on_object returned {handle!r}, not a handle")
        return {
            "$handle": handle["$handle"],
            "kind": plain_text(str(handle["kind"]), 100),
            "type": plain_text(str(handle["type"]), 300),
        }

    def _tensor(self, value, torch):
        with torch._C.DisableTorchFunction():  # a subclass's __torch_function__ is not consulted
            layout, dtype = value.layout, value.dtype
            name = str(dtype).removeprefix("torch.")
            if (
                layout != torch.strided
                or name not in TENSOR_DTYPES
                or value.is_meta
                or value.is_quantized
                or value.is_nested
            ):
                return self._object(value)
            device = str(value.device)
            grad = bool(value.requires_grad)
            plain = torch.Tensor.detach(value)
            if type(plain) is not torch.Tensor:
                plain = plain.as_subclass(torch.Tensor)
            plain = plain.to("cpu").resolve_conj().resolve_neg().contiguous()
            shape = [int(s) for s in plain.shape]
            if plain.dtype != dtype:
                raise WireError(f"a tensor changed its dtype while being copied ({dtype} -> {plain.dtype})")
            raw = plain.reshape(-1).view(torch.uint8).numpy() if plain.numel() else b""
        expected = math.prod(shape) * _itemsize(name)
        if memoryview(raw).nbytes != expected:
            raise WireError(f"a {name} tensor of shape {shape} held {memoryview(raw).nbytes} bytes, not {expected}")
        return {"$tensor": self._blob(raw), "dtype": name, "shape": shape, "device": device, "grad": grad}

    def _ndarray(self, value, np):
        array = value.view(np.ndarray) if type(value) is not np.ndarray else value
        if array.dtype.kind not in _NDARRAY_KINDS or array.dtype.fields is not None:
            return self._object(value)
        array = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("="), copy=False))
        shape = [int(s) for s in array.shape]
        raw = array.reshape(-1).view(np.uint8) if array.size else b""
        return {"$ndarray": self._blob(raw), "dtype": array.dtype.str, "shape": shape}

    def _numpy_scalar(self, value, np):
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return _float(float(value))
        return NotImplemented

    def _generator(self, value, torch):
        key = id(value)
        if key in self._generator_index:
            return {"$genref": self._generator_index[key]}
        state = torch.Generator.get_state(value)
        blob = self._tensor(state, torch)["$tensor"]
        index = len(self.generators)
        self._generator_index[key] = index
        self.generators.append(value)
        return {"$generator": blob, "device": str(value.device), "index": index}


def _float(value: float):
    if math.isfinite(value):
        return value
    return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}


def _itemsize(dtype_name: str) -> int:
    return {
        "bool": 1,
        "uint8": 1,
        "int8": 1,
        "int16": 2,
        "int32": 4,
        "int64": 8,
        "float16": 2,
        "bfloat16": 2,
        "float32": 4,
        "float64": 8,
        "complex64": 8,
        "complex128": 16,
    }[dtype_name]


# ---------------------------------------------------------------------------------------------
# decoding


class Decoder:
    """Turns encoded trees back into values, strictly (call it on each field of one message, then
    ``finish()``). Tensors land on ``device`` when given, else on the device the sender stated.
    ``on_handle(id, kind, type)`` makes the local stand-in for a handle; without it a handle is a
    ``WireError``. ``generators`` lists the fresh generators made, in index order."""

    def __init__(self, blobs, on_handle=None, *, device=None, limits: Limits | None = None):
        self.blobs = list(blobs)
        self.on_handle = on_handle
        self.device = device
        self.limits = limits or DEFAULT_LIMITS
        self.generators: list = []
        self._used = [False] * len(self.blobs)
        self._nodes = 0

    def __call__(self, obj):
        try:
            return self._decode(obj, 0)
        except MemoryError:
            raise WireError("a value could not be decoded within the memory available") from None
        except RecursionError:
            raise WireError("values nested too deeply to decode") from None

    def finish(self) -> None:
        unused = [i for i, used in enumerate(self._used) if not used]
        if unused:
            raise WireError(f"blob(s) {unused[:10]} of the message are not referenced by its header")

    def _take(self, index) -> bytearray:
        if type(index) is not int or not 0 <= index < len(self.blobs):
            raise WireError(f"blob index {index!r} out of range (the message has {len(self.blobs)} blobs)")
        if self._used[index]:
            raise WireError(f"blob {index} is referenced twice")
        self._used[index] = True
        return self.blobs[index]

    def _decode(self, obj, depth: int):
        self._nodes += 1
        if self._nodes > self.limits.max_items:
            raise WireError(f"more than {self.limits.max_items} values in one message")
        if depth > self.limits.max_depth:
            raise WireError(f"values nested more than {self.limits.max_depth} levels deep")
        kind = type(obj)
        if obj is None or kind is bool or kind is int:
            return obj
        if kind is float:
            if not math.isfinite(obj):
                raise WireError("a non-finite float outside a $float tag")
            return obj
        if kind is str:  # sanitised again: the sender is not trusted (room for the sender's cut marker)
            return plain_text(obj, self.limits.max_str + _MARKER_ROOM)
        if kind is list:
            return [self._decode(item, depth + 1) for item in obj]
        if kind is not dict:
            raise WireError(f"unexpected JSON value of type {kind.__name__}")
        tags = [k for k in obj if k.startswith("$")]
        if len(tags) != 1:
            raise WireError(f"an encoded object must have exactly one '$' tag, got keys {sorted(obj)[:8]}")
        tag = tags[0]
        if tag not in _TAGS:
            raise WireError(f"unknown tag {plain_text(tag, 40)!r}")
        fields = set(obj) - {tag}
        if fields != _TAGS[tag]:
            raise WireError(f"{tag} has fields {sorted(fields)}, expected {sorted(_TAGS[tag])}")
        body = obj[tag]
        if tag == "$tuple":
            if type(body) is not list:
                raise WireError("$tuple must hold a list")
            return tuple(self._decode(item, depth + 1) for item in body)
        if tag == "$dict":
            return self._dict(body, depth)
        if tag == "$float":
            if body not in _NONFINITE:
                raise WireError(f"$float must be 'nan', 'inf' or '-inf', got {plain_text(str(body), 40)!r}")
            return _NONFINITE[body]
        if tag == "$bytes":
            data = self._take(body)
            if len(data) > self.limits.max_bytes:
                raise WireError(f"a bytes value of {len(data)} bytes exceeds the cap of {self.limits.max_bytes}")
            return bytes(data)
        if tag == "$tensor":
            return self._tensor(obj)
        if tag == "$ndarray":
            return self._ndarray(obj)
        if tag == "$dtype":
            return _dtype(body)
        if tag == "$device":
            return _device(body)
        if tag == "$generator":
            return self._generator(obj)
        if tag == "$genref":
            if type(body) is not int or not 0 <= body < len(self.generators):
                raise WireError(f"$genref {body!r} names no generator of this message")
            return self.generators[body]
        return self._handle(obj)

    def _dict(self, body, depth: int) -> dict:
        if type(body) is not list:
            raise WireError("$dict must hold a list of [key, value] pairs")
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("$dict items must be [key, value] pairs")
            key, value = pair
            if type(key) is str:
                key = plain_text(key, self.limits.max_str + _MARKER_ROOM)
            elif type(key) not in (int, bool):
                raise WireError(f"a dict key must be str or int, got {type(key).__name__}")
            if key in out:
                raise WireError(f"duplicate dict key {plain_text(repr(key), 80)}")
            out[key] = self._decode(value, depth + 1)
        return out

    def _shape(self, shape) -> list[int]:
        if type(shape) is not list or len(shape) > self.limits.max_dims:
            raise WireError(f"a shape must be a list of at most {self.limits.max_dims} sizes")
        for size in shape:
            if type(size) is not int or not 0 <= size < 2**48:
                raise WireError(f"invalid size {plain_text(repr(size), 40)} in shape")
        return shape

    def _tensor(self, obj):
        torch = _import_torch()
        name = obj["dtype"]
        if name not in TENSOR_DTYPES:
            raise WireError(f"tensor dtype {plain_text(str(name), 40)!r} is not one the wire carries")
        shape = self._shape(obj["shape"])
        stated = _device(obj["device"])
        if type(obj["grad"]) is not bool:
            raise WireError("a tensor's 'grad' must be true or false")
        data = self._take(obj["$tensor"])
        expected = math.prod(shape) * _itemsize(name)
        if len(data) != expected:
            raise WireError(f"a {name} tensor of shape {shape} needs {expected} bytes, its blob has {len(data)}")
        dtype = getattr(torch, name)
        tensor = torch.empty(shape, dtype=dtype) if expected == 0 else torch.frombuffer(data, dtype=dtype)
        tensor = tensor.reshape(shape)
        target = self.device if self.device is not None else stated
        if str(target) != "cpu":
            target = _available(torch, target)
            tensor = tensor.to(target)
        if obj["grad"] and (tensor.is_floating_point() or tensor.is_complex()):
            tensor.requires_grad_(True)
        return tensor

    def _ndarray(self, obj):
        np = _import_numpy()
        name = obj["dtype"]
        if type(name) is not str or not _NP_DTYPE.match(name):
            raise WireError(f"ndarray dtype {plain_text(str(name), 40)!r} is not a numeric dtype")
        try:
            dtype = np.dtype(name)
        except TypeError as exc:
            raise WireError(f"ndarray dtype {name!r}: {exc}") from None
        if dtype.kind not in _NDARRAY_KINDS:
            raise WireError(f"ndarray dtype {name!r} is not numeric")
        shape = self._shape(obj["shape"])
        data = self._take(obj["$ndarray"])
        expected = math.prod(shape) * dtype.itemsize
        if len(data) != expected:
            raise WireError(f"a {name} array of shape {shape} needs {expected} bytes, its blob has {len(data)}")
        if expected == 0:
            return np.empty(shape, dtype=dtype)
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    def _generator(self, obj):
        torch = _import_torch()
        if type(obj["index"]) is not int or obj["index"] != len(self.generators):
            raise WireError(f"generator index {obj['index']!r} out of order (expected {len(self.generators)})")
        device = _available(torch, _device(obj["device"]))
        data = self._take(obj["$generator"])
        state = torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
        generator = torch.Generator(device=device)
        try:
            generator.set_state(state.clone())
        except (RuntimeError, ValueError, TypeError) as exc:
            raise WireError(f"invalid generator state for {device}: {plain_text(str(exc), 200)}") from None
        self.generators.append(generator)
        return generator

    def _handle(self, obj):
        handle_id, kind, type_name = obj["$handle"], obj["kind"], obj["type"]
        if type(handle_id) is not int or handle_id < 0 or type(kind) is not str or type(type_name) is not str:
            raise WireError("a handle needs an integer id and string kind and type")
        if self.on_handle is None:
            raise WireError("a handle where only plain data is allowed")
        return self.on_handle(handle_id, plain_text(kind, 100), plain_text(type_name, 300))


def _import_torch():
    import torch

    return torch


def _import_numpy():
    import numpy

    return numpy


def _dtype(name):
    torch = _import_torch()
    if type(name) is not str or not _DTYPE_NAME.match(name):
        raise WireError(f"invalid dtype name {plain_text(str(name), 40)!r}")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WireError(f"{name!r} is not a torch dtype")
    return dtype


def _device(name):
    torch = _import_torch()
    if type(name) is not str or not _DEVICE.match(name):
        raise WireError(f"invalid device {plain_text(str(name), 40)!r}")
    return torch.device(name)


def _available(torch, device):
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WireError(f"a value on {device}, but CUDA is not available here")
    if device.type not in ("cpu", "cuda"):
        raise WireError(f"values on {device.type} devices are not supported")
    return device


# ---------------------------------------------------------------------------------------------
# framing


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def _left(deadline) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise WireTimeout("timed out")
    return left


def send(sock: socket.socket, header: dict, blobs=(), *, timeout: float | None = None, limits: Limits | None = None):
    """Frame and send one message (``header`` must already be encoded, JSON-able data)."""
    limits = limits or DEFAULT_LIMITS
    if type(header) is not dict:
        raise WireError("a message header must be a dict")
    try:
        data = json.dumps(header, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise WireError(f"the header is not plain JSON data: {exc}") from None
    views = []
    for blob in blobs:
        view = memoryview(blob)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        views.append(view)
    if len(data) > limits.max_header:
        raise WireError(f"a header of {len(data)} bytes exceeds the cap of {limits.max_header}")
    if len(views) > limits.max_blobs:
        raise WireError(f"{len(views)} blobs exceed the cap of {limits.max_blobs}")
    total = len(data) + sum(v.nbytes for v in views)
    if total > limits.max_message:
        raise WireError(f"a message of {total} bytes exceeds the cap of {limits.max_message}")
    prefix = _PREFIX.pack(MAGIC, len(data), len(views)) + struct.pack(f"!{len(views)}Q", *(v.nbytes for v in views))
    deadline = _deadline(timeout)
    try:
        for part in (memoryview(prefix + data), *views):
            if part.nbytes:
                sock.settimeout(_left(deadline))
                sock.sendall(part)
    except TimeoutError:
        raise WireTimeout("timed out sending a message") from None
    finally:
        _reset_timeout(sock)


def _reset_timeout(sock) -> None:
    try:
        sock.settimeout(None)
    except OSError:
        pass


def _read_into(sock, view: memoryview, deadline, what: str, at_start: bool = False) -> None:
    got = 0
    while got < view.nbytes:
        sock.settimeout(_left(deadline))
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            raise WireTimeout(f"timed out receiving {what}") from None
        except ConnectionResetError:
            n = 0
        if n == 0:
            if at_start and got == 0:
                raise WireClosed("the stream was closed")
            raise WireError(f"truncated frame: the stream ended {got} of {view.nbytes} bytes into {what}")
        got += n


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise WireError(f"duplicate key {plain_text(key, 40)!r} in a header object")
        out[key] = value
    return out


def _no_constant(name):
    raise WireError(f"non-standard JSON constant {name}")


def parse_header(data: bytes) -> dict:
    try:
        header = json.loads(
            data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite
        )
    except WireError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"malformed header: {plain_text(str(exc), 200)}") from None
    except MemoryError:
        raise WireError(f"a header of {len(data)} bytes could not be parsed within the memory available") from None
    if type(header) is not dict:
        raise WireError("a message header must be a JSON object")
    return header


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise WireError(f"a JSON number out of float range: {text[:40]}")
    return value


def recv(sock: socket.socket, timeout: float | None = None, *, limits: Limits | None = None):
    """One message: ``(header dict, list of blobs as bytearrays)``. ``WireClosed`` at a clean end of
    the stream, ``WireTimeout`` when it does not arrive within ``timeout`` seconds, ``WireError``
    for anything malformed or over the caps."""
    limits = limits or DEFAULT_LIMITS
    deadline = _deadline(timeout)
    try:
        prefix = bytearray(_PREFIX.size)
        _read_into(sock, memoryview(prefix), deadline, "a message prefix", at_start=True)
        magic, header_len, n_blobs = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise WireError(f"bad frame: magic {bytes(magic)!r}, expected {MAGIC!r}")
        if header_len > limits.max_header:
            raise WireError(f"a header of {header_len} bytes exceeds the cap of {limits.max_header}")
        if n_blobs > limits.max_blobs:
            raise WireError(f"{n_blobs} blobs exceed the cap of {limits.max_blobs}")
        sizes_raw = bytearray(8 * n_blobs)
        _read_into(sock, memoryview(sizes_raw), deadline, "the blob sizes")
        sizes = struct.unpack(f"!{n_blobs}Q", sizes_raw)
        total = header_len + sum(sizes)
        if total > limits.max_message:
            raise WireError(f"a message of {total} bytes exceeds the cap of {limits.max_message}")
        try:
            data = bytearray(header_len)
            _read_into(sock, memoryview(data), deadline, "the header")
            header = parse_header(bytes(data))
            del data
            blobs = []
            for i, size in enumerate(sizes):
                blob = bytearray(size)
                _read_into(sock, memoryview(blob), deadline, f"blob {i}")
                blobs.append(blob)
        except MemoryError:
            raise WireError(
                f"a message of {total} bytes (header {header_len}) could not be held in memory while decoding"
            ) from None
        return header, blobs
    finally:
        _reset_timeout(sock)


def readable(sock: socket.socket, timeout: float) -> bool:
    """Whether a message (or the end of the stream) is waiting, after up to ``timeout`` seconds."""
    ready, _, _ = select.select([sock], [], [], max(0.0, timeout))
    return bool(ready)
