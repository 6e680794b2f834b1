"""The import layering of the package: no circles, and every lazy import says why.

Read from the source with :mod:`ast` (nothing is imported): for each module of
``symquad`` the imports of other ``symquad`` modules at module level and inside
functions, and the third-party packages each module imports at module level.

* No module-level circle (an import cycle at load time).
* No circle either once the function-local imports count as edges, except
  through the few upward edges listed in ``UPWARD`` with their reason.
* A function-local import of a package module carries ``# lazy: <pkg>[, <pkg>]``
  naming the heavy package (SymPy, Dask, matplotlib, ...) it keeps out of the
  importing module's import path, and that claim is checked: the target pulls
  the package in at module level and the importing module does not.  The one
  other reason is an edge listed in ``UPWARD``: such an import carries
  ``# upward: <why>``, and that claim is checked too (every target is an
  ``UPWARD`` edge of the importing module).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "symquad"
#: Packages a lazy import may keep out of an import path.
HEAVY = ("sympy", "dask", "distributed", "matplotlib", "numba", "scipy", "pandas", "pyarrow")
_LAZY = re.compile(r"#[ \t]*lazy:[ \t]*([\w][\w, .\t-]*)")

#: (importer, target) -> why the lower module calls up into the higher one.
UPWARD = {
    ("symquad.studies.validation_report", "symquad.plotting"):
        "a ValidationReport draws and saves its own figures on request (report.figures(), "
        "report.save(figures=True)); matplotlib is imported only then",
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _scan():
    files = {_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    top = defaultdict(set)        # module -> package modules imported at module level
    third = defaultdict(set)      # module -> third-party packages imported at module level
    local = []                    # (module, line, targets, comment text)

    def resolve(mod, node, is_pkg):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = mod.split(".")[: None if is_pkg else -1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                     for a in node.names]
        out = set()
        for n in names:
            if n.split(".")[0] != "symquad":
                out.add("3rd:" + n.split(".")[0])
                continue
            while n and n not in files:
                n = n.rpartition(".")[0]
            if n and n != mod:
                out.add(n)
        return out

    for mod, path in files.items():
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        is_pkg = path.name == "__init__.py"

        def walk(node, in_func, guarded):
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.Import, ast.ImportFrom)):
                    targets = resolve(mod, ch, is_pkg)
                    pkg = {t for t in targets if not t.startswith("3rd:")}
                    if in_func:
                        if pkg:
                            text = "\n".join(lines[ch.lineno - 2: ch.end_lineno])
                            local.append((mod, ch.lineno, pkg, text))
                    elif not guarded:
                        top[mod] |= pkg
                        third[mod] |= {t[4:] for t in targets if t.startswith("3rd:")}
                func = in_func or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda))
                # `if TYPE_CHECKING:` and `try: import x except ImportError` are not load-time
                # dependencies of the package's own modules in the sense checked here
                tc = guarded or (isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test))
                walk(ch, func, tc)

        walk(ast.parse(src), False, False)
    return files, top, third, local


FILES, TOP, THIRD, LOCAL = _scan()


def _cycles(graph) -> list:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(FILES):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop(); on.discard(w); comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _closure(mod) -> set:
    """Third-party packages loaded by ``import mod`` (module-level imports, transitively)."""
    seen, todo, pkgs = set(), [mod], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        pkgs |= THIRD.get(m, set())
        todo.extend(TOP.get(m, ()))
        if "." in m:        # importing a.b.c runs a/__init__ and a/b/__init__ first
            todo.append(m.rpartition(".")[0])
    return pkgs


def _heavy(pkgs) -> set:
    return {p for p in pkgs if p in HEAVY}


def test_the_scan_sees_the_package():
    # a scanner that found nothing would pass every test below
    assert len(FILES) > 50 and sum(map(len, TOP.values())) > 100 and len(LOCAL) > 10
    assert "sympy" in _closure("symquad.symbolic.derive")
    assert "symquad.spec" in TOP["symquad"]


def test_no_module_level_import_cycle():
    assert _cycles(TOP) == []


def test_no_import_cycle_through_function_local_imports():
    graph = defaultdict(set, {m: set(t) for m, t in TOP.items()})
    for mod, _, targets, _ in LOCAL:
        graph[mod] |= {t for t in targets if (mod, t) not in UPWARD}
    assert _cycles(graph) == []
    present = {(m, t) for m, _, ts, _ in LOCAL for t in ts}
    assert set(UPWARD) <= present, "stale UPWARD entry"


def test_the_cycle_check_can_fail():
    graph = defaultdict(set, {m: set(t) for m, t in TOP.items()})
    graph["symquad.spec"].add("symquad.numeric.simulate")
    assert any("symquad.spec" in c for c in _cycles(graph))


def _reason(text):
    m = _LAZY.search(text)
    return None if m is None else {p.strip() for p in m.group(1).split(",") if p.strip()}


def _wrong_reasons(local) -> list:
    wrong = []
    for mod, line, targets, text in local:
        named = _reason(text)
        if named is None:
            continue
        kept_out = set().union(*(_heavy(_closure(t)) for t in targets)) - _closure(mod)
        if not named or not named <= set(HEAVY) or not named <= kept_out:
            wrong.append(f"{mod}:{line} says lazy: {sorted(named)}, but it keeps out "
                         f"{sorted(kept_out) or 'nothing'}")
    return wrong


def test_lazy_reasons_are_true():
    assert _wrong_reasons(LOCAL) == []


def test_a_false_lazy_reason_is_caught():
    # symquad.spec pulls in no SymPy: a lazy import of it guards nothing
    fake = [("symquad.numeric.simulate", 1, {"symquad.spec"}, "# lazy: sympy\nfrom ..spec import Model")]
    assert len(_wrong_reasons(fake)) == 1
    ok = [("symquad.numeric.kernels", 1, {"symquad.symbolic.derive"}, "# lazy: sympy\nimport x")]
    assert _wrong_reasons(ok) == []


_UPWARD_NOTE = re.compile(r"#[ \t]*upward:")


def _wrong_upward_notes(local) -> list:
    """``# upward:`` on an import with a target that is not an ``UPWARD`` edge of its module."""
    return [f"{mod}:{line} says upward, but {sorted(t for t in targets if (mod, t) not in UPWARD)} "
            f"is not in UPWARD" for mod, line, targets, text in local
            if _UPWARD_NOTE.search(text) and any((mod, t) not in UPWARD for t in targets)]


def test_upward_notes_are_true():
    assert _wrong_upward_notes(LOCAL) == []


def test_a_false_upward_note_is_caught():
    fake = [("symquad.studies.validation", 1, {"symquad.plotting"},
             "# upward: figures\nfrom ..plotting import FORMATS")]
    assert len(_wrong_upward_notes(fake)) == 1
    ok = [("symquad.studies.validation_report", 1, {"symquad.plotting"},
           "# upward: figures\nfrom ..plotting import FORMATS")]
    assert _wrong_upward_notes(ok) == []


def _unexplained(local) -> list:
    return [f"{mod}:{line}" for mod, line, _, text in local
            if _reason(text) is None and not _UPWARD_NOTE.search(text)]


def test_function_local_imports_say_why():
    assert _unexplained(LOCAL) == [], (
        "function-local imports of symquad modules need '# lazy: <package>' (the heavy "
        "package they keep out), '# upward: <why>' (an UPWARD edge) or a module-level import")
    # and the check sees one without a reason
    assert _unexplained([("symquad.cli.sweep", 1, {"symquad.spec"},
                          "def f():\n    from ..spec import model_fields")]) == ["symquad.cli.sweep:1"]


def test_numeric_import_path_stays_free_of_sympy_and_dask():
    """The claim of symquad/__init__.py, measured in a fresh interpreter."""
    import subprocess
    code = ("import sys, symquad, symquad.numeric.kernels, symquad.numeric.integrate, "
            "symquad.numeric.simulate, symquad.numeric.sde, symquad.studies.validation; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sympy', 'dask', 'distributed', 'matplotlib'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT.parent, check=True).stdout.strip()
    assert out == "[]"
    # and the static view agrees (so the lazy-reason check above rests on the same facts)
    for mod in ("symquad.numeric.kernels", "symquad.numeric.simulate",
                "symquad.studies.validation"):
        assert not _heavy(_closure(mod)) & {"sympy", "dask", "matplotlib"}, mod
