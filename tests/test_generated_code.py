"""The checked-in stubs are exactly what `make proto` generates from protos/."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKED_IN = ROOT / "clients" / "python" / "genrm" / "cohort" / "v1"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "tools" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_stubs_are_not_stale(tmp_path: pathlib.Path) -> None:
    _generator().generate(tmp_path)
    fresh = sorted(
        p for p in (tmp_path / "genrm" / "cohort" / "v1").iterdir() if p.name.startswith("cohort")
    )
    assert [p.name for p in fresh] == [
        "cohort_descriptor_set.binpb",
        "cohort_pb2.py",
        "cohort_pb2.pyi",
        "cohort_pb2_grpc.py",
    ]
    for new in fresh:
        old = CHECKED_IN / new.name
        assert old.read_bytes() == new.read_bytes(), f"{old} is stale: run `make proto`"
