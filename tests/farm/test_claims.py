"""One owner per path the farm writes: a manifest writing a path of another is refused, whatever state the claims
are in, compared as a tree, across nested roots."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("second_root", ["out", "out/t2v"])
def test_of_two_claims_at_once_only_one_wins(tmp_path, monkeypatch, second_root):
    """Also when the second's root is inside the first's (`out/t2v/{id}` is `out/{task}/{id}`): it takes the lock
    of every root it meets."""
    first_path, second_path = _pair(tmp_path)
    if second_root != "out":
        second_path = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="second",
                                     output={"root": second_root, "path": "{id}"})
    first, second = manifest.load(first_path), manifest.load(second_path)
    for m in (first, second):
        storage.prepare_root(m.output_root)
    real = claims._refuse_taken
    first_checked, second_checking = threading.Event(), threading.Event()

    def refuse_taken(m, roots):
        if m.name == "second":
            second_checking.set()
        real(m, roots)
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


# -- claims fail closed: a manifest whose claims cannot be read is asked through its state, or nobody may claim ------


def _submitted(folder: Path, jobs: list[dict], name: str, output: dict, capsys) -> Path:
    """A manifest whose jobs are all published and whose submit (no cluster needed: all done) claimed them."""
    path = write_manifest(folder, jobs, name=name, output=output)
    for job in manifest.load(path).jobs:
        publish(job, run="earlier", data=f"the render of {name}".encode())
    assert cli.main(["submit", str(path), "--no-progress"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return path


def _refused(path: Path, capsys, *expected: str) -> None:
    """`validate`, `plan` and `submit` of the manifest at `path` each fail, saying every `expected` text."""
    for command in ("validate", "plan", "submit"):
        assert cli.main([command, str(path), *(["--no-progress"] if command == "submit" else [])]) == 1, command
        err = capsys.readouterr().err
        for text in expected:
            assert text in err, (command, err)


def _untouched(path: Path, name: str) -> None:
    for job in manifest.load(path).jobs:
        assert Path(job.media).read_bytes() == f"the render of {name}".encode() and storage.is_done(job)


DAMAGES = {
    "not JSON": "[1, 2",
    "a list": "[]",
    "no files": '{"format": 1, "manifest": {"name": "first"}}',
    "files as a list": '{"format": 1, "files": ["t2v/shot.mp4"]}',
    "a job key that is a number": '{"format": 1, "files": {"t2v/shot.mp4": 7}}',
    "an empty file": "",
}


@pytest.mark.parametrize("damage", [*DAMAGES, "deleted"])
def test_claims_damaged_or_deleted_are_read_from_the_state_and_still_refuse(tmp_path, capsys, damage):
    first = _submitted(tmp_path, [{"id": "shot", "prompt": "a harbour"}], "first", TEMPLATE, capsys)
    second = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="second", output=TEMPLATE)
    path = claims.claims_path(tmp_path / "out", "first")
    if damage == "deleted":
        path.unlink()
    else:
        path.write_text(DAMAGES[damage])

    _refused(second, capsys, "t2v/shot.mp4 (job shot) is already written by job shot of manifest 'first'", str(first))
    _untouched(first, "first")
    assert cli.main(["submit", str(first), "--no-progress"]) == 0  # the first writes its claims again
    assert storage.read_record(path)[0]["files"] == {"t2v/shot.mp4": "shot"}


def test_claims_edited_to_spell_a_path_another_way_still_claim_it(tmp_path, capsys):
    first = _submitted(tmp_path, [{"id": "shot", "prompt": "a harbour"}], "first", TEMPLATE, capsys)
    second = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="second", output=TEMPLATE)
    claims.claims_path(tmp_path / "out", "first").write_text(
        '{"format": 1, "files": {"elsewhere/../t2v/./shot.mp4": "shot"}}')
    _refused(second, capsys, "t2v/shot.mp4 (job shot) is already written by job shot of manifest 'first'")
    _untouched(first, "first")


@pytest.mark.parametrize("state", ["deleted", "not JSON", "entries damaged"])
def test_claims_and_state_both_unreadable_refuse_every_manifest_of_the_root_naming_the_files(tmp_path, capsys, state):
    """Nothing says which files the first writes, so no other manifest of its root may claim any, not even ones
    the first never wrote: unknown is never free."""
    first = _submitted(tmp_path, [{"id": "shot", "prompt": "a harbour"}], "first", TEMPLATE, capsys)
    second = write_manifest(tmp_path, [{"id": "other", "prompt": "a desert"}], name="second", output=TEMPLATE)
    claims_file = claims.claims_path(tmp_path / "out", "first")
    state_file = storage.state_path(tmp_path / "out", "first")
    claims_file.write_text("[1, 2")
    if state == "deleted":
        state_file.unlink()
    elif state == "not JSON":
        state_file.write_text("{")
    else:  # one entry of the state is left out as damaged: the state no longer lists every file
        state_file.write_text('{"jobs": {"shot": {"media": 3}}}')

    _refused(second, capsys, str(claims_file), str(state_file), "run farm submit of manifest 'first'",
             f"remove {claims_file.parent}/")
    _untouched(first, "first")
    assert cli.main(["submit", str(first), "--no-progress"]) == 0  # the fix the message names
    assert cli.main(["validate", str(second)]) == 0


def test_a_records_folder_holding_only_a_lease_or_nothing_claims_nothing(tmp_path, capsys):
    """A driver between its lease and its claims (it claims after this one, under the lock), or a retired one."""
    second = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="second", output=TEMPLATE)
    folder = tmp_path / "out" / ".farm" / "first"
    folder.mkdir(parents=True)
    assert cli.main(["validate", str(second)]) == 0
    (folder / "lease.json").write_text("{}")
    assert cli.main(["validate", str(second)]) == 0
    (folder / "events.jsonl").write_text("")  # a manifest that rendered, its claims and state gone
    _refused(second, capsys, f"{folder / 'claims.json'} is missing")


@pytest.mark.parametrize("planted", ["file", "link"])
def test_something_in_the_records_that_is_not_a_records_folder_is_refused_not_skipped(tmp_path, capsys, planted):
    first = _submitted(tmp_path, [{"id": "shot", "prompt": "a harbour"}], "first", TEMPLATE, capsys)
    second = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="second", output=TEMPLATE)
    records = tmp_path / "out" / ".farm"
    (records / "first").rename(tmp_path / "moved")
    if planted == "file":
        (records / "first").write_text("")
    else:
        (records / "first").symlink_to(tmp_path / "moved")
    _refused(second, capsys, f"{records / 'first'} is not a records folder the farm made")
    _untouched(first, "first")


def test_a_records_folder_that_cannot_be_listed_is_refused(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root lists every folder")
    _submitted(tmp_path, [{"id": "shot", "prompt": "a harbour"}], "first", TEMPLATE, capsys)
    second = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="second", output=TEMPLATE)
    records = tmp_path / "out" / ".farm"
    records.chmod(0o300)
    try:
        assert cli.main(["validate", str(second)]) == 1
        assert f"cannot list {records}" in capsys.readouterr().err
    finally:
        records.chmod(0o755)


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_a_claims_lock_that_is_not_a_file_stops_submit_with_a_message_and_is_never_written_through(
        tmp_path, capsys, planted):
    path = write_manifest(tmp_path, [{"id": "shot", "prompt": "a harbour"}], name="first", output=TEMPLATE)
    for job in manifest.load(path).jobs:
        publish(job, run="earlier")
    target = tmp_path / "precious"
    target.write_text("keep me")
    lock = tmp_path / "out" / ".farm" / claims.LOCK_FILE
    lock.parent.mkdir()
    lock.symlink_to(target) if planted == "link" else lock.mkdir()
    assert cli.main(["submit", str(path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"cannot take the claims lock {lock}" in err and "Traceback" not in err, err
    assert target.read_text() == "keep me"
    assert not (tmp_path / "out" / ".farm" / "first" / "lease.json").exists()  # the lease was given back


# -- claims compared as a tree: a file of one is never a folder of another -----------------------------------------


@pytest.mark.parametrize(("first_output", "first_id", "second_output", "second_id", "said"), [
    # the second's folder is the first's media
    (TEMPLATE, "a_s0", {"path": "{task}/{id}/x"}, "a_s0.mp4", "t2v/a_s0.mp4/x.mp4 (job a_s0.mp4) lies inside "
                                                              "t2v/a_s0.mp4, which is written by job a_s0 "),
    # the second's media is the first's folder
    ({"path": "{task}/{id}/x"}, "a_s0.mp4", TEMPLATE, "a_s0", "t2v/a_s0.mp4 (job a_s0) is a folder of "
                                                              "t2v/a_s0.mp4/x.mp4, written by job a_s0.mp4 "),
    # the second's folder is the first's sidecar
    (TEMPLATE, "a", {"path": "{task}/{id}/x"}, "a.mp4.json", "lies inside t2v/a.mp4.json, which is written by job a "),
    # the second's sidecar is the first's folder
    ({"path": "{task}/{id}/x"}, "a.mp4.json", TEMPLATE, "a", "t2v/a.mp4.json (job a) is a folder of "),
])
def test_a_path_of_one_manifest_is_never_a_folder_of_another(tmp_path, capsys, first_output, first_id,
                                                             second_output, second_id, said):
    """The first has claimed its files and not yet published them (it renders): nothing stands in the way yet."""
    first = write_manifest(tmp_path, [{"id": first_id, "prompt": "a harbour"}], name="first", output=first_output)
    storage.prepare_root(tmp_path / "out")
    claims.claim(manifest.load(first))
    second = write_manifest(tmp_path, [{"id": second_id, "prompt": "a desert"}], name="second", output=second_output)
    _refused(second, capsys, said, "of manifest 'first'")
    assert not (tmp_path / "out" / "t2v").exists()


# -- claims across nested roots: a root inside another, or the reverse, sees the other's claims ---------------------


@pytest.mark.parametrize("order", ["outer first", "inner first"])
def test_a_root_inside_another_root_sees_its_claims_whichever_claimed_first(tmp_path, capsys, order):
    """The inner manifest's `out/t2v/{id}` is the outer's `out/{task}/{id}`: one file, two roots."""
    outer = ([{"id": "shot", "prompt": "a harbour"}], "outer", TEMPLATE)
    inner = ([{"id": "shot", "prompt": "a desert"}], "inner", {"root": "out/t2v", "path": "{id}"})
    first, second = (outer, inner) if order == "outer first" else (inner, outer)
    done = _submitted(tmp_path, *first, capsys)
    later = write_manifest(tmp_path, second[0], name=second[1], output=second[2])
    _refused(later, capsys, f"of manifest {first[1]!r}", str(done))
    _untouched(done, first[1])


def test_nested_roots_that_write_apart_both_run(tmp_path, capsys):
    """Nesting alone is no conflict: only a path both would write is."""
    outer = _submitted(tmp_path, [{"id": "shot", "prompt": "a harbour"}], "outer", TEMPLATE, capsys)
    inner = _submitted(tmp_path, [{"id": "shot", "prompt": "a desert"}], "inner",
                       {"root": "out/other", "path": "{id}"}, capsys)
    for path in (outer, inner):
        assert cli.main(["plan", str(path)]) == 0
        assert "1 renders, 0 to do, 1 done" in capsys.readouterr().out


@pytest.mark.parametrize("inner_root", ["out/.farm/x", "out/.farm", "out/.farm/outer"])
def test_a_root_inside_another_roots_records_is_refused(tmp_path, capsys, inner_root):
    outer = _submitted(tmp_path, [{"id": "shot", "prompt": "a harbour"}], "outer", TEMPLATE, capsys)
    inner = write_manifest(tmp_path, [{"id": "shot", "prompt": "a desert"}], name="inner",
                           output={"root": inner_root, "path": "{id}"})
    _refused(inner, capsys, f"the farm's records of output root {tmp_path / 'out'}")
    assert cli.main(["plan", str(outer)]) == 0


@pytest.mark.parametrize("damage", ["state deleted", "state not JSON", "claims deleted", "claims not JSON"])
def test_another_manifest_of_the_same_name_is_refused_while_either_record_says_whose_the_records_are(
        tmp_path, capsys, damage):
    """A second manifest named like the first takes over its records (its submit rewrites the claims) and overwrites
    its renders, unless the records that still read name the first."""
    shared = {"root": str(tmp_path / "out"), **TEMPLATE}
    first = _submitted(tmp_path / "one", [{"id": "shot", "prompt": "a harbour"}], "first", shared, capsys)
    impostor = write_manifest(tmp_path / "two", [{"id": "shot", "prompt": "a desert"}], name="first", output=shared)
    record, how = damage.split(" ", 1)
    path = (claims.claims_path if record == "claims" else storage.state_path)(tmp_path / "out", "first")
    if how == "deleted":
        path.unlink()
    else:
        path.write_text("{")

    _refused(impostor, capsys, f"already holds the renders of another manifest named 'first' ({first})",
             "change name:")
    _untouched(first, "first")
    assert cli.main(["submit", str(first), "--no-progress"]) == 0  # the first's own records are its own
