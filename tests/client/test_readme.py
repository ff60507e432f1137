"""The collector of clients/python/README.md runs, as printed, against a live server."""

from __future__ import annotations

import asyncio
import pathlib
import sys

from genrm_grpc.testing import FakeJudgeServer
from tests.client.support import cohort_server

README = pathlib.Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"


def _collector_source() -> str:
    section = README.read_text().split("## A collector in 20 lines", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 25
    return code


async def test_the_readme_collector_runs_twice_with_an_edited_answer_and_prints_a_reward_per_member(
    fake_judge: FakeJudgeServer, tmp_path: pathlib.Path
) -> None:
    code = _collector_source()
    assert 'SERVER = "127.0.0.1:50051"' in code
    async with cohort_server(fake_judge.url) as port:
        script = tmp_path / "collector.py"
        script.write_text(code.replace("127.0.0.1:50051", f"127.0.0.1:{port}"))
        first = await _run(script)
        # A user edits an answer and runs it again against the same server: new groups,
        # judged afresh, not SLOT_CONFLICT and not the first run's replayed rewards.
        script.write_text(script.read_text().replace('"Four."', '"Nine is not prime."'))
        calls = fake_judge.stats()["total"]
        second = await _run(script)
        assert fake_judge.stats()["total"] > calls
    for out in (first, second):
        rows = [line.split() for line in out.splitlines()]
        assert [(step, index) for step, index, _ in rows] == [
            (str(s), str(i)) for s in range(2) for i in range(3)
        ]
        assert all(0.0 <= float(reward) <= 10.0 for _, _, reward in rows)


async def _run(script: pathlib.Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()
    return out.decode()
