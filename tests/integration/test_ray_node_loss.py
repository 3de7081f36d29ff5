"""A Ray node that dies with a run on it (docs/ray.md#failure-modes): that run `abandoned`, `node <node> lost`.

It kills node w2 of the session's one cluster for good, so it runs after every other Ray test
(pytest runs the files in name order: test_ray_executor.py, then this one).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Machine
from tests.integration.ray_cluster import RayCluster
from tests.integration.test_ray_executor import WAIT_S, dispatch, lab, status, wait_for

__all__ = ["lab"]  # the fixture, shared with test_ray_executor.py


def test_a_killed_node_abandons_its_run_and_no_other(lab: Machine, ray_cluster: RayCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    doomed = dispatch(lab, "task", f"wait:{release}", "lost-1", repo="acme/other")  # only w2 has acme/other
    spared = dispatch(lab, "tagged", f"wait:{release}", "kept-1")  # only w1 has `fast`
    assert wait_for(lab, doomed, {"running"})["node"] == "w2"
    assert wait_for(lab, spared, {"running"})["node"] == "w1"

    ray_cluster.kill_node(ray_cluster.node("w2"))
    result = wait_for(lab, doomed, {"abandoned"})
    assert (result["failure"], result["node"], result["terminal"]) == ("node w2 lost", "w2", True)
    text = lab.wb("agent", "status", doomed, timeout=WAIT_S).stdout
    assert "state:    abandoned\n" in text and "failure:  node w2 lost\n" in text, text

    assert status(lab, spared)["state"] == "running"
    release.touch()
    assert wait_for(lab, spared, {"completed"})["node"] == "w1"
    done = lab.wb("agent", "list", "--to", "lab", "--json", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    listed = {f"lab:{r['agent_id']}": r for r in json.loads(done.stdout)}
    assert (listed[doomed]["state"], listed[doomed]["failure"]) == ("abandoned", "node w2 lost")
    assert listed[spared]["state"] == "completed"
