"""The public API is documented, the examples use only it, and no file cites outside documents."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

import symquad as sq

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_public_name_resolves():
    for name in sq.__all__:
        assert getattr(sq, name) is not None, name


def test_api_reference_documents_every_public_name():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^###+ `(\w+)", text, flags=re.M))
    # several names may share one heading: `a(...)`, `b(...)`
    for line in re.findall(r"^###+ (.*)$", text, flags=re.M):
        headings.update(re.findall(r"`(\w+)[`(]", line))
    missing = sorted(set(sq.__all__) - headings)
    assert not missing, f"docs/api.md has no entry for {missing}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: getattr(p, "name", str(p)))
def test_examples_use_only_public_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("symquad"):
            raise AssertionError(f"{path.name}:{node.lineno} imports from {node.module}; "
                                 "examples use `import symquad as sq` only")
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name == "symquad" or not alias.name.startswith("symquad"), \
                    f"{path.name}:{node.lineno} imports {alias.name}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "sq":
            assert node.attr in sq.__all__, f"{path.name}:{node.lineno}: sq.{node.attr} is not public"


def _repository_files():
    """Tracked and untracked-but-not-ignored files (git), else a walk without hidden folders."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        return [path for path in ROOT.rglob("*") if not any(
            part.startswith(".") or part.endswith(".egg-info")
            for part in path.relative_to(ROOT).parts)]


def test_no_file_cites_documents_outside_the_repository():
    pattern = re.compile(r"\bSPEC(\.md| result)\b")
    offenders = []
    for path in _repository_files():
        if path.suffix not in {".py", ".md", ".tex", ".toml", ".txt"} or not path.is_file() \
                or path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n + 1}")
    assert not offenders, offenders
