"""The commit a build is made from: its time and its id.

A build in a clone takes them from the last commit; deploy/build-copy.sh
builds in a copy that is no git repository and passes them as
SOURCE_DATE_EPOCH (reproducible-builds.org's variable: seconds since the
Unix epoch) and SOURCE_COMMIT.
"""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _last_commit(field):
    return subprocess.run(["git", "log", "-1", f"--format={field}"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def epoch():
    """SOURCE_DATE_EPOCH as given, else the last commit's time, in seconds."""
    return int(os.environ.get("SOURCE_DATE_EPOCH") or _last_commit("%ct"))


def commit():
    """SOURCE_COMMIT as given, else the last commit's id (40 hex digits)."""
    return os.environ.get("SOURCE_COMMIT") or _last_commit("%H")
