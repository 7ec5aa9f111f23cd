"""The EBS direct APIs ListSnapshotBlocks and ListChangedBlocks for EC2's
snapshots, answered from their real contents.

moto's EBS backend lists the blocks only of snapshots made through its own
StartSnapshot/PutSnapshotBlock, with 512-byte blocks; it knows nothing of
the snapshots CreateSnapshot and CreateSnapshots make, and moto's EC2 keeps
no data. The attach simulator (tests/src/attach_sim.rs) does: it copies each
volume's backing file to `<images>/<snapshot id>.img` when the snapshot
appears. serve.py is started with `--snapshot-images <images>` and sends
requests for EC2's snapshots here; those for moto's own EBS snapshots go on
to moto.

As EBS answers (EBS direct APIs reference, ListSnapshotBlocks,
ListChangedBlocks, "Common errors"):
- blocks of 512 KiB (`BlockSize` 524288), ascending by `BlockIndex`, from
  `startingBlockIndex` (or where `pageToken` left off), at most
  `maxResults` (100–10,000, else ValidationException
  INVALID_PARAMETER_VALUE) a page, `NextToken` while more follow;
  `VolumeSize` in GiB;
- a snapshot that does not exist: 404 ResourceNotFoundException
  SNAPSHOT_NOT_FOUND; two snapshots of different volumes: 400
  ValidationException UNRELATED_SNAPSHOTS; errors as restJson1 sends them
  (`x-amzn-ErrorType` header, a JSON body with `Message` and `Reason`).

Where this differs from EBS, and why it does not matter to the tests: a
snapshot's blocks here are those holding a non-zero byte (EBS lists every
block written since the volume was created, zeros too), and the changed
blocks those whose bytes differ (EBS lists every block written between the
snapshots, even with the same bytes); the tests write distinct, non-zero
data.
"""

import base64
import json
import os
import re
import time
import uuid
from urllib.parse import parse_qs

BLOCK_SIZE = 512 * 1024
GIB = 1 << 30
PAGE_SIZES = range(100, 10_001)
PATH = re.compile(r"^/snapshots/(snap-[0-9a-f]+)/(blocks|changedblocks)$")
# How long an answer waits for the attach simulator to copy a snapshot's
# contents (it polls EC2 every 100 ms in the tests).
COPY_SECONDS = 10


class Refusal(Exception):
    def __init__(self, status, error_type, reason, message):
        super().__init__(message)
        self.status, self.error_type, self.reason = status, error_type, reason


def not_found(snapshot_id):
    return Refusal("404 Not Found", "ResourceNotFoundException", "SNAPSHOT_NOT_FOUND",
                   f"The snapshot '{snapshot_id}' does not exist.")


def json_answer(start_response, status, body, headers=()):
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                            ("x-amzn-RequestId", str(uuid.uuid4())), *headers])
    return [data]


def image(images, snapshot_id):
    """The snapshot's contents, once the attach simulator has copied them."""
    path = os.path.join(images, f"{snapshot_id}.img")
    deadline = time.monotonic() + COPY_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise Refusal("500 Internal Server Error", "InternalServerException", None,
                          f"no contents were copied for {snapshot_id} (is the attach simulator running?)")
        time.sleep(0.05)
    return path


def data_blocks(path):
    """The indexes of the blocks a sparse file holds data in (SEEK_DATA,
    SEEK_HOLE), so that a mostly empty 8 GiB image is read in a moment."""
    blocks = set()
    with open(path, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        offset = 0
        while offset < end:
            try:
                start = os.lseek(f.fileno(), offset, os.SEEK_DATA)
            except OSError:
                break
            stop = os.lseek(f.fileno(), start, os.SEEK_HOLE)
            blocks.update(range(start // BLOCK_SIZE, (stop - 1) // BLOCK_SIZE + 1))
            offset = stop
    return blocks


def block(f, index):
    f.seek(index * BLOCK_SIZE)
    return f.read(BLOCK_SIZE).ljust(BLOCK_SIZE, b"\0")


def allocated(path):
    with open(path, "rb") as f:
        return sorted(i for i in data_blocks(path) if block(f, i).strip(b"\0"))


def changed(first, second):
    """(index, whether the first snapshot holds the block, whether the
    second does) of each block whose bytes differ; with no first snapshot,
    the second's blocks."""
    if first is None:
        return [(i, False, True) for i in allocated(second)]
    with open(first, "rb") as a, open(second, "rb") as b:
        pairs = ((i, block(a, i), block(b, i)) for i in sorted(data_blocks(first) | data_blocks(second)))
        return [(i, bool(x.strip(b"\0")), bool(y.strip(b"\0"))) for i, x, y in pairs if x != y]


def token(snapshot_id, index):
    return base64.b64encode(f"{snapshot_id}:{index}".encode()).decode()


def page_of(blocks, query, index_of=lambda b: b):
    """The blocks of one page and the NextToken after them."""
    one = {k: v[0] for k, v in query.items()}
    size = int(one.get("maxResults", PAGE_SIZES[-1]))
    if size not in PAGE_SIZES:
        raise Refusal("400 Bad Request", "ValidationException", "INVALID_PARAMETER_VALUE",
                      f"maxResults {size} is outside 100-10000")
    if "pageToken" in one:
        start = int(base64.b64decode(one["pageToken"]).decode())
    else:
        start = int(one.get("startingBlockIndex", 0))
    remaining = [b for b in blocks if index_of(b) >= start]
    taken = remaining[:size]
    next_token = base64.b64encode(str(index_of(remaining[size])).encode()).decode() if len(remaining) > size else None
    return taken, next_token


def answer(environ, start_response, images, ec2_snapshot, moto_ebs_snapshot):
    """Answers a ListSnapshotBlocks or ListChangedBlocks request for EC2's
    snapshots; None for a request that is not one, or that names one of
    moto's own EBS snapshots (`moto_ebs_snapshot(id)`): moto answers those.
    `ec2_snapshot(id)` is EC2's snapshot of that id as Describe calls see it
    now, or None."""
    match = PATH.match(environ.get("PATH_INFO", ""))
    if not match or environ["REQUEST_METHOD"] != "GET":
        return None
    second_id, action = match.groups()
    query = parse_qs(environ.get("QUERY_STRING", ""))
    first_id = query.get("firstSnapshotId", [None])[0]
    if moto_ebs_snapshot(second_id) or (first_id and moto_ebs_snapshot(first_id)):
        return None
    second = ec2_snapshot(second_id)
    try:
        if second is None:
            raise not_found(second_id)
        first = ec2_snapshot(first_id) if first_id else None
        if first_id and first is None:
            raise not_found(first_id)
        if first and first.volume.id != second.volume.id:
            raise Refusal("400 Bad Request", "ValidationException", "UNRELATED_SNAPSHOTS",
                          f"The snapshots '{first_id}' and '{second_id}' are not related.")
        second_image = image(images, second_id)
        expiry = time.time() + 7 * 24 * 3600
        common = {"VolumeSize": os.path.getsize(second_image) // GIB, "BlockSize": BLOCK_SIZE, "ExpiryTime": expiry}
        if action == "blocks":
            indexes, next_token = page_of(allocated(second_image), query)
            body = {"Blocks": [{"BlockIndex": i, "BlockToken": token(second_id, i)} for i in indexes], **common}
        else:
            first_image = image(images, first_id) if first else None
            blocks, next_token = page_of(changed(first_image, second_image), query, lambda b: b[0])
            body = {"ChangedBlocks": [
                {"BlockIndex": i,
                 # Each token only where that snapshot holds the block.
                 **({"FirstBlockToken": token(first_id, i)} if in_first else {}),
                 **({"SecondBlockToken": token(second_id, i)} if in_second else {})}
                for i, in_first, in_second in blocks], **common}
        if next_token:
            body["NextToken"] = next_token
        return json_answer(start_response, "200 OK", body)
    except Refusal as e:
        body = {"Message": str(e), **({"Reason": e.reason} if e.reason else {})}
        return json_answer(start_response, e.status, body, [("x-amzn-ErrorType", e.error_type)])
