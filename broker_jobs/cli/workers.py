"""``broker-jobs workers``: the worker processes, beats and exporters that keep a
heartbeat in the ledger, alive or lost, with what each runs (read-only); ``workers
stop ID...`` asks workers to stop gracefully, through the ledger."""

from __future__ import annotations

import click
from rich.text import Text

from broker_jobs.cli.options import app_option, store_option, who_asks
from broker_jobs.cli.output import console, echo_json, fail, json_option, table
from broker_jobs.cli.tasks import chosen_tasks, task_options
from broker_jobs.cli.waiting import still_waiting
from broker_jobs.clock import utc_now
from broker_jobs.errors import BrokerJobsError
from broker_jobs.ops.processes import ProcessView, liveness_counts, process_views
from broker_jobs.ops.readable import span, when
from broker_jobs.plural import plural
from broker_jobs.printable import printable
from broker_jobs.store.base import Store, mask_dsn
from broker_jobs.store.processes import Liveness
from broker_jobs.store.urls import open_store
from topology.names import InvalidNameError, Names

_COLUMNS = (
    "state",
    "kind",
    "id",
    "host",
    "pid",
    "version",
    "tasks",
    "concurrency",
    "in flight",
    "started",
    "last seen",
)
_STYLES = {
    Liveness.ALIVE: "green",
    Liveness.STOPPING: "yellow",
    Liveness.LOST: "bold red",
    Liveness.STOPPED: "dim",
}


@click.group("workers", invoke_without_command=True)
@task_options("whose workers to show")
@store_option
@click.option(
    "--lost-after",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Call a process lost after this long without a heartbeat (default: three of"
    " its heartbeat periods, at least 15 s).",
)
@click.option("--running", "show_running", is_flag=True, help="List each worker's running jobs.")
@json_option
@click.pass_context
def workers_command(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    app_option: str | None,
    namespace: str | None,
    tasks: tuple[str, ...],
    store_url: str,
    lost_after: float | None,
    show_running: bool,
    as_json: bool,
) -> None:
    """Show the worker processes, beats and exporters and what each runs. Read-only.

    Every daemon with a ledger rewrites its heartbeat record there every few
    seconds (docs/operations.md, "Workers"); one silent past the threshold without
    having said it stopped is shown as lost (killed, its host gone, or cut off from
    the ledger). Stopped ones stay listed for a day.

    \b
    Examples:
      broker-jobs workers --store postgresql://ops@db/jobs
      broker-jobs workers --app myproject.tasks:app --running
      broker-jobs workers --namespace jobs --task image.resize --json
      broker-jobs workers stop web-1:2211:a3f9 --namespace jobs --wait 60
    """
    if ctx.invoked_subcommand is not None:
        return
    try:
        chosen_namespace, chosen = _scope(app_option, namespace, tasks)
        with open_store(store_url, must_exist=True) as store:
            now = utc_now()
            views = process_views(
                store, chosen_namespace, tasks=chosen, lost_after=lost_after, now=now
            )
    except (BrokerJobsError, InvalidNameError) as error:
        fail(str(error))
    if as_json:
        echo_json(
            {
                "namespace": chosen_namespace,
                "taken_at": when(now),
                "counts": _counts(views),
                "processes": [view.document() for view in views],
            }
        )
        return
    scope = f"namespace {chosen_namespace!r}" if chosen_namespace else "every namespace"
    click.echo(f"{scope}, ledger {mask_dsn(store_url)}, at {when(now)}")
    if not views:
        click.echo(
            "no heartbeats in this ledger: start a worker with --store pointing here"
            " (workers with the memory store keep theirs to themselves)"
        )
        return
    grid = table(*_COLUMNS, right=("pid", "concurrency", "in flight"))
    for view in views:
        grid.add_row(*_row(view))
    console().print(grid)
    click.echo(
        ", ".join(f"{plural(count, kind)} {state}" for (kind, state), count in _counted(views))
    )
    for view in views:
        if view.present and view.record.held:
            click.echo(f"{view.record.id} holds its deliveries: {printable(view.record.held)}")
    if show_running:
        _echo_running(views)


def _scope(
    app_option: str | None, namespace: str | None, tasks: tuple[str, ...]
) -> tuple[str | None, tuple[str, ...]]:
    """The namespace to show (None: all) and the tasks to filter by."""
    if namespace is None and app_option is None:
        if tasks:
            raise click.UsageError("--task needs --app or --namespace")
        return None, ()
    if namespace is not None and not tasks:
        try:
            return Names(namespace).namespace, ()
        except InvalidNameError as error:
            raise click.BadParameter(str(error), param_hint="--namespace") from None
    picked = chosen_tasks(app_option, namespace, tasks, "whose workers to show")
    return picked.names.namespace, tuple(tasks)


def _row(view: ProcessView) -> list[str | Text]:
    r = view.record
    state = view.liveness.value
    if view.liveness is Liveness.LOST:
        state = f"lost ({span(view.silent_for)})"
    elif view.liveness is Liveness.STOPPED and r.ended:
        # Its exit code only: the message would take the table's width (--json has it).
        state = f"stopped ({printable(r.ended.partition(':')[0])})"
    elif view.present and r.held:
        state += " (held)"  # why: under the table
    concurrency = "-" if r.concurrency is None else str(r.concurrency)
    if r.processes and r.processes > 1:
        concurrency += f" x{r.processes}"
    return [
        Text(state, style=_STYLES[view.liveness]),
        view.kind_and_role,
        r.id,
        r.host,
        str(r.pid),
        r.version,
        ", ".join(r.tasks) or "-",
        concurrency,
        str(r.in_flight),
        when(r.started_at),
        f"{span(view.silent_for)} ago",
    ]


def _echo_running(views: list[ProcessView]) -> None:
    grid = table("worker", "job", "task", "key", "attempt", "running for", right=("attempt",))
    now = utc_now()
    for view in views:
        if not view.present:  # its last heartbeat's jobs ended or were taken over since
            continue
        for job in view.record.running:
            grid.add_row(
                view.record.id,
                job.job_id,
                job.task,
                job.key,
                str(job.attempt),
                span(now - job.started_at),
            )
    console().print(grid)


def _counted(views: list[ProcessView]) -> list[tuple[tuple[str, str], int]]:
    return sorted(liveness_counts(views).items())


def _counts(views: list[ProcessView]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for (kind, state), count in _counted(views):
        counts.setdefault(kind, {})[state] = count
    return counts


@workers_command.command("stop")
@click.argument("worker_ids", metavar="WORKER_ID...", nargs=-1, required=True)
@app_option
@click.option("--namespace", help="The workers' namespace, without --app.")
@store_option
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Wait up to SECONDS until each worker's last heartbeat says it stopped; exit 1"
    " if one has not by then.",
)
@json_option
def stop_command(  # noqa: PLR0917 - click passes every option positionally
    worker_ids: tuple[str, ...],
    app_option: str | None,
    namespace: str | None,
    store_url: str,
    wait: float | None,
    as_json: bool,
) -> None:
    """Ask workers to stop gracefully, from anywhere the ledger is reachable.

    Each worker reads the request within a heartbeat period (5 s) and stops as on
    SIGTERM: it starts no job, lets the running ones finish within its grace period,
    and exits 0. Under a supervisor (systemd, Kubernetes) that restarts it, this is
    how to restart a worker, say with another --concurrency. A child of --processes
    is replaced by its supervisor at once (a graceful restart of that process): to
    stop them all, send SIGTERM to the supervisor. WORKER_ID as `broker-jobs workers`
    lists it.

    \b
    Examples:
      broker-jobs workers stop web-1:2211:a3f9 --app myproject.tasks:app --wait 60
    """
    chosen_namespace, _ = _scope(app_option, namespace, ())
    if chosen_namespace is None:
        raise click.UsageError("give --app or --namespace: the workers' namespace")
    try:
        with open_store(store_url, must_exist=True) as store:
            known = {v.record.id: v for v in process_views(store, chosen_namespace)}
            unknown = [w for w in worker_ids if w not in known]
            if unknown:
                raise click.UsageError(
                    f"no worker {unknown[0]!r} among the heartbeats of namespace"
                    f" {chosen_namespace!r}: `broker-jobs workers --namespace"
                    f" {chosen_namespace}` lists them"
                )
            # One stopping or stopped already is not asked again: a request written
            # after it exited would wait for its next start, to be deleted there.
            going = {w for w in worker_ids if known[w].liveness in _GOING}
            # A lost one reads no request (dead, frozen, or cut off from the ledger):
            # asking it would only leave a request to wait for its next start.
            lost = sorted(w for w in worker_ids if known[w].liveness is Liveness.LOST)
            asked = [
                store.request_stop(chosen_namespace, w, who_asks())
                for w in worker_ids
                if w not in going and w not in lost
            ]
            waited_for = tuple(w for w in worker_ids if w not in lost)
            running = still_waiting(lambda: _not_stopped(store, chosen_namespace, waited_for), wait)
    except BrokerJobsError as error:
        fail(str(error))
    if as_json:
        echo_json(
            {
                "namespace": chosen_namespace,
                "asked": [{"worker": a.worker_id, "at": when(a.at), "by": a.by} for a in asked],
                "already": {w: known[w].liveness.value for w in sorted(going)},
                "lost": lost,
                "not_stopped": running,
            }
        )
    else:
        for request in asked:
            click.echo(
                f"asked {request.worker_id} to stop (at {when(request.at)}, by {request.by}):"
                " it stops within a heartbeat period, letting its running jobs finish"
                + _supervised_note(known[request.worker_id])
            )
        for worker_id in sorted(going):
            click.echo(f"{worker_id} is {known[worker_id].liveness.value} already: not asked again")
        for worker_id in lost:
            click.echo(
                f"{worker_id} is lost (no heartbeat for {span(known[worker_id].silent_for)}):"
                " it cannot read a request; stop its process where it runs (a worker only"
                " cut off from the ledger stops by itself once it reads it again)",
                err=True,
            )
        if running:
            click.echo(f"not stopped yet: {', '.join(running)}", err=True)
        elif wait and waited_for:
            click.echo(f"stopped: {', '.join(waited_for)}")
    if running or lost:
        raise SystemExit(1)


def _supervised_note(view: ProcessView) -> str:
    """For one of several processes of a `--processes N` command: its supervisor
    starts another (a graceful restart), and how to stop them all."""
    processes = view.record.processes
    if not processes or processes < 2:
        return ""
    return (
        f"; it is one of {processes} processes under a supervisor, which starts another"
        f" in its place (a graceful restart): to stop them all, stop the supervisor (the"
        f" parent of pid {view.record.pid} on {view.record.host}: kill -TERM PID)"
    )


#: A worker in these states is not asked to stop again.
_GOING = frozenset({Liveness.STOPPING, Liveness.STOPPED})


def _not_stopped(store: Store, namespace: str, worker_ids: tuple[str, ...]) -> list[str]:
    """The workers whose last heartbeat does not say stopped."""
    states = {v.record.id: v.liveness for v in process_views(store, namespace)}
    return [w for w in worker_ids if states.get(w) is not Liveness.STOPPED]
