"""Turning an ``--impl`` value into an implementation object.

Accepted forms: ``reference``, ``student``, ``bug:<name>`` (a seeded bug from the catalog),
``cs336:<checkout>`` (a CS336 assignment 1 checkout, through ``spec_adapters.cs336``), a dotted
module path ``pkg.mod``, ``pkg.mod:object``, or a path to a ``.py`` file or a package folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
import types
from pathlib import Path

ACCEPTED_FORMS = (
    "reference | student | bug:<name> | cs336:<checkout> | pkg.mod | pkg.mod:object | path/to/file.py "
    "| path/to/package_dir"
)


class ImplUsageError(ValueError):
    """The ``--impl`` value has none of the accepted forms."""


class ImplImportError(RuntimeError):
    """The implementation was found but raised while importing."""


def _import_failure(where: str, exc: BaseException) -> ImplImportError:
    """One line: what failed to import, the exception, and where it was raised, said once (a
    SyntaxError's own text already names the place: its bare message is used)."""
    if isinstance(exc, SyntaxError) and exc.filename:  # raised by the compiler: the place is the bad line
        message, filename, lineno = exc.msg, exc.filename, exc.lineno
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        origin = next((f for f in reversed(frames) if "importlib" not in f.filename), None)
        message, filename, lineno = str(exc), origin.filename if origin else None, origin.lineno if origin else None
    at = f" (at {filename}:{lineno})" if filename else ""
    return ImplImportError(f"implementation {where} failed to import: {type(exc).__name__}: {message}{at}")


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise ImplUsageError(
                f"--impl={name}: no module named {exc.name!r}. Accepted forms: {ACCEPTED_FORMS}"
            ) from None
        raise _import_failure(name, exc) from exc
    except Exception as exc:  # any error in the implementation's own import
        raise _import_failure(name, exc) from exc


def _import_path(path: Path):
    path = path.resolve()
    if path.is_dir():
        init = path / "__init__.py"
        if not init.exists():
            raise ImplUsageError(f"--impl={path}: a folder must be a package with an __init__.py")
        name, location, search = path.name, init, [str(path)]
    else:
        name, location, search = f"_spec_impl_{path.stem}", path, None
    spec = importlib.util.spec_from_file_location(name, location, submodule_search_locations=search)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if search is None:  # let a single file import its neighbours
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the student's own import error
        del sys.modules[name]
        raise _import_failure(str(location), exc) from exc
    return module


def _load_cs336(spec: str):
    """A CS336 checkout's ``tests/adapters.py`` table behind protocol v1 (``spec_adapters.cs336``)."""
    try:
        from spec_adapters import cs336
    except ImportError as exc:  # a handout without the adapters
        raise ImplUsageError(f"--impl={spec}: the CS336 bridge (spec_adapters.cs336) is not installed: {exc}") from None
    checkout = spec.removeprefix("cs336:")
    if not checkout or not Path(checkout).is_dir():
        raise ImplUsageError(f"--impl={spec}: {checkout!r} is not a folder (a CS336 assignment 1 checkout)")
    try:
        return cs336.load(checkout)
    except cs336.BridgeError as exc:
        raise ImplUsageError(str(exc)) from None
    except Exception as exc:
        raise _import_failure(f"{checkout}/tests/adapters.py", exc) from exc


def load_implementation(spec: str):
    """The object behind an ``--impl`` value and a short label for messages."""
    spec = spec.strip()
    if not spec:
        raise ImplUsageError(f"--impl is empty. Accepted forms: {ACCEPTED_FORMS}")
    if spec.startswith("bug:"):
        from ...bugs import load_bug  # the catalog ships with the suite, not with handouts

        return load_bug(spec[4:]), spec
    if spec.startswith("cs336:"):
        return _load_cs336(spec), spec
    looks_like_path = (
        spec.endswith(".py") or "/" in spec or "\\" in spec or Path(spec).is_dir() and not spec.isidentifier()
    )
    if looks_like_path:
        path = Path(spec)
        if not path.exists():
            raise ImplUsageError(f"--impl={spec}: no such file or folder. Accepted forms: {ACCEPTED_FORMS}")
        return _import_path(path), spec
    module_name, _, attr = spec.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")) or (attr and not attr.isidentifier()):
        raise ImplUsageError(f"--impl={spec} is not understood. Accepted forms: {ACCEPTED_FORMS}")
    module = _import_module(module_name)
    if not attr:
        return module, spec
    try:
        return getattr(module, attr), spec
    except AttributeError:
        raise ImplUsageError(f"--impl={spec}: module {module_name} has no attribute {attr!r}") from None


def fresh_copy(obj, shared: tuple[str, ...]):
    """The implementation module ``obj`` loaded again, with every module of its own folder executed anew, so that
    state kept in module globals (a buffer, a cache, a counter) starts over; ``None`` where it cannot be loaded
    again (not a module loaded from a file, its folder is one of ``shared``, or loading it raises). ``shared``:
    folders whose modules stay as they are (the suite's, torch's, Python's, the installed packages') unless the
    implementation's folder lies inside one. The modules loaded before are put back afterwards, and the global
    random state too: the copy's functions keep their own globals, and the rest of the run never sees the copy."""
    import torch

    spec = getattr(obj, "__spec__", None)
    file = getattr(obj, "__file__", None)
    if not isinstance(obj, types.ModuleType) or spec is None or spec.loader is None or not file:
        return None
    folder = os.path.dirname(os.path.realpath(file)) + os.sep  # a package's folder, or the one a file imports beside
    if folder in shared:
        return None
    kept = tuple(root for root in shared if not folder.startswith(root))

    def own(module) -> bool:
        real = os.path.realpath(getattr(module, "__file__", None) or os.sep)
        return real.startswith(folder) and not real.startswith(kept)

    saved_modules, saved_path, saved_rng = dict(sys.modules), list(sys.path), torch.get_rng_state()
    for key, module in saved_modules.items():
        if module is not None and own(module):
            del sys.modules[key]
    try:
        again = importlib.util.spec_from_file_location(
            spec.name, spec.origin, submodule_search_locations=spec.submodule_search_locations
        )
        copy = importlib.util.module_from_spec(again)
        sys.modules[spec.name] = copy
        again.loader.exec_module(copy)
    except Exception:  # noqa: BLE001 - a copy that cannot be loaded shows nothing
        return None
    finally:
        for key in [k for k, m in sys.modules.items() if saved_modules.get(k) is not m]:
            del sys.modules[key]
        sys.modules.update(saved_modules)
        sys.path[:] = saved_path
        torch.set_rng_state(saved_rng)
    return copy
