"""One owner per output file of a root: a manifest writing a file of another is refused (issue 49, defect 1)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from farm import claims, cli, manifest, storage
from tests.farm.helpers import publish, write_manifest

TEMPLATE = {"path": "{task}/{id}"}  # no {name}: two manifests' jobs of one id resolve to one file


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    first = write_manifest(tmp_path, [{"id": "shot", "prompt": "a harbour"}, {"id": "mine", "prompt": "x"}],
                           name="first", output=TEMPLATE)
    second = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}, {"id": "theirs", "prompt": "y"}],
                            name="second", output=TEMPLATE)
    return first, second


def test_a_second_manifest_writing_a_file_of_the_first_is_refused_at_validate_plan_and_submit(tmp_path, capsys):
    first, second = _pair(tmp_path)
    for job in manifest.load(first).jobs:
        publish(job, run="earlier", data=b"the harbour")
    assert cli.main(["submit", str(first), "--no-progress"]) == 0  # all done: no cluster needed, files claimed
    capsys.readouterr()

    for command in ("validate", "plan", "submit"):
        assert cli.main([command, str(second), *(["--no-progress"] if command == "submit" else [])]) == 1
        err = capsys.readouterr().err
        assert "t2v/shot.mp4 (job shot) is already written by job shot of manifest 'first'" in err, err
        assert str(first) in err
    shot = next(job for job in manifest.load(first).jobs if job.id == "shot")
    assert Path(shot.media).read_bytes() == b"the harbour" and storage.is_done(shot)
    assert cli.main(["plan", str(first)]) == 0
    assert "2 renders, 0 to do, 2 done" in capsys.readouterr().out


def test_a_file_a_manifest_no_longer_writes_is_given_back_at_its_next_submit(tmp_path, capsys):
    first, second = _pair(tmp_path)
    for job in manifest.load(first).jobs:
        publish(job, run="earlier")
    assert cli.main(["submit", str(first), "--no-progress"]) == 0
    with pytest.raises(claims.ClaimConflict):
        claims.check(manifest.load(second))

    first = write_manifest(tmp_path, [{"id": "mine", "prompt": "x"}], name="first", output=TEMPLATE)
    assert cli.main(["submit", str(first), "--no-progress"]) == 0
    claims.check(manifest.load(second))  # no longer refused
    assert cli.main(["validate", str(second)]) == 0


def test_of_two_claims_at_once_only_one_wins(tmp_path, monkeypatch):
    first, second = (manifest.load(p) for p in _pair(tmp_path))
    storage.prepare_root(first.output_root)
    real = claims._refuse_taken
    first_checked, second_checking = threading.Event(), threading.Event()

    def refuse_taken(m, files):
        if m.name == "second":
            second_checking.set()
        real(m, files)
        if m.name == "first":
            first_checked.set()
            # Without the root's lock the second claim checks now, before the first is written, and both win;
            # with it, the second waits for the lock and this wait runs out.
            second_checking.wait(timeout=3)

    monkeypatch.setattr(claims, "_refuse_taken", refuse_taken)
    outcomes: dict[str, str] = {}

    def run(m):
        try:
            claims.claim(m)
            outcomes[m.name] = "claimed"
        except claims.ClaimConflict:
            outcomes[m.name] = "refused"

    threads = [threading.Thread(target=run, args=(first,)), threading.Thread(target=run, args=(second,))]
    threads[0].start()
    assert first_checked.wait(timeout=60)
    threads[1].start()
    for thread in threads:
        thread.join(timeout=60)
    assert outcomes == {"first": "claimed", "second": "refused"}


def test_damaged_claims_of_another_manifest_are_reported_and_do_not_stop_a_run(tmp_path):
    first, second = (manifest.load(p) for p in _pair(tmp_path))
    path = claims.claims_path(first.output_root, "first")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2")
    claims.claim(second)
    assert set(storage.read_record(claims.claims_path(second.output_root, "second"))[0]["files"]) == {
        "t2v/shot.mp4", "t2v/theirs.mp4"}


def test_a_file_reached_through_a_folder_symlink_in_the_root_is_the_same_file(tmp_path, capsys):
    """Publishing follows the folders' symlinks, so `alias/{id}` with `alias -> t2v` writes the first's file."""
    first = write_manifest(tmp_path, [{"id": "shot", "prompt": "a harbour"}], name="first", output=TEMPLATE)
    second = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="second",
                            output={"path": "alias/{id}"})
    for job in manifest.load(first).jobs:
        publish(job, run="earlier", data=b"the harbour")
    assert cli.main(["submit", str(first), "--no-progress"]) == 0
    (tmp_path / "out" / "alias").symlink_to("t2v")
    capsys.readouterr()

    assert cli.main(["plan", str(second)]) == 1
    assert "t2v/shot.mp4 (job shot) is already written by job shot of manifest 'first'" in capsys.readouterr().err


def test_a_manifest_named_like_the_claims_lock_shares_a_root_with_others(tmp_path, capsys):
    """The lock lives beside the manifests' records folders (`.farm/NAME/`): no name may be the lock's."""
    for name in ("claims.lock", "other"):
        path = write_manifest(tmp_path, [{"id": f"shot-{name}", "prompt": "a harbour"}], name=name, output=TEMPLATE)
        for job in manifest.load(path).jobs:
            publish(job, run="earlier")
        assert cli.main(["submit", str(path), "--no-progress"]) == 0, capsys.readouterr().err
        assert cli.main(["plan", str(path)]) == 0
        assert "1 renders, 0 to do, 1 done" in capsys.readouterr().out
