"""One verl reward-loop worker process: ``RewardLoopWorker(cfg).compute_score_batch``.

verl 0.9 runs ``reward.num_workers`` of these as Ray actors; here each is a plain
process (no Ray cluster): it reads a pickled ``(config, DataProto)`` from stdin, builds
verl's own ``RewardLoopWorker`` from the config (which loads the reward manager the
config names) and writes the pickled list of results of ``compute_score_batch`` — one
``{"reward_score", "reward_extra_info"}`` per sample, or ``("error", type, message)`` —
to stdout.
"""

from __future__ import annotations

import asyncio
import pickle
import sys


def main() -> None:
    config, data = pickle.load(sys.stdin.buffer)
    # verl's workers take the event loop that exists when they are built (Ray's actor
    # loop in production): make it first.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    try:
        worker = RewardLoopWorker(config)
        outcome: object = loop.run_until_complete(worker.compute_score_batch(data))
    except Exception as exc:  # reported to the test, which asserts on it
        outcome = ("error", type(exc).__name__, str(exc))
    sys.stdout.buffer.write(pickle.dumps(outcome))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
