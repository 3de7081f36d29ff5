"""`wb mcp` start-up (docs/benchmarks.md#mcp-start-up; target ≤ 0.8 s until `initialize` is answered).

Ours: the installed console script `wb mcp` spawned with an `initialize` request on its
stdin, timed until the response line arrives on its stdout (then `tools/list`, timed until
its answer, and the stdin closed so the server ends). Yardstick: `python -c "import mcp"`,
the floor of any program serving MCP with the SDK. Interleaved runs, medians (bench/common.py).

    python3 bench/mcp_startup.py [--repetitions N] [--importtime] [--before TREE]

`--importtime` also prints the slowest imports of `wb mcp` until `tools/list` is answered.
`--before TREE` also times another checkout's tree (e.g. `git archive` of an older commit,
first on PYTHONPATH) in the same interleaved rounds, for a paired before/after.
No sshd and no root needed: the server only starts, answers and ends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common

TARGET_S = 0.8
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def _line(message: Mapping[str, object]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def _answer(stdout: object, want_id: int) -> dict[str, object]:
    while True:
        line = stdout.readline()  # type: ignore[attr-defined]
        if not line:
            raise RuntimeError(f"wb mcp closed its stdout before answering request {want_id}")
        message = json.loads(line)
        if message.get("id") == want_id:
            if "result" not in message:
                raise RuntimeError(f"wb mcp answered request {want_id} with {message}")
            return message  # type: ignore[no-any-return]


def mcp_session(env: dict[str, str], argv: list[str] | None = None) -> tuple[float, float, str]:
    """(seconds until `initialize` is answered, until `tools/list` is, stderr) of one spawned server."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv or [common.WB, "mcp"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    try:
        process.stdin.write(_line(INITIALIZE))
        process.stdin.flush()
        _answer(process.stdout, 1)
        initialized = time.perf_counter() - started
        process.stdin.write(_line(INITIALIZED) + _line(TOOLS_LIST))
        process.stdin.flush()
        tools = _answer(process.stdout, 2)
        listed = time.perf_counter() - started
        if not tools["result"]["tools"]:  # type: ignore[index]
            raise RuntimeError("wb mcp listed no tools")
        process.stdin.close()
        process.wait(timeout=common.SUBPROCESS_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return initialized, listed, process.stderr.read().decode(errors="replace")


def import_profile(env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(cumulative µs, self µs, module) of the slowest imports of `wb mcp` until tools/list is answered."""
    wb_main = "import sys; sys.argv = ['wb', 'mcp']; from courier.main import main; main()"
    _, _, stderr = mcp_session(env, [common.PYTHON, "-X", "importtime", "-c", wb_main])
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        rows.append((int(cumulative_us), int(self_us), name))
    return sorted(rows, reverse=True)[:25]


def run(report: common.Report, repetitions: int, *, importtime: bool = False, before: str = "") -> None:
    with common.workdir("mcp") as base:
        config = base / "wb.yaml"
        config.write_text("agents: {}\n")
        config.chmod(0o600)
        env = common.base_env(WB_HOME=str(base / "home"), WB_CONFIG=str(config))
        env.pop("WB_MCP_PROGRESS_MS", None)
        listed: dict[str, list[float]] = {"ours": [], "before": []}

        def server(name: str, environment: dict[str, str]) -> float:
            initialized, tools_listed, _ = mcp_session(environment)
            listed[name].append(tools_listed)
            return initialized

        def yardstick() -> float:
            return common.run_timed([common.PYTHON, "-c", "import mcp"], env=env)

        subjects = {"ours": lambda: server("ours", env), "yardstick": yardstick}
        if before:
            subjects["before"] = lambda: server("before", {**env, "PYTHONPATH": before})
        samples = common.interleaved(subjects, repetitions)
        floor = common.median(samples["yardstick"])
        load = os.getloadavg()
        for name in ("before", "ours") if before else ("ours",):
            mine = common.median(samples[name])
            shown = common.median(listed[name][-repetitions:])
            report.add(
                common.Row(
                    "mcp start-up" + (f" ({name})" if before else ""),
                    f"wb mcp until initialize answered {common.ms(mine)} (tools/list {common.ms(shown)})",
                    f'python -c "import mcp" {common.ms(floor)}',
                    f"{mine / floor:.2f}x",
                    f"<= {TARGET_S} s",
                    mine <= TARGET_S,
                    f"median of {repetitions}; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
                )
            )
        if importtime:
            for cumulative, own, name in import_profile(env):
                report.detail(f"{cumulative / 1000:8.1f} ms cumulative {own / 1000:7.1f} ms self  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--importtime", action="store_true", help="also print the slowest imports")
    parser.add_argument("--before", default="", metavar="TREE", help="also time this tree (a paired before/after)")
    args = parser.parse_args()
    report = common.Report()
    run(report, args.repetitions, importtime=args.importtime, before=args.before)
    print(common.table(report.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
