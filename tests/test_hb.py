"""One short test per happens-before rule, with synthetic stream and event ids (as CSAN's tests)."""

from __future__ import annotations

from typing import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.hb import CapturedGraph, Conflict, GraphNode, HappensBefore, Region

WHOLE: Region = None


def stream(i: int) -> int:
    return 1000 + i


def event(i: int) -> int:
    return 2000 + i


def ok(
    hb: HappensBefore,
    s: int,
    reads: Mapping[str, Region] = {},
    writes: Mapping[str, Region] = {},
    op: str = "op",
) -> None:
    assert hb.launch(s, op, reads, writes) == []


def bad(
    hb: HappensBefore,
    s: int,
    reads: Mapping[str, Region] = {},
    writes: Mapping[str, Region] = {},
    op: str = "op",
) -> list[Conflict]:
    found = hb.launch(s, op, reads, writes)
    assert found
    return found


@pytest.fixture
def hb() -> HappensBefore:
    return HappensBefore()


def test_same_stream_is_ordered(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    ok(hb, stream(1), reads={"a": WHOLE})
    ok(hb, stream(1), writes={"a": WHOLE})


@pytest.mark.parametrize("first_writes, second_writes", [(True, True), (False, True), (True, False)])
def test_two_streams_without_sync_conflict(hb: HappensBefore, first_writes: bool, second_writes: bool) -> None:
    first = {"writes" if first_writes else "reads": {"a": WHOLE}}
    second = {"writes" if second_writes else "reads": {"a": WHOLE}}
    ok(hb, stream(1), **first)
    bad(hb, stream(2), **second)


def test_two_streams_read_read_is_fine(hb: HappensBefore) -> None:
    ok(hb, stream(1), reads={"a": WHOLE})
    ok(hb, stream(2), reads={"a": WHOLE})


def test_branch_sync(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    hb.record(event(1), stream(1))
    hb.wait(stream(2), event(1))
    ok(hb, stream(2), reads={"a": WHOLE})
    bad(hb, stream(3), reads={"a": WHOLE})


def test_chain_sync(hb: HappensBefore) -> None:
    ok(hb, stream(0), writes={"a": WHOLE})
    for i in range(10):
        hb.record(event(i), stream(i))
        hb.wait(stream(i + 1), event(i))
    ok(hb, stream(10), writes={"a": WHOLE})


def test_expired_record(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE}, op="first")
    hb.record(event(1), stream(1))
    ok(hb, stream(1), writes={"a": WHOLE}, op="second")
    hb.wait(stream(2), event(1))
    (conflict,) = bad(hb, stream(2), reads={"a": WHOLE})
    assert conflict.earlier.op == "second"


def test_record_overwrite(hb: HappensBefore) -> None:
    hb.record(event(1), stream(1))
    ok(hb, stream(1), writes={"a": WHOLE})
    hb.record(event(1), stream(1))
    hb.wait(stream(2), event(1))
    ok(hb, stream(2), reads={"a": WHOLE})


def test_multiple_waits(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    hb.record(event(1), stream(1))
    ok(hb, stream(2), writes={"b": WHOLE})
    hb.record(event(2), stream(2))
    hb.wait(stream(3), event(1))
    hb.wait(stream(3), event(2))
    ok(hb, stream(3), reads={"a": WHOLE, "b": WHOLE})


def test_a_stream_reaches_a_mark_only_through_an_event_recorded_after_it(hb: HappensBefore) -> None:
    hb.record(event(1), stream(1))  # before the mark: waiting for it needs nothing past the mark
    gate = hb.mark(stream(1))
    hb.record(event(2), stream(1))  # right after the mark, with no operation in between
    hb.wait(stream(2), event(1))
    assert not hb.reached(stream(2), stream(1), gate)
    hb.wait(stream(3), event(2))
    assert hb.reached(stream(3), stream(1), gate)
    hb.record(event(3), stream(3))
    hb.wait(stream(4), event(3))  # through a third stream
    assert hb.reached(stream(4), stream(1), gate)
    assert not hb.reached(stream(5), stream(1), gate)  # a stream never seen


def test_a_mark_touches_nothing(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    hb.mark(stream(2))
    bad(hb, stream(2), reads={"a": WHOLE})


def test_wait_on_never_recorded_event_is_noop(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    hb.wait(stream(2), event(1))
    bad(hb, stream(2), reads={"a": WHOLE})


def test_wait_stream_covers_work_issued_so_far_only(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    hb.wait_stream(stream(2), stream(1))
    ok(hb, stream(1), writes={"b": WHOLE})
    ok(hb, stream(2), reads={"a": WHOLE})
    bad(hb, stream(2), reads={"b": WHOLE})


@pytest.mark.parametrize("sync", ["stream", "event", "device"])
@pytest.mark.parametrize("reader", [stream(2), stream(99)])  # stream(99) is first seen after the sync
def test_host_sync(hb: HappensBefore, sync: str, reader: int) -> None:
    hb.launch(stream(2), "warm-up")
    ok(hb, stream(1), writes={"a": WHOLE})
    hb.record(event(1), stream(1))
    if sync == "stream":
        hb.sync_stream(stream(1))
    elif sync == "event":
        hb.sync_event(event(1))
    else:
        hb.sync_device()
    ok(hb, reader, reads={"a": WHOLE})


def test_sync_does_not_cover_later_work(hb: HappensBefore) -> None:
    hb.sync_device()
    ok(hb, stream(1), writes={"a": WHOLE})
    bad(hb, stream(2), reads={"a": WHOLE})


def test_regions(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": frozenset({1, 2})})
    ok(hb, stream(2), writes={"a": frozenset({3})})
    bad(hb, stream(3), reads={"a": frozenset({2, 5})})
    bad(hb, stream(4), writes={"a": WHOLE})


def test_write_to_one_row_does_not_hide_read_of_another(hb: HappensBefore) -> None:
    ok(hb, stream(1), reads={"a": frozenset({2})})
    ok(hb, stream(1), writes={"a": frozenset({1})})
    hb.record(event(1), stream(1))
    hb.wait(stream(2), event(1))
    ok(hb, stream(2), writes={"a": frozenset({1})})
    ok(hb, stream(3), reads={"a": frozenset({2})})
    (conflict,) = bad(hb, stream(3), writes={"a": frozenset({2})})
    assert not conflict.earlier.is_write and conflict.earlier.stream == stream(1)


def test_graph_replay_in_graph_event(hb: HappensBefore) -> None:
    graph = CapturedGraph(
        "decode",
        [
            GraphNode("launch", op="plan", reads=(("req_to_token", WHOLE),)),
            GraphNode("record", event=event(1)),
            GraphNode("launch", op="attend", reads=(("req_to_token", WHOLE),)),
        ],
    )
    assert hb.replay(graph, stream(1)) == []
    hb.wait(stream(2), event(1))
    (conflict,) = bad(hb, stream(2), writes={"req_to_token": WHOLE}, op="scheduler")
    assert conflict.earlier.op == "attend"
    assert conflict.earlier.graph == "decode"
    assert conflict.earlier.stream == stream(1)


def test_graph_replay_fork_join(hb: HappensBefore) -> None:
    graph = CapturedGraph(
        "fork",
        [
            GraphNode("launch", stream=0, op="main", writes=(("a", WHOLE),)),
            GraphNode("launch", stream=1, op="side", writes=(("b", WHOLE),)),
        ],
    )
    assert hb.replay(graph, stream(1)) == []
    ok(hb, stream(1), reads={"a": WHOLE, "b": WHOLE})
    (conflict,) = bad(hb, stream(2), reads={"b": WHOLE})
    assert conflict.earlier.op == "side" and conflict.earlier.graph == "fork"


def test_graph_replay_forked_stream_races_without_in_graph_edge(hb: HappensBefore) -> None:
    unordered = [
        GraphNode("launch", stream=0, op="produce", writes=(("a", WHOLE),)),
        GraphNode("launch", stream=1, op="consume", reads=(("a", WHOLE),)),
    ]
    (conflict,) = hb.replay(CapturedGraph("racy", unordered), stream(1))
    assert conflict.later.graph == "racy"
    ordered = [
        unordered[0],
        GraphNode("record", stream=0, event=event(1)),
        GraphNode("wait", stream=1, event=event(1)),
        unordered[1],
    ]
    assert HappensBefore().replay(CapturedGraph("fixed", ordered), stream(1)) == []


def test_graph_replay_is_ordered_after_prior_work_on_its_stream(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    graph = CapturedGraph("g", [GraphNode("launch", stream=3, op="side", reads=(("a", WHOLE),))])
    assert hb.replay(graph, stream(1)) == []


def test_conflict_str_names_ops_streams_and_buffer(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"kv_cache": frozenset(range(10))}, op="forward:layer1.attention")
    (conflict,) = bad(hb, stream(2), reads={"kv_cache": frozenset({3, 4})}, op="sampler")
    text = str(conflict)
    for needle in ("kv_cache", "forward:layer1.attention", "sampler", str(stream(1)), str(stream(2)), "3, 4"):
        assert needle in text
    assert "write" in text and "read" in text


def test_conflict_str_whole_buffer(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE})
    (conflict,) = bad(hb, stream(2), writes={"a": WHOLE})
    assert "whole buffer" in str(conflict)


def test_no_duplicate_reports(hb: HappensBefore) -> None:
    ok(hb, stream(1), reads={"a": WHOLE}, writes={"a": WHOLE})
    (conflict,) = bad(hb, stream(2), reads={"a": WHOLE}, writes={"a": WHOLE})
    assert conflict.later.is_write
    assert hb.conflicts == [conflict]


def test_conflicts_accumulate(hb: HappensBefore) -> None:
    ok(hb, stream(1), writes={"a": WHOLE, "b": WHOLE})
    first = bad(hb, stream(2), reads={"a": WHOLE})
    second = bad(hb, stream(3), reads={"b": WHOLE})
    assert hb.conflicts == first + second


def test_graph_node_validation() -> None:
    with pytest.raises(ValueError):
        GraphNode("record")
    with pytest.raises(ValueError):
        GraphNode("launch", reads=(("a", WHOLE), ("a", frozenset({1}))))


_regions = st.one_of(st.none(), st.frozensets(st.integers(0, 3), max_size=3))
_accesses = st.dictionaries(st.sampled_from("ab"), _regions, max_size=2)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("launch"), st.integers(0, 2), _accesses, _accesses),
        st.tuples(st.just("record"), st.integers(0, 2), st.integers(0, 1)),
        st.tuples(st.just("wait"), st.integers(0, 2), st.integers(0, 1)),
        st.tuples(st.just("wait_stream"), st.integers(0, 2), st.integers(0, 2)),
        st.tuples(st.just("sync_stream"), st.integers(0, 2)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_pruning_loses_no_racy_access(steps: list[tuple]) -> None:
    """Against a tracker that never forgets an access: every reported pair is a real race, and
    every access that races with anything is reported at least once."""
    pruned, kept = HappensBefore(), HappensBefore()
    kept._replaces = lambda *_: False  # type: ignore[method-assign]
    for name, *args in steps:
        for hb in (pruned, kept):
            if name == "launch":
                hb.launch(stream(args[0]), "op", args[1], args[2])
            elif name == "record":
                hb.record(event(args[1]), stream(args[0]))
            elif name == "wait":
                hb.wait(stream(args[0]), event(args[1]))
            elif name == "wait_stream":
                hb.wait_stream(stream(args[0]), stream(args[1]))
            else:
                hb.sync_stream(stream(args[0]))
    def pairs(hb: HappensBefore) -> set[tuple[int, int, str]]:
        return {(c.earlier.seq, c.later.seq, c.later.buffer) for c in hb.conflicts}

    assert pairs(pruned) <= pairs(kept)
    racy = {(c.later.seq, c.later.buffer) for c in kept.conflicts}
    assert {(c.later.seq, c.later.buffer) for c in pruned.conflicts} == racy


def test_an_access_observed_late_is_judged_by_its_clock_at_issue(hb: HappensBefore) -> None:
    before = hb.open_launch(stream(1), "snapshot")
    hb.record(event(1), stream(1))
    after = hb.open_launch(stream(1), "late")
    hb.wait(stream(2), event(1))
    ok(hb, stream(2), writes={"a": WHOLE}, op="rewrite")
    assert hb.observe(before, "a", WHOLE, False) == []  # issued before the event: ordered
    (conflict,) = hb.observe(after, "a", WHOLE, False, frame="x.py:3 in late")
    assert conflict.earlier.op == "late" and conflict.later.op == "rewrite"
    assert "at x.py:3 in late" in str(conflict)


def test_no_pruning_while_an_access_may_still_be_observed(hb: HappensBefore) -> None:
    """A write later replaced on its own stream still races with an access observed late between them."""
    pending = hb.open_launch(stream(2), "pending")
    hb.record(event(1), stream(2))
    ok(hb, stream(1), writes={"a": WHOLE}, op="first")
    hb.wait(stream(1), event(1))
    ok(hb, stream(1), writes={"a": WHOLE}, op="second")  # ordered after `first` and `pending`
    (conflict,) = hb.observe(pending, "a", WHOLE, False)
    assert conflict.earlier.op == "pending" and conflict.later.op == "first"
    hb.close_launch(pending)


def test_a_pair_found_from_a_declaration_gets_the_frame_observed_later(hb: HappensBefore) -> None:
    late = hb.open_launch(stream(1), "late", reads={"a": WHOLE})
    bad(hb, stream(2), writes={"a": WHOLE}, op="rewrite")
    assert hb.observe(late, "a", WHOLE, False, frame="x.py:7 in dump") == []  # the same pair: not twice
    (conflict,) = hb.conflicts
    assert conflict.earlier.frame == "x.py:7 in dump" and "at x.py:7 in dump" in str(conflict)
