"""Hostile and broken manifests: each is refused with one located message, never a traceback, and
reading them stays within a memory bound; YAML merge keys work; a 100,000-seed sweep validates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3.rules import prompt
from farm import cli, document, manifest
from tests.farm.helpers import write_manifest

REPO = Path(__file__).parents[2]


def _alias_bomb(levels: int = 9) -> str:
    """Each level lists the previous one 9 times: 9**9 values from ~300 bytes."""
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]"
              for prev, name in zip(names, names[1:], strict=False)]
    return "\n".join(lines) + "\n"


# (id, file bytes, line of the problem (None: the whole file), what its message says); a value that cannot be read
# is reported where it is, beside what the manifest then lacks
HOSTILE = [
    ("alias-bomb", _alias_bomb().encode(), 1, "values once aliases are expanded, more than the limit of 500,000 "
                                              "(set FARM_YAML_MAX_VALUES to raise it)"),
    ("recursive-alias", b"jobs: &j [*j]\n", 1, "(or an alias sits inside the value it names)"),
    ("recursive-merge", b"jobs: &j {<<: *j}\n", 1, "(or an alias sits inside the value it names)"),
    ("many-aliases", ("x: &x 1\njobs: [" + ", ".join(["*x"] * 1001) + "]\n").encode(), 2,
     "more aliases (*name) than the limit of 1,000 (set FARM_YAML_MAX_ALIASES to raise it)"),
    ("block-nesting-1000", "".join("  " * i + f"k{i}:\n" for i in range(1000)).encode(), 64,
     "nested deeper than the limit of 64 levels (set FARM_YAML_MAX_DEPTH to raise it)"),
    # libyaml's own bound (1000 levels) on flow collections answers first
    ("flow-nesting-1000", b"jobs: " + b"[" * 1000 + b"]" * 1000 + b"\n", 1, "exceeded maximum nesting depth"),
    ("flow-nesting-100000", b"jobs: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", 1, "exceeded maximum nesting depth"),
    ("nul-byte", b"version: 1\nname: a\x00b\n", 2, "NUL byte at line 2: the file is binary, or UTF-16/32"),
    ("utf-16", "version: 1\nname: x\n".encode("utf-16"), None, "the file is UTF-16 or UTF-32 text; save it as UTF-8"),
    ("binary", bytes(range(1, 256)) * 8, 2, "is not UTF-8 text; save the file as UTF-8"),
    ("latin-1-prompt", "version: 1\njobs:\n  - {id: a, prompt: caf\xe9}\n".encode("latin-1"), 3,
     "byte 0xe9 at line 3 is not UTF-8 text; save the file as UTF-8"),
    ("control-character", b"version: 1\nname: \x07\n", 2, "is not allowed in YAML"),
    ("too-large", b"name: " + b"x" * ((16 << 20) + 1) + b"\n", None,
     "larger than the limit of 16,777,216 bytes (set FARM_YAML_MAX_BYTES to raise it)"),
    ("python-tag", b"version: 1\nname: !!python/object/apply:os.system [ls]\n", 2, "is not supported here"),
    ("bad-timestamp", b"version: 1\nname: 2001-13-45\n", 2, "cannot read '2001-13-45'"),
    ("two-documents", b"version: 1\n---\nversion: 1\n", 2, "expected a single document"),
]


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name, data, line, message", [pytest.param(*case, id=case[0]) for case in HOSTILE])
def test_hostile_manifest_is_refused_with_one_located_message(tmp_path, capsys, name, data, line, message):
    path = _write(tmp_path, name, data)
    assert cli.main(["validate", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    place = f"{path.name}:{line}" if line else path.name
    assert err[0].startswith("error: ") and err[0].endswith(f" in {path.name}")
    assert [problem for problem in err[1:] if problem.startswith(f"{place}: ") and message in problem], err


# Numbers YAML reads that no render can use (cosmos3.rules.request's rules, which farm validate calls): a job
# with guidance .nan rendered black and counted as done.
NUMBERS = [
    ("guidance: .nan", "guidance: nan is not a finite number"),
    ("fps: .inf", "fps: inf is not a finite number"),
    (f"seed: {2**70}", f"seed: {2**70} is not a whole number in [0, 2**63)"),
    (f"seeds: [1, {2**63}]", f"seeds[1]: seed: {2**63} is not a whole number in [0, 2**63)"),
]


@pytest.mark.parametrize("field, message", [pytest.param(*case, id=case[0].split(":")[0]) for case in NUMBERS])
def test_a_number_no_render_can_use_is_refused_at_its_line(tmp_path, capsys, field, message):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    path.write_text(path.read_text().split("jobs:")[0] + f"jobs:\n  - {{id: a, prompt: x, {field}}}\n")
    line = len(path.read_text().splitlines())
    assert cli.main(["validate", str(path)]) == 1
    assert capsys.readouterr().err.splitlines()[1:] == [f"test.yaml:{line}: jobs[0] (id=a) -> {message}"]


def test_every_hostile_manifest_is_read_within_a_memory_bound(tmp_path):
    """In a process limited to 1 GiB of address space (the unbounded reader grew past 5 GB on the bomb)."""
    paths = [str(_write(tmp_path, name, data)) for name, data, _, _ in HOSTILE]
    code = ("import json, resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "from farm import cli\n"
            "print(json.dumps([cli.main(['validate', path]) for path in sys.argv[1:]]))\n")
    done = subprocess.run([sys.executable, "-c", code, *paths], cwd=REPO, capture_output=True, text=True)
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [1] * len(HOSTILE)


def test_a_limit_is_raised_by_its_environment_variable(tmp_path, monkeypatch, capsys):
    path = _write(tmp_path, "deep", "".join("  " * i + f"k{i}:\n" for i in range(80)).encode())
    monkeypatch.setenv("FARM_YAML_MAX_DEPTH", "100")
    assert cli.main(["validate", str(path)]) == 1
    assert "nested deeper" not in capsys.readouterr().err  # read; refused as a manifest instead
    monkeypatch.setenv("FARM_YAML_MAX_DEPTH", "lots")
    assert cli.main(["validate", str(path)]) == 1
    assert "FARM_YAML_MAX_DEPTH='lots' is not a positive integer" in capsys.readouterr().err


def test_merge_keys_merge_with_the_mappings_own_keys_winning():
    doc = document.parse("base: &base {steps: 4, size: [32, 32]}\n"
                         "other: &other {steps: 9, fps: 8}\n"
                         "job:\n"
                         "  <<: [*base, *other]\n"
                         "  steps: 2\n")
    assert doc.problems == []
    assert doc.value["job"] == {"steps": 2, "size": [32, 32], "fps": 8}
    # Merged values point at the lines where they are written.
    assert (doc.line(("job", "steps")), doc.line(("job", "size")), doc.line(("job", "fps"))) == (5, 1, 2)


def test_a_job_can_take_another_jobs_settings_through_a_merge_key(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    text = path.read_text().split("jobs:")[0] + ("jobs:\n"
                                                  "- &shot {id: a, prompt: shared, steps: 3}\n"
                                                  "- {<<: *shot, id: b, steps: 5}\n")
    path.write_text(text)
    jobs = {job.key: job for job in manifest.load(path).jobs}
    assert (jobs["b"].request.prompt, jobs["b"].request.steps, jobs["a"].request.steps) == ("shared", 5, 3)


def test_a_100000_seed_sweep_validates(tmp_path):
    """Seeds were checked pairwise (quadratic: 242 s for 100,000); benchmarks/bench_validate.py measures it."""
    seeds = list(range(100_000))
    path = write_manifest(tmp_path, [{"id": "sweep", "prompt": "x", "seeds": seeds}])
    m = manifest.load(path)
    assert [job.request.seed for job in m.jobs] == seeds

    path = write_manifest(tmp_path, [{"id": "sweep", "prompt": "x", "seeds": [*seeds, 99_999, 5]}])
    with pytest.raises(manifest.ManifestError, match="seeds: seed 5 is listed twice"):
        manifest.load(path)


def test_a_long_prompt_shared_by_jobs_of_every_size_is_tokenized_once(tmp_path, monkeypatch):
    """One prompt in every job (an alias in a 16 MiB manifest), each job at another fps: counted with each job's
    metadata sentences, validate would tokenize the whole prompt once a job (hours). It is tokenized once, and every
    job is refused."""
    tokenized: list[int] = []  # characters of each text the tokenizer was given
    from_dir = prompt.TextBudget.from_dir.__func__

    class Spy:
        def __init__(self, tokenizer):
            self._tokenizer = tokenizer

        def encode(self, text, **options):
            tokenized.append(len(text))
            return self._tokenizer.encode(text, **options)

        def encode_batch(self, texts, **options):
            tokenized.extend(len(text) for text in texts)
            return self._tokenizer.encode_batch(texts, **options)

    def spied(cls, path):
        budget = from_dir(cls, path)
        budget._tokenizer = Spy(budget._tokenizer)
        return budget

    monkeypatch.setattr(prompt.TextBudget, "from_dir", classmethod(spied))
    long = "a red circle " * 20_000
    jobs = [{"id": f"j{fps}", "prompt": long, "fps": fps} for fps in range(1, 21)]
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load(write_manifest(tmp_path, jobs))

    assert [p.where for p in refused.value.problems] == [f"jobs[{i}] (id=j{i + 1}) -> prompt" for i in range(20)]
    assert sum(n for n in tokenized if n >= len(long)) == len(long)
    assert "tokens in the prompt alone, over twice the text tokenizer's limit" in refused.value.problems[0].message
