"""The second unexpected failure of one message dead-letters it (worker/strikes.py)."""

from __future__ import annotations

from broker_jobs.worker.strikes import Strikes


def test_the_second_failure_of_a_message_is_out_and_others_count_apart() -> None:
    strikes = Strikes()
    assert not strikes.out("m1")
    assert not strikes.out("m2")
    assert strikes.out("m1")
    assert strikes.out("m2")
    assert not strikes.out(None)
    assert not strikes.out(None)  # no id: never out (it cannot be told apart)


def test_only_the_newest_message_ids_are_remembered() -> None:
    strikes = Strikes(remembered=2)
    for message_id in ("a", "b", "c"):  # "a" is forgotten
        assert not strikes.out(message_id)
    assert not strikes.out("a")
    assert strikes.out("c")
