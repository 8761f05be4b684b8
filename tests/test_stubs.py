"""The committed gRPC/protobuf stubs in seedq/v1 must match protos/."""

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATED = ("seed_pb2.py", "seed_pb2.pyi", "seed_pb2_grpc.py")


def test_committed_stubs_match_protos(tmp_path):
    pytest.importorskip("grpc_tools")
    proto = ROOT / "protos" / "seedq" / "v1" / "seed.proto"
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}",
            f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            str(proto),
        ],
        check=True,
    )
    stale = [
        name
        for name in GENERATED
        if (tmp_path / "seedq" / "v1" / name).read_bytes()
        != (ROOT / "seedq" / "v1" / name).read_bytes()
    ]
    assert not stale, (
        f"seedq/v1/{', '.join(stale)} are stale: regenerate with "
        "`python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. "
        "--grpc_python_out=. protos/seedq/v1/seed.proto`"
    )
