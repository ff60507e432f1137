"""The repository stands alone: no text file in it points outside the checkout."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Machine paths of a developer's checkout and links that climb out of the repository.
OUTSIDE = re.compile(r"(?<![\w.])(/work/|/root/|/home/|\.\./shared/|/shared/)")


def _tracked_text_files() -> list[pathlib.Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for name in filter(None, names):
        path = ROOT / name.decode()
        if path == pathlib.Path(__file__).resolve():
            continue  # this file spells the patterns out
        if path.is_file() and b"\0" not in path.read_bytes()[:4096]:
            files.append(path)
    return files


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_text_files():
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_path_check_catches_each_kind_of_outside_path() -> None:
    for line in (
        # Built from parts, so that this file does not itself name an outside path.
        "see ``/work/" + "shared/design/SCORING.md``",
        "(`../" + "shared/data/README.md`)",
        "cd /root/project",
        "/home/someone/genrm",
    ):
        assert OUTSIDE.search(line), line
    assert not OUTSIDE.search("docs/protocol.md and genrm_grpc/data/README.md")
