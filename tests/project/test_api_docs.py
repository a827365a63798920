"""Every public function and class has a numpy-style docstring with a runnable example.

The public API is the names in ``__all__`` of the public modules. A function or class must
have a docstring with a ``>>>`` example (exceptions: a docstring is enough) and, when it takes
parameters, a numpy-style ``Parameters`` section that names each of them. The examples
themselves run in tests/project/test_doctests.py, whose MODULES must hold every module that
defines a public object; docs/api.rst must document every public module.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from tests.project.test_doctests import MODULES as DOCTEST_MODULES

PUBLIC_MODULES = ["dspk", "dspk.backend", "dspk.linalg", "dspk.ops", "dspk.match",
                  "dspk.detect", "dspk.io", "dspk.pipeline", "dspk.pipeline.job", "dspk.dask",
                  "dspk.spikeinterface",
                  "dspk.motion"]
API_RST = Path(__file__).resolve().parents[2] / "docs" / "api.rst"


def public_objects() -> list[tuple[str, str, object]]:
    """(module, name, object) for every function and class in the public ``__all__``s."""
    found = []
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                found.append((modname, name, obj))
    return found


def own_doc(obj: object) -> str:
    """The object's own docstring, cleaned (not one inherited from a base class)."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def parameters(obj: object) -> list[str]:
    """The names a caller passes (the constructor's for a class), as a docstring names them."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):   # pragma: no cover - builtins without a signature
        return []
    names = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        names.append(p.name)
    return names


def section(doc: str, title: str) -> str | None:
    """The text of a numpy-style section (``Title`` underlined with dashes), or None."""
    m = re.search(rf"^{title}\n-{{{len(title)}}}\n(.*?)(?=^\S[^\n]*\n-{{3,}}\n|\Z)", doc,
                  re.M | re.S)
    return None if m is None else m.group(1)


def problems(obj: object) -> list[str]:
    doc = own_doc(obj)
    if not doc:
        return ["no docstring"]
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return []                              # exceptions: a docstring is enough
    found = []
    if ">>>" not in doc:
        found.append("no '>>>' example")
    elif section(doc, "Examples") is None:
        found.append("the example is not in an 'Examples' section")
    names = parameters(obj)
    if names:
        params = section(doc, "Parameters")
        if params is None:
            found.append(f"no 'Parameters' section (takes {', '.join(names)})")
        else:
            missing = [n for n in names if not re.search(rf"\b{re.escape(n)}\b", params)]
            if missing:
                found.append(f"'Parameters' does not name {', '.join(missing)}")
    return found


def test_the_public_api_is_not_empty():
    objs = public_objects()
    assert len(objs) > 60
    assert {m for m, _, _ in objs} == set(PUBLIC_MODULES)


def test_every_public_function_and_class_is_documented_with_an_example():
    bad = []
    for modname, name, obj in public_objects():
        for why in problems(obj):
            bad.append(f"{modname}.{name}: {why}")
    assert not bad, "public API without a numpy-style docstring and example:\n" + \
        "\n".join(bad)


def test_the_doctests_cover_every_module_that_defines_public_objects():
    defining = {obj.__module__ for _, _, obj in public_objects()}
    missing = sorted(defining - set(DOCTEST_MODULES))
    assert not missing, f"add to tests/project/test_doctests.py MODULES: {missing}"


def test_the_api_reference_documents_every_public_module():
    if not API_RST.exists():
        pytest.skip("docs/api.rst is not in this checkout")
    text = API_RST.read_text()
    documented = set(re.findall(r"^\.\. automodule:: (\S+)", text, re.M))
    missing = sorted(set(PUBLIC_MODULES) - documented)
    assert not missing, f"docs/api.rst has no automodule for {missing}"
    # the top level's re-exports are listed in its section, linked to where they are documented
    top = text.split("\ndspk\n----\n", 1)[1].split("\ndspk.linalg\n", 1)[0]
    unlisted = []
    for modname, name, obj in public_objects():
        if modname != "dspk":
            continue
        homes = [m for m, n, o in public_objects() if m != "dspk" and n == name and o is obj]
        if not any(f"{home}.{name}`" in top for home in homes):
            unlisted.append(name)
    assert not unlisted, f"the dspk section of docs/api.rst does not list {unlisted}"


@pytest.mark.parametrize("doc, expected", [
    ("Summary.\n\nParameters\n----------\nx : int\n\nExamples\n--------\n>>> 1\n1", []),
    ("Summary.\n\nExamples\n--------\n>>> 1\n1", ["no 'Parameters' section (takes x)"]),
    ("Summary.\n\nParameters\n----------\ny : int\n\nExamples\n--------\n>>> 1\n1",
     ["'Parameters' does not name x"]),
    ("Summary.\n\nParameters\n----------\nx : int", ["no '>>>' example"]),
])
def test_the_checker_itself(doc, expected):
    def f(x):
        pass

    f.__doc__ = doc
    assert problems(f) == expected
