"""A connection-level (L4) balancer for the judge-farm bench: each accepted TCP
connection goes to the next backend, round robin, and its bytes are copied both ways.

It emulates what a Kubernetes Service or an L4 load balancer in front of several vLLM
replicas does: it spreads *connections*, not requests, and knows nothing of a backend's
queue or health. ``python -m bench.l4proxy HOST:PORT [HOST:PORT ...]`` prints
``l4proxy listening on 127.0.0.1:PORT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def main(backends: list[str]) -> None:
    ring = itertools.cycle(backends)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = next(ring).rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"l4proxy listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1:]))
