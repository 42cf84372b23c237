"""The Gradescope autograder zip (``spec-grade --gradescope-zip autograder.zip``).

Gradescope unpacks the zip into ``/autograder/source``, runs ``setup.sh`` once (as root) to build
the image, and ``run_autograder`` for each submission (uploaded to ``/autograder/submission``),
expecting ``/autograder/results/results.json``. The zip holds:

- ``setup.sh``: installs bubblewrap (the sandbox), the CPU build of torch from PyTorch's CPU index,
  and the project; then prepares the manifest (a no-op when the shipped one matches the installed
  versions);
- ``run_autograder``: grades the submission into ``results.json`` with the zip's rubric;
- the project: ``reference/``, ``spec_tests/`` (with the bug catalog, for diagnosis), ``student/``,
  ``spec_grading/`` and a ``pyproject.toml`` that installs them;
- ``rubric.toml`` and the prepared manifest (``grading-cache/<key>/manifest.json`` + SHA-256).

``SPEC_AUTOGRADER_ROOT`` (default ``/autograder``) moves every ``/autograder`` path, and
``SPEC_AUTOGRADER_SKIP_INSTALL=1`` skips ``setup.sh``'s installs: both for testing the zip outside
Gradescope (``tests/test_grading_gradescope.py``).
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
"spec_tests.harness.plugin" = "spec_tests.harness.plugin"

[project.scripts]
spec-grade = "spec_grading.cli:main"

[tool.setuptools.packages.find]
where = ["."]
include = ["reference*", "spec_tests*", "student*", "spec_grading*"]
"""

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
set -euo pipefail
AG="${{SPEC_AUTOGRADER_ROOT:-/autograder}}"
cd "$AG/source"
if [ "${{SPEC_AUTOGRADER_SKIP_INSTALL:-0}}" != "1" ]; then
    apt-get update
    apt-get install -y bubblewrap
    python3 -m pip install {torch} --index-url {index}
    python3 -m pip install .
fi
# the shipped manifest is used when it matches the installed versions; otherwise it is made here
python3 -m spec_grading.cli --prepare --rubric rubric.toml --cache-dir "$AG/source/grading-cache"{select}
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for each submission: /autograder/submission -> /autograder/results/results.json
AG="${{SPEC_AUTOGRADER_ROOT:-/autograder}}"
cd "$AG/source" || exit 1
mkdir -p "$AG/results"
exec python3 -m spec_grading.cli --impl "$AG/submission" --gradescope "$AG/results/results.json" \\
    --rubric rubric.toml --cache-dir "$AG/source/grading-cache"{select}
"""


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
        (root / "setup.sh").write_text(SETUP_SH.format(torch=TORCH_PIN, index=TORCH_INDEX, select=select_arg))
        (root / "run_autograder").write_text(RUN_AUTOGRADER.format(select=select_arg))
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
