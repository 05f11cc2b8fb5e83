"""Test helpers for broker_jobs (e.g. throwaway RabbitMQ nodes)."""
