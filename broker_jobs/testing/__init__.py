"""Test helpers for broker_jobs: throwaway RabbitMQ nodes (``rabbit_node``) and
clusters of them (``rabbit_cluster``), a throwaway PostgreSQL (``postgres_node``), what
those share (``throwaway``), and a TCP proxy that cuts the network (``tcp_proxy``)."""
