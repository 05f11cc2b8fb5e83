"""Whole frames read in one step (broker_jobs/worker/frame_reading.py), against the
installed aiormq and asyncio: the frames read are the frames sent, a frame not wholly
read yet waits on aiormq's own path, and a bad one fails as aiormq's path fails it.
`broker-jobs worker` runs its worker inside it (the last test drives the command)."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pamqp.frame
import pytest
from aiormq.connection import FrameReceiver
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from broker_jobs import JobRequest, Publisher
from broker_jobs.worker import frame_reading
from tests.support import Broker, app_from, worker_command
from topology import Topology

BODY = b'{"n":1}'


def delivery(tag: int) -> list[bytes]:
    """The three frames of one delivery on channel 1, marshalled."""
    properties = commands.Basic.Properties(
        content_type="application/json",
        message_id=f"job-{tag}",
        message_type="image.resize",
        headers={"bj-created-at": "2026-12-05T10:00:00.000000Z"},
    )
    deliver = commands.Basic.Deliver("ctag", tag, False, "jobs.work", "image.resize")
    return [
        pamqp.frame.marshal(deliver, 1),
        pamqp.frame.marshal(ContentHeader(0, len(BODY), properties), 1),
        pamqp.frame.marshal(ContentBody(BODY), 1),
    ]


@pytest.fixture
def installed() -> Iterator[None]:
    async def enter() -> None:  # with a running loop, as the worker enters it
        stack.enter_context(frame_reading.reading_whole_frames())

    with contextlib.ExitStack() as stack:
        asyncio.run(enter())
        yield


def test_the_block_takes_effect_on_the_installed_aiormq_and_ends_with_it() -> None:
    aiormq_way = FrameReceiver.get_frame

    async def check() -> None:
        with frame_reading.reading_whole_frames() as installed:
            assert installed
            assert getattr(FrameReceiver.get_frame, "reads_whole_frames", False)
            with frame_reading.reading_whole_frames():  # nested: not wrapped twice
                assert FrameReceiver.get_frame.__wrapped__ is aiormq_way  # type: ignore[attr-defined]
            assert getattr(FrameReceiver.get_frame, "reads_whole_frames", False)

    asyncio.run(check())
    assert FrameReceiver.get_frame is aiormq_way


def test_whole_frames_are_the_frames_sent_in_order(installed: None) -> None:
    sent = delivery(1) + delivery(2)

    async def read() -> list[tuple[int, int, object]]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"".join(sent))
        receiver = FrameReceiver(reader)
        receiver.started = True  # past the connection's first frame
        taken = [frame_reading.whole_frame(receiver) for _ in sent]
        assert frame_reading.whole_frame(receiver) is None  # the buffer is empty
        return [frame for frame in taken if frame is not None]

    read_frames = asyncio.run(read())
    # Each frame read is the frame sent: marshalled again, the same bytes.
    assert [pamqp.frame.marshal(frame, channel) for _, channel, frame in read_frames] == sent
    assert [size for size, _, _ in read_frames] == [len(data) for data in sent]


def counting_reads(reader: asyncio.StreamReader) -> list[int]:
    """The sizes of ``reader.readexactly`` calls from now on (aiormq's path reads so)."""
    calls: list[int] = []
    readexactly = reader.readexactly

    async def counted(n: int) -> bytes:
        calls.append(n)
        return await readexactly(n)

    reader.readexactly = counted  # type: ignore[method-assign]
    return calls


def test_a_delivery_arriving_after_a_quiet_spell_is_read_in_one_step(installed: None) -> None:
    """An idle worker waits with nothing in the buffer: the delivery then arrives
    whole in one read, and each of its frames is read without aiormq's path."""
    sent = delivery(5)

    async def read() -> tuple[list[object], list[int]]:
        reader = asyncio.StreamReader()
        receiver = FrameReceiver(reader)
        receiver.started = True
        reads = counting_reads(reader)
        pending = asyncio.ensure_future(receiver.get_frame())
        await asyncio.sleep(0)
        assert not pending.done()
        reader.feed_data(b"".join(sent))
        frames = [await pending, await receiver.get_frame(), await receiver.get_frame()]
        return frames, reads

    frames, reads = asyncio.run(read())
    assert reads == []
    assert [pamqp.frame.marshal(frame, channel) for _, channel, frame in frames] == sent


def test_a_frame_still_not_wholly_read_waits_on_aiormqs_path(installed: None) -> None:
    frames = delivery(7)
    first = frames[0]

    async def read() -> tuple[object, list[int]]:
        reader = asyncio.StreamReader()
        reader.feed_data(first[:5])
        receiver = FrameReceiver(reader)
        receiver.started = True
        assert frame_reading.whole_frame(receiver) is None
        assert bytes(reader._buffer) == first[:5]  # type: ignore[attr-defined]  # untouched
        reads = counting_reads(reader)
        pending = asyncio.ensure_future(receiver.get_frame())
        await asyncio.sleep(0)
        reader.feed_data(first[5:10])  # more, still not the whole frame
        await asyncio.sleep(0)
        assert not pending.done()
        reader.feed_data(first[10:])
        _, _, frame = await pending
        return frame, reads

    frame, reads = asyncio.run(read())
    assert isinstance(frame, commands.Basic.Deliver)
    assert frame.delivery_tag == 7
    assert reads  # aiormq's path read the rest


@pytest.mark.parametrize("end", ["eof", "error"])
def test_the_end_of_the_stream_while_waiting_is_met_as_aiormqs_path_meets_it(
    installed: None, end: str
) -> None:
    async def read(get_frame: Callable[[FrameReceiver], Any]) -> tuple[type, str]:
        reader = asyncio.StreamReader()
        receiver = FrameReceiver(reader)
        receiver.started = True
        pending = asyncio.ensure_future(get_frame(receiver))
        await asyncio.sleep(0)
        if end == "eof":
            reader.feed_eof()
        else:
            reader.set_exception(ConnectionResetError("reset by peer"))
        try:
            await pending
        except (StopAsyncIteration, AMQPConnectionError) as error:
            return type(error), str(error)
        raise AssertionError("the frame reader did not fail")

    aiormq_way = FrameReceiver.get_frame.__wrapped__  # type: ignore[attr-defined]
    ours = asyncio.run(read(FrameReceiver.get_frame))
    assert ours == asyncio.run(read(aiormq_way))
    assert ours[0] is AMQPConnectionError  # the connection sees its loss


def test_a_bad_frame_end_fails_as_aiormqs_path_fails_it(installed: None) -> None:
    broken = delivery(3)[0][:-1] + b"\x00"

    async def read() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(broken)
        receiver = FrameReceiver(reader)
        receiver.started = True
        assert frame_reading.whole_frame(receiver) is None
        await receiver.get_frame()

    with pytest.raises(InvalidFrameError):
        asyncio.run(read())


def test_the_worker_command_runs_each_job_once_through_it(
    broker: Broker,
    namespace: str,
    tmp_path: Path,
    cleanup_topology: Callable[[Topology], Topology],
) -> None:
    """`broker-jobs worker` (which reads whole frames) drains small jobs and a few
    whose body spans several frames (frame_max is 128 KiB), each run once with its
    payload whole."""
    (tmp_path / "frames_app.py").write_text(
        textwrap.dedent(f"""
            import threading
            from pydantic import BaseModel
            from broker_jobs import App

            class Blob(BaseModel):
                n: int
                blob: str = ""

            app = App(namespace={namespace!r})
            lock = threading.Lock()

            @app.task("frames.blob")
            def blob(payload: Blob) -> None:
                with lock, open({str(tmp_path / "ran.txt")!r}, "a") as ran:
                    ran.write(f"{{payload.n}} {{len(payload.blob)}}\\n")
        """)
    )
    app = app_from(tmp_path, "frames_app")
    cleanup_topology(app.topology())
    large = {n: "x" * 300_000 for n in range(0, 2_000, 400)}
    with Publisher(broker.url, app) as publisher:
        publisher.publish_many(
            [JobRequest("frames.blob", {"n": n, "blob": large.get(n, "")}) for n in range(2_000)]
        )
    done = worker_command(broker, tmp_path, "frames_app:app", "--store", "memory://", "--burst")
    assert done.returncode == 0, done.stderr
    ran = [
        tuple(map(int, line.split()))
        for line in (tmp_path / "ran.txt").read_text().split("\n")
        if line
    ]
    assert sorted(ran) == [(n, len(large.get(n, ""))) for n in range(2_000)]
