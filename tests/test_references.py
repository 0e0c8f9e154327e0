"""Every reference in the code and the docs points at something in this repository that exists: relative links
(and their anchors), section numbers (`docs/checkpoints.md` followed by a section sign and a number), repository paths,
the results files and benchmarks named bare, and a document's section named in quotes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".sh", ".cpp", ".cu", ".cuh", ".h", ".yaml", ".yml", ".toml"}
TOP_FOLDERS = ("farm", "worker", "cosmos3", "toy", "testbed", "tests", "benchmarks", "scripts", "docs", "manifests")
SECTION = "\u00a7"  # the section sign, spelled out so this file holds no reference of its own

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
DOCUMENT = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b")
SECTION_NUMBER = re.compile(SECTION + r"(\d+(?:\.\d+)*)")
REPO_PATH = re.compile(r"(?<![\w/.@:-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./*{}<-]*[\w*}])")
BARE_NAME = re.compile(r"`((?:[\w-]+)\.md|bench_\w+\.py)[`\s]")
NAMED_SECTION = re.compile(r"(README|(?:[\w-]+/)*[\w-]+\.md),? \(?[\"'\u201c]([A-Z][^\"'\u201d]{2,60})[\"'\u201d]")


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if Path(name).suffix in TEXT_SUFFIXES and (ROOT / name).is_file()]


def ignored(name: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT).returncode == 0


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def headings(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a comment in a code block is no heading
    return HEADING.findall(text)


def named_parts(path: Path) -> list[str]:
    """What a quote may name in a document: its headings and the bold words that open its list items."""
    return headings(path) + re.findall(r"^\s*- \*\*(.+?)\*\*", path.read_text(), flags=re.M)


def documents(name: str, source: Path) -> list[Path]:
    """The documents a name in `source` may mean: from the repository's root (where code names paths from), beside
    `source` (a page's sibling), or under docs/ and benchmarks/results/ (a page or a results file named bare)."""
    if name == "README":
        name = "README.md"
    bases = (ROOT, source.parent, ROOT / "docs", ROOT / "benchmarks" / "results")
    return list(dict.fromkeys(base / name for base in bases if (base / name).is_file()))


def has_section(candidates: list[Path], number: str) -> bool:
    return any(re.match(rf"{re.escape(number)}[.\s]", title) for path in candidates for title in headings(path))


def link_problems(path: Path, text: str) -> list[str]:
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: outside the repository
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            found.append(f"link to {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in {slug(h) for h in headings(linked)}:
            found.append(f"link to {target}: no heading with that anchor")
    return found


def section_problems(path: Path, line: str) -> list[str]:
    """Each section sign on a line belongs to the last document named before it on that line."""
    found = []
    events = sorted([(m.start(), "doc", m.group(1)) for m in DOCUMENT.finditer(line)]
                    + [(m.start(), "section", m.group(1)) for m in SECTION_NUMBER.finditer(line)])
    named, candidates = (path.name, [path]) if path.suffix == ".md" else (None, [])  # a page's own sections
    for _, kind, value in events:
        if kind == "doc":
            named, candidates = value, documents(value, path)
        elif not candidates:
            found.append(f"{SECTION}{value} names no document of this repository before it")
        elif not has_section(candidates, value):
            found.append(f"{SECTION}{value}: {named} has no section {value}")
    return found


def path_problems(path: Path, line: str) -> list[str]:
    found = []
    for name in REPO_PATH.findall(line):
        name = name.rstrip(".")
        if name.count("}") > name.count("{"):
            name = name.rstrip("}")  # a shell ${VAR:-default} around the path
        if "{" in name or "<" in name:
            continue  # a template: benchmarks/results/{topic}.md, cosmos3/ops/_cuda_ops.<python ABI>.so
        if ignored(name):
            continue  # a build output (.gitignore): the compiled library and its build record
        if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists()):
            found.append(f"{name}: no such file or folder")
    for name in BARE_NAME.findall(line + " "):
        if name.endswith(".py"):
            exists = (ROOT / "benchmarks" / name).is_file()
        else:
            exists = bool(documents(name, path))
        if not exists:
            found.append(f"{name}: no such document or benchmark")
    for document, title in NAMED_SECTION.findall(line):
        candidates = documents(document, path)
        if candidates and not any(title.lower() in part.lower() for c in candidates for part in named_parts(c)):
            found.append(f"{document} has no section {title!r}")
    return found


def problems(path: Path) -> list[str]:
    text = path.read_text()
    found = link_problems(path, text) if path.suffix == ".md" else []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"line {number}: {p}" for p in section_problems(path, line) + path_problems(path, line)]
    return found


def test_every_reference_resolves():
    files = tracked_files()
    assert ROOT / "docs" / "checkpoints.md" in files
    broken = {str(p.relative_to(ROOT)): found for p in files if p != Path(__file__) and (found := problems(p))}
    assert broken == {}


@pytest.mark.parametrize("text, expected", [
    ("see docs/checkpoints.md \u00a74.2 and \u00a76", []),
    ("see docs/checkpoints.md \u00a79", ["line 1: \u00a79: docs/checkpoints.md has no section 9"]),
    ("see reference \u00a72.1", ["line 1: \u00a72.1 names no document of this repository before it"]),
    ("run cosmos3/missing.py", ["line 1: cosmos3/missing.py: no such file or folder"]),
    ("in `h200-fp8.md` and `bench_ops.py`", []),
    ("in `h200-nothing.md`", ["line 1: h200-nothing.md: no such document or benchmark"]),
    ("README, 'GPU cluster'", ["line 1: README has no section 'GPU cluster'"]),
    ("README, 'On a cluster'", []),
])
def test_the_check_finds_what_does_not_resolve(tmp_path, text, expected):
    source = tmp_path / "module.py"
    source.write_text(text + "\n")
    assert problems(source) == expected


def test_links_and_their_anchors_are_checked(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## The part\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#the-part) [b](other.md#nothing) [c](missing.md) [d](https://example.com/x.md)\n")
    assert problems(page) == ["link to other.md#nothing: no heading with that anchor",
                              "link to missing.md: no such file"]
