"""``python -m bench.failover``: the run (see :mod:`bench.failover`); with ``--child``,
one beat process of it (:mod:`bench.failover.child`)."""

from __future__ import annotations

import functools
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import Admin, measure_on_broker, print_config
from bench.failover.app import build_app, leader_topology
from bench.failover.beats import Beats, Timeout
from bench.failover.child import child_main
from bench.failover.options import Options, options_from, parse_args
from bench.failover.report import (
    aims,
    check_sequence,
    describe_config,
    event_json,
    figures,
    print_aims,
    print_event,
    print_table,
    problems,
)
from bench.failover.rounds import SETTLE, Event, kill_round, pause_round, plan
from broker_jobs.store.urls import open_store
from broker_jobs.testing.rabbit_node import RabbitNode


def run(options: Options, beats: Beats) -> list[Event]:
    """Start the beats, then run the rounds; a round that cannot start (no leader
    emitting, a replacement that does not come up) ends the run as a failed round."""
    started = [beats.start(f"beat-{index}") for index in range(options.beats)]
    try:
        for child in started:
            beats.wait_ready(child)
        beats.leader()
    except Timeout as error:
        print_log_tails(beats)
        raise SystemExit(f"the beats did not start: {error}") from None
    events: list[Event] = []
    numbers: Counter[str] = Counter()
    for kind in plan(options.kills, options.pauses):
        numbers[kind] += 1
        step = kill_round if kind == "kill" else pause_round
        try:
            event = step(beats, numbers[kind])
        except Timeout as error:
            event = Event(kind, numbers[kind], "-", error=f"run aborted: {error}")
        print_event(event, options.kills if kind == "kill" else options.pauses)
        events.append(event)
        if event.error:
            print_log_tails(beats)
        if event.error and event.error.startswith("run aborted"):
            break
    time.sleep(SETTLE)
    return events


def print_log_tails(beats: Beats) -> None:
    for child in beats.current.values():
        tail = child.log_tail().replace("\n", "\n      ")
        print(f"    {child.name} log tail:\n      {tail}", flush=True)


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    namespace = f"bfail{secrets.token_hex(4)}"
    app = build_app(namespace, options.interval)
    topology = app.topology() + leader_topology(app.names)
    admin = Admin(url)
    try:
        config = describe_config(options, url, node, admin, namespace)
        print_config("Beat failover benchmark (broker_jobs)", config)
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as workdir:
            beats = Beats(url, options, namespace, Path(workdir))
            open_store(beats.store_url).close()  # the schema, before the beats race for it
            try:
                events = run(options, beats)
            finally:
                beats.stop_all()
            emits = list(beats.emits)
            unparsed = list(beats.unparsed)
    finally:
        admin.delete(topology)
        admin.close()
    table = figures(events)
    sequence = check_sequence(emits, options.interval)
    met = aims(options, table, events)
    found = problems(events, sequence, unparsed)
    print_table(table, sequence)
    print_aims(options, met, found)
    result = {
        "config": config,
        "kill": table["kill"],
        "pause": table["pause"],
        "events": [event_json(event) for event in events],
        "fires": asdict(sequence),
        "aims_met": {aim.label: aim.met for aim in met},
        "problems": found,
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    options = options_from(args)
    result = measure_on_broker(options.url, functools.partial(bench, options))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
