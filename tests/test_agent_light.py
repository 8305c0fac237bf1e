"""The agent stays light and portable: stdlib, mlx, mlx-lm (and psutil) only."""

import ast
import sys
from pathlib import Path

from agent.soak import soak_verdict

AGENT = Path(__file__).resolve().parents[1] / "agent"
ALLOWED = {"mlx", "mlx_lm", "psutil"}


def test_agent_imports_only_stdlib_mlx_and_mlx_lm():
    stdlib = set(sys.stdlib_module_names)
    for py in AGENT.rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib or top in ALLOWED, f"{py.name} imports {name}"


def test_soak_verdict_fails_growth_and_monotonic_swap():
    flat = [{"rss_bytes": 100 << 20, "swap_used_bytes": 0} for _ in range(12)]
    assert soak_verdict(flat)["status"] == "pass"
    leak = [{"rss_bytes": (100 + 5 * i) << 20, "swap_used_bytes": 0} for i in range(12)]
    v = soak_verdict(leak)
    assert v["status"] == "fail" and v["reasons"][0].startswith("working set grew")
    assert v["peak_rss_bytes"] == 155 << 20
    swapping = [{"rss_bytes": 100 << 20, "swap_used_bytes": 1000 * i} for i in range(6)]
    assert soak_verdict(swapping)["reasons"] == ["swap use grew at every sample (0 → 5000 bytes)"]
    spike = flat[:5] + [{"rss_bytes": 400 << 20, "swap_used_bytes": 0}] + flat[6:]
    assert soak_verdict(spike)["status"] == "pass"  # one spike is not growth
