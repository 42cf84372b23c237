"""The Gradescope autograder zip (``spec-grade --gradescope-zip autograder.zip``).

Gradescope unpacks the zip into ``/autograder/source``, runs ``setup.sh`` once (as root) to build
the image, and ``run_autograder`` for each submission (uploaded to ``/autograder/submission``),
expecting ``/autograder/results/results.json``. The zip holds:

- ``setup.sh``: installs bubblewrap (the sandbox); finds a Python >= 3.11 (or fails naming the
  versions found and the base image to pick in Gradescope's settings); makes its own virtual
  environment ``/autograder/venv`` (so an old or externally managed system Python does not matter);
  installs the CPU build of torch from PyTorch's CPU index and the project into it; then prepares
  the manifest (a no-op when the shipped one matches the installed versions);
- ``run_autograder``: grades the submission into ``results.json`` with the zip's rubric;
- the project: ``reference/``, ``spec_tests/`` (with the bug catalog, for diagnosis), ``student/``,
  ``spec_grading/`` and a ``pyproject.toml`` that installs them;
- ``rubric.toml`` (byte for byte the rubric it was built from, its SHA-256 in
  ``rubric.toml.sha256`` and in both scripts' headers) and the prepared manifest
  (``grading-cache/<key>/manifest.json`` + SHA-256).

``SPEC_AUTOGRADER_ROOT`` (default ``/autograder``) moves every ``/autograder`` path, and
``SPEC_AUTOGRADER_SKIP_INSTALL=1`` skips ``setup.sh``'s installs (``SPEC_AUTOGRADER_SKIP_APT=1`` only
the apt-get lines), ``SPEC_AUTOGRADER_PYTHON`` names the Python to use: for testing the zip outside
Gradescope (``tests/test_grading_gradescope.py``, ``tests/test_grading_reports.py``).
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import zipfile
from pathlib import Path

from .manifest import Manifest
from .packages import package_dir
from .rubric import Rubric

TORCH_PIN = "torch==2.13.0"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PACKAGES = ("reference", "spec_tests", "student", "spec_grading")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "recorded", ".hypothesis", ".pytest_cache")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "transformer-spec-autograder"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["torch>=2.5", "numpy>=1.24", "einops>=0.7", "pytest>=8", "hypothesis>=6.100"]

[project.entry-points.pytest11]
"spec_tests.harness.plugin.hooks" = "spec_tests.harness.plugin.hooks"

[project.scripts]
spec-grade = "spec_grading.cli:main"

[tool.setuptools.packages.find]
where = ["."]
include = ["reference*", "spec_tests*", "student*", "spec_grading*"]
"""

PYTHON_MIN = (3, 11)
SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image. Rubric: {rubric}
# It installs into a virtual environment of its own ($AG/venv), never into the image's python3 (which
# may be too old, or marked externally managed as on Ubuntu 24.04).
set -euo pipefail
AG="${{SPEC_AUTOGRADER_ROOT:-/autograder}}"
cd "$AG/source"
skip_install="${{SPEC_AUTOGRADER_SKIP_INSTALL:-0}}"
skip_apt="${{SPEC_AUTOGRADER_SKIP_APT:-$skip_install}}"
if [ "$skip_apt" != "1" ]; then
    apt-get update
    apt-get install -y bubblewrap
fi
# a Python >= {min_major}.{min_minor}: $SPEC_AUTOGRADER_PYTHON, else python3, else the newest python3.X on PATH
found=""
PY=""
for candidate in ${{SPEC_AUTOGRADER_PYTHON:-}} python3 python3.14 python3.13 python3.12 python3.11; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    version="$("$candidate" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || true)"
    [ -n "$version" ] || continue
    found="$found $candidate=$version"
    major="${{version%%.*}}"; rest="${{version#*.}}"; minor="${{rest%%.*}}"
    if [ "$major" -gt {min_major} ] || {{ [ "$major" -eq {min_major} ] && [ "$minor" -ge {min_minor} ]; }}; then
        PY="$candidate"
        break
    fi
done
if [ -z "$PY" ]; then
    echo "setup.sh: ERROR: the autograder needs Python {min_major}.{min_minor} or newer;" \\
        "found:${{found:- no python3 at all}}." >&2
    echo "setup.sh: In Gradescope's autograder settings, pick a base image whose python3 is" \\
        "{min_major}.{min_minor}+" >&2
    echo "setup.sh: (Ubuntu 24.04 ships Python 3.12; Ubuntu 22.04 ships 3.10, too old), or set" >&2
    echo "setup.sh: SPEC_AUTOGRADER_PYTHON to a python{min_major}.{min_minor}+ this script can run." >&2
    exit 1
fi
echo "setup.sh: using $PY ($version)"
if [ "$skip_install" != "1" ]; then
    if ! "$PY" -m venv "$AG/venv"; then  # Debian/Ubuntu keep venv's ensurepip in a package of its own
        [ "$skip_apt" != "1" ] && apt-get install -y "python$major.$minor-venv" || true
        "$PY" -m venv "$AG/venv"
    fi
    "$AG/venv/bin/python" -m pip install --upgrade pip
    "$AG/venv/bin/python" -m pip install {torch} --index-url {index}
    "$AG/venv/bin/python" -m pip install .
fi
[ -x "$AG/venv/bin/python" ] && PY="$AG/venv/bin/python"
# the shipped manifest is used when it matches the installed versions; otherwise it is made here
"$PY" -m spec_grading.cli --prepare --rubric rubric.toml --cache-dir "$AG/source/grading-cache"{select}
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for each submission: /autograder/submission -> /autograder/results/results.json
# Rubric: {rubric}
AG="${{SPEC_AUTOGRADER_ROOT:-/autograder}}"
cd "$AG/source" || exit 1
mkdir -p "$AG/results"
PY="$AG/venv/bin/python"
[ -x "$PY" ] || PY=python3
exec "$PY" -m spec_grading.cli --impl "$AG/submission" --gradescope "$AG/results/results.json" \\
    --rubric rubric.toml --cache-dir "$AG/source/grading-cache"{select}
"""


def _one_line(rubric: Rubric) -> str:
    return rubric.identity.replace("\n", " ")


def setup_script(rubric: Rubric, select_arg: str = "") -> str:
    """``setup.sh``'s text (tests run it with a fake python)."""
    return SETUP_SH.format(
        torch=TORCH_PIN,
        index=TORCH_INDEX,
        select=select_arg,
        rubric=_one_line(rubric),
        min_major=PYTHON_MIN[0],
        min_minor=PYTHON_MIN[1],
    )


def rubric_text(rubric: Rubric) -> str:
    if rubric.source and Path(rubric.source).is_file():
        return Path(rubric.source).read_text(encoding="utf-8")
    return "# built-in defaults (spec_grading.rubric)\n"


def write_autograder_zip(
    path: Path, manifest: Manifest, rubric: Rubric, *, select: str | None = None, cache_dir=None
) -> Path:
    """Write the autograder zip to ``path`` (atomically); returns its path."""
    if manifest.path is None:
        raise ValueError("the manifest must be saved before it can be shipped")
    select_arg = f" --select {shlex.quote(select)}" if select else ""
    with tempfile.TemporaryDirectory(prefix="autograder-") as tmp:
        root = Path(tmp) / "zip"
        root.mkdir()
        for name in PACKAGES:
            shutil.copytree(package_dir(name), root / name, ignore=SKIP)
        (root / "pyproject.toml").write_text(PYPROJECT)
        (root / "rubric.toml").write_text(rubric_text(rubric), encoding="utf-8")
        (root / "setup.sh").write_text(setup_script(rubric, select_arg))
        (root / "run_autograder").write_text(RUN_AUTOGRADER.format(select=select_arg, rubric=_one_line(rubric)))
        (root / "rubric.toml.sha256").write_text(f"{rubric.sha256 or 'built-in defaults'}  rubric.toml\n")
        shipped = root / "grading-cache" / manifest.key
        shipped.mkdir(parents=True)
        for source in (manifest.path, manifest.path.with_name(manifest.path.name + ".sha256")):
            shutil.copyfile(source, shipped / source.name)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for file in sorted(root.rglob("*")):
                if file.is_file():
                    info = zipfile.ZipInfo(file.relative_to(root).as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
                    executable = file.name in ("setup.sh", "run_autograder")
                    info.external_attr = (0o755 if executable else 0o644) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    z.writestr(info, file.read_bytes())
        partial.replace(path)
    return path
