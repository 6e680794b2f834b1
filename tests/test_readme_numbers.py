"""Every measured number the README states names the command that measures it.

The rule (checked on README.md's prose by :func:`problems`):

1. *Prose* is README.md without its fenced code blocks (lines between two ```` ``` ````
   fences). Inline code spans (`` `...` ``) are taken out of the text before numbers are
   looked for, so ``t_max=5.0`` in a code span is code, not a claim; they are kept to find
   commands.
2. The prose is split into *paragraphs* at blank lines, and a paragraph into *sentences* at
   ``.``, ``!`` or ``?`` followed by white space and an upper-case letter, ``(``, ``*``,
   a back-tick or a digit (inline code spans and link targets are masked first, so a dot
   inside them never ends a sentence). A table row or a heading is a sentence of its own.
3. A *measured number* is a decimal number (``25``, ``8.7``, ``1.5``, ``0.024–0.031``)
   followed, after at most one space, by a unit of time (``ns µs us ms s sec min h``,
   ``second(s) minute(s) hour(s) day(s)``), of memory (``kB MB GB KiB MiB GiB``), a ratio
   (``×``, or ``x`` ending a word: ``1.5x``), a percentage (``%``), or a word counting
   tests (``passed failed skipped errors deselected tests xfailed``).
4. A sentence holding a measured number must *name the command that measures it*: it
   contains an inline code span that is a command — it starts (after optional
   ``NAME=value`` environment assignments) with ``symquad``, ``python``, ``pip``,
   ``pytest``, ``.ci/`` or ``benchmarks/`` — or a Markdown link to
   ``docs/benchmarks.md#ANCHOR`` whose section (from the heading or ``<a id>`` named
   ``ANCHOR`` to the next heading) contains such a command.
5. A sentence that links to a section of docs/benchmarks.md states only numbers that this
   section states too (so a benchmark rerun that changes the table makes the README's
   sentence fail until it is updated).

A violation is reported as ``(line, sentence, reason)``, `line` the first line of the
sentence's paragraph. The tests below run the
rule on the README and on synthetic lines that must fail, so the rule can fail.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

_NUMBER = r"\d+(?:\.\d+)?(?:\s?[–-]\s?\d+(?:\.\d+)?)?"
_UNIT = (r"(?:ns|µs|us|ms|sec|s|min|h|seconds?|minutes?|hours?|days?"
         r"|kB|MB|GB|KiB|MiB|GiB|×|x|%"
         r"|passed|failed|skipped|errors?|deselected|tests|xfailed)")
MEASURED = re.compile(rf"(?<![\w.]){_NUMBER} ?{_UNIT}(?![\w])")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_COMMAND = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S+\s+)*(?:symquad|python|pip|pytest|\.ci/|benchmarks/)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*`\d])")


def is_command(span):
    """True when the inline code `span` is a shell command (rule 4)."""
    return bool(_COMMAND.match(span.strip()))


def prose_lines(text):
    """``(line number, line)`` of the prose: the text without its fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def sentences(text):
    """``(line number, sentence)`` of the prose, split as rule 2 says."""
    paragraphs, current = [], []
    for number, line in prose_lines(text):
        stripped = line.strip()
        if not stripped:
            if current:
                paragraphs.append(current)
            current = []
        elif stripped.startswith(("|", "#")):          # a table row or a heading: its own
            if current:
                paragraphs.append(current)
            paragraphs.append([(number, stripped)])
            current = []
        else:
            current.append((number, stripped))
    if current:
        paragraphs.append(current)
    out = []
    for paragraph in paragraphs:
        first = paragraph[0][0]
        joined = " ".join(line for _, line in paragraph)
        # mask code spans and link targets so that their dots never end a sentence
        masked = _CODE_SPAN.sub(lambda m: "`" + "_" * len(m.group(1)) + "`", joined)
        masked = _LINK.sub(lambda m: "](" + "_" * len(m.group(1)) + ")", masked)
        start = 0
        for m in _SENTENCE_END.finditer(masked):
            out.append((first, joined[start:m.start()]))
            start = m.end()
        out.append((first, joined[start:]))
    return [(n, s) for n, s in out if s.strip()]


def measured_numbers(sentence):
    """The measured numbers of `sentence` (rule 3), inline code taken out first."""
    return [m.group(0) for m in MEASURED.finditer(_CODE_SPAN.sub(" ", sentence))]


def _slug(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces -> -."""
    text = heading.strip().lstrip("#").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def benchmark_sections(text):
    """{anchor: section text} of docs/benchmarks.md.

    A heading's section runs to the next heading; an ``<a id="NAME"></a>`` line opens a
    section that runs from it to the next heading.
    """
    sections, open_at, body = {}, {}, []
    for line in text.splitlines() + ["# end"]:
        anchor = re.match(r'\s*<a id="([^"]+)"></a>', line)
        if line.startswith("#"):
            for name, start in open_at.items():
                sections[name] = "\n".join(body[start:])
            open_at, body = {_slug(line): 0}, []
        elif anchor:
            open_at[anchor.group(1)] = len(body)
        else:
            body.append(line)
    return sections


def _normalise(number):
    return re.sub(r"\s", "", number).replace("-", "–")


def problems(readme_text, benchmarks_text):
    """Violations of the rule in the module docstring: ``[(line, sentence, reason)]``."""
    sections = benchmark_sections(benchmarks_text)
    found = []
    for line, sentence in sentences(readme_text):
        numbers = measured_numbers(sentence)
        if not numbers:
            continue
        commands = [s for s in _CODE_SPAN.findall(sentence) if is_command(s)]
        linked = []
        for target in _LINK.findall(sentence):
            if not re.match(r"(?:\./)?docs/benchmarks\.md#", target):
                continue
            anchor = target.split("#", 1)[1]
            if anchor not in sections:
                found.append((line, sentence, f"link to a missing section #{anchor}"))
                continue
            if not any(is_command(s) for s in _CODE_SPAN.findall(sections[anchor])):
                found.append((line, sentence, f"section #{anchor} names no command"))
                continue
            linked.append(anchor)
            stated = {_normalise(n) for n in measured_numbers(sections[anchor])}
            for number in numbers:
                if _normalise(number) not in stated:
                    found.append((line, sentence,
                                  f"{number!r} is not in docs/benchmarks.md#{anchor}"))
        if not commands and not linked:
            found.append((line, sentence, f"{', '.join(numbers)}: no command named"))
    return found


def _read(path):
    return path.read_text(encoding="utf-8")


def test_every_readme_number_names_its_command():
    bad = problems(_read(README), _read(BENCHMARKS))
    assert not bad, "\n".join(f"README.md:{n}: {why}: {s}" for n, s, why in bad)


def test_the_readme_states_measured_numbers():
    """The check is not vacuous: the README's runtimes and test counts are found."""
    found = [n for _, s in sentences(_read(README)) for n in measured_numbers(s)]
    assert "5 min" in found and "6 s" in found and "2255 passed" in found, found
    assert len(found) >= 6, found


BENCH = """# Benchmarks

## symquad validate

Command: `symquad validate`. It takes 25 s (22 s by its own timer).

## No command here

It took 3 s.
"""


def test_a_bare_number_fails():
    for bad in ("The default suite takes 4 min 3 s on a laptop.",
                "The reduced simulator is 2.5× faster than the full one.",
                "From a fresh clone: 1350 passed, 1 skipped.",
                "Memory stays under 62 MB at p = 1000.",
                "It is 1.5x faster; see the `docs/benchmarks.md` table."):
        bad_lines = problems("# t\n\nIntro.\n\n" + bad + "\n", BENCH)
        assert len(bad_lines) == 1 and bad_lines[0][0] == 5, (bad, bad_lines)
        assert "no command named" in bad_lines[0][2]


def test_a_number_beside_its_command_passes():
    good = ("`python -m pytest` ran 1351 tests (1350 passed, 1 skipped) in 8 min 12 s.\n\n"
            "`OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py` gives 1.5× on 2 workers.\n\n"
            "The run takes 25 s ([docs/benchmarks.md](docs/benchmarks.md#symquad-validate)).\n\n"
            "```bash\nsleep 3 s  # 99 % of code blocks are not prose\n```\n"
            "Python ≥ 3.10 and `t_max=5.0 s` in code, p = 4.\n")
    assert problems(good, BENCH) == []


def test_each_sentence_needs_its_own_command():
    text = "`symquad validate` prints a verdict. It takes 25 s on a laptop.\n"
    bad = problems(text, BENCH)
    assert [why for _, _, why in bad] == ["25 s: no command named"]


def test_links_must_reach_a_section_with_the_command_and_the_number():
    cases = {
        "It takes 25 s ([b](docs/benchmarks.md#nowhere)).": "missing section #nowhere",
        "It takes 3 s ([b](docs/benchmarks.md#no-command-here)).": "names no command",
        "It takes 26 s ([b](docs/benchmarks.md#symquad-validate)).": "'26 s' is not in",
    }
    for text, reason in cases.items():
        bad = problems(text + "\n", BENCH)
        assert len(bad) >= 1 and reason in bad[0][2], (text, bad)


def test_readme_is_short_and_keeps_the_quick_start_commands():
    text = _read(README)
    assert len(text.splitlines()) <= 250
    # .ci/run and the contributors run these two lines as written
    assert ("```bash\npip install -e . && symquad validate\n"
            "pip install -e \".[test]\" && python -m pytest\n```") in text


def _anchors(path):
    """The anchors of a Markdown file: GitHub's heading slugs (``-1``, ``-2`` for repeats)
    and ``<a id="...">`` tags; headings inside fenced code are not headings."""
    text = _read(path)
    found, seen = set(re.findall(r'<a id="([^"]+)"', text)), {}
    for _, line in prose_lines(text):
        if re.match(r"#{1,6} ", line):
            slug = _slug(line)
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(paths):
    """``[(file, target)]`` of relative Markdown links whose file or anchor does not exist."""
    bad = []
    for path in paths:
        prose = "\n".join(line for _, line in prose_lines(_read(path)))
        for target in _LINK.findall(prose):
            if re.match(r"[a-z]+:", target):               # http:, https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            dest = (path.parent / name).resolve() if name else path
            if not dest.exists() or (anchor and dest.suffix == ".md"
                                     and anchor not in _anchors(dest)):
                bad.append((str(path), target))
    return bad


def test_links_of_the_readme_and_docs_resolve(tmp_path):
    """Links between the README and docs/ follow the move of the README's sections."""
    paths = [README] + sorted((ROOT / "docs").glob("*.md"))
    assert broken_links(paths) == []
    # the check can fail: a missing anchor and a missing file are found
    probe = tmp_path / "probe.md"
    probe.write_text("# Probe\n\n[a](#probe) [b](#nowhere) [c](missing.md)\n"
                     "```\n[d](#in-code)\n```\n", encoding="utf-8")
    assert [target for _, target in broken_links([probe])] == ["#nowhere", "missing.md"]
