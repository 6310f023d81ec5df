"""The plugins' shared per-node bookkeeping (scheduler_plugins.plugins.nodecache): the change-log
cursor tells a new snapshot from a change on the same one, and the per-shape memo recomputes a
node's value only when the node changed."""

from __future__ import annotations

from scheduler_plugins.plugins.nodecache import Changes, NodeMemo
from scheduler_plugins.snapshot import NodeInfo, parse_pod
from tests.scheduler.builders import node, pod
from tests.scheduler.helpers import snapshot_of


def test_the_cursor_names_the_changed_nodes_and_tells_a_new_snapshot_apart() -> None:
    snap = snapshot_of(node("n1"), node("n2"))
    changes = Changes()
    assert changes.poll(snap) is None
    assert changes.new_snapshot
    assert changes.poll(snap) == set()
    assert not changes.new_snapshot
    snap.assume(parse_pod(pod("p1", requests={"cpu": "1"}), "test"), "n2")
    assert changes.poll(snap) == {"n2"}
    assert not changes.new_snapshot
    other = snapshot_of(node("n1"))
    assert changes.poll(other) is None
    assert changes.new_snapshot


def test_the_memo_computes_a_node_once_until_it_changes() -> None:
    snap = snapshot_of(node("n1"), node("n2"))
    memo: NodeMemo[int] = NodeMemo()
    computed: list[str] = []

    def value(n: NodeInfo) -> int:
        computed.append(n.name)
        return len(n.pods)

    nodes = list(snap.nodes.values())
    assert memo.values("shape", nodes, value) == {"n1": 0, "n2": 0}
    assert memo.values("shape", nodes, value) == {"n1": 0, "n2": 0}
    assert computed == ["n1", "n2"]
    snap.assume(parse_pod(pod("p1", requests={"cpu": "1"}), "test"), "n1")
    assert memo.values("shape", nodes, value) == {"n1": 1, "n2": 0}
    assert computed == ["n1", "n2", "n1"]
    assert memo.values("other shape", nodes[1:], value) == {"n2": 0}
    assert computed == ["n1", "n2", "n1", "n2"]
