"""Writes instance-types.tsv: the EBS attachment facts of every EC2 instance type.

Source: EC2's DescribeInstanceTypes answers (EbsInfo.MaximumEbsAttachments,
EbsInfo.AttachmentLimitType, Hypervisor) as moto ships them, captured from
the real API in moto/ec2/resources/instance_types.json.gz, with the two
corrections below, each with its source. Refresh with a newer moto:

    .venv/bin/python agent/data/generate.py > agent/data/instance-types.tsv
"""

import gzip
import json
from importlib import metadata, resources

# Types DescribeInstanceTypes lists that moto's capture lacks, as the Go
# driver's table generated from the real API holds them
# (kubernetes-sigs/aws-ebs-csi-driver pkg/cloud/limits/volume_limits_table.go
# at 1a42de62): G4ad (AMD GPUs, Nitro).
MISSING = {
    "g4ad.xlarge": {"Hypervisor": "nitro", "EbsInfo": {"AttachmentLimitType": "shared", "MaximumEbsAttachments": 25}},
    "g4ad.2xlarge": {"Hypervisor": "nitro", "EbsInfo": {"AttachmentLimitType": "shared", "MaximumEbsAttachments": 25}},
    "g4ad.4xlarge": {"Hypervisor": "nitro", "EbsInfo": {"AttachmentLimitType": "shared", "MaximumEbsAttachments": 25}},
    "g4ad.8xlarge": {"Hypervisor": "nitro", "EbsInfo": {"AttachmentLimitType": "shared", "MaximumEbsAttachments": 24}},
    "g4ad.16xlarge": {"Hypervisor": "nitro", "EbsInfo": {"AttachmentLimitType": "shared", "MaximumEbsAttachments": 21}},
}

# Bare-metal types DescribeInstanceTypes calls shared whose EBS limit is
# dedicated: the Go driver's `dedicatedInstances`, "where the API
# incorrectly returns shared" (kubernetes-sigs/aws-ebs-csi-driver
# pkg/cloud/limits/volume_limits.go), 48 types at v1.64.0: the first 15 here
# since 03352d57, the 33 of the 8th and 9th generations after them as
# ../shared/reviews/parity-go-driver.md (row 10.10) compared them type by
# type. The EC2 User Guide, "Amazon EBS volume limits", lists these
# families with a dedicated limit. r9g and r9gd `.metal-48xl`, which Go
# does not list, keep the API's answer.
DEDICATED = {
    "c8a.metal-48xl", "c8gb.metal-24xl", "c8gn.metal-24xl", "i7i.metal-24xl", "i7i.metal-48xl",
    "i7ie.metal-24xl", "i7ie.metal-48xl", "i8ge.metal-24xl", "i8ge.metal-48xl", "m8a.metal-48xl",
    "r8a.metal-48xl", "r8gb.metal-24xl", "r8gn.metal-24xl", "x8i.metal-48xl", "x8i.metal-96xl",
    # The 8th generation's Intel types with local disks, faster networks
    # or EBS bandwidth (d, n, b), and Graviton's m8gb and m8gn.
    "c8ib.metal-48xl", "c8ib.metal-96xl", "c8id.metal-48xl", "c8id.metal-96xl",
    "c8in.metal-48xl", "c8in.metal-96xl", "m8gb.metal-24xl", "m8gn.metal-24xl",
    "m8ib.metal-48xl", "m8ib.metal-96xl", "m8id.metal-48xl", "m8id.metal-96xl",
    "m8idb.metal-48xl", "m8idb.metal-96xl", "m8idn.metal-48xl", "m8idn.metal-96xl",
    "m8in.metal-48xl", "m8in.metal-96xl", "r8ib.metal-48xl", "r8ib.metal-96xl",
    "r8id.metal-48xl", "r8id.metal-96xl", "r8idb.metal-48xl", "r8idb.metal-96xl",
    "r8idn.metal-48xl", "r8idn.metal-96xl", "r8in.metal-48xl", "r8in.metal-96xl",
    # Graviton's i8g and the 9th generation.
    "i8g.metal-48xl", "c9g.metal-48xl", "c9gd.metal-48xl", "m9g.metal-48xl", "m9gd.metal-48xl",
}


def main() -> None:
    path = resources.files("moto.ec2") / "resources" / "instance_types.json.gz"
    with gzip.open(path) as f:
        types = json.load(f)
    assert not MISSING.keys() & types.keys(), "moto has these now: drop them from MISSING"
    types.update(MISSING)
    print("# EBS attachment facts per EC2 instance type, from DescribeInstanceTypes")
    print(f"# as captured in moto {metadata.version('moto')} (moto/ec2/resources/instance_types.json.gz),")
    print(f"# with {len(MISSING)} types moto lacks and {len(DEDICATED)} metal types made dedicated (sources in")
    print("# agent/data/generate.py, which generated this). Columns: instance type, hypervisor")
    print("# (nitro, xen, or metal for bare metal), EbsInfo.AttachmentLimitType,")
    print("# EbsInfo.MaximumEbsAttachments.")
    for name in sorted(types):
        info = types[name]
        ebs = info["EbsInfo"]
        if "MaximumEbsAttachments" not in ebs:
            continue
        hypervisor = info.get("Hypervisor") or "metal"
        kind = "dedicated" if name in DEDICATED else ebs["AttachmentLimitType"]
        print(f"{name}\t{hypervisor}\t{kind}\t{ebs['MaximumEbsAttachments']}")


if __name__ == "__main__":
    main()
