"""The replay save's cost per checkpoint alone (the last part of ``edgerl bench``), quickly.

python scripts/bench_replay_save.py [ENV_ID] [--set key=value ...]
"""

from __future__ import annotations

import json
import logging
import sys

from edgerl.hw.device import resolve_device
from edgerl.measure.bench import BenchOptions, _config
from edgerl.measure.replay import render_replay_save, replay_save_cost


def main(argv: list[str]) -> int:
    env_id = argv[0] if argv and not argv[0].startswith("--") else "ALE/Pong-v5"
    overrides = tuple(a for a in argv if "=" in a)
    cfg = _config(BenchOptions(env_id=env_id, overrides=overrides))
    result = replay_save_cost(cfg, resolve_device(cfg.perf.device), cfg.replay.capacity // 4)
    print("\n".join(render_replay_save(result)))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
