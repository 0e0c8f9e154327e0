"""docs/deploy/Dockerfile read as instructions per build stage (continuation lines joined, comments dropped)."""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "docs" / "deploy" / "Dockerfile"


def stages(path: Path = DOCKERFILE) -> list[list[tuple[str, str]]]:
    """[(INSTRUCTION, arguments), ...] per stage; the ARGs before the first FROM are stage 0's."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM" and found[-1] and any(i == "FROM" for i, _ in found[-1]):
            found.append([])
        found[-1].append((instruction.upper(), " ".join(arguments.split())))
    return found


def final_stage_user() -> tuple[int, int | None]:
    """The numeric uid (and gid) the image runs as: its last USER; Kubernetes checks runAsNonRoot against a number."""
    users = [arguments for instruction, arguments in stages()[-1] if instruction == "USER"]
    assert users, "the image runs as root: no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and (not gid or gid.isdigit()), f"USER {users[-1]}: use numbers (runAsNonRoot checks them)"
    return int(uid), int(gid) if gid else None
