"""One scenario's run: set up, the loads, the fault's marks, the drain, the tally."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Admin
from bench.faults.fleet import WORKERS, Fleet, notable_records
from bench.faults.harness import (
    APP_MODULE,
    APP_SOURCE,
    CONCURRENCY,
    HEALTHY,
    OVERRUN,
    OVERRUN_ATTEMPTS,
    OVERRUN_BASE_DELAY,
    OVERRUN_LIMIT,
    OVERRUN_SLEEP,
    PLAIN,
    POSTGRES,
    PREFIXES,
    TX,
    DeadLetter,
    Env,
    Ledger,
    RunLog,
    dead_letters,
)
from bench.load import Load
from bench.workers import write_app
from broker_jobs import App
from broker_jobs.store.base import Status

#: Seconds after the drain to catch a late duplicate.
AFTER_DRAIN = 2.0
#: Ledger states of a job not settled yet.
UNSETTLED = (Status.RUNNING, Status.RETRYING, Status.QUEUED, Status.SCHEDULED)


# -- one scenario's run ----------------------------------------------------------------------


@dataclass
class Fault:
    """When the fault began and ended (wall time), and what it was."""

    started: float
    ended: float
    details: dict[str, Any] = field(default_factory=dict)


class Run:
    """One scenario with one store: a temp dir, a namespace, a ledger, the app, and
    (once started) a fleet and the loads. Use as a context manager: everything it
    started is stopped at the end, also on failure."""

    def __init__(
        self,
        env: Env,
        scenario: str,
        store: str,
        *,
        tasks: Sequence[str] = HEALTHY,
        ledger_dir: Path | None = None,
    ) -> None:
        self.env, self.scenario, self.store, self.tasks = env, scenario, store, tuple(tasks)
        token = secrets.token_hex(3)
        self.workdir = env.base / f"{scenario}-{store}-{token}"
        self.ledger_dir = ledger_dir or self.workdir
        self.namespace = f"bjf{token}"
        self.plain_log = RunLog(self.workdir / "plain.log")
        self.overrun_log = RunLog(self.workdir / "overrun.log")
        self.ledger: Ledger | None = None
        self.app: App | None = None
        self.fleet: Fleet | None = None
        self.loads: dict[str, Load] = {}
        self.admin_url: str | None = None
        self.faults: list[Fault] = []
        self.extra: dict[str, Any] = {}
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.began = time.time()
        self.drain_s: float | None = None

    # -- set up -----------------------------------------------------------------------

    def __enter__(self) -> Run:
        self.workdir.mkdir(parents=True)
        dsn = self.env.postgres().dsn if self.store == POSTGRES else None
        self.ledger = Ledger(self.store, self.ledger_dir, dsn)
        self.ledger.create()
        source = APP_SOURCE.substitute(
            namespace=repr(self.namespace),
            tx=repr(TX),
            plain=repr(PLAIN),
            overrun=repr(OVERRUN),
            insert=repr(self.ledger.effects.insert_sql()),
            plain_log=repr(str(self.plain_log.path)),
            overrun_log=repr(str(self.overrun_log.path)),
            limit=repr(OVERRUN_LIMIT),
            attempts=repr(OVERRUN_ATTEMPTS),
            base_delay=repr(OVERRUN_BASE_DELAY),
            sleep=repr(OVERRUN_SLEEP),
        )
        self.app = write_app(self.workdir, APP_MODULE, source)
        return self

    def __exit__(self, *_exc: object) -> None:
        for load in self.loads.values():
            load.stop()
        if self.fleet is not None:
            self.fleet.kill_all()
        if self.ledger is not None:
            self.ledger.drop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def ledger_(self) -> Ledger:
        assert self.ledger is not None
        return self.ledger

    @property
    def app_(self) -> App:
        assert self.app is not None
        return self.app

    @property
    def fleet_(self) -> Fleet:
        assert self.fleet is not None
        return self.fleet

    def declare(self, url: str) -> None:
        """The topology, before any publish (the workers declare it too)."""
        with Admin(url) as admin:
            admin.declare(self.app_.topology())
        self.admin_url = self.admin_url or url

    def start_workers(
        self,
        urls: Sequence[str],
        *,
        extra: Sequence[str] = (),
        count: int = WORKERS,
        supervise: bool = True,
    ) -> Fleet:
        args = ["--url", ",".join(urls), f"{APP_MODULE}:app", "--store", self.ledger_.store_url]
        args += ["--concurrency", str(CONCURRENCY), "--grace", "5"]
        for task in self.tasks:
            args += ["--task", task]
        self.fleet = Fleet(self.workdir, [*args, *extra], count, supervise=supervise)
        self.fleet.start()
        self.fleet.wait_ready()
        return self.fleet

    def start_loads(self, rate: float, url: str, *, limit: int | None = None) -> None:
        """One publisher thread per task, ``rate`` jobs/s each (confirmed, keyed)."""
        for task in self.tasks:
            load = Load(
                url,
                self.app_,
                rate,
                task=task,
                prefix=PREFIXES[task],
                limit=limit,
                keyed=True,
                name=f"bench.faults {task}",
            )
            self.loads[task] = load
            load.start()

    def begin(self, url: str, rate: float, *, settle: float = 0.0) -> Fleet:
        """Declare the topology on ``url`` (then wait ``settle`` s), start the workers
        on it and the loads: ``rate`` jobs/s per task."""
        self.declare(url)
        time.sleep(settle)
        fleet = self.start_workers([url])
        self.start_loads(rate, url)
        return fleet

    def end(self, steady: float) -> dict[str, Any]:
        """``steady`` s more of the load after the fault, then stop it, drain (90 s at
        most) and :meth:`finish`."""
        time.sleep(max(0.0, steady))
        self.stop_loads()
        self.drain(timeout=90)
        return self.finish()

    def stop_loads(self) -> None:
        for load in self.loads.values():
            load.stop()

    def wait_loads(self, timeout: float) -> None:
        """Until every load published its ``limit`` (bounded), then stop them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
            load.limit is not None and load.attempted < load.limit for load in self.loads.values()
        ):
            time.sleep(0.1)
        self.stop_loads()

    def fault(self, started: float, ended: float, **details: Any) -> Fault:
        record = Fault(started, ended, details)
        self.faults.append(record)
        return record

    def held_fault(
        self,
        lasting: float,
        kind: str,
        cause: Callable[[], dict[str, Any]],
        heal: Callable[[], object],
    ) -> Fault:
        """``cause()`` the fault (it returns the fault's details), hold it until
        ``lasting`` s after it began, ``heal()`` it: the fault, from its start to the
        heal's end."""
        started = time.time()
        details = cause()
        time.sleep(max(0.0, lasting - (time.time() - started)))
        heal()
        return self.fault(started, time.time(), kind=kind, **details)

    # -- the end ----------------------------------------------------------------------

    def confirmed(self, task: str) -> set[str]:
        load = self.loads.get(task)
        if load is None:
            return set()
        with load.lock:
            return set(load.confirmed)

    def effects(self, task: str) -> dict[str, int]:
        """Effects per key: rows of ``effects`` (TX), E lines (PLAIN), S lines (OVERRUN)."""
        if task == TX:
            return {key: len(times) for key, times in self.ledger_.effects.runs().items()}
        if task == PLAIN:
            return self.plain_log.ended()
        return dict(Counter(run.key for run in self.overrun_log.runs()))

    def missing(self) -> dict[str, set[str]]:
        return {task: self.confirmed(task) - set(self.effects(task)) for task in self.tasks}

    def drain(self, timeout: float, *, settled: Callable[[], bool] | None = None) -> float:
        """Wait (at most ``timeout`` s) until the jobs are settled (by default: every
        confirmed job ran or is in a dead-letter queue, and no ledger record is running
        or retrying: a redelivery may still be waiting for a lease); then 2 s more."""
        check = settled or self._accounted
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                if check():
                    break
            except Exception:  # the ledger or the broker away: not settled yet
                pass
            time.sleep(0.5)
        self.drain_s = time.monotonic() - started
        time.sleep(AFTER_DRAIN)
        return self.drain_s

    def _accounted(self) -> bool:
        missing = self.missing()
        if any(missing.values()) and not self._all_dead(missing):
            return False
        counts = self.ledger_.counts()
        return not any(counts.get(status.value) for status in UNSETTLED)

    def _all_dead(self, missing: dict[str, set[str]]) -> bool:
        """Is every missing key in its task's dead-letter queue?"""
        if self.admin_url is None:
            return False
        for task, keys in missing.items():
            if not keys:
                continue
            queue = self.app_.names.dead_letter_queue(task)
            try:
                with Admin(self.admin_url) as admin:
                    if admin.depth(queue) < len(keys):
                        return False
                if not keys <= {d.key for d in dead_letters(self.admin_url, queue)}:
                    return False
            except Exception:  # the broker away: not settled
                return False
        return True

    def recovery(self, fault: Fault) -> float | None:
        """From the fault's end to the first job completed after it: a row of
        ``effects`` (committed with the success) or a plain handler's E line."""
        firsts = [self.plain_log.first_end_after(fault.ended)]
        if TX in self.tasks:
            firsts.append(self.ledger_.effects.first_after(fault.ended))
        found = [moment for moment in firsts if moment is not None]
        return round(min(found) - fault.ended, 3) if found else None

    def wait_recovered(self, timeout: float) -> float | None:
        """Until a job completed after the last fault's end (at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the ledger's database still away
                if (found := self.recovery(self.faults[-1])) is not None:
                    return found
            time.sleep(0.2)
        return None

    def finish(self) -> dict[str, Any]:
        """Stop the loads and the workers, tally, judge: the scenario's summary."""
        self.stop_loads()
        codes = self.fleet_.stop() if self.fleet else {}
        by_task: dict[str, Any] = {}
        dead_all: list[DeadLetter] = []
        for task in self.tasks:
            by_task[task] = self._tally(task)
            dead_all += by_task[task].pop("_dead")
        counts = self.ledger_.counts()
        lost = sum(t["lost"] for t in by_task.values())
        healthy_dead = sum(t["dead_count"] for k, t in by_task.items() if k in HEALTHY)
        recoveries = [self.recovery(f) for f in self.faults]
        known = [r for r in recoveries if r is not None]
        exits = self.fleet_.unexpected if self.fleet else []
        summary: dict[str, Any] = {
            "scenario": self.scenario,
            "store": self.store,
            "ok": None,
            "published": sum(t["published"] for t in by_task.values()),
            "lost": lost,
            "effects_doubled": by_task[TX]["doubled"] if TX in by_task else None,
            "plain_reruns": by_task[PLAIN]["doubled"] if PLAIN in by_task else None,
            "dead_lettered": len(dead_all),
            "healthy_dead_lettered": healthy_dead if set(self.tasks) & set(HEALTHY) else None,
            "running_left": counts.get(Status.RUNNING.value, 0),
            "running_in_ledger": self.explain(self.ledger_.keys(Status.RUNNING, 5)),
            "recovery_s": max(known) if known and len(known) == len(recoveries) else None,
            "faults": [
                {
                    "started_s": round(f.started - self.began, 3),
                    "lasted_s": round(f.ended - f.started, 3),
                    "recovery_s": recovery,
                    **f.details,
                }
                for f, recovery in zip(self.faults, recoveries, strict=True)
            ],
            "kills": len(self.fleet_.kills) if self.fleet else 0,
            "tasks": by_task,
            "ledger": counts,
            "dead_reasons": dict(Counter(d.reason for d in dead_all)),
            "workers": {
                "command": self.fleet_.command if self.fleet else None,
                "unexpected_exits": [
                    {
                        "worker": e.name,
                        "pid": e.pid,
                        "code": e.code,
                        "at_s": round(e.at - self.began),
                    }
                    for e in exits
                ],
                "stop_codes": codes,
                "outcomes": self.fleet_.outcomes() if self.fleet else {},
                "log": notable_records(self.fleet_.records()) if self.fleet else {},
            },
            "publish_errors": {
                task: {"counts": dict(load.errors), "first": load.messages}
                for task, load in self.loads.items()
                if load.errors
            },
            "drain_s": None if self.drain_s is None else round(self.drain_s, 3),
            "duration_s": round(time.time() - self.began, 1),
            **self.extra,
        }
        summary["problems"] = self.problems + judge(summary, recoveries)
        summary["ok"] = not summary["problems"]
        summary["notes"] = self.notes
        return summary

    def explain(self, keys: Sequence[str]) -> dict[str, Any]:
        """The ledger's account of ``keys`` and every worker log line naming them."""
        found = self.ledger_.explain(keys)
        records = self.fleet_.records() if self.fleet else []
        for key, about in found.items():
            marks = [key] + ([about["job_id"]] if about else [])
            lines = [
                f"{name} {time.strftime('%H:%M:%S', time.localtime(r.at))} {r.level} {r.message}"
                for name, r in records
                if any(mark in r.message for mark in marks)
            ]
            found[key] = {"ledger": about, "worker_log": [line[:400] for line in lines[:12]]}
        return found

    def _tally(self, task: str) -> dict[str, Any]:
        load = self.loads.get(task)
        confirmed = self.confirmed(task)
        failed: set[str] = set()
        if load is not None:
            with load.lock:
                failed = set(load.failed) - confirmed
        effects = self.effects(task)
        dead: list[DeadLetter] = []
        if self.admin_url is not None:
            try:
                dead = dead_letters(self.admin_url, self.app_.names.dead_letter_queue(task))
            except Exception as error:  # the broker's state decides; say so
                self.problems.append(f"{task}: dead-letter queue unreadable: {error}")
        dead_keys = sorted({d.key for d in dead} & confirmed)
        never_ran = sorted(confirmed - set(effects))
        lost = [key for key in never_ran if key not in set(dead_keys)]
        return {
            "published": len(confirmed),
            "not_published": len(failed),
            "ran_not_published": sum(key in effects for key in failed),
            "ran": len(set(effects) & confirmed),
            "never_ran": len(never_ran),
            "lost": len(lost),
            "lost_keys": lost[:20],
            "lost_in_ledger": self.explain(lost[:5]),
            "doubled": sum(count > 1 for count in effects.values()),
            "doubled_keys": sorted(k for k, c in effects.items() if c > 1)[:20],
            "dead_count": len(dead_keys),
            "dead_keys": dead_keys[:20],
            "_dead": dead,
        }


def judge(summary: dict[str, Any], recoveries: Sequence[float | None]) -> list[str]:
    """The must-be-0 rules: what makes a scenario not ok."""
    found = []
    if summary["lost"]:
        found.append(f"{summary['lost']} confirmed jobs lost (never ran, not dead-lettered)")
    if summary["effects_doubled"]:
        found.append(f"{summary['effects_doubled']} transactional effects doubled")
    if summary["healthy_dead_lettered"]:
        found.append(f"{summary['healthy_dead_lettered']} healthy jobs dead-lettered")
    if summary["running_left"]:
        found.append(f"{summary['running_left']} ledger records left running")
    if summary.get("overlapping_keys"):
        found.append(f"{summary['overlapping_keys']} keys ran overlapping executions")
    if missed := sum(recovery is None for recovery in recoveries):
        found.append(f"no job completed after the end of {missed} fault(s)")
    return found
