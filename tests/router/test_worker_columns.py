"""WorkerColumns: per-worker totals read for a list of candidates in one gather, bounded under churn."""

from __future__ import annotations

from tokenfront.router.policies.worker_columns import WorkerColumns


def urls(first: int, count: int) -> list[str]:
    return [f"http://w{i}" for i in range(first, first + count)]


def test_totals_are_read_per_candidate_in_the_order_given() -> None:
    columns = WorkerColumns(("pending", "occupancy"))
    columns.add("http://w2", "pending", 300)
    columns.add("http://w2", "occupancy", 40)
    columns.add("http://w0", "occupancy", 7)
    columns.add("http://w2", "pending", -100)
    read = columns.read(["http://w2", "http://w9", "http://w0"])
    assert read.tolist() == [[200.0, 40.0], [0.0, 0.0], [0.0, 7.0]]
    assert columns.get("http://w2", "pending") == 200.0
    assert columns.get("http://w7", "occupancy") == 0.0


def test_a_read_is_a_copy_and_sees_later_changes_through_the_reused_slots() -> None:
    columns = WorkerColumns(("pending",))
    candidates = urls(0, 3)
    first = columns.read(candidates)
    first[1, 0] = 99.0  # the caller's copy: the totals are not changed
    columns.add("http://w1", "pending", 5)  # a slot the candidates already have: the layout stays
    assert columns.read(list(candidates)).tolist() == [[0.0], [5.0], [0.0]]
    columns.add("http://w3", "pending", 8)  # a new url: a new slot, the reused slots still right
    assert columns.read(candidates).tolist() == [[0.0], [5.0], [0.0]]
    assert columns.read([*candidates, "http://w3"])[:, 0].tolist() == [0.0, 5.0, 0.0, 8.0]


def test_cleared_totals_read_zero() -> None:
    columns = WorkerColumns(("pending", "occupancy"))
    columns.add("http://w0", "pending", 12)
    columns.add("http://w0", "occupancy", 3)
    columns.clear("http://w0")
    columns.clear("http://never-seen")
    assert columns.read(["http://w0"]).tolist() == [[0.0, 0.0]]


def test_fleet_churn_keeps_the_table_bounded_and_the_busy_workers_totals() -> None:
    columns = WorkerColumns(("pending",))
    columns.MIN_PRUNE = 8
    columns.add("http://busy", "pending", 42)
    for generation in range(20):  # a fleet of 4 replaced 20 times, each time one request in flight and done
        fleet = urls(4 * generation, 4)
        assert columns.read(fleet).tolist() == [[0.0]] * 4
        columns.add(fleet[0], "pending", 1)
        if generation % 5:  # every fifth one's request is still in flight
            columns.add(fleet[0], "pending", -1)
    assert len(columns) <= 8 + 4
    # Urls whose totals are not zero survive a prune, each with its own total.
    assert columns.get("http://busy", "pending") == 42.0
    assert columns.read(["http://busy", "http://w0", "http://w20", "http://w4"])[:, 0].tolist() == [
        42.0,
        1.0,
        1.0,
        0.0,
    ]
