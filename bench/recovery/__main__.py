"""``python -m bench.recovery``: the run (see :mod:`bench.recovery`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import URL_ENV, Admin, print_config
from bench.effects import Effects
from bench.load import Load
from bench.recovery.options import Options, parse_args
from bench.recovery.report import (
    aims,
    describe_config,
    print_header,
    print_round,
    print_round_counts,
    print_summary,
    problems,
    round_json,
    summary,
)
from bench.recovery.rounds import (
    TASK,
    Round,
    Workers,
    kill_and_restart,
    steady,
    wait_recovered,
    warm_up,
    write_app,
)
from bench.recovery.tally import drain, tally
from broker_jobs import App
from broker_jobs.store.urls import open_store
from broker_jobs.testing.rabbit_node import RabbitNode

#: Seconds after the drain to catch a late duplicate.
AFTER_DRAIN = 2.0


@contextlib.contextmanager
def throwaway_node(workdir: Path) -> Iterator[RabbitNode]:
    if not RabbitNode.available():
        raise SystemExit("no local rabbitmq-server: this bench needs a node it can kill")
    if os.environ.get(URL_ENV):
        print(f"${URL_ENV} is ignored: this bench kills the broker, so it starts its own")
    node = RabbitNode.create(workdir / "node")
    print(f"Starting a throwaway RabbitMQ node ({node.nodename}); it is removed at the end")
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


def run_rounds(
    options: Options,
    node: RabbitNode,
    workers: Workers,
    *,
    effects: Effects,
    load: Load,
    rounds: list[Round],
) -> None:
    """Run the rounds, appending each to ``rounds``; a failed round ends the run."""
    print_header([w.name for w in workers.every])
    for number in range(1, options.rounds + 1):
        if error := steady(options.steady, workers):
            print(f"  stopped before round {number}: {error}")
            break
        record = kill_and_restart(node, number)
        wait_recovered(record, workers, effects, load)
        print_round(record, options.rounds)
        rounds.append(record)
        if record.error:
            break


def bench(options: Options) -> tuple[dict[str, Any], bool]:
    namespace = f"brec{secrets.token_hex(4)}"
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # the publisher's failed connects
    logging.getLogger("broker_jobs").setLevel(logging.CRITICAL)  # ... and its reconnects
    with (
        tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp,
        throwaway_node(Path(tmp)) as node,
    ):
        workdir = Path(tmp)
        effects = Effects(workdir, options.store, prefix="brec")
        try:
            effects.create()
            open_store(effects.store_url).close()  # the schema, before the workers race for it
            app = write_app(workdir, namespace, effects)
            admin = Admin(node.url)
            try:
                config = describe_config(options, node, admin, namespace, effects)
            finally:
                admin.close()
            print_config("Broker recovery benchmark (broker_jobs)", config)
            result, ok = _measure(options, node, workdir, effects=effects, app=app, config=config)
        finally:
            effects.drop()
    return result, ok


def _measure(
    options: Options,
    node: RabbitNode,
    workdir: Path,
    *,
    effects: Effects,
    app: App,
    config: dict[str, Any],
) -> tuple[dict[str, Any], bool]:
    load = Load(node.url, app, options.rate, task=TASK, name="bench.recovery publisher")
    workers = Workers(node.url, effects.store_url, options, workdir)
    rounds: list[Round] = []
    try:
        load.start()
        warm_up(workers, effects)
        run_rounds(options, node, workers, effects=effects, load=load, rounds=rounds)
        time.sleep(1.0)  # a last second of steady load after the last recovery
    except BaseException:
        load.stop()
        workers.stop()
        raise
    load.stop()
    exited_early = [w.name for w in workers.exited()]
    drain_s = drain(load, effects)
    time.sleep(AFTER_DRAIN)  # a late duplicate would show now
    admin: Admin | None = None
    with contextlib.suppress(Exception):
        admin = Admin(node.url)
    try:
        counts = tally(load, effects, rounds, drain_s, admin)
    finally:
        if admin is not None:
            admin.close()
    codes = workers.stop()
    outcomes = {w.name: w.stdout_path.read_text(errors="replace").strip() for w in workers.every}
    stray, levels = workers.stray(), workers.levels()
    print()
    print_round_counts(rounds, options.rounds)
    figures = summary(rounds, counts)
    met = aims(figures, counts, options.rounds)
    found = problems(rounds, counts, codes, exited_early, options.rounds)
    print_summary(
        figures,
        counts,
        met=met,
        codes=codes,
        exited_early=exited_early,
        stray=stray,
        outcomes=outcomes,
        levels=levels,
    )
    for problem in found:
        print(f"FAILED: {problem}")
    jobs = asdict(counts)
    for key in ("lost", "twice", "unknown"):
        jobs[key] = jobs[key][:100]  # the first keys; the counts are in the summary
    result = {
        "config": config,
        "summary": figures,
        "rounds": [round_json(r) for r in rounds],
        "jobs": jobs,
        "publish_errors": dict(load.errors),
        "workers": {
            "exited_during_run": exited_early,
            "exit_codes": codes,
            "reported": outcomes,
            "log_records": levels,
            "stray_log_records": [
                {"worker": name, "level": r.level, "message": r.message, "more": r.more[-6:]}
                for name, r in stray[:50]
            ],
        },
        "aims_met": met,
        "problems": found,
    }
    return result, not found


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    result, ok = bench(options)
    print(json.dumps(result, sort_keys=False))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
