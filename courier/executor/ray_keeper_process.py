"""The head's keeper process (docs/ray.md#the-keeper): `python -m courier.executor.ray_keeper_process ADDRESS`.

Joins the cluster as a driver, creates the head node's `NodeService` (so that service, and
every holder task it submits, belongs to this driver's job, which stays alive), and waits
until the cluster is gone. courier/executor/ray_keeper.py starts it and holds its lock rules.
"""

from __future__ import annotations

import contextlib
import sys
import time

KEEPER_LOOK_S = 10.0  # how often the keeper asks whether the cluster is still there


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m courier.executor.ray_keeper_process ADDRESS\n")
        return 2
    from courier.config import load_config
    from courier.executor import ray_cluster
    from courier.executor.ray_keeper import hold_lock

    config = load_config()
    if hold_lock(config.home) is None:
        return 0  # another keeper serves this head
    import ray

    ray_cluster.connect(argv[0], config.home, keeper=True)
    service = ray_cluster.head_service()  # created here, by this driver
    service.warm.remote([(node.node_id, int(node.total.get("CPU", 0))) for node in ray_cluster.live_nodes()])
    while True:  # until the cluster goes: this driver's job, and the keeper, end with it
        time.sleep(KEEPER_LOOK_S)
        try:
            ray_cluster.cluster_nodes()
        except Exception:
            with contextlib.suppress(Exception):
                ray.shutdown()
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
