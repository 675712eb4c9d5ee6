"""Shared by the stand-ins: where to record calls and find captured output (from env vars)."""

import json
import os
import sys
import time
from pathlib import Path

STATE = Path(os.environ["EDGERL_STANDIN_DIR"])
FIXTURES = Path(os.environ["EDGERL_STANDIN_FIXTURES"])


def record(tool: str) -> list[str]:
    """Append this call to calls.jsonl; honour EDGERL_STANDIN_SLEEP (to test timeouts)."""
    with (STATE / "calls.jsonl").open("a") as f:
        f.write(json.dumps({"tool": tool, "argv": sys.argv[1:], "t": time.time()}) + "\n")
    if sleep := os.environ.get(f"EDGERL_STANDIN_SLEEP_{tool.upper()}"):
        time.sleep(float(sleep))
    return sys.argv[1:]
