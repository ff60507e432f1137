"""`make buf-breaking`: buf FILE-level breaking checks of protos/.

Compares the working tree with (1) the checked-in image of the released contract,
``api/genrm-cohort-v1.binpb``, and (2) the protos of the previous commit, when git
has one that contains them. There is no network to the Buf Schema Registry, so
``google/rpc/status.proto`` comes from the installed googleapis-common-protos wheel
(``build/proto-deps``, filled by the Makefile).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUF = ROOT / ".venv" / "bin" / "buf"
BASELINE = ROOT / "api" / "genrm-cohort-v1.binpb"
DEPS = ROOT / "build" / "proto-deps"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def _breaking(against: pathlib.Path, label: str) -> bool:
    print(f"buf breaking against {label}", flush=True)
    return (
        subprocess.run([str(BUF), "breaking", "--against", str(against)], cwd=ROOT).returncode == 0
    )


def _previous_commit_image(workdir: pathlib.Path) -> pathlib.Path | None:
    listed = _git("ls-tree", "-r", "--name-only", "HEAD~1", "protos/")
    files = [line for line in listed.stdout.splitlines() if line.endswith(".proto")]
    if listed.returncode != 0 or not files:
        return None
    tree = workdir / "previous"
    for name in files:
        shown = _git("show", f"HEAD~1:{name}")
        target = tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(shown.stdout)
    shutil.copytree(DEPS, tree / "deps")
    (tree / "buf.yaml").write_text("version: v2\nmodules:\n  - path: protos\n  - path: deps\n")
    image = workdir / "previous.binpb"
    subprocess.run([str(BUF), "build", "-o", str(image)], cwd=tree, check=True)
    return image


def main() -> int:
    ok = _breaking(BASELINE, str(BASELINE.relative_to(ROOT)))
    with tempfile.TemporaryDirectory() as tmp:
        image = _previous_commit_image(pathlib.Path(tmp))
        if image is None:
            print("no previous commit with protos/: checked against the baseline image only")
        else:
            ok = _breaking(image, "the previous commit (HEAD~1)") and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
