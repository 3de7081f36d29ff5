"""A real Ray cluster on this machine for the Ray executor's tests (docs/ray.md): a head and two workers.

Test traffic stays on loopback, and Ray advertises a loopback address only when the machine
has no other interface, so the whole cluster lives in a private network namespace whose only
interface is `lo`: a holder process (`unshare --net sleep`) keeps the namespace, and every
`ray start` and every `wb` that talks to the cluster enters it with `nsenter --net=/proc/PID/ns/net`.
The test reaches the head as a machine through an `exec` target whose argv is exactly that
(`nsenter --net=… -- env -i … wb`), a realistic way to reach a head node.

Each node is its own wb installation: its own WB_HOME, projects root (with its canonical
clones, declared to Ray by nothing: the head asks each node, docs/ray.md#repositories), wb.yaml
and custom resources, so records of different nodes never share a store. Ray's workers inherit
the environment of `ray start`, which is how a run placed on a node gets that node's WB_HOME.

Stopping: `ray stop` finds Ray's processes by name on the whole machine, so it would also stop
another cluster; this fixture ends exactly the processes inside its namespace (SIGTERM, then
SIGKILL), then the holder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, FAKES, git, make_clone

PYTHON_BIN = Path(sys.executable).parent
RAY = PYTHON_BIN / "ray"
HEAD_PORT = 6380
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is about 75 MiB; runs pass no objects
START_TIMEOUT_S = 180  # a `ray start` takes 15-20 s on a loaded 2-core machine

# The task-script every node's `command` profiles run: `sleep:N` sleeps N seconds, `wait:PATH`
# until PATH exists (the test releases its runs), `fail` exits 3, anything else finishes at once.
# The task arrives on stdin, never on a command line; what follows its first space is padding
# (a test's large task) and is ignored.
TASK_SCRIPT = """#!/bin/sh
task=$(cat)
task=${task%% *}
case "$task" in
  sleep:*) sleep "${task#sleep:}" ;;
  wait:*) while [ ! -e "${task#wait:}" ]; do sleep 0.2; done ;;
  fail) echo "failing on purpose"; exit 3 ;;
esac
echo "{\\"type\\":\\"wb.result\\",\\"message\\":\\"done: $task\\"}"
"""

NODE_CONFIG = """\
agents:
  executor:
    ray:
      address: 127.0.0.1:{port}
  providers:
    mock:
      base_url: http://127.0.0.1:9/v1
      credential_env: {credential_env}
      request_max_retries: 0
      stream_max_retries: 0
  profiles:
    fake: {{harness: codex, provider: mock, model: gpt-5.5}}
    task: {{harness: command, command: ["{script}"]}}
    two: {{harness: command, command: ["{script}"], resources: {{cpus: 2}}}}
    fast: {{harness: codex, provider: mock, model: gpt-5.5, resources: {{cpus: 2}}}}
    tagged: {{harness: command, command: ["{script}"], resources: {{cpus: 1, custom: {{fast: 1}}}}}}
    gpu: {{harness: command, command: ["{script}"], resources: {{cpus: 1, gpus: 1}}}}
    huge: {{harness: command, command: ["{script}"], resources: {{cpus: 64}}}}
    on-head: {{harness: command, command: ["{script}"], resources: {{cpus: 1, labels: {{wb-node: head}}}}}}
    not-head: {{harness: command, command: ["{script}"],
      resources: {{labels: {{wb-node: "!head"}}, custom: {{fast: 1}}}}}}
    nowhere: {{harness: command, command: ["{script}"], resources: {{labels: {{wb-node: "in(gone, lost)"}}}}}}
"""


@dataclass
class RayNode:
    """One node: its Ray resources and its own wb installation under `root`."""

    name: str
    root: Path
    cpus: int
    repositories: tuple[str, ...]
    custom: dict[str, float] = field(default_factory=dict)

    @property
    def wb_home(self) -> Path:
        return self.root / "wbhome"

    @property
    def projects_root(self) -> Path:
        return self.root / "projects"

    @property
    def config_path(self) -> Path:
        return self.root / "wb.yaml"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def environment(self) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "WB_HOME": str(self.wb_home),
            "WB_PROJECTS_ROOT": str(self.projects_root),
            "WB_CONFIG": str(self.config_path),
            "PATH": f"{FAKES}:{PYTHON_BIN}:/usr/local/bin:/usr/bin:/bin",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "RAY_USAGE_STATS_ENABLED": "0",
            # A killed node is declared dead after about 3 s, not Ray's default 15 s or more.
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
            CREDENTIAL_ENV: CREDENTIAL_VALUE,
        }

    def resources(self) -> dict[str, float]:
        return dict(self.custom)  # its clones are not among them: the head finds them itself

    def prepare(self, port: int) -> None:
        for sub in ("wbhome", "projects", "home"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        script = self.root / "task.sh"
        script.write_text(TASK_SCRIPT)
        script.chmod(0o755)
        self.config_path.write_text(NODE_CONFIG.format(port=port, script=script, credential_env=CREDENTIAL_ENV))
        self.config_path.chmod(0o600)
        for repo in self.repositories:
            self.clone(repo)

    def clone(self, repo: str) -> Path:
        """A canonical clone of `repo` under this node's projects root (also while the cluster runs)."""
        clone = make_clone(self.projects_root / repo)
        git(clone, "remote", "add", "origin", f"git@github.com:{repo}.git")
        return clone


@dataclass
class RayCluster:
    """The namespace, its nodes and how to reach the head; `start` once per session, `stop` at the end."""

    root: Path
    nodes: list[RayNode]
    holder: subprocess.Popen[bytes] | None = None
    # The namespace's id (`net:[inode]`), kept apart from its holder: `stop` finds the cluster by it even
    # when the holder has been ended first.
    namespace: str | None = None
    temp_dir: Path | None = None

    @property
    def head(self) -> RayNode:
        return self.nodes[0]

    def node(self, name: str) -> RayNode:
        return next(node for node in self.nodes if node.name == name)

    def enter(self) -> list[str]:
        """The argv prefix that runs a command inside the cluster's network namespace."""
        assert self.holder is not None, "the cluster is not started"
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--"]

    def head_argv(self) -> list[str]:
        """An exec target's argv reaching the head: its namespace and exactly its environment."""
        env = self.head.environment()
        return [*self.enter(), "env", "-i", "-C", str(self.head.home), *(f"{k}={v}" for k, v in env.items())]

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # Ray's unix sockets live under its temp dir; the path must stay short (108 bytes).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="wbray-", dir="/tmp"))
        for node in self.nodes:
            node.prepare(HEAD_PORT)
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"], start_new_session=True)
        self._wait_for_namespace()
        subprocess.run([*self.enter(), "ip", "link", "set", "lo", "up"], check=True)
        try:
            head = ["--head", f"--port={HEAD_PORT}", f"--temp-dir={self.temp_dir}", "--include-dashboard=false"]
            self._ray_start(self.head, head)
            # One at a time: in parallel, a loaded 2-core machine overruns `ray start`'s fixed 30 s wait.
            for node in self.nodes[1:]:
                self._ray_start(node, [f"--address=127.0.0.1:{HEAD_PORT}"])
            self._wait_for_nodes(len(self.nodes))
        except BaseException:
            self.stop()
            raise

    def _wait_for_namespace(self) -> None:
        assert self.holder is not None
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                namespace = os.readlink(f"/proc/{self.holder.pid}/ns/net")
                if namespace != own:
                    self.namespace = namespace
                    return
            time.sleep(0.02)
        raise RuntimeError("unshare --net did not make a network namespace (needs root or user namespaces)")

    def _ray_start(self, node: RayNode, extra: list[str]) -> None:
        argv = [
            *self.enter(), "env", "-i", *(f"{k}={v}" for k, v in node.environment().items()),
            str(RAY), "start", *extra, f"--num-cpus={node.cpus}", "--num-gpus=0",
            f"--resources={json.dumps(node.resources())}", f"--labels=wb-node={node.name}",
            f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats",
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S, cwd=node.home)
        if done.returncode != 0 and "timed out during startup" in done.stderr:
            return  # its raylet runs and registers later: _wait_for_nodes waits for it
        if done.returncode != 0:
            raise RuntimeError(f"ray start for node {node.name} failed ({done.returncode}): {done.stderr[-2000:]}")

    def _wait_for_nodes(self, count: int) -> None:
        probe = "import ray; ray.init(address='auto', log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            done = subprocess.run(
                [*self.enter(), "env", *(f"{k}={v}" for k, v in self.head.environment().items()), sys.executable,
                 "-c", probe],
                capture_output=True, text=True, timeout=START_TIMEOUT_S,
            )  # fmt: skip
            if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster did not reach {count} live nodes")

    def namespace_processes(self) -> list[psutil.Process]:
        """Every process inside the cluster's network namespace, the holder excepted."""
        if self.namespace is None:
            return []
        holder = self.holder.pid if self.holder is not None else None
        found = []
        for process in psutil.process_iter():
            if process.pid == holder:
                continue
            with contextlib.suppress(OSError, psutil.Error):
                if os.readlink(f"/proc/{process.pid}/ns/net") == self.namespace:
                    found.append(process)
        return found

    def node_processes(self, node: RayNode) -> list[psutil.Process]:
        """The Ray processes (raylet, its workers) and wb processes that run with this node's WB_HOME."""
        found = []
        for process in self.namespace_processes():
            with contextlib.suppress(psutil.Error):
                if process.environ().get("WB_HOME") == str(node.wb_home):
                    found.append(process)
        return found

    def kill_node(self, node: RayNode) -> None:
        """The node dies: SIGKILL to its raylet, its Ray workers and every process of its runs."""
        doomed = self.node_processes(node)
        for process in list(doomed):
            with contextlib.suppress(psutil.Error):
                doomed += process.children(recursive=True)  # owners and workers (their env is an allowlist)
        _kill(doomed, signal.SIGKILL)

    def stop(self) -> None:
        _kill(self.namespace_processes(), signal.SIGTERM)
        _kill(self.namespace_processes(), signal.SIGKILL)
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
            self.holder = None
        self.namespace = None
        if self.temp_dir is not None:
            subprocess.run(["rm", "-rf", str(self.temp_dir)], check=False)
            self.temp_dir = None


def _kill(processes: Iterable[psutil.Process], signum: int) -> None:
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signum)
            alive.append(process)
    psutil.wait_procs(alive, timeout=10)


def default_cluster(root: Path) -> RayCluster:
    """The suite's one cluster: head (1 cpu), w1 (2 cpus, `fast`), w2 (1 cpu, the only clone of acme/other)."""
    return RayCluster(
        root,
        [
            RayNode("head", root / "head", 1, ("acme/widget",)),
            RayNode("w1", root / "w1", 2, ("acme/widget",), {"fast": 4.0}),
            RayNode("w2", root / "w2", 1, ("acme/widget", "acme/other")),
        ],
    )
