"""broker-jobs: a RabbitMQ job system that does not lose, duplicate or silently hold work."""

from broker_jobs.app import App, TaskSpec
from broker_jobs.due import InvalidDelayError
from broker_jobs.envelope import Job, WireMessage, decode, encode
from broker_jobs.errors import (
    AccessRefusedError,
    BrokerConnectionError,
    BrokerJobsError,
    BrokerUnreachableError,
    ConfigurationError,
    ConfirmTimeoutError,
    ConsumerCancelledError,
    DecodeError,
    FollowUpError,
    HandlerStuckError,
    JobError,
    MessageTooLargeError,
    NackedError,
    PayloadEncodingError,
    PayloadValidationError,
    PublishBatchError,
    PublisherBusyError,
    PublishError,
    ReconnectTimeoutError,
    TopologyConflictError,
    TopologyError,
    TopologyMissingError,
    UnknownTaskError,
    UnroutableError,
)
from broker_jobs.job_context import JobContext, follow_up_key
from broker_jobs.publish.async_publisher import AsyncPublisher
from broker_jobs.publish.prepare import JobRequest
from broker_jobs.publish.publisher import Publisher
from broker_jobs.retry import PermanentError, RetryableError, RetryPolicy
from broker_jobs.store.errors import LeaseLostError, StoreError
from broker_jobs.urls import mask_url
from broker_jobs.version import __version__
from broker_jobs.worker import Worker, WorkerSettings
from topology import QueueOptions, QueueType

__all__ = [
    # declaring tasks
    "App",
    "QueueOptions",
    "QueueType",
    "TaskSpec",
    # publishing
    "AsyncPublisher",
    "JobRequest",
    "Publisher",
    # running jobs
    "PermanentError",
    "RetryPolicy",
    "RetryableError",
    "Worker",
    "WorkerSettings",
    # the envelope and its wire form
    "Job",
    "JobContext",
    "follow_up_key",
    "FollowUpError",
    "WireMessage",
    "decode",
    "encode",
    # errors
    "AccessRefusedError",
    "BrokerConnectionError",
    "BrokerJobsError",
    "BrokerUnreachableError",
    "ConfigurationError",
    "ConfirmTimeoutError",
    "ConsumerCancelledError",
    "DecodeError",
    "HandlerStuckError",
    "InvalidDelayError",
    "JobError",
    "LeaseLostError",
    "NackedError",
    "MessageTooLargeError",
    "PayloadEncodingError",
    "PayloadValidationError",
    "PublishBatchError",
    "PublishError",
    "PublisherBusyError",
    "ReconnectTimeoutError",
    "StoreError",
    "TopologyConflictError",
    "TopologyError",
    "TopologyMissingError",
    "UnknownTaskError",
    "UnroutableError",
    # utilities
    "__version__",
    "mask_url",
]
