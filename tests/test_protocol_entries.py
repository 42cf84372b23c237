"""The protocol registry (spec_tests/protocol/entries.py): one entry per protocol name, every per-name table
a view of the entries, the export lists equal to the names, and no other table keyed by names in spec_tests/."""

from __future__ import annotations

import ast
import inspect
import itertools
import re
from pathlib import Path

import pytest
import torch

import reference
import student
from spec_tests import inputs, protocol
from spec_tests.harness.diagnosis import catalog, crashes, knobs
from spec_tests.harness.judging.tolerances import KINDS
from spec_tests.harness.subject import subject
from spec_tests.protocol import ENTRIES, ENTRY, PROTOCOL_NAMES

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "spec_tests"

# Dict literals in spec_tests/ keyed by several protocol-name strings that stay where they are, and why.
ALLOWED_NAME_TABLES = {
    # keyed by bug class: some classes share a name's spelling (rmsnorm, causal_mask), a class is not a name
    ("bug_classes.py", "BUG_CLASSES"),
    ("harness/diagnosis/catalog.py", "CLASS_CODES"),
}


def test_every_protocol_name_has_exactly_one_entry_in_protocol_order():
    names = [e.name for e in ENTRIES]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    assert tuple(names) == PROTOCOL_NAMES
    assert set(ENTRY) == set(PROTOCOL_NAMES)


def test_the_name_groups_partition_the_names():
    groups = (protocol.COMPONENT_NAMES, protocol.SAMPLING_NAMES, protocol.MODEL_NAMES, protocol.TRAINING_NAMES)
    assert sum(len(g) for g in groups) == len(PROTOCOL_NAMES) == len(set(PROTOCOL_NAMES))


@pytest.mark.parametrize("name", PROTOCOL_NAMES)
def test_protocol_views_follow_the_entry(name):
    """Each view of ``spec_tests.protocol`` says for ``name`` what the entry's documented fields mean."""
    e = ENTRY[name]
    assert protocol.COMPONENT_OF[name] == e.component
    if e.calls is None:
        assert name not in protocol.MAY_CALL and not e.calls_model_parts
    else:
        parts = tuple(n for n in PROTOCOL_NAMES if ENTRY[n].model_part) if e.calls_model_parts else ()
        assert protocol.MAY_CALL[name] == e.calls + parts
    assert (name in protocol.SUBSTITUTABLE) == e.substitutable
    assert (name in protocol.MODEL_PARTS) == e.model_part
    assert (name in protocol._MODEL_PARTS) == e.model_part
    assert protocol.REFERENCE_ONLY.get(name, frozenset()) == e.reference_only
    assert protocol.STYLE_KEYWORD.get(name) == e.style_keyword
    assert protocol.CATALOG_GROUPS.get(name, ()) == e.catalog_groups
    assert protocol.KNOB_FAMILIES.get(name) == e.knob_family
    assert protocol.TOLERANCE_KIND.get(name) == e.tolerance
    assert (name in protocol.PRECISION_FUNCTIONS) == (e.precision_sample is not None)
    assert (name in protocol.ANY_LEADING) == e.any_leading_dims
    assert (name in protocol.NAN_UNSPECIFIED) == e.nan_rows_unspecified
    assert protocol.CAPABILITY_OF.get(name) == e.capability


@pytest.mark.parametrize("name", PROTOCOL_NAMES)
def test_harness_views_follow_the_entry(name):
    """The harness's tables are the same views: the consumers read the entries, not copies."""
    e = ENTRY[name]
    if e.knob_family is None:
        assert name not in knobs.FAMILIES
    else:
        assert knobs.FAMILIES[name] is getattr(knobs, e.knob_family)
    assert (name in knobs.NAN_UNSPECIFIED) == e.nan_rows_unspecified
    assert catalog.CATALOG_GROUPS.get(name, ()) == e.catalog_groups
    assert (name in crashes.ANY_LEADING) == e.any_leading_dims
    assert subject.STYLE_KEYWORD.get(name) == e.style_keyword


def test_precision_test_is_parametrised_by_the_entries():
    from spec_tests import test_precision

    marks = [m for m in test_precision.test_float64_computed_in_float64.pytestmark if m.name == "parametrize"]
    assert [p.id for p in marks[0].args[1]] == list(protocol.PRECISION_FUNCTIONS)
    assert list(protocol.PRECISION_FUNCTIONS) == [n for n in PROTOCOL_NAMES if ENTRY[n].precision_sample]


@pytest.mark.parametrize("e", ENTRIES, ids=lambda e: e.name)
def test_an_entry_names_what_exists(e):
    """Every name an entry holds resolves: calls are protocol names, the component has its test module, the
    reference's function has each reference-only keyword, the tolerance kind and knob function exist, and each
    catalog group tags some catalogued bug."""
    assert e.component in protocol.COMPONENT_ORDER and (SUITE / f"test_{e.component}.py").is_file()
    assert set(e.calls or ()) <= set(PROTOCOL_NAMES) - {e.name}
    params = inspect.signature(getattr(reference, e.name)).parameters
    assert e.reference_only <= {p for p, v in params.items() if v.kind is v.KEYWORD_ONLY}
    assert e.style_keyword is None or e.style_keyword in e.reference_only
    assert e.tolerance is None or e.tolerance in KINDS
    assert e.knob_family is None or callable(getattr(knobs, e.knob_family))
    assert e.capability is None or e.capability in protocol.V2_CAPABILITIES
    if e.catalog_groups:
        from spec_tests.bugs import CATALOG

        tags = {t for bug in CATALOG.values() for t in bug.components}
        assert set(e.catalog_groups) <= tags


@pytest.mark.parametrize("name", protocol.PRECISION_FUNCTIONS)
def test_precision_sample_is_float64_and_the_reference_computes_it(name):
    args, kwargs = ENTRY[name].precision_sample(inputs.On("cpu"), inputs.S, "cpu")
    floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    assert floats and all(a.dtype == torch.float64 for a in floats)
    assert getattr(reference, name)(*args, **kwargs).dtype == torch.float64


def test_the_export_lists_are_the_protocol_names():
    assert reference.PROTOCOL_NAMES == PROTOCOL_NAMES
    assert [n for n in reference.__all__ if n in ENTRY] == list(PROTOCOL_NAMES)
    assert [n for n in student.__all__ if n in ENTRY] == list(PROTOCOL_NAMES)
    assert all(callable(getattr(student, n)) for n in PROTOCOL_NAMES)


# Keywords of the reference's functions that the protocol does not name and that are nevertheless not
# reference-only (not ``reference_only``): (name, keyword) -> why. None today.
ALLOWED_UNNAMED: dict[tuple[str, str], str] = {}


def protocol_rows() -> dict[str, list[str]]:
    """name -> the parameters of its signature row in docs/protocol.md (``| `name` | `(...)` | ...``)."""
    rows = {}
    for line in (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] not in ENTRY or not cells[1].startswith("("):
            continue
        depths = itertools.accumulate({"(": 1, ")": -1}.get(ch, 0) for ch in cells[1])
        end = next(i for i, depth in enumerate(depths) if depth == 0)  # the parenthesis that closes the first
        args = ast.parse(f"def f{cells[1][: end + 1]}: pass").body[0].args
        rows[cells[0]] = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return rows


def amendments() -> dict[int, str]:
    """number -> the text of that amendment of docs/protocol.md (``N. **...``, up to the next one)."""
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    return {int(n): body for n, body in re.findall(r"(?ms)^(\d+)\. (\*\*.*?)(?=^\d+\. \*\*|^## |\Z)", text)}


def test_the_protocol_rows_are_read():
    rows = protocol_rows()
    assert set(rows) == set(PROTOCOL_NAMES), sorted(set(PROTOCOL_NAMES) - set(rows))
    assert rows["multihead_self_attention"] == [
        "x", "wq", "wk", "wv", "wo", "n_heads", "n_kv_heads", "theta", "positions"
    ]  # fmt: skip
    assert rows["build_model"] == ["config", "state_dict"] and rows["kv_cache_bytes"][-1] == "dtype"
    assert "Reference-only options" in amendments()[6] and "attention_mask=None" in amendments()[23]


@pytest.mark.parametrize("name", PROTOCOL_NAMES)
def test_every_reference_keyword_is_the_protocols_reference_only_or_allowed(name):
    """Each parameter of the reference's function is the protocol's (its signature row, or an amendment in
    the entry's ``amended_keywords`` whose text names it), ``reference_only`` in its entry (an implementation is
    never called with it), or deliberately allowed (``ALLOWED_UNNAMED``, with the reason): a keyword added
    to the reference that nobody lists fails here. The protocol's own parameters are never refused."""
    e = ENTRY[name]
    reference_params = list(inspect.signature(getattr(reference, name)).parameters)
    row = protocol_rows()[name]
    amended = e.amended_keywords
    allowed = {kw for fn, kw in ALLOWED_UNNAMED if fn == name}
    missing = [p for p in row if p not in reference_params]
    assert missing == [], f"{name}: the protocol's parameters {missing} are not the reference's"
    unlisted = [p for p in reference_params if p not in {*row, *amended, *e.reference_only, *allowed}]
    assert unlisted == [], (
        f"{name}: the reference's {unlisted} are not in the protocol's row: list each in the entry's reference_only "
        "(spec_tests/protocol/entries.py), or as the protocol's in its amended_keywords (with the amendment that "
        "names it in docs/protocol.md), or in ALLOWED_UNNAMED with the reason"
    )
    refused_protocol = sorted(e.reference_only & {*row, *amended})
    assert refused_protocol == [], f"{name}: protocol keywords {refused_protocol} are listed as reference-only"
    assert not allowed & ({*row, *amended} | e.reference_only), f"{name}: {allowed} is listed twice"
    for kw, number in amended.items():
        text = amendments().get(number, "")
        assert kw in reference_params, f"{name}: amended_keywords names {kw}=, which the reference does not have"
        assert name in text and f"{kw}=" in text, f"amendment {number} of docs/protocol.md names no {name}(..., {kw}=)"
    for kw in allowed:
        assert kw in reference_params, f"{name}: ALLOWED_UNNAMED names {kw}=, which the reference does not have"


def name_tables(source: str) -> list[tuple[int, str, list[str]]]:
    """``[(line, target, keys)]``: dict literals (``{...}``, ``dict.fromkeys((...), v)``, ``**`` splats of
    those) whose string keys hold two or more protocol names; ``target`` is the assigned name, if any."""
    names = set(PROTOCOL_NAMES)

    def keys(node) -> list[str]:
        if isinstance(node, ast.Dict):
            out = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:
                    out += keys(v)
            return out
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "fromkeys"
            and node.args
            and isinstance(node.args[0], (ast.Tuple, ast.List, ast.Set))
        ):
            return [k.value for k in node.args[0].elts if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        return []

    targets = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    targets[id(node.value)] = t.id
    found = []
    for node in ast.walk(tree):
        hit = [k for k in keys(node) if k in names]
        if len(hit) >= 2:
            found.append((node.lineno, targets.get(id(node), "?"), hit))
    return found


def test_the_scan_finds_a_table_keyed_by_names():
    src = 'T = {"rmsnorm": 1, "layernorm": 2}\nU = {**dict.fromkeys(("rope", "silu"), 1)}\nV = {"rmsnorm": 1, "x": 2}\n'
    assert [(line, target) for line, target, _ in name_tables(src)] == [(1, "T"), (2, "U"), (2, "?")]


def test_no_other_module_keys_a_table_by_protocol_names():
    """Per-name facts live in the entries: a dict literal keyed by protocol names elsewhere in spec_tests/ is
    a second home for them (allowed only in ``ALLOWED_NAME_TABLES``, with the reason there)."""
    found, allowed = [], set()
    for path in sorted(SUITE.rglob("*.py")):
        rel = path.relative_to(SUITE).as_posix()
        if rel.startswith("protocol/"):
            continue
        for line, target, hit in name_tables(path.read_text(encoding="utf-8")):
            if (rel, target) in ALLOWED_NAME_TABLES:
                allowed.add((rel, target))
            else:
                found.append(f"spec_tests/{rel}:{line} {target} keyed by {hit}")
    assert found == [], "move these per-name facts into spec_tests/protocol/entries.py:\n" + "\n".join(found)
    assert allowed == ALLOWED_NAME_TABLES, f"stale allowances: {sorted(ALLOWED_NAME_TABLES - allowed)}"
