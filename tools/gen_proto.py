"""Regenerate the checked-in Python stubs from protos/ (run via `make proto`).

Also used by the staleness test: ``generate(out_dir)`` writes the stubs into any
directory so the test can compare them byte for byte with the checked-in copies.
"""

from __future__ import annotations

import pathlib
import sys

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "clients" / "python"
DESCRIPTOR_SET = "genrm/cohort/v1/cohort_descriptor_set.binpb"


def _include_dirs() -> list[str]:
    import google.rpc  # googleapis-common-protos ships google/rpc/status.proto

    googleapis_root = pathlib.Path(next(iter(google.rpc.__path__))).parent.parent
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    return [str(PROTO_ROOT), str(googleapis_root), str(well_known)]


def proto_files() -> list[pathlib.Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc"]
    args += [f"-I{d}" for d in _include_dirs()]
    args += [f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}"]
    # Generated modules drop comments; this descriptor set keeps them so that server
    # reflection (grpcurl describe) shows the proto comments, the operators' API reference.
    descriptors = out_dir / DESCRIPTOR_SET
    descriptors.parent.mkdir(parents=True, exist_ok=True)
    args += [f"--descriptor_set_out={descriptors}", "--include_source_info", "--include_imports"]
    args += [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_ROOT)
