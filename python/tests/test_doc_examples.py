"""The package's docstrings: every public name of ``tensorwire`` (the module,
each name in ``__all__``, and the public methods and properties of the
classes ``tensorwire`` defines) has an ``Examples`` section, every example
runs and shows what it really prints, and the stubs in ``_native.pyi`` say
word for word what the runtime docstrings (python/src's doc comments) say.

The examples are collected from the runtime objects and from the stub's
text (parsed with ``ast``: the .pyi cannot be imported), deduplicated, and
each run by doctest (ELLIPSIS, NORMALIZE_WHITESPACE) from the repository's
root, where their ``models/build/...`` paths lead, with ``shm://`` names in
a private directory. A failure names the item whose example failed."""

from __future__ import annotations

import ast
import doctest
import gc
import inspect
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import tensorwire as tw
from tensorwire import _native
from twtest import ROOT

STUB = ROOT / "python" / "tensorwire" / "_native.pyi"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
EXAMPLES_HEADING = "Examples\n--------"


def _public_items() -> List[Tuple[str, object]]:
    """(name, object) for everything a user of ``tensorwire`` touches."""
    items: List[Tuple[str, object]] = [("tensorwire", tw)]
    for name in tw.__all__:
        obj = getattr(tw, name)
        items.append((f"tensorwire.{name}", obj))
        if not inspect.isclass(obj) or obj.__module__ != "tensorwire":
            continue
        for attr, member in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(member, property) or inspect.isfunction(member):
                items.append((f"tensorwire.{name}.{attr}", member))
    return items


def _dunder_docstrings() -> List[Tuple[str, object]]:
    """Documented special methods of the classes ``tensorwire`` defines
    (``Outputs.__getitem__``): not required, but run when they have
    examples."""
    found = []
    for name in tw.__all__:
        obj = getattr(tw, name)
        if inspect.isclass(obj) and obj.__module__ == "tensorwire":
            for attr, member in vars(obj).items():
                if (
                    attr.startswith("__")
                    and inspect.isfunction(member)
                    and member.__doc__
                    and ">>>" in member.__doc__
                ):
                    found.append((f"tensorwire.{name}.{attr}", member))
    return found


def _stub_docstrings() -> Dict[str, str]:
    """``_native.X`` / ``_native.X.member`` -> docstring, for every class
    and function the stub declares (``__init__`` aside: pyo3 keeps no
    constructor docstring); a missing docstring is ``""``."""
    tree = ast.parse(STUB.read_text(), filename=str(STUB))
    docs: Dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs[f"_native.{node.name}"] = ast.get_docstring(node) or ""
        for member in node.body:
            if isinstance(member, ast.FunctionDef) and member.name != "__init__":
                docs[f"_native.{node.name}.{member.name}"] = ast.get_docstring(member) or ""
    return docs


def _runtime_native(qualname: str) -> object:
    """The runtime object a stub name (``_native.X[.member]``) stands for."""
    parts = qualname.split(".")[1:]
    obj: object = getattr(_native, parts[0])
    if len(parts) == 2:
        obj = vars(obj)[parts[1]]
    return obj


def _source_of(obj: object) -> str:
    """Where a runtime docstring is written: a file of the package, or
    python/src for the native (pyo3) objects."""
    try:
        return inspect.getsourcefile(obj.fget if isinstance(obj, property) else obj) or "?"
    except TypeError:  # built in: the native module's
        return "python/src (pyo3)"


def _examples() -> List[Tuple[str, str, str]]:
    """(names, source file, docstring) of every docstring holding an
    example, each docstring once (the exceptions' stub docstrings are
    their runtime ones)."""
    seen: Dict[str, int] = {}
    found: List[Tuple[str, str, str]] = []

    def add(name: str, source: str, doc: str) -> None:
        if ">>>" not in doc:
            return
        if doc in seen:
            i = seen[doc]
            names, src, d = found[i]
            found[i] = (f"{names} = {name}", src, d)
            return
        seen[doc] = len(found)
        found.append((name, source, doc))

    for name, obj in _public_items() + _dunder_docstrings():
        add(name, _source_of(obj), inspect.getdoc(obj) or "")
    for name, doc in _stub_docstrings().items():
        add(name, str(STUB), doc)
    return found


def test_every_public_item_has_an_example():
    missing = []
    for name, obj in _public_items():
        doc = inspect.getdoc(obj) or ""
        if EXAMPLES_HEADING not in doc or ">>>" not in doc.split(EXAMPLES_HEADING, 1)[1]:
            missing.append(name)
    assert not missing, f"no `Examples` section with a >>> example in: {missing}"


def test_the_stubs_say_what_the_runtime_docstrings_say():
    stub = _stub_docstrings()
    assert "_native.Model.infer" in stub and "_native.ConnectError" in stub  # parsed
    undocumented = [name for name, doc in stub.items() if not doc]
    assert not undocumented, f"{STUB.name}: no docstring for {undocumented}"
    differ = []
    for name, doc in stub.items():
        runtime = inspect.cleandoc(getattr(_runtime_native(name), "__doc__", None) or "")
        if runtime != doc:
            differ.append(f"{name}:\n--- stub\n{doc}\n--- runtime\n{runtime}")
    assert not differ, (
        f"{STUB.name} and the runtime docstrings (python/src) differ; make them say "
        "the same (the runtime is what help() shows):\n\n" + "\n\n".join(differ)
    )


@pytest.fixture
def doc_env(monkeypatch, tmp_path):
    """The examples' world: the repository's root as the working directory,
    shm:// names in a private directory, no token from the environment."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TENSORWIRE_SHM_DIR", str(tmp_path))
    monkeypatch.delenv("TENSORWIRE_TOKEN", raising=False)


EXAMPLES = _examples()


@pytest.mark.parametrize("names,source,doc", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_the_example_runs(names, source, doc, doc_env):
    test = doctest.DocTestParser().get_doctest(doc, {}, names, source, 0)
    assert test.examples, f"{names}: no example parsed"
    report: List[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    try:
        result = runner.run(test, out=report.append, clear_globs=False)
    finally:
        # Agents an example left running (it failed half-way) stop here.
        test.globs.clear()
        gc.collect()
    assert result.attempted == len(test.examples)
    if result.failed:
        pytest.fail(f"the example of {names} ({source}) failed:\n" + "".join(report), pytrace=False)

