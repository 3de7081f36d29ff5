"""What a Ray head asks of Ray for a run, and what it says of a run no node could ever take
(docs/ray.md#how-a-run-reaches-a-node, docs/ray.md#repositories)."""

from __future__ import annotations

from typing import Any

import ray

from courier.config import Config, Resources
from courier.errors import NotStartable
from courier.executor.placements import wants_text
from courier.executor.ray_cluster import NODE_CALL_S, NODE_ID_LABEL, Node, forget_service, head_service, service
from courier.executor.ray_node import ask_for_clone


def ray_options(resources: Resources, holders: list[Node] | None = None) -> dict[str, Any]:
    """The holder task's Ray options: the run's resources, its labels, and with `holders` the nodes it may start on.

    `holders` (the nodes that have the run's canonical clone, asked at this dispatch) becomes a
    selector on Ray's own `ray.io/node-id` label of every node, beside the profile's labels (which
    never name `ray.io/…`): Ray keeps the run pending until one of them has its resources free.
    """
    custom = {name: float(amount) for name, amount in resources.custom.items()}
    options: dict[str, Any] = {"num_cpus": resources.cpus, "num_gpus": resources.gpus, "resources": custom}
    if resources.memory_bytes:
        options["memory"] = resources.memory_bytes
    selector = dict(resources.labels)
    if holders is not None:
        # No space after a comma: Ray 2.60 reads " <id>" as a node ID of the wrong length and aborts the submitter.
        selector[NODE_ID_LABEL] = "in(" + ",".join(sorted(node.node_id for node in holders)) + ")"
    if selector:
        options["label_selector"] = selector
    return options


_RELAY_MARGIN_S = 5.0  # the head's service bounds its own calls to the nodes by NODE_CALL_S; this is its reply's


def clone_holders(nodes: list[Node], repository: str) -> tuple[list[Node], list[str]]:
    """The nodes that have the canonical clone of `repository` now (docs/ray.md#repositories); and, for the
    nodes that did not answer, why. The head's own service asks the others (it keeps its handles on them: one
    new connection for this receiver, which it makes anyway to place the run); a service of an older wb, or one
    that fails, leaves it to this receiver to ask each node's service in parallel."""
    by_id = {node.node_id: node for node in nodes}
    try:
        found, silent_ids = ray.get(
            head_service().clone_holders.remote(repository, list(by_id), NODE_CALL_S),
            timeout=NODE_CALL_S + _RELAY_MARGIN_S,
        )
    except (ray.exceptions.RayError, AttributeError):  # AttributeError: a service of an older wb
        return _asked_one_by_one(nodes, repository)
    silent = [f"{by_id[node_id].name if node_id in by_id else node_id}: {error}" for node_id, error in silent_ids]
    return [by_id[node_id] for node_id in found if node_id in by_id], silent


def _asked_one_by_one(nodes: list[Node], repository: str) -> tuple[list[Node], list[str]]:
    by_id = {node.node_id: node for node in nodes}
    found, silent = ask_for_clone(
        list(by_id), repository, NODE_CALL_S, lambda node_id: service(by_id[node_id]), forget_service
    )
    return [by_id[node_id] for node_id in found], [f"{by_id[node_id].name}: {error}" for node_id, error in silent]


def labels_match(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Whether a node with `labels` satisfies Ray's label_selector `selector` (VALUE, !VALUE, in(…), !in(…))."""
    for key, expression in selector.items():
        negated = expression.startswith("!")
        body = expression.removeprefix("!")
        if body.startswith("in(") and body.endswith(")"):
            hit = labels.get(key) in {part.strip() for part in body[3:-1].split(",")}
        else:
            hit = labels.get(key) == body
        if hit == negated:
            return False
    return True


def wants_of(resources: Resources) -> str:
    """What the status line says a queued run waits for: its amounts, then its labels."""
    wants = wants_text(resources.cpus, resources.gpus, resources.memory, dict(resources.custom))
    return ", ".join([wants, *(f"{key}={value}" for key, value in sorted(resources.labels.items()))])


def _needs(options: dict[str, Any]) -> dict[str, float]:
    needs = {"CPU": float(options["num_cpus"]), "GPU": float(options["num_gpus"]), **options["resources"]}
    if options.get("memory"):
        needs["memory"] = float(options["memory"])
    return {name: amount for name, amount in needs.items() if amount > 0}


_NAMES = {"CPU": "cpus", "GPU": "gpus"}  # Ray's resource names as a profile's `resources` says them


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return f"{_NAMES.get(name, name)}={value / 2**30:.3g}GiB"
    return f"{_NAMES.get(name, name)}={value:g}"


def _shortfall(candidates: list[Node], needs: dict[str, float]) -> str:
    """What no candidate has enough of, with the most one has; or that none has all of it at once."""
    short = {name: max(node.total.get(name, 0.0) for node in candidates) for name in needs}
    short = {name: most for name, most in short.items() if most < needs[name]}
    if not short:
        return "no one node has all of it at once"
    names = ", ".join(_NAMES.get(name, name) for name in short)
    return f"short of {names} (the most on one node: {', '.join(_amount(n, most) for n, most in short.items())})"


def check_feasible(
    nodes: list[Node], holders: list[Node], options: dict[str, Any], repository: str, wants: str, silent: list[str]
) -> None:
    """Refuse (exit 1) a run that no live node could take even when idle, naming the shortfall.

    `holders`: the nodes with the run's canonical clone (`nodes` when the run names none);
    `silent`: the nodes that did not say whether they have it.
    """
    needs = _needs(options)
    selector = {key: value for key, value in (options.get("label_selector") or {}).items() if key != NODE_ID_LABEL}
    if not nodes:
        raise NotStartable("the Ray cluster has no live node")
    if selector and not any(labels_match(node.labels, selector) for node in nodes):
        wanted = ", ".join(f"{key}={value}" for key, value in sorted(selector.items()))
        raise NotStartable(
            f"no node of the Ray cluster has the labels {wanted} (a node's labels are its "
            f"`ray start --labels`; see docs/ray.md)"
        )
    if repository and not holders:
        unanswered = f"; no answer from node {', '.join(silent)}" if silent else ""
        raise NotStartable(
            f"no node of the Ray cluster has a canonical clone of {repository} (clone it under a "
            f"node's projects root as <projects_root>/{repository}: the next dispatch finds it; see docs/ray.md)"
            f"{unanswered}"
        )
    candidates = [node for node in holders if labels_match(node.labels, selector)]
    labelled = ", ".join(f"{key}={value}" for key, value in sorted(selector.items()))
    if not candidates:  # some node has the clone, some the labels, none both
        cloned = ", ".join(node.name for node in holders[:8])
        raise NotStartable(
            f"no node of the Ray cluster could ever take this run: none of the nodes with a canonical "
            f"clone of {repository} ({cloned}) has the labels {labelled}"
        )
    scope = f"the nodes with a canonical clone of {repository}" if repository else "the nodes"
    if selector:
        scope += f" and the labels {labelled}" if repository else f" with the labels {labelled}"
    if any(all(node.total.get(name, 0.0) >= amount for name, amount in needs.items()) for node in candidates):
        return
    have = ", ".join(
        f"{node.name} ({', '.join(_amount(name, node.total.get(name, 0.0)) for name in needs)})"
        for node in candidates[:8]
    )
    raise NotStartable(
        f"no node of the Ray cluster could ever take this run: it needs {wants}; "
        f"{_shortfall(candidates, needs)}; {scope}: {have}"
    )


def resources_of(config: Config, profile: str) -> Resources:
    return config.profile(profile).resources or Resources()
