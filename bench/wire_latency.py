"""``python -m bench.wire_latency``: where publish-to-start goes, read off the packets.

bench.compare's latency phase, split at the wire: the raw aio-pika consumer and the
``broker-jobs worker`` with a sync and with an async no-op handler (each started as
bench.compare starts it, each fed by its own publisher, one confirmed publish every
1/``--rate`` s, interleaved rounds) while ``tcpdump`` stamps every packet to and from
the broker's port on the loopback. For each job:

- **call > frame**: the publish call to its first packet to the broker (the publisher);
- **frame > deliver**: that packet to the broker's next packet to the consumer (the
  broker: routing, the queue, a quorum queue's log);
- **frame > confirm**: that packet to the broker's next packet to the publisher;
- **deliver > start**: the delivery's packet to the handler's start (the consumer:
  waking, reading the frames, decoding, claiming, a handler thread);
- **call > start**: what bench.compare's latency figure is.

Figures: per round the median over the jobs (µs), then the median over rounds. Needs
``tcpdump`` (Debian's package) and the right to capture (root). A diagnostic: the
capture itself wakes the machine at every packet, which makes wake-ups cheaper than
in bench.compare.

    python -m bench.wire_latency --queue-type quorum --rounds 4
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench.common import (
    Admin,
    add_number,
    bench_parser,
    describe_broker,
    from_args,
    print_config,
    run_bench,
)
from bench.compare import publish_paced
from bench.figures import round_order
from bench.peers.bj import BjLane
from bench.peers.common import Variant, session_pids, wait_for_jobs
from bench.peers.raw import RawLane
from broker_jobs.testing.rabbit_node import RabbitNode

PARTS = ("call > frame", "frame > deliver", "frame > confirm", "deliver > start", "call > start")
KINDS = {
    "raw": Variant("raw aio-pika", "raw"),
    "broker-jobs": Variant("broker-jobs 1x8", "broker-jobs"),
    # no hand-over to a handler thread: the difference to the line above is that hop
    "bj-async": Variant("broker-jobs async", "broker-jobs", pool="async"),
}
WARMUP_SEQ = 1_000_000
_PACKET = re.compile(r"([\d.]+) IP 127\.0\.0\.1\.(\d+) > 127\.0\.0\.1\.(\d+): tcp")


@dataclass(frozen=True)
class Options:
    url: str | None
    rounds: int
    rate: float
    jobs: int
    queue_type: str


@dataclass
class Packets:
    """When the broker heard from the publisher, and wrote to the publisher and to the
    consumer (seconds, the wall clock ``time.time()`` also gives)."""

    published: list[float]
    confirmed: list[float]
    delivered: list[float]

    @staticmethod
    def after(stamps: list[float], moment: float) -> float | None:
        found = bisect.bisect_right(stamps, moment)
        return stamps[found] if found < len(stamps) else None


def local_ports(broker_port: int, pids: set[int]) -> set[int]:
    """The local ports of the connections of ``pids`` to the broker (``ss``)."""
    listed = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( dport = :{broker_port} )"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    ports = set()
    for line in listed.splitlines():
        local = re.search(rf"127\.0\.0\.1:(\d+)\s+127\.0\.0\.1:{broker_port}\b", line)
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if local and owners & pids:
            ports.add(int(local.group(1)))
    return ports


def read_capture(text: str, broker: int, publisher: set[int], consumer: set[int]) -> Packets:
    packets = Packets([], [], [])
    for line in text.splitlines():
        found = _PACKET.match(line)
        if found is None:
            continue
        moment, source, target = float(found[1]), int(found[2]), int(found[3])
        if source in publisher and target == broker:
            packets.published.append(moment)
        elif source == broker and target in publisher:
            packets.confirmed.append(moment)
        elif source == broker and target in consumer:
            packets.delivered.append(moment)
    return packets


def split(sent: dict[int, float], starts: dict[int, float], packets: Packets) -> dict[str, float]:
    """Each part's median over the jobs (µs); a job whose packets were not all seen
    is left out."""
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    for seq, called in sent.items():
        started = starts[seq]
        frame = packets.after(packets.published, called)
        delivered = packets.after(packets.delivered, frame) if frame else None
        confirmed = packets.after(packets.confirmed, frame) if frame else None
        if frame is None or delivered is None or confirmed is None or delivered > started:
            continue
        for part, span in zip(
            PARTS,
            (frame - called, delivered - frame, confirmed - frame, started - delivered,
             started - called),
            strict=True,
        ):  # fmt: skip
            parts[part].append(span)
    return {part: statistics.median(spans) * 1e6 for part, spans in parts.items() if spans}


def one_run(options: Options, url: str, kind: str, workdir: Path) -> dict[str, float]:
    lane = RawLane(url, options.queue_type) if kind == "raw" else BjLane(url, options.queue_type)
    worker = lane.worker(KINDS[kind], workdir)
    reader = worker.start()
    publisher = lane.publisher()
    broker = urlparse(url).port or 5672
    capture = workdir / f"{kind}.packets"
    try:
        publisher.publish(WARMUP_SEQ)  # connected, and the worker consumes
        if not wait_for_jobs(reader, range(WARMUP_SEQ, WARMUP_SEQ + 1), worker, 60):
            raise SystemExit(f"{kind}: the worker took no job within 60 s")
        assert worker.process is not None  # started
        consumer = local_ports(broker, set(session_pids(worker.process.pid)))
        own = local_ports(broker, {os.getpid()})
        with capture.open("w") as output:
            tcpdump = subprocess.Popen(
                ["tcpdump", "-i", "lo", "-nn", "-tt", "-l", "-q",
                 f"tcp port {broker} and (tcp[tcpflags] & tcp-push != 0)"],
                stdout=output, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                time.sleep(0.5)  # capturing
                seqs = range(options.jobs)
                sent = publish_paced(publisher, seqs, options.rate, None)
                if not wait_for_jobs(reader, seqs, worker, 60):
                    raise SystemExit(f"{kind}: {reader.found} of {len(seqs)} jobs started")
            finally:
                tcpdump.send_signal(signal.SIGINT)
                tcpdump.wait(10)
        packets = read_capture(capture.read_text(), broker, own, consumer)
        return split(sent, {seq: reader.starts[seq] for seq in seqs}, packets)
    finally:
        publisher.close()
        worker.stop()
        lane.cleanup()


def bench(options: Options, url: str, node: RabbitNode | None) -> dict[str, Any]:
    with Admin(url) as admin:
        config = describe_broker(url, node, admin)
    config.update(
        rounds=options.rounds, jobs=options.jobs, rate=f"{options.rate:g} jobs/s",
        queue_type=options.queue_type, consumers=", ".join(v.name for v in KINDS.values()),
    )  # fmt: skip
    print_config("Publish-to-start, split at the wire", config, 12)
    found: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="bench-wire-") as workdir:
        for index in range(options.rounds):
            for kind in round_order(list(KINDS), index):
                row = one_run(options, url, kind, Path(workdir))
                found[kind].append(row)
                figures = "  ".join(f"{part} {value:.0f}" for part, value in row.items())
                print(f"round {index + 1} {kind:<12} {figures}")
    medians = {
        kind: {part: statistics.median(row[part] for row in rows) for part in PARTS}
        for kind, rows in found.items()
    }
    print("\nmedians of the rounds (µs):")
    for kind, row in medians.items():
        print(f"  {kind:<12}", "  ".join(f"{part} {value:.0f}" for part, value in row.items()))
    return {"config": config, "median_us": medians}


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = bench_parser("wire_latency", __doc__)
    add_number(parser, "--rounds", int, 4, "rounds (each consumer once per round)")
    add_number(parser, "--rate", float, 200, "jobs/s")
    add_number(parser, "--jobs", int, 1000, "jobs per run")
    parser.add_argument("--queue-type", default="quorum", choices=("classic", "quorum"))
    options = from_args(Options, parser.parse_args(argv))
    if options.rounds < 1 or options.jobs < 1 or options.rate <= 0:
        parser.error("--rounds and --jobs must be at least 1, --rate positive")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    if shutil.which("tcpdump") is None:
        raise SystemExit("tcpdump is not installed: apt-get install tcpdump")
    return run_bench(options, bench)


if __name__ == "__main__":
    sys.exit(main())
