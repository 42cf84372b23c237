"""The rubric: how many points each test is worth, who sees it, and how it is tagged.

Read from a TOML file (default ``rubric.toml`` at the repository root; see its comments)::

    total = 100                         # the full rubric is worth this many points

    [components]                        # relative weights of the components (test modules'
    attention = 16                      # ``component(...)`` markers); normalised over the
    ...                                 # components present, so they always sum to ``total``

    [defaults]
    component_weight = 5                # a component not listed above
    test_weight = 1                     # a test function inside its component; its
                                        # parametrised cases share it equally
    visibility = "visible"

    [gradescope]
    hidden_message = "..."              # shown instead of the output of concealed tests
    conceal = ["hidden", "after_due_date", "after_published"]

    [limits]
    test_timeout_s = 60                 # per test
    run_timeout_s = 1200                # the whole submission
    memory_mb = 4096                    # address space of the process running graded code

    [capabilities]
    required = ["gqa", ...]             # what every submission must support (default: all of
                                        # spec_tests/protocol/names.py CAPABILITIES); tests needing
                                        # others are not graded. A submission's own
                                        # CAPABILITIES (and SPEC_XFAILS) are ignored.

    [assignment]                        # what the course's assignment asks for (all optional)
    name = "Assignment 1"               # shown in every report
    families = ["llama"]                # model families graded (default both): tests of another
                                        # family are not graded at all (not "not provided")
    not_graded = ["layernorm", ...]     # protocol names the assignment does not ask for: tests
                                        # that judge or use one are not graded

    [[tests]]                           # overrides, applied in order, later wins
    match = "test_generation.py::*"     # fnmatch on "file::function[params]"; or any of
    component = "generation"            #   component = "...", bug_class = "...", name = "rmsnorm"
    weight = 2                          # sets the test function's weight
    visibility = "after_due_date"
    graded = false                      # the selected cases are not graded (say, float64
                                        # precision where the course computes in float32)

Which rubric: ``--rubric PATH``, else the project's ``rubric.toml`` (next to the grader package
in a checkout, or shipped inside it), else the built-in defaults; never the working directory's.
Every output names the rubric it used: its path and the SHA-256 of its bytes (``Rubric.identity``).

Tests can also carry ``@pytest.mark.points(w)`` (weight) and ``@pytest.mark.visibility(v)``; the
rubric file's ``[[tests]]`` entries take precedence over markers.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from spec_tests.protocol import ALL_CAPABILITIES, ALL_FAMILIES, PROTOCOL_NAMES

BUILT_IN = "(built-in defaults: every component weighs the same)"
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
DEFAULT_HIDDEN_MESSAGE = "This test is hidden: it counts towards your score, but its details are not shown."


class RubricError(ValueError):
    """The rubric file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Override:
    match: str | None = None
    component: str | None = None
    bug_class: str | None = None
    weight: float | None = None
    visibility: str | None = None
    name: str | None = None
    graded: bool | None = None

    def applies(self, test: dict) -> bool:
        test_id = test["id"]
        if self.match is not None and not (
            test_id == self.match  # an exact id, brackets and all (fnmatch reads [...] as a set)
            or fnmatch.fnmatchcase(test_id, self.match)
            or fnmatch.fnmatchcase(f"{test['file']}::{test['function']}", self.match)
        ):
            return False
        if self.component is not None and test["component"] != self.component:
            return False
        if self.bug_class is not None and self.bug_class not in test["bug_classes"]:
            return False
        if self.name is not None and self.name not in test.get("subjects", ()):
            return False
        return True


@dataclass
class Rubric:
    total: float = 100.0
    components: dict[str, float] = field(default_factory=dict)
    component_weight: float = 5.0
    test_weight: float = 1.0
    visibility: str = "visible"
    hidden_message: str = DEFAULT_HIDDEN_MESSAGE
    conceal: tuple[str, ...] = ("hidden", "after_due_date", "after_published")
    test_timeout_s: float = 60.0
    run_timeout_s: float = 1200.0
    memory_mb: int = 4096
    capabilities: tuple[str, ...] = ALL_CAPABILITIES
    overrides: list[Override] = field(default_factory=list)
    source: str = BUILT_IN
    sha256: str = ""
    assignment: str = ""
    families: tuple[str, ...] = ALL_FAMILIES
    not_graded: tuple[str, ...] = ()

    @property
    def identity(self) -> str:
        """What every output says about the rubric: its path and digest (or the built-in defaults)."""
        return f"{self.source} (sha256 {self.sha256})" if self.sha256 else self.source

    def metadata(self) -> dict:
        return {"path": self.source, "sha256": self.sha256, "assignment": self.assignment}

    def ungraded_reason(self, test: dict) -> str | None:
        """Why the assignment does not grade ``test`` (a manifest entry), or ``None`` if it does."""
        lacking = [n for n in (*test.get("subjects", ()), *test.get("uses", ())) if n in self.not_graded]
        if lacking:
            return f"the assignment does not ask for {', '.join(dict.fromkeys(lacking))}"
        graded = None
        for o in self.overrides:
            if o.graded is not None and o.applies(test):
                graded = o.graded
        return "the rubric's [[tests]] entries do not grade it" if graded is False else None

    def select(self, tests: list[dict]) -> tuple[list[dict], list[tuple[dict, str]]]:
        """``(graded, [(test, why not graded), ...])`` of manifest entries, in order."""
        kept, dropped = [], []
        for t in tests:
            why = self.ungraded_reason(t)
            (kept.append(t) if why is None else dropped.append((t, why)))
        return kept, dropped


def _number(value, where: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RubricError(f"{where} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise RubricError(f"{where} must be {'positive' if positive else 'non-negative'}, got {value!r}")
    return float(value)


def _visibility(value, where: str) -> str:
    if value not in VISIBILITIES:
        raise RubricError(f"{where} must be one of {', '.join(VISIBILITIES)}, got {value!r}")
    return value


def load_rubric(path) -> Rubric:
    """Parse and validate a rubric file (``RubricError`` naming the problem)."""
    path = Path(path).resolve()
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RubricError(f"rubric {path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise RubricError(f"rubric {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RubricError(f"rubric {path}: {exc}") from None
    where = str(path)
    known = {"total", "components", "defaults", "gradescope", "limits", "capabilities", "tests", "assignment"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RubricError(f"rubric {where}: unknown keys {unknown}; known: {sorted(known)}")
    r = Rubric(source=where, sha256=hashlib.sha256(raw).hexdigest())
    r.assignment, r.families, r.not_graded = _assignment(data.get("assignment", {}), where)
    r.total = _number(data.get("total", 100), f"{where}: total", positive=True)
    comps = data.get("components", {})
    if not isinstance(comps, dict):
        raise RubricError(f"{where}: [components] must be a table of name = weight")
    r.components = {str(k): _number(v, f"{where}: components.{k}") for k, v in comps.items()}
    defaults = data.get("defaults", {})
    r.component_weight = _number(
        defaults.get("component_weight", r.component_weight), f"{where}: defaults.component_weight"
    )
    r.test_weight = _number(defaults.get("test_weight", r.test_weight), f"{where}: defaults.test_weight")
    r.visibility = _visibility(defaults.get("visibility", r.visibility), f"{where}: defaults.visibility")
    gs = data.get("gradescope", {})
    r.hidden_message = str(gs.get("hidden_message", r.hidden_message))
    conceal = gs.get("conceal", list(r.conceal))
    if not isinstance(conceal, list):
        raise RubricError(f"{where}: gradescope.conceal must be a list of visibilities")
    r.conceal = tuple(_visibility(v, f"{where}: gradescope.conceal") for v in conceal)
    limits = data.get("limits", {})
    r.test_timeout_s = _number(
        limits.get("test_timeout_s", r.test_timeout_s), f"{where}: limits.test_timeout_s", positive=True
    )
    r.run_timeout_s = _number(
        limits.get("run_timeout_s", r.run_timeout_s), f"{where}: limits.run_timeout_s", positive=True
    )
    r.memory_mb = int(_number(limits.get("memory_mb", r.memory_mb), f"{where}: limits.memory_mb"))
    r.capabilities = _capabilities(data.get("capabilities", {}), where)
    tests = data.get("tests", [])
    if not isinstance(tests, list):
        raise RubricError(f"{where}: tests must be an array of tables ([[tests]])")
    for i, entry in enumerate(tests):
        w = f"{where}: tests[{i}]"
        if not isinstance(entry, dict):
            raise RubricError(f"{w}: must be a table, got {entry!r}")
        allowed = {"match", "component", "bug_class", "name", "weight", "visibility", "graded"}
        bad = sorted(set(entry) - allowed)
        if bad:
            raise RubricError(f"{w}: unknown keys {bad}; allowed: {sorted(allowed)}")
        if not {"match", "component", "bug_class", "name"} & set(entry):
            raise RubricError(f"{w}: needs a selector (match, component, bug_class or name)")
        if not {"weight", "visibility", "graded"} & set(entry):
            raise RubricError(f"{w}: sets nothing (weight, visibility or graded)")
        if "graded" in entry and not isinstance(entry["graded"], bool):
            raise RubricError(f"{w}: graded must be true or false, got {entry['graded']!r}")
        if "name" in entry and entry["name"] not in PROTOCOL_NAMES:
            raise RubricError(f"{w}: name must be a protocol name, got {entry['name']!r}")
        r.overrides.append(
            Override(
                match=entry.get("match"),
                component=entry.get("component"),
                bug_class=entry.get("bug_class"),
                weight=_number(entry["weight"], f"{w}: weight") if "weight" in entry else None,
                visibility=_visibility(entry["visibility"], f"{w}: visibility") if "visibility" in entry else None,
                name=entry.get("name"),
                graded=entry.get("graded"),
            )
        )
    return r


def _assignment(table, where: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    if not isinstance(table, dict):
        raise RubricError(f"{where}: [assignment] must be a table")
    bad = sorted(set(table) - {"name", "families", "not_graded"})
    if bad:
        raise RubricError(f"{where}: assignment: unknown keys {bad}; allowed: ['families', 'name', 'not_graded']")
    name = table.get("name", "")
    if not isinstance(name, str):
        raise RubricError(f"{where}: assignment.name must be a string, got {name!r}")
    families = table.get("families", list(ALL_FAMILIES))
    if not isinstance(families, list) or not families or not all(isinstance(f, str) for f in families):
        raise RubricError(f"{where}: assignment.families must be a non-empty list of names, got {families!r}")
    unknown = [f for f in families if f not in ALL_FAMILIES]
    if unknown:
        raise RubricError(f"{where}: assignment.families names unknown families {unknown}; known: {list(ALL_FAMILIES)}")
    names = table.get("not_graded", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RubricError(f"{where}: assignment.not_graded must be a list of protocol names, got {names!r}")
    unknown = [n for n in names if n not in PROTOCOL_NAMES]
    if unknown:
        raise RubricError(f"{where}: assignment.not_graded names unknown protocol names {unknown}")
    return name, tuple(f for f in ALL_FAMILIES if f in families), tuple(names)


def project_rubric() -> Path | None:
    """The project's own ``rubric.toml``: shipped inside the grader package, or at the root of the
    checkout the grader lives in (``spec_grading/../rubric.toml`` beside ``pyproject.toml``)."""
    here = Path(__file__).resolve().parent
    for candidate, marker in ((here / "rubric.toml", None), (here.parent / "rubric.toml", "pyproject.toml")):
        if candidate.is_file() and (marker is None or (candidate.parent / marker).is_file()):
            return candidate
    return None


def resolve_rubric(path=None) -> Rubric:
    """``--rubric PATH`` if given, else the project's rubric, else the built-in defaults; never a
    ``rubric.toml`` that happens to be in the working directory."""
    if path:
        return load_rubric(path)
    found = project_rubric()
    return load_rubric(found) if found is not None else Rubric()


def _capabilities(table, where: str) -> tuple[str, ...]:
    if not isinstance(table, dict):
        raise RubricError(f"{where}: [capabilities] must be a table with required = [...]")
    bad = sorted(set(table) - {"required"})
    if bad:
        raise RubricError(f"{where}: capabilities: unknown keys {bad}; allowed: ['required']")
    required = table.get("required", list(ALL_CAPABILITIES))
    if not isinstance(required, list) or not all(isinstance(c, str) for c in required):
        raise RubricError(f"{where}: capabilities.required must be a list of names, got {required!r}")
    unknown = [c for c in required if c not in ALL_CAPABILITIES]
    if unknown:
        raise RubricError(
            f"{where}: capabilities.required names unknown capabilities {unknown}; known: {list(ALL_CAPABILITIES)}"
        )
    return tuple(c for c in ALL_CAPABILITIES if c in required)


@dataclass
class GradedTest:
    """One test as graded: identity, how it is shown, and what it is worth."""

    id: str
    component: str
    function: str
    params: str
    name: str
    doc: str
    tags: list[str]
    visibility: str
    max_score: float
    number: str
    subjects: tuple[str, ...] = ()
    rerun: str = ""


DISPLAY_MAX = 90
_CITATION = re.compile(r"\s*\((protocol|course notes|symptoms table|amendment)[^()]*(\([^()]*\)[^()]*)*\)\s*\.?$")


def _balanced(text: str) -> bool:
    depth = {"(": 0, "[": 0}
    closing = {")": "(", "]": "["}
    for ch in text:
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            if depth[closing[ch]] < 0:
                return False
    return not any(depth.values())


def short_name(test: dict) -> str:
    """A test's name for people: its docstring's first sentence without the trailing citation
    ("(protocol: ...)", "(course notes: ...)") when that is short and its brackets balance; else
    its function's name in words. Never a sentence cut in the middle."""
    paragraph = " ".join((test.get("doc") or "").strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=[a-z0-9)\]])\.\s+(?=[A-Z])", paragraph, maxsplit=1)[0]
    sentence = _CITATION.sub("", sentence).rstrip(" .:;,")
    if sentence and len(sentence) <= DISPLAY_MAX and _balanced(sentence):
        return sentence
    return test["function"].removeprefix("test_").replace("_", " ")


def display_name(test: dict) -> str:
    name = short_name(test)
    return f"{name} [{test['params']}]" if test.get("params") else name


def rerun_command(test: dict) -> str:
    """The command a student runs to rerun one test locally: its exact node id (a ``-k`` expression
    would also select every test whose name starts the same)."""
    return f'python -m pytest "spec_tests/{test["id"]}"'


def assign(tests: list[dict], rubric: Rubric) -> list[GradedTest]:
    """Points, visibility, tags and numbers for ``tests`` (manifest entries), in manifest order."""
    order: list[str] = []
    for t in tests:
        if t["component"] not in order:
            order.append(t["component"])
    cw = {c: rubric.components.get(c, rubric.component_weight) for c in order}
    cw_total = sum(cw.values())
    # weights belong to test functions (shared by their cases), visibility to cases;
    # default < marker < rubric overrides (in file order, later wins)
    functions: dict[tuple[str, str], list[dict]] = {}
    for t in tests:
        functions.setdefault((t["file"], t["function"]), []).append(t)
    fn_weight: dict[tuple[str, str], float] = {}
    for key, fn_cases in functions.items():
        marked = [c["points"] for c in fn_cases if c.get("points") is not None]
        weight = marked[0] if marked else rubric.test_weight
        for o in rubric.overrides:
            if o.weight is not None and any(o.applies(c) for c in fn_cases):
                weight = o.weight
        fn_weight[key] = weight
    visibility: dict[str, str] = {}
    for t in tests:
        vis = t.get("visibility") or rubric.visibility
        for o in rubric.overrides:
            if o.visibility is not None and o.applies(t):
                vis = o.visibility
        visibility[t["id"]] = vis
    cases: dict[tuple[str, str], int] = {}
    for t in tests:
        cases[(t["file"], t["function"])] = cases.get((t["file"], t["function"]), 0) + 1
    case_weight = {t["id"]: fn_weight[(t["file"], t["function"])] / cases[(t["file"], t["function"])] for t in tests}
    comp_sum = {c: sum(case_weight[t["id"]] for t in tests if t["component"] == c) for c in order}
    # exact shares, then rounded to cents so that tests sum to their component and components to the total
    comp_cents = apportion(
        [rubric.total * cw[c] / cw_total if cw_total else 0.0 for c in order], round(rubric.total * 100)
    )
    cents: dict[str, int] = {}
    for c, total_cents in zip(order, comp_cents):
        members = [t for t in tests if t["component"] == c]
        shares = [case_weight[t["id"]] / comp_sum[c] * total_cents if comp_sum[c] else 0.0 for t in members]
        cents.update({t["id"]: v for t, v in zip(members, apportion(shares, total_cents if comp_sum[c] else 0))})
    graded, counters = [], {}
    for t in tests:
        c = t["component"]
        points = cents[t["id"]] / 100
        counters[c] = counters.get(c, 0) + 1
        graded.append(
            GradedTest(
                id=t["id"],
                component=c,
                function=t["function"],
                params=t.get("params", ""),
                name=display_name(t),
                doc=t.get("doc", ""),
                tags=list(dict.fromkeys([c, *t["bug_classes"]])),  # Gradescope tags, each once
                visibility=visibility[t["id"]],
                max_score=points,
                number=f"{order.index(c) + 1}.{counters[c]}",
                subjects=tuple(t.get("subjects", ())),
                rerun=rerun_command(t),
            )
        )
    return graded


def apportion(shares: list[float], total: int) -> list[int]:
    """Integers summing to ``total``, proportional to ``shares`` (largest remainder; ties by position)."""
    whole = sum(shares)
    if not shares or whole <= 0:
        return [0] * len(shares)
    exact = [s * total / whole for s in shares]
    base = [int(x) for x in exact]
    left = total - sum(base)
    by_remainder = sorted(range(len(shares)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in by_remainder[:left]:
        base[i] += 1
    return base


def unknown_components(tests: list[dict], rubric: Rubric) -> list[str]:
    present = {t["component"] for t in tests}
    return sorted(set(rubric.components) - present)
