"""A Ray cluster as one machine (docs/ray.md), through the `wb` CLI against a real three-node cluster.

The cluster (tests/integration/ray_cluster.py) is the session's one: head (1 cpu), w1 (2 cpus,
custom resource `fast`), w2 (1 cpu, the only clone of acme/other). This machine reaches its
head as the exec machine `lab`, as a supervisor would. The slow scenarios run once each.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import yaml
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import CONFIG_TEMPLATE, CREDENTIAL_ENV, Machine, make_machine
from tests.conftest import wait_for as wait_for_condition
from tests.integration.ray_cluster import HEAD_PORT, RayCluster

WAIT_S = 240  # a loaded 2-core machine starts Ray workers slowly


@pytest.fixture
def lab(tmp_path: Path, ray_cluster: RayCluster) -> Machine:
    """This machine, with the cluster's head as the exec machine `lab`."""
    machine = make_machine(tmp_path / "caller")
    config = yaml.safe_load(CONFIG_TEMPLATE.format(credential_env=CREDENTIAL_ENV))
    config["session_move"] = {"targets": {"lab": {"exec": {"argv": ray_cluster.head_argv()}}}}
    machine.write_config(yaml.safe_dump(config))
    return machine


def dispatch(lab: Machine, profile: str, task: str, worktree: str, repo: str = "acme/widget", pad: int = 0) -> str:
    """Dispatch `task` (followed by a space and `pad` bytes of padding the task-script ignores)."""
    task_file = lab.root / f"task-{worktree}.txt"
    task_file.write_text(task + (" " + "x" * pad if pad else ""), encoding="utf-8")
    done = lab.wb(
        "agent", "dispatch", "--to", "lab", "--new-worktree", worktree, "--profile", profile, "--repo", repo,
        "--task-file", str(task_file), timeout=WAIT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert ref.startswith("lab:agt-"), done.stdout
    return ref


def status(lab: Machine, ref: str) -> dict[str, Any]:
    done = lab.wb("agent", "status", ref, "--json", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def wait_for(lab: Machine, ref: str, states: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        result = status(lab, ref)
        if result["state"] in states or time.monotonic() > deadline:
            assert result["state"] in states, result
            return result
        time.sleep(0.5)


def _queued_through_mcp(lab: Machine, ref: str) -> tuple[str, str]:
    """(status, list) states of `ref` as `wb mcp` answers them to the MCP SDK's client."""

    async def main() -> tuple[str, str]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "courier.main", "mcp"], env=lab.env)
        with anyio.fail_after(WAIT_S):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                status = (await session.call_tool("status", {"ref": ref})).structured_content or {}
                listed = (await session.call_tool("list", {"to": "lab"})).structured_content or {}
        agent_id = ref.split(":", 1)[1]
        states = [r["state"] for r in listed.get("results", []) if r["agent_id"] in (ref, agent_id)]
        return str(status.get("state")), str(states[0]) if len(states) == 1 else repr(states)

    return anyio.run(main)


def test_more_runs_than_cpus_queue_then_complete_across_the_nodes(lab: Machine, tmp_path: Path) -> None:
    # Four cpus in the cluster, six one-cpu runs that wait for a file: two are `queued`. Their
    # tasks are larger than what Ray inlines in a call (100 KiB), so a queued run's task must
    # outlive the short-lived receiver that dispatched it.
    release = tmp_path / "release"
    refs = [dispatch(lab, "task", f"wait:{release}", f"q{i}", pad=300_000) for i in range(6)]
    results = {ref: status(lab, ref) for ref in refs}
    queued = [ref for ref, result in results.items() if result["state"] == "queued"]
    assert len(queued) >= 2, {ref: r["state"] for ref, r in results.items()}
    text = lab.wb("agent", "status", queued[-1], timeout=WAIT_S)
    assert "state:    queued (waiting for cpus=1)\n" in text.stdout, text.stdout
    # An MCP supervisor sees `queued` too: the status tool and the list tool through the head.
    mcp_seen = _queued_through_mcp(lab, queued[-1])
    assert mcp_seen == ("queued", "queued"), mcp_seen

    # A queued run stopped ends `failed` before it starts; the others are unaffected.
    stopped = queued[0]
    done = lab.wb("agent", "stop", stopped, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{stopped}: stopped before it started\n", done.stdout  # not "its worker is already gone"
    result = status(lab, stopped)
    assert (result["state"], result["failure"]) == ("failed", "stopped on request before it started")

    # logs --follow of a queued run waits through `queued` and ends when the run does.
    follower = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "logs", "--follow", queued[-1]],
        env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # await waits through `queued`; every other run completes on a node of the cluster.
    release.touch()
    nodes = set()
    for ref in refs:
        if ref == stopped:
            continue
        done = lab.wb("agent", "await", ref, "--json", timeout=WAIT_S)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["state"] == "completed", result
        assert result["node"] in {"head", "w1", "w2"}
        assert result["sandbox"]["kind"] == "bwrap", result  # the owner confines on whichever node runs it
        nodes.add(result["node"])
    assert len(nodes) >= 2, nodes
    _out, err = follower.communicate(timeout=WAIT_S)
    assert follower.returncode == 0, err

    # list (the head, for every node) shows them all, with their nodes; the stopped one too.
    done = lab.wb("agent", "list", "--to", "lab", "--json", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    listed = {f"lab:{r['agent_id']}": r for r in json.loads(done.stdout)}
    assert set(refs) <= set(listed)
    assert listed[stopped]["state"] == "failed"
    assert {listed[ref]["node"] for ref in refs if ref != stopped} == nodes
    text = lab.wb("agent", "status", refs[0], timeout=WAIT_S).stdout
    assert f"node:     {listed[refs[0]]['node']}\n" in text, text


def test_placement_by_custom_resource_and_by_repository(lab: Machine, ray_cluster: RayCluster) -> None:
    tagged = dispatch(lab, "tagged", "quick", "p-tagged")  # needs `fast`: only w1 has it
    labelled = dispatch(lab, "on-head", "quick", "p-label")  # the node label wb-node=head
    other = dispatch(lab, "task", "quick", "p-other", repo="acme/other")  # only w2 has that clone
    assert wait_for(lab, tagged, {"completed"})["node"] == "w1"
    assert wait_for(lab, labelled, {"completed"})["node"] == "head"
    result = wait_for(lab, other, {"completed"})
    assert result["node"] == "w2"
    assert result["worktree_dir"].startswith(str(ray_cluster.node("w2").projects_root))
    # The record is in w2's own store, not the head's.
    agent_id = other.split(":", 1)[1]
    assert (ray_cluster.node("w2").wb_home / "agents" / agent_id / "run.json").is_file()
    assert not (ray_cluster.head.wb_home / "agents" / agent_id).exists()

    # prune is every node's: a dry run lists the finished runs of w1 and of w2.
    done = lab.wb("agent", "prune", "--older-than", "0s", "--dry-run", "--to", "lab", "--json", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    candidates = json.dumps(json.loads(done.stdout))
    assert tagged.split(":", 1)[1] in candidates and agent_id in candidates, candidates
    # ...and the prune itself removes each record from its own node's store.
    done = lab.wb("agent", "prune", "--older-than", "0s", "--to", "lab", "--json", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    tagged_id = tagged.split(":", 1)[1]
    assert not (ray_cluster.node("w1").wb_home / "agents" / tagged_id).exists()
    assert not (ray_cluster.node("w2").wb_home / "agents" / agent_id).exists()
    assert lab.wb("agent", "status", other, timeout=WAIT_S).returncode == 1  # an unknown run now


def test_a_clone_made_under_a_nodes_projects_root_is_used_at_the_next_dispatch(
    lab: Machine, ray_cluster: RayCluster
) -> None:
    """Nothing is declared to Ray about clones (no `wb-repo:` resource, no label, no restart): the
    head asks every node at each dispatch, so a clone made on w1 while the cluster runs is w1's run."""
    args = ("agent", "dispatch", "--to", "lab", "--new-worktree", "late-0", "--profile", "task", "--task", "quick")
    done = lab.wb(*args, "--repo", "acme/late", timeout=WAIT_S)
    assert done.returncode == 1, done.stderr
    assert "no node of the Ray cluster has a canonical clone of acme/late" in done.stderr, done.stderr
    w1 = ray_cluster.node("w1")
    w1.clone("acme/late")
    ref = dispatch(lab, "task", "quick", "late-1", repo="acme/late")
    result = wait_for(lab, ref, {"completed"})
    assert result["node"] == "w1", result
    assert result["worktree_dir"].startswith(str(w1.projects_root)), result


def test_a_run_no_node_could_ever_take_is_refused_at_dispatch(lab: Machine) -> None:
    args = ("agent", "dispatch", "--to", "lab", "--new-worktree", "never", "--task", "quick")
    done = lab.wb(*args, "--profile", "huge", "--repo", "acme/widget", timeout=WAIT_S)
    assert done.returncode == 1, done.stderr
    assert "could ever take this run: it needs cpus=64; short of cpus (the most on one node: cpus=2)" in done.stderr, (
        done.stderr
    )
    done = lab.wb(*args, "--profile", "gpu", "--repo", "acme/widget", timeout=WAIT_S)
    assert done.returncode == 1 and "it needs cpus=1, gpus=1; short of gpus " in done.stderr, done.stderr
    done = lab.wb(*args, "--profile", "two", "--repo", "acme/other", timeout=WAIT_S)  # acme/other: w2 alone, 1 cpu
    assert done.returncode == 1, done.stderr
    assert (
        "it needs cpus=2; short of cpus (the most on one node: cpus=1); the nodes with a canonical clone of "
        "acme/other: w2 (cpus=1)" in done.stderr
    ), done.stderr
    done = lab.wb(*args, "--profile", "task", "--repo", "acme/nowhere", timeout=WAIT_S)
    assert done.returncode == 1, done.stderr
    assert "no node of the Ray cluster has a canonical clone of acme/nowhere" in done.stderr, done.stderr
    done = lab.wb(*args, "--profile", "nowhere", "--repo", "acme/widget", timeout=WAIT_S)
    assert done.returncode == 1, done.stderr
    assert "no node of the Ray cluster has the labels wb-node=in(gone, lost)" in done.stderr, done.stderr
    done = lab.wb(*args, "--profile", "not-head", "--repo", "acme/other", timeout=WAIT_S)  # w2: acme/other, no `fast`
    assert done.returncode == 1, done.stderr
    assert "could ever take this run: it needs cpus=1, fast=1, wb-node=!head; short of fast " in done.stderr, (
        done.stderr
    )


def test_stop_a_running_run_and_continue_on_the_same_node(lab: Machine) -> None:
    running = dispatch(lab, "task", "sleep:120", "s-run")
    wait_for(lab, running, {"running"})
    done = lab.wb("agent", "stop", running, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    result = wait_for(lab, running, {"failed"})
    assert result["failure"].startswith("stopped on request"), result

    first = dispatch(lab, "fake", "scenario:complete", "c-run")
    parent = wait_for(lab, first, {"completed"})
    done = lab.wb("agent", "continue", first, "--task", "scenario:complete", "--json", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    child_ref = f"lab:{json.loads(done.stdout)['agent_id']}"
    child = wait_for(lab, child_ref, {"completed"})
    assert child["parent_id"] == parent["agent_id"]
    assert (child["node"], child["worktree_dir"]) == (parent["node"], parent["worktree_dir"])
    done = lab.wb("agent", "diff", child_ref, "--stat", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    done = lab.wb("agent", "logs", child_ref, timeout=WAIT_S)
    assert done.returncode == 0 and "events.jsonl" in done.stdout, done.stderr


def test_watch_through_the_head_follows_the_runs_on_every_node(lab: Machine) -> None:
    """`wb agent watch --to lab` is the cluster's: a run on w1 (not in the head's own store) is watched to its end."""
    release = lab.root / "watch-release"
    ref = dispatch(lab, "tagged", f"wait:{release}", "w-watch")  # `fast`: w1's
    wait_for(lab, ref, {"running"})
    watcher = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "watch", "--to", "lab", "--json", "--until-idle"],
        env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watcher.stdout is not None
        ready, _, _ = select.select([watcher.stdout], [], [], WAIT_S)
        line = watcher.stdout.readline() if ready else ""
        first = json.loads(line) if line else {}  # nothing: the watch saw no run (the head's own store)
        assert first.get("ref") == ref and first.get("state") == "running", first
    finally:
        release.touch()
    out, err = watcher.communicate(timeout=WAIT_S)
    assert watcher.returncode == 0, err
    (finished,) = [json.loads(line) for line in out.splitlines() if json.loads(line).get("ref") == ref]
    assert (finished["event"], finished["state"], finished["result"]["node"]) == ("finished", "completed", "w1")


def test_machines_check_shows_the_executor_and_each_node(lab: Machine) -> None:
    done = lab.wb("machines", "--check", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    assert "lab: executor: ray, 3 nodes\n" in done.stdout, done.stdout
    assert "  w1: cpus " in done.stdout and "/2 free, gpus 0/0 free\n" in done.stdout, done.stdout
    done = lab.wb("machines", "--check", "--json", timeout=WAIT_S)
    (row,) = json.loads(done.stdout)
    assert row["executor"] == "ray"
    assert sorted(node["node"] for node in row["nodes"]) == ["head", "w1", "w2"]
    assert {node["node"]: node["cpus_total"] for node in row["nodes"]} == {"head": 1, "w1": 2, "w2": 1}


def test_the_same_operations_on_the_head_itself(ray_cluster: RayCluster) -> None:
    """wb run on the head (no channel): its runs go to the cluster, its list covers every node."""

    def on_head(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*ray_cluster.head_argv(), sys.executable, "-m", "courier.main", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, check=False)

    done = on_head(
        "agent", "dispatch", "--new-worktree", "h-local", "--profile", "tagged", "--repo", "acme/widget",
        "--task", "quick",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert ref.startswith("agt-") and " queued " in done.stdout, done.stdout
    done = on_head("agent", "await", ref, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["state"], result["node"]) == ("completed", "w1")  # `fast` is w1's only
    done = on_head("agent", "status", ref[:12], "--json")  # a short reference, resolved among the head's runs
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["agent_id"] == ref
    done = on_head("agent", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert ref in {r["agent_id"] for r in json.loads(done.stdout)}
    assert done.stderr == ""  # Ray's start-up notices stay out of a local command's output


@pytest.mark.courier_independent  # it sets WB_COURIER=on itself: one courier pass runs it
def test_dispatch_to_a_head_travels_over_its_warm_serve_session(tmp_path: Path, ray_cluster: RayCluster) -> None:
    """A Ray head lists `dispatch-in-serve`: once the courier has its serve process, a dispatch
    starts no receiver of its own (which would join the cluster afresh, docs/ray.md#cost)."""
    calls = tmp_path / "calls.log"  # one line per process the courier starts on the head
    logged = ["sh", "-c", f'printf "%s\\n" "$*" >> {calls}; exec "$@"', "sh", *ray_cluster.head_argv()]
    machine = make_machine(tmp_path / "warm")
    config = yaml.safe_load(CONFIG_TEMPLATE.format(credential_env=CREDENTIAL_ENV))
    config["session_move"] = {"targets": {"lab": {"exec": {"argv": logged}}}}
    machine.write_config(yaml.safe_dump(config))
    machine.env["WB_COURIER"] = "on"
    try:
        assert machine.wb("machines", "--check", timeout=WAIT_S).returncode == 0

        def mode() -> object:
            status = json.loads(machine.wb("courier", "status", "--json").stdout)
            return next((r["mode"] for r in status.get("machines") or [] if r["machine"] == "lab"), None)

        assert wait_for_condition(lambda: mode() == "serve", WAIT_S)
        before = calls.read_text().count("--wb-internal-agent-remote")
        refs = [dispatch(machine, "task", "quick", f"warm-{index}") for index in range(2)]
        assert calls.read_text().count("--wb-internal-agent-remote") == before, calls.read_text()
        for ref in refs:
            done = machine.wb("agent", "await", ref, "--json", timeout=WAIT_S)
            assert done.returncode == 0 and json.loads(done.stdout)["state"] == "completed", done.stdout + done.stderr
    finally:
        machine.wb("courier", "stop")


def test_a_run_being_admitted_is_listed_once(lab: Machine, ray_cluster: RayCluster) -> None:
    """Mid-admission a node has the run's directory before its record (its own list warns that it
    cannot read it) while the head still has it queued: the head's list names the run once."""
    from courier.executor.placements import Placement, Placements, now
    from protocol.refs import new_run_id

    agent_id = new_run_id()
    resolved = {
        "profile": "task",
        "harness": "command",
        "provider": "",
        "model": "",
        "routing": {"base_url": "", "wire_api": ""},
    }
    placements = Placements(ray_cluster.head.wb_home)
    placements.save(Placement(agent_id, now(), "task", resolved, "acme/widget", "new", "in-transit", "cpus=1"))
    arriving = ray_cluster.node("w1").wb_home / "agents" / agent_id
    arriving.parent.mkdir(mode=0o700, exist_ok=True)
    arriving.mkdir(mode=0o700)
    try:
        done = lab.wb("agent", "list", "--to", "lab", "--json", timeout=WAIT_S)
        assert done.returncode == 0, done.stderr
        (entry,) = [r for r in json.loads(done.stdout) if r["agent_id"] == agent_id]
        assert entry["state"] == "queued"
    finally:
        arriving.rmdir()
        placements.remove(agent_id)


def test_holders_run_in_the_pooled_workers_of_the_keepers_job(lab: Machine, ray_cluster: RayCluster) -> None:
    """docs/ray.md#the-keeper: the head's service belongs to the keeper's live job, so the holders of
    runs one after another on the head reuse its pooled worker. Under a finished job (the service made
    by a receiver that exited) Ray ended each holder's worker once idle, and every run started a new one."""

    def workers() -> set[int]:
        found = set()
        for process in ray_cluster.node_processes(ray_cluster.head):
            with contextlib.suppress(psutil.Error):
                name = process.name()
                # A worker is the raylet's child. A holder's fork, before it execs the run's owner (or
                # git), has the worker's name too: it is no worker, and counting it made this flaky.
                if name.startswith("ray::") and "NodeService" not in name and _is_raylet(process.parent()):
                    found.add(process.pid)
        return found

    first = dispatch(lab, "on-head", "sleep:1", "pooled-0")
    wait_for(lab, first, {"completed"})
    before = workers()
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:  # a worker started and ended between two looks would be missed: look often
        while not done.is_set():
            seen.update(workers())
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for index in (1, 2):
            wait_for(lab, dispatch(lab, "on-head", "sleep:1", f"pooled-{index}"), {"completed"})
    finally:
        done.set()
        watcher.join()
    assert before, "no Ray worker left on the head after its first run: its holder's worker ended once idle"
    assert not seen - before, (
        f"new Ray workers started for later runs: {sorted(seen - before)} (before: {sorted(before)})"
    )


def _is_raylet(process: psutil.Process | None) -> bool:
    with contextlib.suppress(psutil.Error):
        return process is not None and process.name() == "raylet"
    return False


# A NodeService of the test's own (not the head's): the claim a starting holder makes and the
# cancel a stop of a queued run makes, in both orders. Whichever comes first wins, and the
# other learns it: a stop that arrives as the run starts never leaves it both started and stopped.
CLAIM_AND_CANCEL = f"""
import json, logging, ray
from courier.executor.ray_node import NAMESPACE, NodeService
ray.init(address="127.0.0.1:{HEAD_PORT}", namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR)
service = NodeService.remote()
stopped_first = [ray.get(service.cancel.remote("agt-a")), ray.get(service.claim.remote("agt-a"))]
started_first = [ray.get(service.claim.remote("agt-b")), ray.get(service.cancel.remote("agt-b"))]
print(json.dumps({{"stopped_first": stopped_first, "started_first": started_first}}))
"""


def test_a_stop_and_a_start_of_a_queued_run_cannot_both_win(ray_cluster: RayCluster) -> None:
    argv = [*ray_cluster.head_argv(), sys.executable, "-c", CLAIM_AND_CANCEL]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["stopped_first"] == [True, False]  # stopped before it started: its holder never admits it
    assert outcome["started_first"] == [True, False]  # started: the stop goes to the running run instead


_CLONE_HOLDERS = """
import json, sys
import ray
from courier.executor.ray_cluster import live_nodes
from courier.executor.ray_node import service_handle
ray.init(address=sys.argv[1], logging_level="ERROR")
nodes = {node.name: node.node_id for node in live_nodes()}
names = {node_id: name for name, node_id in nodes.items()}
asking = service_handle(nodes["w1"])
answers = {}
for repository in ("acme/other", "acme/widget", "acme/nowhere"):
    found, silent = ray.get(asking.clone_holders.remote(repository, list(nodes.values()), 60.0), timeout=120)
    answers[repository] = [sorted(names[node_id] for node_id in found), silent]
from courier.executor.ray_placement import _asked_one_by_one
each = {}  # the fallback: this driver asks every node's service itself
for repository in answers:
    found_nodes, silent_text = _asked_one_by_one(live_nodes(), repository)
    each[repository] = [sorted(node.name for node in found_nodes), silent_text]
print(json.dumps([answers, each]))
"""


def test_one_nodes_service_asks_every_node_for_a_clone(ray_cluster: RayCluster) -> None:
    """The head's receiver asks its own node's service, which asks the others (docs/ray.md#repositories): any
    node's service answers for every node, itself included, as each node's own check would, and as the
    receiver's own fallback, asking each node in turn, does."""
    argv = [*ray_cluster.head_argv(), sys.executable, "-c", _CLONE_HOLDERS, f"127.0.0.1:{HEAD_PORT}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = {
        "acme/other": [["w2"], []],
        "acme/widget": [["head", "w1", "w2"], []],
        "acme/nowhere": [[], []],
    }
    through_one_service, asked_one_by_one = json.loads(done.stdout.splitlines()[-1])
    assert through_one_service == expected
    assert asked_one_by_one == expected  # an older head's service: the receiver asks each node, with the same answer
