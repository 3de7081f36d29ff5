"""Benchmark 4 — the store at scale (docs/benchmarks.md#targets: `list` over 10,000 records ≤ 1 s; `status`
independent of the record count).

`wb agent list --json` over 10,000 records on disk, `wb agent status <id> --json` with 10
records and with 10,000 (same record), and `list` over the 10 (issue 19's cold local row),
interleaved. The yardstick for `list` is an absolute target; for `status` it is the same
command over a home of 10 records.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common


def run(report: common.Report, base: Path, records: int = 10_000, repetitions: int = 5) -> None:
    small, large = base / "small-home", base / "large-home"
    small_id = common.write_records(small, 10)[0]
    large_ids = common.write_records(large, records)
    large_id = large_ids[len(large_ids) // 2]
    env_small = common.no_config_env(base, WB_HOME=str(small))
    env_large = common.no_config_env(base, WB_HOME=str(large))
    samples = common.interleaved(
        {
            "list": lambda: common.run_timed([common.WB, "agent", "list", "--json"], env=env_large),
            "status-large": lambda: common.run_timed([common.WB, "agent", "status", large_id, "--json"], env=env_large),
            "status-small": lambda: common.run_timed([common.WB, "agent", "status", small_id, "--json"], env=env_small),
            "list-small": lambda: common.run_timed([common.WB, "agent", "list", "--json"], env=env_small),
        },
        repetitions,
    )
    listing = common.median(samples["list"])
    large_status, small_status = common.median(samples["status-large"]), common.median(samples["status-small"])
    report.add(
        common.Row(
            f"4. list over {records:,} records",
            f"wb agent list --json {common.ms(listing)}",
            "1 s",
            f"{listing:.2f} s",
            "<= 1 s",
            listing <= 1.0,
            f"medians of {repetitions}",
        )
    )
    small_listing = common.median(samples["list-small"])
    report.add(
        common.Row(
            "4c. cold local list (issue 19)",
            f"wb agent list --json, 10 records {common.ms(small_listing)}",
            "0.2 s",
            f"{small_listing:.3f} s",
            "<= 0.2 s",
            small_listing <= 0.2,
            f"medians of {repetitions}; WB_COURIER=off, no wb.yaml",
        )
    )
    ratio = large_status / small_status
    report.add(
        common.Row(
            "4b. status vs record count",
            f"status, {records:,} records {common.ms(large_status)}",
            f"status, 10 records {common.ms(small_status)}",
            f"{ratio:.2f}x",
            "~1.0x (within noise)",
            ratio <= 1.10,
            f"medians of {repetitions}; 1.10x taken as the noise bound",
        )
    )


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("store") as base:
        run(report, base, *(int(a) for a in sys.argv[1:3]))
    print(common.table(report.rows))
