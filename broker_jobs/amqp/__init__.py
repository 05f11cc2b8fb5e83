"""Talking to RabbitMQ, for every client of the package: ``connecting`` to the first
node of a broker that answers, ``declaring`` a topology with its errors translated,
``frame_layout``: the bytes of the frames the publisher and the worker read or write
themselves."""
