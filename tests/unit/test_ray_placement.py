"""What a Ray head asks of Ray for a run, and what it says of a run no node could take (docs/ray.md#repositories)."""

from __future__ import annotations

import pytest

from courier.config import Resources
from courier.errors import NotStartable
from courier.executor.ray_cluster import NODE_ID_LABEL, Node
from courier.executor.ray_placement import check_feasible, ray_options

HEAD = Node("head", "a" * 56, {"CPU": 1.0, "memory": 2.0 * 2**30}, {"wb-node": "head"})
W1 = Node("w1", "b" * 56, {"CPU": 2.0, "memory": 8.0 * 2**30, "fast": 4.0}, {"wb-node": "w1"})
W2 = Node("w2", "c" * 56, {"CPU": 1.0, "GPU": 1.0, "memory": 2.0 * 2**30}, {"wb-node": "w2"})
NODES = [HEAD, W1, W2]


def refusal(
    resources: Resources, holders: list[Node], repository: str = "acme/widget", silent: list[str] | None = None
) -> str:
    with pytest.raises(NotStartable) as refused:
        check_feasible(NODES, holders, ray_options(resources, holders), repository, "…", silent or [])
    return refused.value.message


def test_the_nodes_with_the_clone_are_a_selector_on_rays_node_id_label_beside_the_profiles() -> None:
    options = ray_options(Resources(cpus=2, labels={"zone": "eu"}), [W2, HEAD])
    # No space after a comma: Ray 2.60 takes " <id>" for a node ID and aborts the submitting process.
    assert options["label_selector"] == {"zone": "eu", NODE_ID_LABEL: f"in({'a' * 56},{'c' * 56})"}
    assert (options["num_cpus"], options["resources"]) == (2, {})  # no `wb-repo:` resource
    assert "label_selector" not in ray_options(Resources())  # a continuation: pinned to its node instead


def test_a_run_that_fits_some_node_with_the_clone_is_not_refused() -> None:
    check_feasible(NODES, [W1], ray_options(Resources(cpus=2), [W1]), "acme/widget", "cpus=2", [])


def test_the_refusal_names_the_repository_no_node_has_and_the_nodes_that_did_not_answer() -> None:
    message = refusal(Resources(), [], "acme/nowhere", ["w2: ActorDiedError"])
    assert message.startswith("no node of the Ray cluster has a canonical clone of acme/nowhere (clone it under")
    assert message.endswith("; no answer from node w2: ActorDiedError")


@pytest.mark.parametrize(
    ("resources", "short"),
    [
        (Resources(cpus=64), "short of cpus (the most on one node: cpus=2)"),
        (Resources(gpus=1), "short of gpus (the most on one node: gpus=0)"),  # w2's gpu: w2 has no clone
        (Resources(memory="16GiB"), "short of memory (the most on one node: memory=8GiB)"),
        (Resources(custom={"a100": 1}), "short of a100 (the most on one node: a100=0)"),
        (Resources(cpus=2, memory="4GiB", custom={"fast": 1}), None),  # w1 has it all: not refused
    ],
)
def test_the_refusal_names_what_no_node_with_the_clone_has_enough_of(resources: Resources, short: str | None) -> None:
    holders = [HEAD, W1]
    if short is None:
        check_feasible(NODES, holders, ray_options(resources, holders), "acme/widget", "…", [])
        return
    message = refusal(resources, holders)
    assert f"; {short}; the nodes with a canonical clone of acme/widget: head (" in message, message


def test_a_need_each_node_meets_alone_but_none_together_is_said_so() -> None:
    message = refusal(Resources(cpus=2, gpus=1), [W1, W2])  # w1 has the cpus, w2 the gpu
    assert "; no one node has all of it at once; " in message, message
    assert message.endswith("w1 (cpus=2, gpus=0), w2 (cpus=1, gpus=1)"), message


def test_labels_no_node_with_the_clone_has_are_said_so() -> None:
    message = refusal(Resources(labels={"wb-node": "head"}), [W1, W2])
    assert message.endswith(
        "none of the nodes with a canonical clone of acme/widget (w1, w2) has the labels wb-node=head"
    )
