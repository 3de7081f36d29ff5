"""Benchmark 7 — remote diff of a 1 MiB patch (issue 13: within 1.2× of `ssh host git -C <worktree> diff`).

Ours: `wb agent diff m1:agt-…` as a user types it: interpreter start, the CLI, an asyncssh
connection, the remote receiver (temporary index, one `git diff --binary`), the JSON reply,
the patch written to stdout. Yardstick: OpenSSH running `git -C <worktree> diff` against the
same sshd, key and known_hosts (no multiplexing), which sees the same change (tracked lines
only, so both patches are about 1 MiB). Floors beside it (information rows, bench/common.py
`Fleet.least_clients`): the least asyncssh client running the receiver with the same diff
request (what wb costs above it is its own client: the CLI, wb.yaml, the reply's validation, the
patch written out), and the least client of the contract's shape (the request and the answer
validated with pydantic).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, warm

LINES = 10_000  # 10,000 added lines of 100 bytes: a patch of about 1 MiB


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@example.invalid",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@example.invalid",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _worktree_with_change(root: Path) -> tuple[Path, str]:
    worktree = root / "projects" / "acme" / "widget"
    worktree.mkdir(parents=True)
    _git(worktree, "init", "-q", "-b", "main")
    (worktree / "data.txt").write_text("start\n")
    _git(worktree, "add", "data.txt")
    _git(worktree, "commit", "-q", "-m", "base")
    base = _git(worktree, "rev-parse", "HEAD").strip()
    line = "x" * 99 + "\n"
    (worktree / "data.txt").write_text("start\n" + "".join(f"{index:08d}{line[8:]}" for index in range(LINES)))
    return worktree, base


def run(report: common.Report, base: Path, repetitions: int = 11) -> None:
    with common.fleet(1, base, name="diff") as machines:
        server = machines.servers[0]
        agent_id = common.write_records(server.wb_home, 1)[0]
        worktree, base_sha = _worktree_with_change(server.root)
        record_path = server.wb_home / "agents" / agent_id / "run.json"
        record = json.loads(record_path.read_text())
        record.update(worktree_dir=str(worktree), base_sha=base_sha)
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        env = machines.env()
        ours = [common.WB, "agent", "diff", f"m1:{agent_id}"]
        status = [common.WB, "agent", "status", f"m1:{agent_id}"]
        yardstick = machines.ssh_argv(server, "git", "-C", str(worktree), "diff")
        patch = common.run_output(ours, env=env)
        plain = common.run_output(yardstick, env=env)
        request = base / "diff-request.json"
        request.write_text(json.dumps({"schema_version": 1, "operation": "diff", "agent_id": agent_id}))
        clients = machines.least_clients(server)
        least, validating = clients["asyncssh"], clients["validating"]
        reply = json.loads(common.run_output(least, env=env, stdin_path=request))
        if len(reply.get("result", {}).get("patch", "")) < len(plain) // 2:
            raise RuntimeError(f"the least asyncssh client's diff has no patch: {str(reply)[:300]}")
        samples = common.interleaved(
            {
                "wb": lambda: common.run_timed(ours, env=env),
                "ssh": lambda: common.run_timed(yardstick, env=env),
                "status": lambda: common.run_timed(status, env=env),
                "least": lambda: common.run_timed(least, env=env, stdin_path=request),
                "validating": lambda: common.run_timed(validating, env=env, stdin_path=request),
            },
            repetitions,
        )
        # The same diff on the warm path (docs/courier.md): the courier's kept connection and program.
        warm_env = machines.env(WB_COURIER="on")
        try:
            warm._warm_up(ours, warm_env, 1)
            warm_samples = common.interleaved(
                {
                    "wb": lambda: common.run_timed(ours, env=warm_env),
                    "ssh": lambda: common.run_timed(yardstick, env=warm_env),
                },
                repetitions,
            )
        finally:
            warm._stop(warm_env)
    warm_wb, warm_ssh = common.median(warm_samples["wb"]), common.median(warm_samples["ssh"])
    report.add(
        common.Row(
            "7c. warm remote diff, 1 MiB patch",
            f"wb agent diff m:agt {common.ms(warm_wb)}",
            f"ssh host git diff {common.ms(warm_ssh)}",
            f"{warm_wb / warm_ssh:.2f}x",
            "<= 1.2x",
            warm_wb / warm_ssh <= 1.2,
            f"medians of {repetitions}; courier running, serve mode",
        )
    )
    wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
    status_s = common.median(samples["status"])
    ratio = wb / ssh
    report.add(
        common.Row(
            "7. remote diff, 1 MiB patch",
            f"wb agent diff m:agt {common.ms(wb)}",
            f"ssh host git diff {common.ms(ssh)}",
            f"{ratio:.2f}x",
            "<= 1.2x",
            ratio <= 1.2,
            f"medians of {repetitions}; patches {len(patch.encode())} / {len(plain.encode())} bytes",
        )
    )
    floor = common.median(samples["least"])
    report.add(
        common.Row(
            "7d. remote diff / the least asyncssh client running the receiver's diff",
            f"wb agent diff m:agt {common.ms(wb)}",
            f"python + asyncssh, same request {common.ms(floor)}",
            f"{wb / floor:.2f}x",
            "(info)",
            None,
            f"that client is {floor / ssh:.2f}x ssh host git diff: a floor for any asyncssh client of the receiver",
        )
    )
    validated = common.median(samples["validating"])
    report.add(
        common.Row(
            "7e. remote diff / the least client of the contract's shape",
            f"wb agent diff m:agt {common.ms(wb)}",
            f"python + pydantic + asyncssh, same request {common.ms(validated)}",
            f"{wb / validated:.2f}x",
            "(info)",
            None,
            f"the request and the answer validated with pydantic, then asyncssh, one after the other; "
            f"{validated / ssh:.2f}x ssh host git diff",
        )
    )
    # What the diff itself costs over any remote call: the same round trip asking `status`.
    report.add(
        common.Row(
            "7b. remote diff / remote status",
            f"wb agent diff m:agt {common.ms(wb)}",
            f"wb agent status m:agt {common.ms(status_s)}",
            f"{wb / status_s:.2f}x",
            "(info)",
            True,
            "the diff's own cost beyond the remote call",
        )
    )


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("diff") as base:
        run(report, base, int(sys.argv[1]) if len(sys.argv) > 1 else 11)
    print(common.table(report.rows))
