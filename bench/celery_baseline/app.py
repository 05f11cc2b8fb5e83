"""The Celery app of ``bench.celery_baseline`` (and ``bench.compare``'s Celery peer):
its one queue, its settings, its no-op task; Celery itself is imported on use."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery  # type: ignore[import-untyped]
    from celery.app.task import Task  # type: ignore[import-untyped]

TASK = "bench.celery_noop"
#: worker_prefetch_multiplier set for throughput, not Celery's default of 4: Celery's
#: optimizing guide raises it for many short tasks, and the other workers compared hold
#: ~80 deliveries. The prefetch count is the multiplier times the concurrency.
PREFETCH_MULTIPLIER = 100
CELERY_DEFAULT_PREFETCH_MULTIPLIER = 4
BROKER_POOL_LIMIT = 10
INSTALL_HINT = (
    'celery is not installed; it is an optional bench dependency: pip install "celery>=5.4"'
)
#: What Celery >= 5.5 declares for native delayed delivery once it sees a quorum queue
#: (kombu.transport.native_delayed_delivery): 28 levels, each a queue and an exchange.
DELAYED_LEVELS = 28
DELAYED_DELIVERY_EXCHANGE = "celery_delayed_delivery"


class CeleryMissingError(RuntimeError):
    """Celery (an optional bench dependency) is not installed."""


def celery_versions() -> dict[str, str]:
    """Versions of celery and the libraries under it; CeleryMissingError without it."""
    try:
        return {name: version(name) for name in ("celery", "kombu", "amqp", "billiard")}
    except PackageNotFoundError as exc:
        raise CeleryMissingError(INSTALL_HINT) from exc


def make_app(
    url: str,
    queue: str,
    queue_type: str = "quorum",
    prefetch_multiplier: int = PREFETCH_MULTIPLIER,
    *,
    exchange_type: str = "direct",
    confirm_publish: bool = False,
) -> Celery:
    """An app whose only queue is ``queue``: durable, quorum (by default), behind its own
    exchange (direct by default; topic lets a quorum queue's ``countdown`` take Celery's
    native delayed delivery). ``confirm_publish``: each publish waits for its confirm
    (``broker_transport_options={"confirm_publish": True}``)."""
    try:
        from celery import Celery  # noqa: PLC0415 - optional dependency, imported on use
        from kombu.entity import Exchange, Queue  # noqa: PLC0415 - idem
    except ModuleNotFoundError as exc:
        raise CeleryMissingError(INSTALL_HINT) from exc
    app = Celery("bench_celery_baseline", broker=url, set_as_current=False)
    app.conf.update(
        task_queues=(
            Queue(  # type: ignore[no-untyped-call]
                queue,
                Exchange(queue, type=exchange_type, durable=True),  # type: ignore[no-untyped-call]
                routing_key=queue,
                durable=True,
                queue_arguments={"x-queue-type": queue_type},
            ),
        ),
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        task_default_delivery_mode="persistent",
        task_acks_late=True,
        task_ignore_result=True,
        result_backend=None,
        worker_prefetch_multiplier=prefetch_multiplier,
        # The default, stated: with a quorum queue the worker uses per-consumer QoS
        # (global QoS is not supported by quorum queues).
        worker_detect_quorum_queues=True,
        # No pidbox queue and exchange per worker; idle during a drain either way.
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        broker_pool_limit=BROKER_POOL_LIMIT,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": confirm_publish},
    )
    return app


def register_noop(app: Celery, on_run: Any = None) -> Task:
    """The no-op task; ``on_run`` (the worker's counter) is called by every run."""

    @app.task(name=TASK, acks_late=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def noop() -> None:
        if on_run is not None:
            on_run()

    return noop


def delayed_delivery_objects() -> tuple[list[str], list[str]]:
    """The queues and exchanges of Celery's native delayed delivery (no prefix)."""
    levels = [f"celery_delayed_{level}" for level in range(DELAYED_LEVELS)]
    return levels, [*levels, DELAYED_DELIVERY_EXCHANGE]
