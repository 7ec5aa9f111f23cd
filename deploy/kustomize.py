"""Renders the kustomize overlays from the Helm chart: each overlay's
chart.yaml is `helm template` of charts/aws-ebs-csi-driver with the
values.yaml beside it, in kube-system, without the labels only a Helm
release has. One source of truth, as the reference driver keeps its own
overlays: deploy/validate.py fails when a committed rendering differs.

Usage: kustomize.py HELM   (make kustomize: writes every overlay's chart.yaml)
"""

import re
import subprocess
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
OVERLAYS = ["hardened", "standard"]
HEADER = (
    "# Rendered from charts/aws-ebs-csi-driver with the values.yaml beside it by\n"
    "# `make kustomize` (deploy/kustomize.py): change those, not this file.\n"
)
# Labels of a Helm release, which objects applied with kubectl do not have.
RELEASE_LABEL = re.compile(r"^\s*(app\.kubernetes\.io/managed-by: Helm|app\.kubernetes\.io/instance: ebs-csi|helm\.sh/chart: .*)\n",
                           re.MULTILINE)


def arguments(deploy, overlay):
    """helm's arguments that render `overlay` from the chart beside `deploy`:
    `helm template` in kube-system for the chart's oldest Kubernetes."""
    chart = deploy.parent / "charts" / "aws-ebs-csi-driver"
    minimum = re.search(r'kubeVersion: ">=(\d+\.\d+)', (chart / "Chart.yaml").read_text()).group(1)
    values = deploy / "kubernetes" / "overlays" / overlay / "values.yaml"
    return ["template", "ebs-csi", str(chart), "--namespace", "kube-system",
            "--kube-version", f"{minimum}.0", "--values", str(values)]


def chart_yaml(helm_output):
    """The overlay's chart.yaml from helm's output."""
    return HEADER + RELEASE_LABEL.sub("", helm_output)


def main():
    for overlay in OVERLAYS:
        output = subprocess.run([sys.argv[1], *arguments(DEPLOY, overlay)], check=True, capture_output=True, text=True)
        (DEPLOY / "kubernetes" / "overlays" / overlay / "chart.yaml").write_text(chart_yaml(output.stdout))


if __name__ == "__main__":
    main()
