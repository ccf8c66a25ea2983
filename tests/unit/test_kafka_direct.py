"""The direct read's offset planning (spark_jobs.kafka_direct): pure rules, no Kafka."""

from __future__ import annotations

from spark_jobs.kafka_direct import (
    Range,
    Subscription,
    admit,
    kafka_source_ranges,
    plan_ranges,
    reconcile,
    spread_ranges,
    starting_offsets,
)

MARKS = {"p.public.a": {"0": (5, 50), "1": (0, 10)}, "hb": {"0": (0, 3)}}


def test_starting_offsets_earliest_latest_and_json() -> None:
    assert starting_offsets(MARKS, "earliest") == {
        "p.public.a": {"0": 5, "1": 0},
        "hb": {"0": 0},
    }
    assert starting_offsets(MARKS, "latest") == {"p.public.a": {"0": 50, "1": 10}, "hb": {"0": 3}}
    # Spark's Kafka source's JSON: -2 earliest, -1 latest, absent earliest.
    assert starting_offsets(MARKS, '{"p.public.a": {"0": 7, "1": -1}}') == {
        "p.public.a": {"0": 7, "1": 10},
        "hb": {"0": 0},
    }


def test_reconcile_keeps_what_fits_and_says_what_was_lost() -> None:
    start = {"p.public.a": {"0": 2, "1": 12}, "gone": {"0": 9}}
    begin, lost = reconcile(start, MARKS)
    # 0: offsets 2..4 fell out of retention; 1: past the end (the topic was made again);
    # hb: a new topic from its start; gone: dropped.
    assert begin == {"p.public.a": {"0": 5, "1": 0}, "hb": {"0": 0}}
    assert len(lost) == 2
    assert "p.public.a[0]: offsets 2..4 are gone" in lost[0]
    assert "p.public.a[1]: offset 12 is past the end 10" in lost[1]
    assert reconcile({"p.public.a": {"0": 6, "1": 10}, "hb": {"0": 1}}, MARKS) == (
        {"p.public.a": {"0": 6, "1": 10}, "hb": {"0": 1}},
        [],
    )


def test_admit_shares_a_limit_in_proportion_to_each_backlog() -> None:
    start = {"a": {"0": 0, "1": 100}, "b": {"0": 10}}
    latest = {"a": {"0": 300, "1": 200}, "b": {"0": 10}}
    assert admit(start, latest, None) == latest
    assert admit(start, latest, 1000) == latest  # the whole backlog fits
    # 400 of a backlog of 300 + 100: three quarters and a quarter; b has none.
    assert admit(start, latest, 40) == {"a": {"0": 30, "1": 110}, "b": {"0": 10}}
    # A tiny limit still moves every partition with records by one.
    assert admit(start, latest, 1) == {"a": {"0": 1, "1": 101}, "b": {"0": 10}}


def test_plan_ranges_one_task_per_partition_with_records() -> None:
    start = {"a": {"0": 0, "1": 5}, "b": {"0": 3}}
    end = {"a": {"0": 4, "1": 5}, "b": {"0": 9}, "new": {"0": 2}}
    # A partition the start does not know is recorded first, read from the next batch.
    assert plan_ranges(start, end) == [Range("a", 0, 0, 4), Range("b", 0, 3, 9)]


def test_subscription_matches_whole_names_like_spark() -> None:
    pattern = Subscription((), r"shop\.[^.]+\.[^.]+|__cdc-heartbeat\.shop")
    assert pattern.wants("shop.public.orders")
    assert pattern.wants("__cdc-heartbeat.shop")
    assert not pattern.wants("shop.public.orders.extra")
    assert not pattern.wants("xshop.public.orders")
    named = Subscription(("shop.public.orders",), None)
    assert named.wants("shop.public.orders")
    assert not named.wants("shop.public.other")


def test_kafka_source_ranges_read_new_and_remade_partitions_from_their_log_start() -> None:
    """Spark's Kafka source's logged offsets (spark.direct_planner = kafka): a partition
    with records gets its range; one new to the offsets (a new topic or partition) and one
    whose offsets went back (its topic made again, which the Kafka source would skip) are
    read from offset 0, the log start; one gone from the end is not read."""
    start = {"p.public.a": {"0": 5, "1": 12, "2": 4}, "gone": {"0": 9}}
    end = {"p.public.a": {"0": 9, "1": 3, "2": 4}, "hb": {"0": 2}}
    ranges, again = kafka_source_ranges(start, end)
    assert ranges == [
        Range("hb", 0, 0, 2),
        Range("p.public.a", 0, 5, 9),
        Range("p.public.a", 1, 0, 3),
    ]
    assert again == ["p.public.a[1]: offset 12 is past the end 3 (topic made again?)"]
    assert kafka_source_ranges(end, end) == ([], [])


def test_spread_ranges_balances_records_over_the_tasks_the_most_first() -> None:
    """The bench's batch: three partitions of a table and a heartbeat range over two cores;
    each range goes, the most records first, to the task holding the fewest so far."""
    rs = [Range("t", 0, 0, 33_000), Range("t", 1, 0, 34_000), Range("t", 2, 0, 33_500)]
    rs.append(Range("hb", 0, 7, 9))
    assert spread_ranges(rs, 2) == [[1, 3], [2, 0]]
    # A tie goes to the first task; more tasks than ranges: a range a task, none empty.
    assert spread_ranges([Range("t", p, 0, 10) for p in range(3)], 2) == [[0, 2], [1]]
    assert spread_ranges(rs, 8) == [[1], [2], [0], [3]]
    assert spread_ranges(rs, 1) == [[1, 2, 0, 3]]
    # Each range in exactly one task, whatever the sizes.
    many = [Range("t", p, p * 7 % 5, 10 + p * 13 % 17) for p in range(11)]
    for tasks in range(1, 14):
        groups = spread_ranges(many, tasks)
        assert sorted(i for g in groups for i in g) == list(range(11))
        assert len(groups) == min(tasks, 11)
        sizes = [sum(many[i].end - many[i].start for i in g) for g in groups]
        biggest = max(r.end - r.start for r in many)
        assert max(sizes) - min(sizes) <= biggest  # no task over the others by a whole range
