"""Writes EBS performance statistics log pages (NVMe log page 0xD0, 4096
bytes) as hex, for agent/src/statistics_tests.rs.

No page captured from a real EBS volume is at hand, so these are laid out
independently of the Rust parser, with Python's struct module, from
`struct amzn_latency_log_page` in nvme-cli's amzn plugin
(plugins/amzn/amzn-nvme.c): `__u32 magic; __u32 version;` eleven `__u64`
counters, `__u8 reserved1[416]`, then two `struct amzn_latency_histogram`
(`__u64 num_bins;` 64 × `{__u64 lower; __u64 upper; __u32 count; __u32
reserved;}`), all `__packed`, little endian; the rest of the 4096 bytes is
left as a device leaves it (here 0xEE, to catch reads past the layout).

Usage: python3 generate.py (rewrites the .hex files beside it).
"""

import struct
from pathlib import Path

MAGIC = 0x3C23B510
PAGE = 4096


def histogram(bins):
    body = struct.pack("<Q", len(bins))
    for lower, upper, count in bins:
        body += struct.pack("<QQII", lower, upper, count, 0)
    return body + bytes(24 * (64 - len(bins)))


def page(version, counters, read_bins, write_bins, magic=MAGIC):
    data = struct.pack("<II11Q", magic, version, *counters) + bytes(416)
    data += histogram(read_bins) + histogram(write_bins)
    return data + b"\xee" * (PAGE - len(data))


# A gp3 volume after a mixed fio run: latency bins as powers of two in
# microseconds, as `nvme amzn stats` prints them.
BUSY = page(
    0,
    [
        1_234_567,        # total_read_ops
        765_432,          # total_write_ops
        5_056_790_528,    # total_read_bytes
        3_135_209_472,    # total_write_bytes
        987_654_321,      # total_read_time (µs)
        456_789_012,      # total_write_time (µs)
        12_500_000,       # ebs_volume_performance_exceeded_iops (µs)
        3_000_000,        # ebs_volume_performance_exceeded_tp (µs)
        250_000,          # ec2_instance_ebs_performance_exceeded_iops (µs)
        0,                # ec2_instance_ebs_performance_exceeded_tp (µs)
        7,                # volume_queue_length
    ],
    [(0, 128, 1000), (128, 256, 200_000), (256, 512, 900_000), (512, 1024, 130_000), (1024, 2048, 4567)],
    [(0, 256, 500_000), (256, 512, 250_000), (512, 1024, 15_432)],
)

# A newer page version (nvme-cli's later `amzn_latency_log_page_base` names
# the second word `version`), on an idle volume: no bins yet.
IDLE_V1 = page(1, [0] * 11, [], [])

# Not EBS's page: another vendor's 0xD0.
FOREIGN = page(0, [1] * 11, [], [], magic=0x12345678)


def main():
    here = Path(__file__).parent
    pages = {"busy": BUSY, "idle-v1": IDLE_V1, "foreign": FOREIGN}
    for name, data in pages.items():
        assert len(data) == PAGE, name
        (here / f"{name}.hex").write_text(data.hex() + "\n")


if __name__ == "__main__":
    main()
