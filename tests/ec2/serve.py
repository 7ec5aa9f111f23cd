"""moto's EC2 server with what moto lacks: CopyVolumes, and EC2's answers
to the situations the controller must survive, each as EC2 gives it.

Usage: serve.py PORT [--seed N] [--lag S] [--create S] [--attach S] [--detach S]
                    [--faults FRACTION] [--snapshot-images DIR] [--zones NAME,...]

Everything is moto (moto[server], PyPI) behind one WSGI middleware, served
by werkzeug as moto_server serves it, with EC2's timing and consistency
(below) put into moto's EBS backend. The middleware:

- answers CopyVolumes (EC2 API Reference, CopyVolumes) by creating the copy
  in moto's EC2 backend in the source's zone with its encryption, tagging it,
  and answering with moto's own rendering of the new volume under
  <CopyVolumesResponse><volumeSet>, the element names of aws-sdk-ec2's
  CopyVolumes deserializer; a ClientToken reused with other parameters is
  IdempotentParameterMismatch, as for every idempotent EC2 action;
- with --snapshot-images, answers the EBS direct APIs ListSnapshotBlocks
  and ListChangedBlocks for EC2's snapshots from the contents the attach
  simulator copied there (ebs_direct.py);
- answers DescribeVolumeStatus (EC2 API Reference), each volume `ok` and
  initialized unless a test said otherwise with POST
  /_initializing/<volume id>?progress=P&seconds=S (DELETE ends it);
- answers EnableFastSnapshotRestores and LockSnapshot (EC2 API Reference),
  keeping their state for DescribeFastSnapshotRestores and
  DescribeLockedSnapshots, element names as aws-sdk-ec2 deserializes them;
- once POST /_request-limits turns them on, keeps EC2's request limits: a
  token bucket per action, full at first and refilled every whole second
  from then, with the capacities and refill rates of the Amazon EC2
  Developer Guide, "Request throttling for the Amazon EC2 API" (BUCKETS
  below); a call that finds its bucket empty is answered 503
  RequestLimitExceeded, and GET /_request-limits answers how many were;
- injects faults armed with POST /_faults/<name>?count=N, each the next N
  calls of its action (all actions for `throttle`), from FAULTS below;
  GET /_faults/<name> answers how many are left to fire.

- with --faults, answers that fraction of EC2 calls (but the tests' own
  set-up calls, SET_UP) with one of CHAOS
  below, chosen by the seed and the request (its body and how many times
  the same body came before), so a run with the same seed meets the same
  faults at the same calls;
- GET /_history answers, as JSON, every volume and snapshot EC2 calls
  made, each with its tags and whether it was deleted, and every
  attachment there is: what a chaos run checks its invariants against;
  and how long each volume was `creating` and `attaching`: what make
  bench's P9 sets the driver's time beside;
- makes CreateVolume idempotent by its ClientToken, as EC2 does (EC2 API
  Reference, CreateVolume, ClientToken; "Ensuring idempotency"): a repeat
  with the same parameters answers the volume the first call made, one
  with other parameters IdempotentParameterMismatch (moto ignores tokens);
- refuses AttachVolume of a volume in another zone than the instance's
  with EC2's InvalidVolume.ZoneMismatch (moto attaches it);
- with --zones, answers DescribeAvailabilityZones with those zones of the
  region only, as an account sees the zones enabled for it (Amazon EC2
  User Guide, "Regions and Zones": zones are mapped and offered per
  account): a world of one node in one zone, where every volume placed
  without a topology requirement can attach to that node.

EC2 error responses have the shape of the EC2 API Reference, "Error
responses": <Response><Errors><Error><Code/><Message/></Error></Errors>
<RequestID/></Response>.

Timing and consistency, on by default (moto changes state at once and is
always consistent; DESIGN.md §10), each time a nominal one (the options,
in seconds) times a factor drawn from 0.5-1.5 by a generator seeded with
--seed, printed at start:

- CreateVolume and CopyVolumes answer the volume `creating` (EC2 API
  Reference, CreateVolume, example response), `available` after --create;
- the EC2 API is eventually consistent (Amazon EC2 Developer Guide,
  "Eventual consistency in the Amazon EC2 API"): a new volume or snapshot
  stays out of Describe calls for --lag (asked by id, EC2 answers
  InvalidVolume.NotFound / InvalidSnapshot.NotFound; a filter leaves it
  out), and other calls naming it answer NotFound the same while; a
  deleted volume is still described, `deleting`, for --lag; a new
  attachment is left out of DescribeVolumes for --lag, and after CreateTags
  or DeleteTags a resource is described with its earlier tags for --lag;
- AttachVolume answers `attaching` (EC2 API Reference, AttachVolume); the
  attachment is `attaching` for --attach, then `attached`; DetachVolume
  answers `detaching`, and the attachment stays, `detaching`, for
  --detach (EC2 API Reference, DetachVolume; VolumeAttachment states).

--lag 0 --create 0 --attach 0 --detach 0 is moto's own behaviour.
"""

import argparse
import copy
import hashlib
import json
import random
import socket

import datetime
import io
import os
import re
import sys
import threading
import time
import uuid
from urllib.parse import parse_qs

import ebs_direct
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ebs.models import ebs_backends
from moto.ec2.exceptions import EC2ClientError, InvalidSnapshotIdError, InvalidVolumeIdError, VolumeInUseError
from moto.ec2.models import ec2_backends
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.models.elastic_block_store import EBSBackend, Volume
from moto.ec2.models.tags import TagBackend
from moto.ec2.utils import generic_filter
from moto.moto_api import recorder
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

# name: (action or None for every action, HTTP status, code, message); an
# action with "+DryRun" matches only its DryRun=true requests.
FAULTS = {
    # Request throttling for the Amazon EC2 API: beyond the bucket EC2
    # answers 503 RequestLimitExceeded (EC2 API Reference, "Error codes";
    # the SDK retries it as a throttling error).
    "throttle": (None, 503, "RequestLimitExceeded", "Request limit exceeded."),
    # The same, for AttachVolume alone (a mutating call).
    "throttle-attach": ("AttachVolume", 503, "RequestLimitExceeded", "Request limit exceeded."),
    # DetachVolume of a volume that is no longer attached: the message EC2
    # sends, as captured in kubernetes-sigs/aws-ebs-csi-driver#1801.
    "detach-available": ("DetachVolume", 400, "IncorrectState", "Volume '{VolumeId}' is in the 'available' state."),
    # A dry-run CreateVolume asking more IOPS than the zone allows: EC2
    # names the maximum (the message kubernetes-sigs/aws-ebs-csi-driver
    # pkg/cloud/cloud.go quotes for its nonIo2ErrRegex). 16,000 is gp3's
    # maximum before EC2 raised it to 80,000, still the Go driver's
    # gp3FallbackMaxIOPS: a zone that has not caught up.
    "iops-maximum": ("CreateVolume+DryRun", 400, "InvalidParameterValue", "Volume iops of {Iops} is too high; maximum is 16000"),
    # A ClientToken reused with other parameters (EC2 API Reference, "Error
    # codes", IdempotentParameterMismatch).
    "token-mismatch": (
        "CreateVolume",
        400,
        "IdempotentParameterMismatch",
        "The request uses the same client token as a previous, but non-identical request.",
    ),
}

# What --faults answers with, each as likely: (name, HTTP status, EC2 code,
# message) or a way of answering. EC2 API Reference, "Error codes":
# InternalError (500) "An internal error has occurred", Unavailable (503)
# "The server is overloaded and can't handle the request",
# RequestLimitExceeded (503); and what a network does: an answer seconds
# late, a connection dropped before the call reached EC2, and one dropped
# after EC2 did what it asked (the answer lost).
CHAOS = (
    ("internal", 500, "InternalError", "An internal error has occurred."),
    ("unavailable", 503, "Unavailable", "The server is overloaded and can't handle the request."),
    ("throttle", 503, "RequestLimitExceeded", "Request limit exceeded."),
    ("slow", None, None, None),
    ("drop-before", None, None, None),
    ("drop-after", None, None, None),
)

# Request throttling for the Amazon EC2 API, tables "Request token bucket
# sizes and refill rates" and "Uncategorized actions": (capacity, refill
# per second). Uncategorized actions the controller sends:
BUCKETS = {
    "CreateVolume": (100, 5),
    "DeleteVolume": (100, 5),
    "CreateSnapshot": (100, 5),
    "DeleteSnapshot": (100, 5),
    "CreateTags": (100, 10),
    "DeleteTags": (100, 10),
}
# Describe*, Get*, List*, Search*: "non-mutating actions" ...
NON_MUTATING = (100, 20)
# ... except these when asked without a filter or pagination.
UNFILTERED = (50, 10)
UNFILTERED_ACTIONS = {
    "DescribeInstances",
    "DescribeInstanceStatus",
    "DescribeNetworkInterfaces",
    "DescribeSecurityGroups",
    "DescribeSnapshots",
    "DescribeSpotInstanceRequests",
    "DescribeVolumes",
}
# Every other action: "mutating actions".
MUTATING = (50, 5)
# While on: when they were turned on, each bucket (by action and kind) as
# (tokens, whole seconds refilled), and how many calls were throttled.
limits = None

armed = {}
copies = {}
# (snapshot id, zone): the time fast snapshot restore was enabled.
fast_restores = {}
# snapshot id: the LockSnapshot parameters.
locks = {}
# volume id: (percent done, seconds left) while a test says it initializes.
initializing = {}
lock = threading.Lock()


class Timeline:
    """When each volume's and snapshot's state changes come and what
    Describe calls show until then (the module's "Timing and consistency").
    Times are time.monotonic() seconds."""

    def __init__(self, seed, lag, create, attach, detach):
        self.rng = random.Random(seed)
        self.lag, self.create, self.attach, self.detach = lag, create, attach, detach
        self.lock = threading.RLock()
        # volume or snapshot id: when Describe calls start to show it.
        self.visible_at = {}
        # volume id: when `creating` ends.
        self.available_at = {}
        # volume id: (its attachment, when `attaching` ends / `detaching` does).
        self.attaching = {}
        self.detaching = {}
        # volume id: (the deleted volume, until when it is described `deleting`).
        self.deleted = {}
        # volume id: until when its new attachment is left out.
        self.attachment_hidden = {}
        # volume id: {"creating": s, "attaching": s}, how long its state
        # changes took (the last attachment's), for GET /_history.
        self.state_seconds = {}
        # resource id: (its earlier tags, until when they are described).
        self.earlier_tags = {}
        # Per request thread: `on` while serve.py renders a volume for an
        # answer of its own; `action`, the EC2 action being served (moto
        # makes volumes of its own, an instance's root volume at
        # RunInstances, which are there at once).
        self.revealing = threading.local()
        self.serving = threading.local()

    def after(self, nominal):
        with self.lock:
            return time.monotonic() + nominal * (0.5 + self.rng.random())

    def state_change(self, volume_id, state, nominal):
        """When the volume's `state` ends (after), kept for GET /_history."""
        at = self.after(nominal)
        with self.lock:
            self.state_seconds.setdefault(volume_id, {})[state] = at - time.monotonic()
        return at

    def hidden(self, resource_id):
        if getattr(self.revealing, "on", False):
            return False
        return time.monotonic() < self.visible_at.get(resource_id, 0)

    def settle(self):
        """Moves the attachments whose time has come."""
        now = time.monotonic()
        with self.lock:
            for volume_id, (attachment, at) in list(self.attaching.items()):
                if now >= at:
                    attachment.status = "attached"
                    del self.attaching[volume_id]
            for volume_id, (attachment, at) in list(self.detaching.items()):
                if now >= at:
                    if attachment.volume.attachment is attachment:
                        attachment.volume.attachment = None
                    del self.detaching[volume_id]
            for volume_id, (_, until) in list(self.deleted.items()):
                if now >= until:
                    del self.deleted[volume_id]

    def status(self, volume):
        if volume.id in self.deleted:
            return "deleting"
        if time.monotonic() < self.available_at.get(volume.id, 0):
            return "creating"
        return "in-use" if volume.attachment else "available"


timeline = None
BACKEND = {name: getattr(EBSBackend, name) for name in (
    "create_volume", "get_volume", "describe_volumes", "delete_volume", "attach_volume", "detach_volume",
    "create_snapshot", "create_snapshots", "get_snapshot", "describe_snapshots", "delete_snapshot",
    "modify_volume",
)}


def incorrect_state(volume_id, state):
    # EC2 API Reference, "Error codes": IncorrectState, with the message of
    # kubernetes-sigs/aws-ebs-csi-driver#1801.
    return EC2ClientError("IncorrectState", f"Volume '{volume_id}' is in the '{state}' state.")


# gp3's throughput range in MiB/s, its IOPS when none are asked (EC2 API
# Reference, CreateVolume: Throughput "Valid Range: Minimum value of 125.
# Maximum value of 2000"; Iops, gp3 "3,000") and its most throughput per
# provisioned IOPS (Amazon EBS User Guide, "General Purpose SSD volumes").
GP3_THROUGHPUT = (125, 2000)
GP3_BASELINE_IOPS = 3000
GP3_THROUGHPUT_PER_IOPS = 0.25


def throughput_refusal(volume_type, iops, throughput):
    """EC2's refusal of `throughput` on a `volume_type` volume of `iops`, as
    controller/src/ec2/model.rs gives it, with the same sources: the
    messages quoted in runs-on/runs-on#426 (another type than gp3),
    gardener/gardener-extension-provider-aws#590 ("Volume throughput o…",
    in the form of EC2's IOPS message) and runs-on/runs-on#260 (the ratio)."""
    if not throughput:
        return None
    throughput, iops = int(throughput), int(iops or GP3_BASELINE_IOPS)
    if volume_type != "gp3":
        return EC2ClientError("InvalidParameterCombination", "throughput can only be specified for volumeType gp3.")
    low, high = GP3_THROUGHPUT
    if throughput < low:
        return EC2ClientError("InvalidParameterValue", f"Volume throughput of {throughput} is too low; minimum is {low}")
    if throughput > high:
        return EC2ClientError("InvalidParameterValue", f"Volume throughput of {throughput} is too high; maximum is {high}")
    ratio = throughput / iops
    if ratio > GP3_THROUGHPUT_PER_IOPS:
        return EC2ClientError(
            "InvalidParameterValue",
            f"Throughput (MiBps) to iops ratio of {ratio:.6f} is too high; "
            f"maximum is {GP3_THROUGHPUT_PER_IOPS:.6f} MiBps per iops",
        )
    return None


def create_volume(self, size, zone_name, *args, **kwargs):
    refusal = throughput_refusal(kwargs.get("volume_type"), kwargs.get("iops"), kwargs.get("throughput"))
    if refusal:
        raise refusal
    volume = BACKEND["create_volume"](self, size, zone_name, *args, **kwargs)
    if getattr(timeline.serving, "action", None) not in ("CreateVolume", "CopyVolumes"):
        return volume
    with timeline.lock:
        history["volumes"][volume.id] = volume
        timeline.visible_at[volume.id] = timeline.after(timeline.lag)
        timeline.available_at[volume.id] = timeline.state_change(volume.id, "creating", timeline.create)
    return volume


def modify_volume(self, volume_id, target_size=None, target_volume_type=None, target_iops=None,
                  target_throughput=None, *args, **kwargs):
    # EC2 judges the volume the modification would leave: its throughput
    # kept where its type is.
    volume = self.get_volume(volume_id)
    kept = volume.throughput if not target_volume_type else None
    refusal = throughput_refusal(target_volume_type or volume.volume_type, target_iops or volume.iops,
                                 target_throughput or kept)
    if refusal:
        raise refusal
    return BACKEND["modify_volume"](self, volume_id, target_size, target_volume_type, target_iops,
                                    target_throughput, *args, **kwargs)


def get_volume(self, volume_id):
    timeline.settle()
    if timeline.hidden(volume_id):
        raise InvalidVolumeIdError(volume_id)
    return BACKEND["get_volume"](self, volume_id)


def describe_volumes(self, volume_ids=None, filters=None):
    timeline.settle()
    hidden = [i for i in volume_ids or [] if timeline.hidden(i)]
    if hidden:
        raise InvalidVolumeIdError(hidden[0])
    with timeline.lock:
        deleted = [v for i, (v, _) in timeline.deleted.items() if not volume_ids or i in volume_ids]
    live_ids = [i for i in volume_ids or [] if i not in timeline.deleted]
    live = [] if volume_ids and not live_ids else BACKEND["describe_volumes"](self, live_ids, filters)
    deleted = generic_filter(filters, deleted) if filters else deleted
    return [without_new_attachment(v) for v in live if not timeline.hidden(v.id)] + deleted


def without_new_attachment(volume):
    """The volume as Describe calls show it: one attached less than --lag
    ago still without its attachment (a copy; moto's object stays whole)."""
    if volume.attachment is None or time.monotonic() >= timeline.attachment_hidden.get(volume.id, 0):
        return volume
    if getattr(timeline.revealing, "on", False):
        return volume
    shown = copy.copy(volume)
    shown.attachment = None
    return shown


def delete_volume(self, volume_id):
    volume = get_volume(self, volume_id)
    if volume.attachment:
        raise VolumeInUseError(volume_id, volume.attachment.instance.id)
    tags = resource_tags(volume)
    volume = BACKEND["delete_volume"](self, volume_id)
    with timeline.lock:
        history["deleted"][volume_id] = tags
        timeline.deleted[volume_id] = (volume, timeline.after(timeline.lag))
    return volume


def attach_volume(self, volume_id, instance_id, device_path, delete_on_termination=False):
    volume = get_volume(self, volume_id)
    if timeline.status(volume) == "creating":
        raise incorrect_state(volume_id, "creating")
    if volume.attachment:
        # EC2 API Reference, "Error codes": VolumeInUse.
        raise EC2ClientError("VolumeInUse", f"{volume_id} is already attached to an instance")
    instance = self.get_instance(instance_id)
    if volume.zone.name != instance.availability_zone:
        # EC2 API Reference, "Error codes": InvalidVolume.ZoneMismatch, "The
        # specified volume and instance are in different Availability Zones",
        # with the message EC2 gives (kubernetes-sigs/aws-ebs-csi-driver#52).
        raise EC2ClientError(
            "InvalidVolume.ZoneMismatch",
            f"The volume '{volume_id}' is not in the same availability zone as instance '{instance_id}'",
        )
    attachment = BACKEND["attach_volume"](self, volume_id, instance_id, device_path, delete_on_termination)
    attachment.status = "attaching"
    with timeline.lock:
        timeline.attaching[volume_id] = (attachment, timeline.state_change(volume_id, "attaching", timeline.attach))
        timeline.attachment_hidden[volume_id] = timeline.after(timeline.lag)
    return attachment


def detach_volume(self, volume_id, instance_id, device_path):
    volume = get_volume(self, volume_id)
    if volume.attachment and volume.attachment.status == "detaching":
        raise incorrect_state(volume_id, "in-use")
    attachment = BACKEND["detach_volume"](self, volume_id, instance_id, device_path)
    attachment.status = "detaching"
    volume.attachment = attachment
    with timeline.lock:
        timeline.attaching.pop(volume_id, None)
        timeline.detaching[volume_id] = (attachment, timeline.after(timeline.detach))
    return attachment


def create_snapshot(self, volume_id, *args, **kwargs):
    snapshot = BACKEND["create_snapshot"](self, volume_id, *args, **kwargs)
    if getattr(timeline.serving, "action", None) not in ("CreateSnapshot", "CreateSnapshots"):
        return snapshot
    with timeline.lock:
        history["snapshots"][snapshot.id] = snapshot
        timeline.visible_at[snapshot.id] = timeline.after(timeline.lag)
    return snapshot


def create_snapshots(self, instance_spec, description, tags):
    """CreateSnapshots leaves out the instance's ExcludeDataVolumeIds (EC2
    API Reference, CreateSnapshots, InstanceSpecification), which moto
    snapshots too: what moto makes of them is deleted before the answer."""
    excluded = instance_spec.get("ExcludeDataVolumeId") or instance_spec.get("ExcludeDataVolumeIds") or []
    if isinstance(excluded, dict):
        excluded = list(excluded.values())
    made = BACKEND["create_snapshots"](self, instance_spec, description, tags)
    kept = [s for s in made if s.volume.id not in excluded]
    for snapshot in made:
        if snapshot not in kept:
            BACKEND["delete_snapshot"](self, snapshot.id)
            with timeline.lock:
                history["snapshots"].pop(snapshot.id, None)
    return kept


def get_snapshot(self, snapshot_id):
    if timeline.hidden(snapshot_id):
        raise InvalidSnapshotIdError()
    return BACKEND["get_snapshot"](self, snapshot_id)


def describe_snapshots(self, snapshot_ids=None, filters=None):
    if any(timeline.hidden(i) for i in snapshot_ids or []):
        raise InvalidSnapshotIdError()
    return [s for s in BACKEND["describe_snapshots"](self, snapshot_ids, filters) if not timeline.hidden(s.id)]


def delete_snapshot(self, snapshot_id):
    tags = resource_tags(get_snapshot(self, snapshot_id))
    snapshot = BACKEND["delete_snapshot"](self, snapshot_id)
    with timeline.lock:
        history["deleted"][snapshot_id] = tags
    return snapshot


def resource_tags(resource):
    return {t["key"]: t["value"] for t in resource.get_tags()}


# Every volume and snapshot EC2 calls made (moto's objects), those deleted
# since with the tags they had, and how many EC2 calls came.
history = {"volumes": {}, "snapshots": {}, "deleted": {}, "calls": 0}


def history_json():
    """GET /_history: {"volumes": [{"id", "tags", "deleted", "attachment",
    "state_seconds": {"creating", "attaching"}}], "snapshots": [{"id",
    "volume_id", "tags", "deleted"}], "calls": N}; state_seconds, how long
    the volume was `creating` and its last attachment `attaching`."""
    def tags(resource):
        return history["deleted"].get(resource.id) or resource_tags(resource)

    with timeline.lock:
        volumes = [
            {
                "id": i,
                "tags": tags(v),
                "deleted": i in history["deleted"],
                "attachment": v.attachment.instance.id if v.attachment else None,
                "state_seconds": timeline.state_seconds.get(i, {}),
            }
            for i, v in history["volumes"].items()
        ]
        snapshots = [
            {"id": i, "volume_id": s.volume.id, "tags": tags(s), "deleted": i in history["deleted"]}
            for i, s in history["snapshots"].items()
        ]
    return json.dumps({"volumes": volumes, "snapshots": snapshots, "calls": history["calls"]}).encode()


TAGS = {"create_tags": TagBackend.create_tags, "delete_tags": TagBackend.delete_tags, "get_tags": TaggedEC2Resource.get_tags}


def changing_tags(name):
    def change(self, resource_ids, tags):
        if getattr(timeline.serving, "action", None) in ("CreateTags", "DeleteTags"):
            now = time.monotonic()
            with timeline.lock:
                for resource_id in resource_ids:
                    earlier = timeline.earlier_tags.get(resource_id)
                    if earlier is None or now >= earlier[1]:
                        shown = self.describe_tags(filters={"resource-id": [resource_id]})
                        timeline.earlier_tags[resource_id] = (shown, timeline.after(timeline.lag))
        return TAGS[name](self, resource_ids, tags)
    return change


def get_tags(self):
    earlier = timeline.earlier_tags.get(self.id)
    if earlier and time.monotonic() < earlier[1] and not getattr(timeline.revealing, "on", False):
        return earlier[0]
    return TAGS["get_tags"](self)


def offer_only(zone_names):
    """DescribeAvailabilityZones answers only the zones `zone_names`."""
    describe = RegionsAndZonesBackend.describe_availability_zones

    def offered(self, *args, **kwargs):
        return [z for z in describe(self, *args, **kwargs) if z.name in zone_names]

    RegionsAndZonesBackend.describe_availability_zones = offered


def keep_time(seed, lag, create, attach, detach):
    """Puts EC2's timing and consistency into moto's EBS backend."""
    global timeline
    timeline = Timeline(seed, lag, create, attach, detach)
    for name in BACKEND:
        setattr(EBSBackend, name, globals()[name])
    Volume.status = property(timeline.status)
    TagBackend.create_tags = changing_tags("create_tags")
    TagBackend.delete_tags = changing_tags("delete_tags")
    TaggedEC2Resource.get_tags = get_tags


def error(start_response, status, code, message):
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()
    start_response(f"{status} {'Service Unavailable' if status == 503 else 'Bad Request'}",
                   [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


def region_of(environ):
    match = re.search(r"Credential=[^/]+/[^/]+/([^/]+)/(?:ec2|ebs)/", environ.get("HTTP_AUTHORIZATION", ""))
    return match.group(1) if match else "us-east-1"


def tags_of(params):
    tags = {}
    for key, values in params.items():
        match = re.fullmatch(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.Key", key)
        if match:
            value = params.get(f"TagSpecification.{match.group(1)}.Tag.{match.group(2)}.Value", [""])[0]
            tags[values[0]] = value
    return tags


def copy_volumes(app, environ, start_response, params):
    one = {k: v[0] for k, v in params.items()}
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region_of(environ)]
    token = one.get("ClientToken")
    request = {k: v for k, v in one.items() if k != "ClientToken"}
    with lock:
        if token in copies and copies[token][0] != request:
            return error(start_response, *FAULTS["token-mismatch"][1:])
        if token in copies:
            volume_id = copies[token][1]
        else:
            source = backend.get_volume(one["SourceVolumeId"])
            try:
                volume = backend.create_volume(
                    size=int(one.get("Size", source.size)),
                    zone_name=source.zone.name,
                    encrypted=source.encrypted,
                    kms_key_id=source.kms_key_id if source.encrypted else None,
                    volume_type=one.get("VolumeType", source.volume_type),
                    iops=int(one["Iops"]) if "Iops" in one else None,
                    throughput=int(one["Throughput"]) if "Throughput" in one else None,
                    multi_attach_enabled=one.get("MultiAttachEnabled") == "true",
                )
            except EC2ClientError as refused:
                return error(start_response, 400, refused.code, refused.message)
            backend.create_tags([volume.id], tags_of(params))
            volume_id = volume.id
            if token:
                copies[token] = (request, volume_id)
    # moto's own rendering of the volume, under CopyVolumes' root element.
    describe = f"Action=DescribeVolumes&Version=2016-11-15&VolumeId.1={volume_id}".encode()
    status, body = call(app, environ, describe, reveal=True)
    body = body.replace(b"DescribeVolumesResponse", b"CopyVolumesResponse")
    start_response(status, [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


def call(app, environ, body, reveal=False):
    """moto's (status, body) for the request `body`; with `reveal`, as if
    every resource were visible already."""
    inner = dict(environ, **{"wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))})
    captured = {}
    timeline.revealing.on = reveal
    try:
        answer = b"".join(app(inner, lambda status, headers, *_: captured.update(status=status)))
    finally:
        timeline.revealing.on = False
    return captured["status"], answer


# ClientToken: (the request without it, the first answer's body).
volume_tokens = {}
tokens_lock = threading.Lock()


def create_volume_once(app, environ, start_response, params, body):
    """CreateVolume with EC2's idempotency: a repeated ClientToken answers
    the first call's volume (in its state now), or
    IdempotentParameterMismatch if the parameters differ."""
    one = {k: v[0] for k, v in params.items()}
    token = one.pop("ClientToken")
    with tokens_lock:
        earlier = volume_tokens.get(token)
        if earlier and earlier[0] != one:
            return error(start_response, *FAULTS["token-mismatch"][1:])
        if earlier:
            recorder._record_request(Served(environ), body)
            status, answer = "200 OK", earlier[1]
            volume_id = xml_value(answer, "volumeId")
            backend = ec2_backends[DEFAULT_ACCOUNT_ID][region_of(environ)]
            volume = backend.volumes.get(volume_id)
            if volume is not None:
                state = timeline.status(volume).encode()
                answer = re.sub(rb"<status>[a-z-]+</status>", b"<status>" + state + b"</status>", answer, count=1)
        else:
            status, answer = call(app, environ, body)
            if status.startswith("200"):
                volume_tokens[token] = (one, answer)
    start_response(status, [("Content-Type", "text/xml"), ("Content-Length", str(len(answer)))])
    return [answer]


def xml_value(body, tag):
    match = re.search(rb"<%s>([^<]*)</%s>" % (tag.encode(), tag.encode()), body)
    return match.group(1).decode() if match else None


ANSWERED_HERE = (
    "CopyVolumes",
    "DescribeVolumeStatus",
    "EnableFastSnapshotRestores",
    "DescribeFastSnapshotRestores",
    "LockSnapshot",
    "DescribeLockedSnapshots",
)


def targets(target, action, params):
    if target is None:
        return True
    name, _, dry_run = target.partition("+")
    return name == action and (not dry_run or params.get("DryRun") == ["true"])


class Served:
    """The parts of a request moto's recorder reads (moto_api/_internal/
    recorder/models.py), so that the actions answered here are in
    /moto-api/recorder's log like moto's own."""

    def __init__(self, environ):
        self.method = environ["REQUEST_METHOD"]
        self.raw_path = environ.get("PATH_INFO", "/")
        self.raw_url = f"http://{environ.get('HTTP_HOST', 'localhost')}{self.raw_path}"
        self.headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}


def respond(start_response, action, inner):
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId>{inner}</{action}Response>"
    ).encode()
    start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


def snapshot_exists(environ, snapshot_id):
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region_of(environ)]
    return snapshot_id in backend.snapshots and not timeline.hidden(snapshot_id)


def fast_restore_item(snapshot_id, zone, since):
    return (
        f"<item><snapshotId>{snapshot_id}</snapshotId><availabilityZone>{zone}</availabilityZone>"
        f"<state>enabling</state><stateTransitionReason>Client.UserInitiated</stateTransitionReason>"
        f"<ownerId>{DEFAULT_ACCOUNT_ID}</ownerId><enablingTime>{since}</enablingTime></item>"
    )


def enable_fast_snapshot_restores(environ, start_response, params):
    """EnableFastSnapshotRestores (EC2 API Reference): each snapshot and zone
    lands in `successful` (state `enabling`) or, for a snapshot that does not
    exist, in `unsuccessful` with InvalidSnapshot.NotFound."""
    zones = [v[0] for k, v in sorted(params.items()) if k.startswith("AvailabilityZone.")]
    snapshots = [v[0] for k, v in sorted(params.items()) if k.startswith("SourceSnapshotId.")]
    successful, unsuccessful = "", ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    for snapshot_id in snapshots:
        if not snapshot_exists(environ, snapshot_id):
            errors = "".join(
                f"<item><availabilityZone>{zone}</availabilityZone><error><code>InvalidSnapshot.NotFound</code>"
                f"<message>The snapshot '{snapshot_id}' does not exist.</message></error></item>"
                for zone in zones
            )
            unsuccessful += (
                f"<item><snapshotId>{snapshot_id}</snapshotId>"
                f"<fastSnapshotRestoreStateErrorSet>{errors}</fastSnapshotRestoreStateErrorSet></item>"
            )
            continue
        for zone in zones:
            with lock:
                since = fast_restores.setdefault((snapshot_id, zone), now)
            successful += fast_restore_item(snapshot_id, zone, since)
    inner = f"<successful>{successful}</successful><unsuccessful>{unsuccessful}</unsuccessful>"
    return respond(start_response, "EnableFastSnapshotRestores", inner)


def describe_fast_snapshot_restores(start_response):
    with lock:
        items = "".join(fast_restore_item(s, z, t) for (s, z), t in fast_restores.items())
    return respond(start_response, "DescribeFastSnapshotRestores", f"<fastSnapshotRestoreSet>{items}</fastSnapshotRestoreSet>")


def locked_item(snapshot_id, one):
    mode = one["LockMode"]
    state = "compliance-cooloff" if mode == "compliance" and "CoolOffPeriod" in one else mode
    fields = {"lockDuration": "LockDuration", "coolOffPeriod": "CoolOffPeriod", "lockExpiresOn": "ExpirationDate"}
    extra = "".join(f"<{tag}>{one[key]}</{tag}>" for tag, key in fields.items() if key in one)
    return f"<snapshotId>{snapshot_id}</snapshotId><lockState>{state}</lockState>{extra}"


def lock_snapshot(environ, start_response, params):
    """LockSnapshot (EC2 API Reference): the lock's state, `compliance-cooloff`
    while a compliance lock's cooling-off period runs."""
    one = {k: v[0] for k, v in params.items()}
    snapshot_id = one["SnapshotId"]
    if not snapshot_exists(environ, snapshot_id):
        return error(start_response, 400, "InvalidSnapshot.NotFound", f"The snapshot '{snapshot_id}' does not exist.")
    with lock:
        locks[snapshot_id] = one
    return respond(start_response, "LockSnapshot", locked_item(snapshot_id, one))


def describe_locked_snapshots(start_response):
    with lock:
        items = "".join(f"<item>{locked_item(s, one)}</item>" for s, one in locks.items())
    return respond(start_response, "DescribeLockedSnapshots", f"<snapshotSet>{items}</snapshotSet>")


def describe_volume_status(environ, start_response, params):
    """DescribeVolumeStatus (EC2 API Reference; moto does not implement it):
    each volume `ok` with io-enabled passed, io-performance not-applicable,
    and initialization-state completed (progress 100) or, while a test
    says so, initializing with InitializationStatusDetails; a volume that
    does not exist is InvalidVolume.NotFound."""
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region_of(environ)]
    ids = [v[0] for k, v in sorted(params.items()) if k.startswith("VolumeId.")] or list(backend.volumes)
    items = ""
    for volume_id in ids:
        if volume_id not in backend.volumes or timeline.hidden(volume_id):
            return error(start_response, 400, "InvalidVolume.NotFound", f"The volume '{volume_id}' does not exist.")
        with lock:
            progress, seconds = initializing.get(volume_id, (100, 0))
        state = "completed" if progress == 100 else "initializing"
        items += (
            f"<item><volumeId>{volume_id}</volumeId>"
            f"<availabilityZone>{backend.volumes[volume_id].zone.name}</availabilityZone>"
            "<volumeStatus><status>ok</status><details>"
            "<item><name>io-enabled</name><status>passed</status></item>"
            "<item><name>io-performance</name><status>not-applicable</status></item>"
            f"<item><name>initialization-state</name><status>{state}</status></item>"
            "</details></volumeStatus><eventsSet/><actionsSet/>"
            "<initializationStatusDetails><initializationType>provisioned-rate</initializationType>"
            f"<progress>{progress}</progress><estimatedTimeToCompleteInSeconds>{seconds}"
            "</estimatedTimeToCompleteInSeconds></initializationStatusDetails></item>"
        )
    return respond(start_response, "DescribeVolumeStatus", f"<volumeStatusSet>{items}</volumeStatusSet>")


def bucket_of(action, params):
    if action in BUCKETS:
        return BUCKETS[action]
    if action.startswith(("Describe", "Get", "List", "Search")):
        filtered = any(k.startswith("Filter.") or k in ("MaxResults", "NextToken") for k in params)
        return UNFILTERED if action in UNFILTERED_ACTIONS and not filtered else NON_MUTATING
    return MUTATING


def within_limits(action, params):
    """Takes a token of the action's bucket, if there is one."""
    bucket = bucket_of(action, params)
    capacity, refill = bucket
    # An unfiltered Describe call draws on a bucket of its own.
    key = (action, bucket)
    seconds = int(time.monotonic() - limits["since"])
    tokens, refilled = limits["buckets"].get(key, (capacity, 0))
    tokens = min(capacity, tokens + (seconds - refilled) * refill)
    taken = tokens >= 1
    limits["buckets"][key] = (tokens - 1 if taken else tokens, seconds)
    if not taken:
        limits["throttled"] += 1
    return taken


def middleware(app):
    def serve(environ, start_response):
        global limits
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_faults/") and environ["REQUEST_METHOD"] == "GET":
            left = str(armed.get(path.removeprefix("/_faults/"), 0)).encode()
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(left)))])
            return [left]
        if path.startswith("/_faults/") and environ["REQUEST_METHOD"] == "POST":
            name = path.removeprefix("/_faults/")
            count = int(parse_qs(environ.get("QUERY_STRING", "")).get("count", ["1"])[0])
            if name not in FAULTS:
                return error(start_response, 400, "UnknownFault", name)
            with lock:
                armed[name] = count
            start_response("204 No Content", [])
            return []
        if path == "/_history":
            body = history_json()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if path == "/_request-limits":
            with lock:
                if environ["REQUEST_METHOD"] == "POST":
                    limits = {"since": time.monotonic(), "buckets": {}, "throttled": 0}
                throttled = str(limits["throttled"] if limits else 0).encode()
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(throttled)))])
            return [throttled]
        if path.startswith("/_initializing/"):
            volume_id = path.removeprefix("/_initializing/")
            query = parse_qs(environ.get("QUERY_STRING", ""))
            with lock:
                if environ["REQUEST_METHOD"] == "DELETE":
                    initializing.pop(volume_id, None)
                else:
                    initializing[volume_id] = (int(query["progress"][0]), int(query["seconds"][0]))
            start_response("204 No Content", [])
            return []
        if snapshot_images:
            answered = ebs_direct.answer(environ, start_response, snapshot_images,
                                         *snapshot_lookups(environ))
            if answered is not None:
                return answered
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(body)
        params = parse_qs(body.decode(errors="replace"))
        action = params.get("Action", [""])[0]
        with lock:
            for name, (target, status, code, message) in FAULTS.items():
                if armed.get(name) and targets(target, action, params):
                    armed[name] -= 1
                    recorder._record_request(Served(environ), body)
                    fields = {k: v[0] for k, v in params.items()}
                    return error(start_response, status, code, message.format(**fields))
            if limits and action and not within_limits(action, params):
                return error(start_response, *FAULTS["throttle"][1:])
            fault = chaos.draw(body) if action and action not in SET_UP else None
            history["calls"] += bool(action)
        if fault == "drop-after":
            b"".join(action_answer(app, environ, lambda *_: None, action, params, body))
        if fault in ("drop-before", "drop-after"):
            return drop(environ)
        if fault == "slow":
            time.sleep(chaos.slow_seconds(body))
        elif fault:
            return error(start_response, *fault)
        return action_answer(app, environ, start_response, action, params, body)

    return serve


def action_answer(app, environ, start_response, action, params, body):
    """Serves an EC2 action: here, or by moto."""
    # The backend of the request's account and Region is made (and moto's
    # own AMIs with their volumes) before the action is served.
    account = environ.get("HTTP_X_MOTO_ACCOUNT_ID", DEFAULT_ACCOUNT_ID)
    ec2_backends[account][region_of(environ)]
    timeline.serving.action = action
    if action in ANSWERED_HERE:
        recorder._record_request(Served(environ), body)
    if action == "CopyVolumes":
        return copy_volumes(app, environ, start_response, params)
    if action == "CreateVolume" and params.get("ClientToken") and params.get("DryRun") != ["true"]:
        return create_volume_once(app, environ, start_response, params, body)
    if action == "EnableFastSnapshotRestores":
        return enable_fast_snapshot_restores(environ, start_response, params)
    if action == "DescribeFastSnapshotRestores":
        return describe_fast_snapshot_restores(start_response)
    if action == "DescribeVolumeStatus":
        return describe_volume_status(environ, start_response, params)
    if action == "LockSnapshot":
        return lock_snapshot(environ, start_response, params)
    if action == "DescribeLockedSnapshots":
        return describe_locked_snapshots(start_response)
    return app(environ, start_response)


# --snapshot-images: where the attach simulator copies snapshot contents.
snapshot_images = None


def snapshot_lookups(environ):
    """For ebs_direct.answer: EC2's snapshot of an id as Describe calls see
    it now (None while EC2 does not list it), and whether an id is one of
    moto's own EBS snapshots (StartSnapshot)."""
    region = region_of(environ)
    ec2 = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    ebs = ebs_backends[DEFAULT_ACCOUNT_ID][region]
    return (lambda i: None if timeline.hidden(i) else ec2.snapshots.get(i)), (lambda i: i in ebs.snapshots)


class Chaos:
    """--faults: which calls meet which fault (CHAOS), decided by the seed
    and the request alone."""

    def __init__(self, seed, fraction):
        self.seed, self.fraction = seed, fraction
        self.seen = {}

    def rng(self, body, salt):
        """A generator for the request `body`, the how-many-th time it came."""
        digest = hashlib.sha256(body).hexdigest()
        return digest, random.Random(f"{self.seed}:{digest}:{self.seen.get(digest, 0)}:{salt}")

    def draw(self, body):
        """The fault for this request (None for most); call once per request."""
        digest, rng = self.rng(body, "draw")
        self.seen[digest] = self.seen.get(digest, 0) + 1
        if rng.random() >= self.fraction:
            return None
        name, *answer = rng.choice(CHAOS)
        return tuple(answer) if answer[0] else name

    def slow_seconds(self, body):
        return 0.5 + 2.5 * self.rng(body, "slow")[1].random()


chaos = Chaos(0, 0.0)

# The tests' own calls that make what exists before the driver runs (the
# node's instance): never answered with a fault by --faults, so that no
# seed fails a run in its set-up (the driver never calls them).
SET_UP = frozenset({"RunInstances"})


def drop(environ):
    """Closes the connection without an answer, as a network that drops it."""
    connection = environ.get("werkzeug.socket")
    if connection is not None:
        connection.shutdown(socket.SHUT_RDWR)
        connection.close()
    raise ConnectionAbortedError("dropped by --faults")


def main():
    parser = argparse.ArgumentParser(description="moto's EC2 with EC2's timing and consistency")
    parser.add_argument("port", type=int)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (the real cluster's node address for its pods)")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(2**32))
    parser.add_argument("--lag", type=float, default=0.5, help="seconds a new resource stays out of Describe calls")
    parser.add_argument("--create", type=float, default=0.5, help="seconds a volume is `creating`")
    parser.add_argument("--attach", type=float, default=0.5, help="seconds an attachment is `attaching`")
    parser.add_argument("--detach", type=float, default=0.5, help="seconds an attachment is `detaching`")
    parser.add_argument("--faults", type=float, default=0.0, help="fraction of EC2 calls answered with a fault")
    parser.add_argument("--snapshot-images", help="where the attach simulator copies snapshot contents")
    parser.add_argument("--zones", help="the only zones DescribeAvailabilityZones answers (comma-separated names)")
    args = parser.parse_args()
    if args.zones:
        offer_only(args.zones.split(","))
    global chaos, snapshot_images
    snapshot_images = args.snapshot_images
    chaos = Chaos(args.seed, args.faults)
    print(f"serve.py: seed {args.seed}", file=sys.stderr, flush=True)
    keep_time(args.seed, args.lag, args.create, args.attach, args.detach)
    # moto's default AMIs, off: they come with about 1,300 snapshots and
    # 1,000 volumes of moto's own, which every DescribeSnapshots and
    # DescribeVolumes walked and rendered (0.7 s of CPU for each
    # DescribeSnapshots, which the attach simulator asks ten times a second:
    # one core busy all through a test). No test needs an AMI: RunInstances
    # takes any image id (moto checks none unless MOTO_ENABLE_AMI_VALIDATION
    # is set) and gives the instance its root volume all the same. moto
    # reads it when it makes a region's EC2 backend, at its first call.
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, middleware(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
