"""The example receiver as a user's application: the fence it keeps is the signed one, raised in
the same transaction as its write by one worker at a time, whatever the unsigned header says; its
body limit comes before verification; its fence survives a restart (tests/docs runs the command)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import trio

from ingestion.testing.receiver import MAX_BODY, Receiver, serve_receiver
from ingestion.webhook.core import message_id, parse_secrets, sign
from tests.support.deliveries import SECRET, delivery
from tests.support.doc_shell import ROOT

RAISED = 4611686018427387904  # 2**62: what a forger would put in the header


def test_an_altered_fencing_header_neither_blocks_genuine_deliveries_nor_lets_a_stale_one_land() -> None:
    """Issue 46's reproduction: the header is outside the signature. A captured delivery re-sent
    with it raised to 2^62 made the receiver answer 409 to every genuine delivery afterwards; a
    former leader's POST with it raised to the current token was written."""
    receiver = Receiver(SECRET)
    captured = delivery(1, 7)
    assert receiver.accept(*captured)[0] == 204
    headers, body = captured
    assert receiver.accept({**headers, "webhook-fencing-token": str(RAISED)}, body)[0] == 204  # a duplicate
    assert receiver.fence() == 7  # a duplicate never raises the fence
    assert receiver.accept(*delivery(2, 7))[0] == 204  # the genuine leader goes on
    assert receiver.accept(*delivery(3, 8, header=0))[0] == 204  # a lowered header changes nothing
    # a former leader's late POST (token 7 < 8), its header raised to pass: still refused
    assert receiver.accept(*delivery(4, 7, header=8))[0] == 409
    assert receiver.accept(*delivery(5, 7, header=RAISED))[0] == 409
    assert [r["id"] for r in receiver.records()] == ["1", "2", "3"]
    assert (receiver.fence(), receiver.refused_stale, receiver.duplicates) == (8, 2, 1)


def test_each_record_is_taken_once_whatever_batch_it_comes_in() -> None:
    """A record re-sent in another batch (another ``webhook-id``, after a failover cut the batch
    from a longer page) is not written twice: the receiver de-duplicates by each payload's id."""
    receiver = Receiver(SECRET)

    def batch(first: int, last: int, token: int) -> tuple[dict[str, str], bytes]:
        items = [json.loads(delivery(n, token)[1]) for n in range(first, last + 1)]
        msg_id = message_id("ops", str(first), str(last))
        body = json.dumps(items).encode()
        ts = int(time.time())
        return {"webhook-id": msg_id, "webhook-timestamp": str(ts),
                "webhook-signature": sign(parse_secrets(SECRET), msg_id, ts, body)}, body  # fmt: skip

    assert receiver.accept(*batch(1, 5, 3))[0] == 204  # taken, its answer lost, then a failover
    assert receiver.accept(*batch(1, 10, 4))[0] == 204  # the new leader's cut: 1..10
    assert receiver.accept(*batch(1, 10, 4))[0] == 204  # and its retry
    assert [int(r["id"]) for r in receiver.records()] == list(range(1, 11))
    assert (receiver.stored, receiver.duplicates, receiver.regrouped) == (10, 1, 1)
    assert receiver.ids() == ["ops:1:5", "ops:1:10"]


def test_each_source_job_has_a_fence_of_its_own() -> None:
    """Two webhook jobs (of two source jobs) delivering to one endpoint count their tokens apart:
    one fence for both refused every POST of the job whose tokens were lower."""
    receiver = Receiver(SECRET)
    assert receiver.accept(*delivery(1, 40, source_job="payments"))[0] == 204
    assert receiver.accept(*delivery(1, 3, source_job="trades"))[0] == 204
    assert receiver.accept(*delivery(2, 3, source_job="trades"))[0] == 204
    assert receiver.accept(*delivery(2, 39, source_job="payments"))[0] == 409  # still fenced per job
    assert receiver.accept(*delivery(3, 2, source_job="trades"))[0] == 409
    assert receiver.stored == 3 and receiver.fence() == 40


RACER = """
import json, sys, time
from pathlib import Path
from tests.support.deliveries import delivery
from ingestion.testing.receiver import Receiver
path, parity, count, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
receiver = Receiver("{secret}", path)
Path(go.parent / f"ready-{{parity}}").touch()
while not go.exists():
    time.sleep(0.001)
answers = [receiver.accept(*delivery(2 * k + parity, 2 * k + parity))[0] for k in range(1, count + 1)]
print(json.dumps(answers))
"""


def race(path: Path, count: int) -> Iterator[list[int]]:
    """Two worker processes on one database file, each POSTing ``count`` records, worker p with
    tokens 2k + p (k = 1, 2, ...): two leaders whose terms keep overtaking each other."""
    go = path.parent / "go"
    script = RACER.format(secret=SECRET)
    argv = [sys.executable, "-c", script, str(path)]
    procs = [
        subprocess.Popen([*argv, str(p), str(count), str(go)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for p in (0, 1)
    ]
    deadline = time.monotonic() + 60
    while not all((path.parent / f"ready-{p}").exists() for p in (0, 1)):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.01)
    go.touch()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        yield json.loads(out)


def test_two_workers_on_one_database_never_land_a_stale_token_nor_lower_the_fence(tmp_path: Path) -> None:
    """The fence read, the write and the raise are one write-locked transaction: in the order the
    records were written, the tokens never go down, and the fence is the highest written (the
    former code read the fence outside its transaction and stored a max computed in Python)."""
    path = tmp_path / "receiver.sqlite3"
    answers = list(race(path, 1500))
    receiver = Receiver(SECRET, str(path))
    tokens = [t for (t,) in receiver.db.execute("SELECT fencing_token FROM records ORDER BY rowid")]
    went_down = [(a, b) for a, b in itertools.pairwise(tokens) if b < a]
    assert went_down == [], f"{len(went_down)} stale tokens landed after a newer one: {went_down[:5]}"
    assert receiver.fence() == max(tokens)
    taken = sum(a.count(204) for a in answers)
    assert taken == len(tokens) and sum(a.count(409) for a in answers) == 2 * 1500 - taken


async def test_a_body_over_the_limit_is_refused_before_it_is_read_or_verified() -> None:
    receiver = Receiver(SECRET)
    headers, _ = delivery(1, 1)
    too_big = b"x" * (MAX_BODY + 1)

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: the limit cuts the read
        for at in range(0, len(too_big), 65536):
            yield too_big[at : at + 65536]

    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        url = f"http://127.0.0.1:{port}/hook"
        async with httpx.AsyncClient() as client:
            declared = await client.post(url, content=too_big, headers=headers)
        async with httpx.AsyncClient() as client:
            streamed = await client.post(url, content=chunks(), headers=headers)
        nursery.cancel_scope.cancel()
    assert (declared.status_code, streamed.status_code) == (413, 413)
    assert receiver.refused_signature == 0 and receiver.refused_size == 2  # never verified
