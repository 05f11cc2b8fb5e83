"""Beat: schedules, leader election through RabbitMQ, emission and catch-up.

Empty until the beat issue lands; it will depend on ``broker_jobs`` only.
"""
