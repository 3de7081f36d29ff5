"""Benchmark 2 — the receiver's start-up (docs/benchmarks.md#targets: ≤ 1.5× `python -c "import pydantic"`).

Ours: `wb --wb-internal-agent-remote` answering a `status` request read from a file, for a
record that exists, as sshd would run it. Yardstick: `python -c "import pydantic"` (issue 35's
yardstick; it imports only pydantic's lazy top). Both through the real interpreter (no shim).
Also reports the same with a wb.yaml present (which must be read for agents.home), the least
pydantic program that validates the same request (bench/common.py LEAST_PYDANTIC: the floor of
any receiver that validates with pydantic), and the top importers from `python -X importtime`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common

# serve() points stderr at /dev/null before answering (so a detached owner never inherits the
# session), which would hide -X importtime's lines: this probe takes the same path without that.
PROBE = """
import sys
from courier.receiver.serve import _home_id, _import_models, answer, read_request
_import_models()
data, oversize = read_request(0)
response = answer(data, oversize, lambda: False)
response.home_id = _home_id()
sys.stdout.buffer.write(response.encode())
"""

LEAN_ABSENT = ("yaml", "typer", "asyncssh", "rich", "courier.config", "courier.runs.admission", "courier.runs.owner")

CONFIG = """\
agents:
  home: {home}
  providers:
    mock:
      base_url: http://127.0.0.1:9/v1
      credential_env: TEST_PROVIDER_KEY
  profiles:
    fake:
      harness: codex
      provider: mock
      model: gpt-5.5
"""


def import_profile(env: dict[str, str], request: Path) -> list[tuple[int, int, str]]:
    """(cumulative µs, self µs, module) of the slowest imports on the receiver's path."""
    import subprocess

    with open(request, "rb") as stdin:
        completed = subprocess.run(
            [common.PYTHON, "-X", "importtime", "-c", PROBE],
            cwd=request.parent,
            env=env,
            stdin=stdin,
            capture_output=True,
            timeout=common.SUBPROCESS_TIMEOUT_S,
            check=True,
        )
    rows: list[tuple[int, int, str]] = []
    for line in completed.stderr.decode().splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        own, cumulative, name = line[len("import time:") :].split("|")
        rows.append((int(cumulative), int(own), name.rstrip()))
    return rows


def summarize_imports(rows: list[tuple[int, int, str]], top: int = 10) -> list[str]:
    top_level = sorted((c, o, n.strip()) for c, o, n in rows if n.startswith(" ") and n[1:2] != " ")[::-1]
    by_self = sorted(((o, c, n.strip()) for c, o, n in rows), reverse=True)[:top]
    cumulative = ", ".join(f"{n} {c / 1000:.1f} ms" for c, _, n in top_level[:top])
    lines = [f"top-level imports by cumulative time: {cumulative}"]
    lines.append("slowest modules by own time: " + ", ".join(f"{n} {o / 1000:.1f} ms" for o, _, n in by_self))
    imported = {n.strip() for _, _, n in rows}
    absent = [name for name in LEAN_ABSENT if name not in imported]
    lines.append("not imported: " + ", ".join(absent))
    return lines


def run(report: common.Report, base: Path, repetitions: int = 20) -> None:
    home = base / "receiver-home"
    agent_id = common.write_records(home, 1)[0]
    request = base / "status-request.json"
    request.write_text(json.dumps({"schema_version": 1, "operation": "status", "agent_id": agent_id}))
    env = common.no_config_env(base, WB_HOME=str(home))
    config_dir = base / "receiver-config"
    config_dir.mkdir(mode=0o700)
    config = config_dir / "wb.yaml"
    config.write_text(CONFIG.format(home=home))
    config.chmod(0o600)
    env_config = common.base_env(WB_CONFIG=str(config))
    reply = json.loads(common.run_output([common.WB, "--wb-internal-agent-remote"], env=env, stdin_path=request))
    if reply.get("result", {}).get("agent_id") != agent_id:
        raise RuntimeError(f"the receiver did not answer the status request: {reply}")
    ours = [common.WB, "--wb-internal-agent-remote"]
    least = [common.PYTHON, "-c", common.LEAST_PYDANTIC]
    samples = common.interleaved(
        {
            "wb": lambda: common.run_timed(ours, env=env, stdin_path=request),
            "pydantic": lambda: common.run_timed([common.PYTHON, "-c", "import pydantic"], env=env),
            "wb+yaml": lambda: common.run_timed(ours, env=env_config, stdin_path=request),
            "python": lambda: common.run_timed([common.PYTHON, "-c", "pass"], env=env),
            "least": lambda: common.run_timed(least, env=env, stdin_path=request),
        },
        repetitions,
    )
    wb, floor = common.median(samples["wb"]), common.median(samples["pydantic"])
    with_config, bare = common.median(samples["wb+yaml"]), common.median(samples["python"])
    least = common.median(samples["least"])
    report.add(
        common.Row(
            "2. receiver start-up (status)",
            f"wb --wb-internal-agent-remote {common.ms(wb)}",
            f"python -c 'import pydantic' {common.ms(floor)}",
            f"{wb / floor:.2f}x",
            "<= 1.5x",
            wb / floor <= 1.5,
            f"medians of {repetitions}; bare python {common.ms(bare)}",
        )
    )
    report.add(
        common.Row(
            "2b. receiver start-up, wb.yaml present",
            f"same, reading wb.yaml {common.ms(with_config)}",
            f"python -c 'import pydantic' {common.ms(floor)}",
            f"{with_config / floor:.2f}x",
            "(info)",
            None,
            "a machine whose wb.yaml exists pays for yaml and the config models",
        )
    )
    report.add(
        common.Row(
            "2c. receiver start-up / the least pydantic program",
            f"wb --wb-internal-agent-remote {common.ms(wb)}",
            f"one pydantic model validating the request {common.ms(least)}",
            f"{wb / least:.2f}x",
            "(info)",
            None,
            f"the least pydantic program is {least / floor:.2f}x `import pydantic`: below it, no program that "
            "validates its request with pydantic answers",
        )
    )
    for line in summarize_imports(import_profile(env, request)):
        report.detail(f"receiver imports: {line}")


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("receiver") as base:
        run(report, base, int(sys.argv[1]) if len(sys.argv) > 1 else 20)
    print(common.table(report.rows))
