"""No manifest, path or log line writes to the user's terminal: every acting character reaches it escaped."""

from __future__ import annotations

import io
import json
import os

import pytest
import structlog

from farm import cli, cluster, events, manifest, template, terminal
from farm.errors import ManifestError
from tests.farm.helpers import publish, write_manifest

# Each acts on a terminal, or on what a line shows: a CSI (red), an OSC that sets the window title, the one-character
# C1 CSI, a bidi override that reverses what follows, a cursor movement, a newline that forges a line.
ATTACKS = {"csi": "\x1b[31m", "osc": "\x1b]0;pwned\x07", "c1-csi": "\x9b2J", "bidi": "\u202e", "bell": "\a",
           "isolate": "\u2066", "forged-line": "\nerror: all good"}


def _clean(text: str) -> bool:
    """Only printable characters and the message's own line breaks."""
    return all(c.isprintable() or c == "\n" for c in text)


@pytest.mark.parametrize("text, shown", [("\x1b[31m", "\\x1b[31m"), ("\x9b", "\\x9b"), ("a\u202eb", "a\\u202eb"),
                                         ("\x00\x7f", "\\x00\\x7f"), ("\t\r\n", "\\t\\r\\n"),
                                         ("\U000e0041", "\\U000e0041"), ("café 東京 ü", "café 東京 ü")])
def test_escape_writes_every_acting_character_as_its_escape_and_keeps_text(text, shown):
    assert terminal.escape(text) == shown
    assert terminal.escape("a\nb", lines=True) == "a\nb"


def _commands(capsys, path, *commands: str) -> str:
    printed = ""
    for command in commands:
        cli.main([command, str(path), "--no-progress"] if command == "submit" else [command, str(path)])
        out, err = capsys.readouterr()
        printed += out + err
    return printed


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_a_manifests_unknown_keys_ids_and_checkpoint_reach_the_terminal_escaped(tmp_path, capsys, attack):
    jobs = [{"id": "a", "prompt": "x", f"{attack}key": 1}, {"id": f"b{attack}", "prompt": "y"}]
    path = write_manifest(tmp_path, jobs, model={f"opt{attack}": 1}, defaults={f"d{attack}": 1})
    path.write_text(path.read_text().replace("checkpoint: ckpt", f"checkpoint: {json.dumps('ck' + attack)}")
                    .replace("name: test", f"name: {json.dumps('n' + attack)}"))
    printed = _commands(capsys, path, "validate", "plan", "submit")
    assert _clean(printed) and attack not in printed, printed
    assert printed.count(terminal.escape(attack)) >= 5 * 3  # every command names every value, escaped


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_a_manifest_file_name_and_a_root_reach_the_terminal_escaped(tmp_path, capsys, attack):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    named = path.rename(tmp_path / f"m{attack}.yaml")
    publish(manifest.load(named).jobs[0], run="earlier")  # submit: all done, no cluster needed
    printed = _commands(capsys, named, "validate", "plan", "submit", "retry")
    printed += _commands(capsys, tmp_path / f"none{attack}.yaml", "validate")
    printed += _commands(capsys, tmp_path / f"out{attack}", "status")
    assert _clean(printed) and attack not in printed, printed
    assert printed.count(terminal.escape(attack)) >= 3


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_an_output_root_holding_an_acting_character_is_refused(tmp_path, capsys, attack):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], output={"root": f"out{attack}"})
    printed = _commands(capsys, path, "validate", "plan", "submit")
    assert printed.count("which no file name should hold") == 3
    assert _clean(printed) and attack not in printed, printed
    assert not (tmp_path / f"out{attack}").exists()


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_an_output_path_holding_an_acting_character_is_refused(tmp_path, attack):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], output={"path": f"{{id}}{attack}_s{{seed}}"})
    with pytest.raises(ManifestError, match="which no file name should hold") as refused:
        manifest.load(path)
    assert _clean(str(refused.value))
    for character in ("\u00a0", "\u2028", "\ufeff"):  # a no-break space, a line separator, a zero-width no-break
        with pytest.raises(template.TemplateError):
            template.check(f"{{id}}{character}", ".farm")


def test_a_log_line_shows_its_values_escaped(capsys):
    events.configure_logging(json_lines=False)
    structlog.get_logger("farm").warning("job_failed", job="a", error="\x1b]0;pwned\x07 \u202eevil")
    err = capsys.readouterr().err
    assert "\\x1b]0;pwned\\x07 \\u202eevil" in err and _clean(err)


def test_a_workers_forwarded_lines_are_shown_escaped(monkeypatch):
    seen = []
    monkeypatch.setattr(cluster.ray_worker, "print_worker_logs",
                        lambda data, print_file, ignore_prefix=False: seen.extend(data["lines"]))
    cluster._forward_worker_logs_only()
    cluster.ray_worker.print_worker_logs({"pid": 7, "lines": ["prompt: \x1b[2J\x9bH"]}, io.StringIO())
    assert seen == ["prompt: \\x1b[2J\\x9bH"]


def test_a_manifest_file_name_that_is_not_utf8_is_named_escaped_not_a_crash(tmp_path, capsys):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    named = path.rename(tmp_path / os.fsdecode(b"m\xff\x1b.yaml"))  # a byte no UTF-8 decodes: a lone surrogate
    printed = _commands(capsys, named, "validate", "plan")
    assert "m\\udcff\\x1b.yaml" in printed and _clean(printed)


def test_a_table_lines_up_as_the_terminal_shows_its_escaped_cells(tmp_path, capsys):
    """A records folder named with an escape sequence is shown escaped, and its row's columns stay under their
    headings (widths counted on what is shown, not on the raw name)."""
    for name in ("plain", "x\x1b]0;title\x07"):
        (tmp_path / ".farm" / name).mkdir(parents=True)
        (tmp_path / ".farm" / name / "state.json").write_text('{"jobs": {}, "run": "r1", "result": "complete"}')
    assert cli.main(["status", str(tmp_path)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert any(row.startswith("x\\x1b]0;title\\x07  ") for row in rows)
    assert {row.index("  0  ") + 2 for row in rows} == {header.index("DONE")}
