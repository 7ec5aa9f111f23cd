"""Checks the deployment artefacts under deploy/ against the schemas and
against each other, and every flag they pass against the binaries.

Usage: validate.py BIN_DIR [--self-test]
  BIN_DIR      the directory holding the three built binaries (their
               --help lists the flags they accept)
  --self-test  instead, break copies of the files in each way checked
               below and fail unless every break is reported

Kubernetes: each overlay's chart.yaml must be the chart's rendering with
its values.yaml (deploy/kustomize.py); each overlay is rendered with
`kubectl kustomize` and every
object is checked with kubernetes-validate --strict against the oldest
Kubernetes docs/install-kubernetes.md says is supported ("Kubernetes ≥
X.Y") and the newest (NEWEST_KUBERNETES); kinds it has no schema for (the snapshot CRDs) are
checked field by field here. Then: the agent container is unprivileged,
the helper container is the only privileged one, the helper admits
the agent's uid and group, and the controller's sidecars apply
VolumeAttributesClasses of storage.k8s.io/v1 and wait long enough for an attach and a Probe.
The Helm chart (charts/aws-ebs-csi-driver, rendered by the helm that
`make go-tools` builds, $HELM): `helm lint --strict`, then its defaults and
each values file under its ci/ rendered with `helm template` and checked as
the overlays are, against every Kubernetes minor from the oldest supported
to the newest; a key it does not take, or a value of the reference chart
it does not do, is refused with the key's name.
IAM: the base policy and the migration policy allow exactly what each
promises on volumes of every origin. Nomad: every .hcl parses (python-hcl2), plugin
ids and types agree across the jobs and the volume, and the helper's
systemd drop-in allows the node plugin's directory. Prints one line per
failure and exits 1 if there was any.
"""

import fnmatch
import functools
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import hcl2
import kubernetes_validate
import yaml

import kustomize
from hcl2.utils import SerializationOptions

NEWEST_KUBERNETES = "1.37"
# PyYAML's binding of libyaml where the wheel has it (ten times faster).
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DEPLOY = Path(__file__).resolve().parent


@functools.cache
def kubernetes_versions(deploy):
    """The oldest supported Kubernetes, as the install guide beside `deploy`
    states it, and the newest: every object must be valid in both (a field
    newer than the stated minimum, such as CSIDriver's
    nodeAllocatableUpdatePeriodSeconds of 1.33, is refused by older API
    servers' client-side validation). Read once per tree."""
    guide = (deploy.parent / "docs" / "install-kubernetes.md").read_text()
    match = re.search(r"Kubernetes ≥ (\d+\.\d+)", guide)
    if not match:
        fail("docs/install-kubernetes.md", "states no minimum Kubernetes version (\"Kubernetes ≥ X.Y\")")
        return [NEWEST_KUBERNETES]
    return [match.group(1), NEWEST_KUBERNETES]
# Where the controller calls AWS (each call observed under its action
# name), and the IAM prefix of those actions: EC2, and the EBS direct APIs.
CONTROLLER_CALLS = {
    DEPLOY.parent / "controller" / "src" / "ec2" / "sdk.rs": "ec2",
    DEPLOY.parent / "controller" / "src" / "snapshot_metadata" / "blocks.rs": "ebs",
}
OVERLAYS = kustomize.OVERLAYS
AGENT_UID = 990
AGENT_CONTAINER = "ebs-plugin"
HELPER_CONTAINER = "ebs-csi-helper"
DRIVER = "ebs.csi.aws.com"
NODE_ACCOUNT = "ebs-csi-node-sa"
NOBODY = 65534
HELPER_LABEL = "ebs.csi.aws.com/helper"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

failures = []


def fail(where, message):
    failures.append(f"{where}: {message}")


def accepted_flags(bin_dir, binary, *subcommand):
    """The long flags `binary [subcommand] --help` lists."""
    help_text = subprocess.run(
        [str(bin_dir / binary), *subcommand, "--help"], check=True, capture_output=True, text=True
    ).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))


def check_args(where, flags, args):
    """Every `--flag` or `--flag=value` in args is a flag the binary accepts."""
    for arg in args:
        if arg.startswith("--") and arg.split("=", 1)[0] not in flags:
            fail(where, f"{arg} is not a flag of the binary")


def flag_value(args, flag):
    """The value of `--flag=value` or `--flag value` in args, or None."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


# Kubernetes -----------------------------------------------------------


def check_snapshot_class(where, obj):
    allowed = {"apiVersion", "kind", "metadata", "driver", "deletionPolicy", "parameters"}
    for key in set(obj) - allowed:
        fail(where, f"unknown field {key}")
    if obj.get("driver") != DRIVER:
        fail(where, f"driver is {obj.get('driver')!r}, not {DRIVER}")
    if obj.get("deletionPolicy") not in ("Delete", "Retain"):
        fail(where, "deletionPolicy must be Delete or Retain")


def check_snapshot_metadata_service(where, obj):
    """The SnapshotMetadataService (cbt.storage.k8s.io/v1beta1, the
    external-snapshot-metadata sidecar's CRD): named after the driver, as
    the sidecar looks it up, with its three fields set."""
    if obj.get("apiVersion") != "cbt.storage.k8s.io/v1beta1":
        fail(where, f"apiVersion {obj.get('apiVersion')} is not cbt.storage.k8s.io/v1beta1")
    if obj["metadata"].get("name") != DRIVER:
        fail(where, f"is not named {DRIVER}: the sidecar looks it up by the driver's name")
    spec = obj.get("spec", {})
    for key in set(spec) ^ {"address", "caCert", "audience"}:
        fail(where, f"spec.{key}: {'unknown field' if key in spec else 'missing'}")
    for key in ("address", "caCert", "audience"):
        if key in spec and not spec[key]:
            fail(where, f"spec.{key} is empty")


# The metrics Services' ports, by the name a ServiceMonitor selects them by.
METRICS_PORTS = {"ebs-csi-controller": 3301, "ebs-csi-node": 3302}


def check_service_monitor(where, obj):
    """A ServiceMonitor (monitoring.coreos.com/v1, the Prometheus
    Operator's CRD): it selects the metrics Service of its own name, in its
    namespace, and scrapes /metrics on that Service's port."""
    if obj.get("apiVersion") != "monitoring.coreos.com/v1":
        fail(where, f"apiVersion {obj.get('apiVersion')} is not monitoring.coreos.com/v1")
    name, spec = obj["metadata"]["name"], obj.get("spec", {})
    for key in set(spec) - {"selector", "namespaceSelector", "endpoints"}:
        fail(where, f"spec.{key}: unknown field")
    if spec.get("selector", {}).get("matchLabels") != {"app": name} or name not in METRICS_PORTS:
        fail(where, f"does not select the metrics Service {name}")
    if spec.get("namespaceSelector", {}).get("matchNames") != [obj["metadata"].get("namespace")]:
        fail(where, "does not select its own namespace")
    for endpoint in spec.get("endpoints") or [None]:
        if not endpoint or endpoint.get("targetPort") != METRICS_PORTS.get(name) or endpoint.get("path") != "/metrics":
            fail(where, f"does not scrape /metrics on port {METRICS_PORTS.get(name)}: {endpoint}")


def validate_schema(where, obj, versions=None):
    """Checks `obj` against the schema of each of `versions` (by default
    the oldest supported Kubernetes and the newest)."""
    if obj.get("apiVersion", "").startswith("snapshot.storage.k8s.io/"):
        check_snapshot_class(where, obj)
        return
    if obj.get("kind") == "SnapshotMetadataService":
        check_snapshot_metadata_service(where, obj)
        return
    if obj.get("kind") == "ServiceMonitor":
        check_service_monitor(where, obj)
        return
    for version in versions or kubernetes_versions(DEPLOY):
        problem = schema_problem(json.dumps(obj, sort_keys=True), version)
        if problem:
            fail(where, f"Kubernetes {version}: {problem}")


@functools.cache
def schema_problem(obj_json, version):
    """What kubernetes-validate --strict finds wrong with the object (given
    as JSON) in Kubernetes `version`, or None. Asked once per object and
    version: kubernetes-validate reads the schema's files again at every
    call, and the self-test checks the same objects once per break."""
    try:
        kubernetes_validate.validate(json.loads(obj_json), version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{'.'.join(map(str, e.path))}: {e.message}"
    except kubernetes_validate.utils.SchemaNotFoundError as e:
        return f"no schema: {e}"
    return None


def containers(pod_spec):
    return pod_spec.get("initContainers", []) + pod_spec.get("containers", [])


def is_privileged(container):
    context = container.get("securityContext", {})
    caps = context.get("capabilities", {})
    return context.get("privileged", False) or "SYS_ADMIN" in caps.get("add", []) or "ALL" in caps.get("add", [])


def check_agent(where, pod_spec, agent):
    context = {**pod_spec.get("securityContext", {}), **agent.get("securityContext", {})}
    expected = {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": AGENT_UID,
        "runAsGroup": AGENT_UID,
    }
    for key, value in expected.items():
        if context.get(key) != value:
            fail(where, f"agent securityContext.{key} is {context.get(key)!r}, not {value!r}")
    caps = context.get("capabilities", {})
    if caps.get("drop") != ["ALL"] or caps.get("add"):
        fail(where, "the agent must drop all capabilities and add none")
    if any(m.get("mountPropagation") == "Bidirectional" for m in agent.get("volumeMounts", [])):
        fail(where, "the agent must not have Bidirectional mount propagation")
    if any(e["name"].startswith("AWS_") for e in agent.get("env", [])):
        fail(where, "the agent must have no AWS settings or credentials")
    if pod_spec.get("automountServiceAccountToken") is not False:
        fail(where, "the node pod must not automount a Kubernetes token")
    env = {e["name"]: e for e in agent.get("env", [])}
    if env.get("CSI_NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
        fail(where, "the agent's CSI_NODE_NAME must come from spec.nodeName")
    hook = agent.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if hook[:2] != ["/usr/bin/ebs-csi-agent", "pre-stop"]:
        fail(where, "the agent's preStop hook must run ebs-csi-agent pre-stop (a drain waits for the detaches)")


def check_termination_message(where, pod_spec, container):
    """kubelet's termination message file (terminationMessagePath, default
    /dev/termination-log) is bind-mounted where the runtime first makes a
    file: never in a directory of the host's, where a read-only mount
    fails the container's start on a node that lacks the file, and a
    writable one leaves it on the host."""
    path = container.get("terminationMessagePath", "/dev/termination-log")
    host = {v["name"] for v in pod_spec.get("volumes", []) if "hostPath" in v}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in host and path.startswith(mount["mountPath"].rstrip("/") + "/"):
            fail(where, f"its termination message {path} is made in the host's {mount['mountPath']}")


def check_tracing(where, container):
    """The OpenTelemetry variables (the chart's otelTracing) go with
    --enable-otel-tracing=true, which needs the collector's endpoint."""
    traced = "--enable-otel-tracing=true" in container.get("args", [])
    otel = {e["name"] for e in container.get("env", []) if e["name"].startswith("OTEL_")}
    if otel and not traced:
        fail(where, f"sets {', '.join(sorted(otel))} without --enable-otel-tracing=true")
    if traced and "OTEL_EXPORTER_OTLP_ENDPOINT" not in otel:
        fail(where, "--enable-otel-tracing=true without OTEL_EXPORTER_OTLP_ENDPOINT")


def token_volumes(pod_spec):
    """Names of the pod's volumes that project a service account token."""
    return {
        v["name"]
        for v in pod_spec.get("volumes", [])
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    }


def check_node_token(where, pod_spec):
    """Only the agent mounts a token, where in-cluster clients look for it."""
    tokens = token_volumes(pod_spec)
    agent_mounts = [m for c in containers(pod_spec) if c["name"] == AGENT_CONTAINER for m in c.get("volumeMounts", [])]
    if not any(m["name"] in tokens for m in agent_mounts):
        fail(where, "the agent mounts no token for the kubernetes metadata source")
    for container in containers(pod_spec):
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in tokens:
                continue
            if container["name"] != AGENT_CONTAINER:
                fail(where, f"{container['name']} mounts a Kubernetes token")
            elif mount["mountPath"] != SERVICE_ACCOUNT_DIR:
                fail(where, f"the agent's token is at {mount['mountPath']}, not {SERVICE_ACCOUNT_DIR}")


# What the node's service account may do: get Nodes (the `kubernetes`
# metadata source) and patch them (the startup taint), and list
# VolumeAttachments (the pre-stop step).
NODE_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments"], "verbs": ["list"]},
]


# The same without the Node patch (the chart's
# node.serviceAccount.disableMutation).
NODE_RULES_READ_ONLY = [{**NODE_RULES[0], "verbs": ["get"]}, NODE_RULES[1]]


def check_node_rbac(where, objects, rules=NODE_RULES):
    """The node's service account may do `rules` and nothing else."""
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    granted = []
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if any(s.get("name") == NODE_ACCOUNT for s in binding.get("subjects", [])):
            granted += roles.get(binding["roleRef"]["name"], {}).get("rules", [])
    if granted != rules:
        fail(where, f"{NODE_ACCOUNT} must be allowed {rules} and nothing else, not {granted}")


def check_helper(where, pod_spec, agent, helper):
    """The containerised helper admits the agent's uid and group, and they
    share the socket."""
    args = helper.get("args", [])
    if flag_value(args, "--allowed-uid") != str(AGENT_UID) or flag_value(args, "--socket-group") != str(AGENT_UID):
        fail(where, f"the helper must allow uid and group {AGENT_UID}")
    helper_socket = flag_value(args, "--socket")
    if helper_socket != flag_value(agent.get("args", []), "--helper-socket"):
        fail(where, "the agent's --helper-socket is not the helper's --socket")
    if not any(m.get("mountPropagation") == "Bidirectional" for m in helper.get("volumeMounts", [])):
        fail(where, "the helper's kubelet directory needs Bidirectional propagation")
    if pod_spec.get("hostPID") is not True:
        fail(where, "the helper needs the node's PID namespace (hostPID: true) to read the node's mount table")


def requires_helper_label(pod_spec):
    """Whether the pod is scheduled only on nodes labelled as having the
    host's helper installed (by its nodeSelector or its node affinity)."""
    if pod_spec.get("nodeSelector", {}).get(HELPER_LABEL) == "installed":
        return True
    terms = (
        pod_spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    wanted = {"key": HELPER_LABEL, "operator": "In", "values": ["installed"]}
    return bool(terms) and all(wanted in term.get("matchExpressions", []) for term in terms)


def check_node(where, daemonset, helper_in_pod):
    pod_spec = daemonset["spec"]["template"]["spec"]
    if not helper_in_pod and not requires_helper_label(pod_spec):
        fail(where, f"the DaemonSet must require the node label {HELPER_LABEL}=installed (the host's helper)")
    by_name = {c["name"]: c for c in containers(pod_spec)}
    agent = by_name.get(AGENT_CONTAINER)
    if agent is None:
        return fail(where, f"no {AGENT_CONTAINER} container")
    check_agent(where, pod_spec, agent)
    socket_dir = str(Path(flag_value(agent.get("args", []), "--helper-socket") or "/").parent)
    if not any(m["mountPath"] == socket_dir for m in agent.get("volumeMounts", [])):
        fail(where, f"the agent does not mount the helper's socket directory {socket_dir}")
    helper = by_name.get(HELPER_CONTAINER)
    if helper_in_pod != (helper is not None):
        fail(where, f"a helper container is {'missing' if helper_in_pod else 'present'}")
    if helper is not None:
        check_helper(where, pod_spec, agent, helper)


# ControllerPublishVolume waits this long for `attached` before it detaches
# a stuck attachment (controller/src/service/mod.rs, Settings::attach_timeout).
ATTACH_WAIT_SECONDS = 90


def seconds(duration):
    """Seconds in a Go duration such as `90s`, `6m` or `1m30s`, or None."""
    parts = re.fullmatch(r"((\d+)h)?((\d+)m)?((\d+)s)?", duration or "")
    if not parts or not duration:
        return None
    hours, minutes, secs = (int(parts.group(i) or 0) for i in (2, 4, 6))
    return hours * 3600 + minutes * 60 + secs


# The first major versions of csi-provisioner and csi-resizer whose
# VolumeAttributesClass is storage.k8s.io/v1's, found by discovery, with the
# gate on by default (pkg/features/features.go at v6.3.0 and v2.2.0). The
# majors before watched only v1beta1, which Kubernetes 1.34 and later do not
# serve: a claim's class change was never applied (tests/tests/kube/claims.rs).
VAC_V1_MAJORS = {"csi-provisioner": 6, "csi-resizer": 2}


def check_controller(where, deployment):
    """Sidecar settings the controller's behaviour needs."""
    by_name = {c["name"]: c for c in containers(deployment["spec"]["template"]["spec"])}
    for sidecar, first in VAC_V1_MAJORS.items():
        container = by_name.get(sidecar, {})
        tag = container.get("image", ":").rsplit(":", 1)[1]
        major = re.match(r"v(\d+)\.", tag)
        if not major or int(major.group(1)) < first:
            fail(f"{where} {sidecar}", f"{tag} does not apply VolumeAttributesClasses of storage.k8s.io/v1")
        gates = flag_value(container.get("args", []), "--feature-gates") or ""
        if "VolumeAttributesClass=false" in gates.split(","):
            fail(f"{where} {sidecar}", "VolumeAttributesClass is turned off")
    timeout = seconds(flag_value(by_name.get("csi-attacher", {}).get("args", []), "--timeout"))
    if timeout is None or timeout <= ATTACH_WAIT_SECONDS:
        fail(f"{where} csi-attacher", f"--timeout {timeout}s is not longer than the attach wait")
    probe = seconds(flag_value(by_name.get("liveness-probe", {}).get("args", []), "--probe-timeout"))
    kubelet = by_name.get("ebs-plugin", {}).get("livenessProbe", {}).get("timeoutSeconds", 1)
    if probe is None or probe < 10 or kubelet < probe:
        fail(f"{where} liveness-probe", f"--probe-timeout {probe}s with the kubelet's timeoutSeconds {kubelet}")


def render(kustomization, name=None):
    """The objects `kubectl kustomize` renders from the directory. Its
    output is read once per content of deploy/kubernetes/ and `name`
    (what the kustomization is: by default its path under deploy/), so
    that the self-test's breaks of other files render once."""
    name = name or os.path.relpath(kustomization, DEPLOY)
    key = (kubernetes_digest(), name)
    if key not in RENDERED:
        RENDERED[key] = subprocess.run(
            ["kubectl", "kustomize", str(kustomization)], check=True, capture_output=True, text=True
        ).stdout
    return [o for o in yaml.load_all(RENDERED[key], Loader=Loader) if o]


RENDERED = {}


def kubernetes_digest():
    """A digest of every file under deploy/kubernetes/ (all a rendering can
    read)."""
    return tree_digest(DEPLOY / "kubernetes")


def tree_digest(root):
    """A digest of every file under `root`: each one's path under the
    repository and its contents."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(os.path.relpath(path, DEPLOY.parent).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def render_with_component(overlay, component):
    """The objects of `overlay` with `component` added, as a kustomization
    of the user's own would render them."""
    with tempfile.TemporaryDirectory() as tmp:
        # kustomize takes relative paths only.
        kustomization = {
            "resources": [os.path.relpath(DEPLOY / "kubernetes/overlays" / overlay, tmp)],
            "components": [os.path.relpath(component, tmp)],
        }
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return render(tmp, f"{overlay} with {os.path.relpath(component, DEPLOY)}")


def check_selinux_component():
    """components/selinux, added to either overlay, sets the CSIDriver's
    seLinuxMount (as the Go chart's node.selinux) and changes nothing else."""
    component = DEPLOY / "kubernetes/components/selinux"
    for overlay in OVERLAYS:
        where = f"{overlay} + components/selinux"
        if not component.is_dir():
            return fail(where, "no component: seLinuxMount cannot be turned on")
        objects = render_with_component(overlay, component)
        expected = render(DEPLOY / "kubernetes/overlays" / overlay)
        for obj in expected:
            if obj["kind"] == "CSIDriver":
                obj["spec"]["seLinuxMount"] = True
        if objects != expected:
            fail(where, "must set the CSIDriver's spec.seLinuxMount to true and change nothing else")
        for obj in objects:
            validate_schema(f"{where}: {obj['kind']}/{obj['metadata']['name']}", obj)


def mounted_dir(container, path):
    """The volume `container` mounts the directory of `path` from, or None."""
    for mount in container.get("volumeMounts", []):
        if str(Path(path).parent) == mount["mountPath"].rstrip("/"):
            return mount["name"]
    return None


def check_snapshot_metadata_component(flags):
    """components/snapshot-metadata, added to either overlay: every object
    valid and every command's flags accepted; the controller serves
    SnapshotMetadata on the socket the sidecar dials, in an emptyDir only
    those two containers mount; the SnapshotMetadataService's address is
    the Service, which reaches the sidecar's port."""
    component = DEPLOY / "kubernetes/components/snapshot-metadata"
    for overlay in OVERLAYS:
        where = f"{overlay} + components/snapshot-metadata"
        objects = render_with_component(overlay, component)
        check_objects(where, overlay, objects, flags)
        by_kind = {}
        for obj in objects:
            by_kind.setdefault(obj["kind"], []).append(obj)
        pod = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "ebs-csi-controller")["spec"]["template"]["spec"]
        named = {c["name"]: c for c in containers(pod)}
        plugin, sidecar = named["ebs-plugin"], named.get("csi-snapshot-metadata")
        endpoint = flag_value(plugin.get("args", []), "--snapshot-metadata-endpoint") or ""
        if sidecar is None or not endpoint.startswith("unix://"):
            fail(where, "the controller must serve --snapshot-metadata-endpoint=unix://… to a csi-snapshot-metadata sidecar")
            continue
        socket = endpoint.removeprefix("unix://")
        if flag_value(sidecar.get("args", []), "--csi-address") != socket:
            fail(where, f"the sidecar dials {flag_value(sidecar.get('args', []), '--csi-address')}, not {socket}")
        volume = mounted_dir(plugin, socket)
        if volume is None or mounted_dir(sidecar, socket) != volume:
            fail(where, f"the controller and the sidecar must mount the directory of {socket} from one volume")
        elif any(mounted_dir(c, socket) == volume for n, c in named.items() if n not in ("ebs-plugin", "csi-snapshot-metadata")):
            fail(where, f"{volume}: only the controller and the snapshot metadata sidecar may mount it")
        ports = {p["containerPort"] for p in sidecar.get("ports", [])}
        services = {f"{o['metadata']['name']}.{o['metadata'].get('namespace', 'default')}:{p['port']}": p["targetPort"]
                    for o in by_kind.get("Service", []) for p in o["spec"]["ports"]}
        for sms in by_kind.get("SnapshotMetadataService", []):
            address = sms["spec"].get("address")
            if services.get(address) not in ports:
                fail(where, f"SnapshotMetadataService address {address} is not a Service port that reaches the sidecar")


def check_objects(where, overlay, objects, flags, versions=None):
    """Every object of `overlay` (with what else `where` says) valid in
    `versions` (validate_schema's by default); every container's image
    allowed, the flags of the driver's commands accepted, none privileged
    but the standard overlay's helper; the node DaemonSet and the
    controller Deployment as check_node and check_controller want."""
    for obj in objects:
        at = f"{where}: {obj['kind']}/{obj['metadata']['name']}"
        validate_schema(at, obj, versions)
        pod_spec = obj.get("spec", {}).get("template", {}).get("spec")
        if pod_spec is None:
            continue
        for container in containers(pod_spec):
            check_image(f"{at} {container['name']}", container)
            command = container.get("command", [""])
            check_command(f"{at} {container['name']}", command + container.get("args", []), flags)
            hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            if hook:
                check_command(f"{at} {container['name']} preStop", hook, flags)
            check_termination_message(f"{at} {container['name']}", pod_spec, container)
            check_tracing(f"{at} {container['name']}", container)
            privileged_allowed = overlay == "standard" and container["name"] == HELPER_CONTAINER
            if is_privileged(container) != privileged_allowed:
                state = "privileged" if is_privileged(container) else "not privileged"
                fail(f"{at} {container['name']}", f"is {state}")
        if obj["kind"] == "DaemonSet":
            check_node(at, obj, helper_in_pod=overlay == "standard")
            check_node_token(at, pod_spec)
        if obj["kind"] == "Deployment":
            check_controller(at, obj)


def check_overlay(overlay, flags):
    committed = (DEPLOY / "kubernetes/overlays" / overlay / "chart.yaml").read_text()
    rendering = helm(*kustomize.arguments(DEPLOY, overlay))
    if rendering.returncode != 0:
        fail(overlay, f"the chart does not render with values.yaml: {rendering.stderr}")
    elif committed != kustomize.chart_yaml(rendering.stdout):
        fail(overlay, "chart.yaml is not the chart's rendering with values.yaml: run make kustomize")
    objects = render(DEPLOY / "kubernetes/overlays" / overlay)
    check_objects(overlay, overlay, objects, flags)
    check_node_rbac(overlay, objects)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    if ("CSIDriver", DRIVER) not in kinds:
        fail(overlay, f"no CSIDriver {DRIVER}")


HELM = os.environ.get("HELM", "helm")
# Each values file under the chart's ci/ (None: the defaults), the helper
# mode it renders and what the node's service account may do.
CHART_CASES = {
    None: ("standard", NODE_RULES),
    "ci/hardened-values.yaml": ("hardened", NODE_RULES),
    "ci/every-key-values.yaml": ("standard", NODE_RULES_READ_ONLY),
}
# Values the chart must refuse, and the part of helm's error that names
# the key: one it does not know, and reference keys it does not do.
CHART_REFUSALS = [
    ("controller.noSuchKey=1", "'noSuchKey' not allowed"),
    ("node.enableWindows=true", "/node/enableWindows"),
    ("sidecars.volumemodifier.logLevel=2", "/sidecars/volumemodifier"),
    ("node.securityContext.runAsUser=0", "/node/securityContext"),
    ("node.helper.mode=privileged", "/node/helper/mode"),
]


def chart():
    return DEPLOY.parent / "charts" / "aws-ebs-csi-driver"


def every_minor():
    """Every Kubernetes minor from the oldest supported to the newest."""
    oldest, newest = (tuple(map(int, v.split("."))) for v in kubernetes_versions(DEPLOY))
    return [f"{oldest[0]}.{minor}" for minor in range(oldest[1], newest[1] + 1)]


def helm(*args):
    """helm's answer to `args`, asked once per content of the chart and of
    deploy/kubernetes/ (all it reads): the self-test's breaks of other files
    reuse the unbroken tree's answers."""
    root = str(DEPLOY.parent)
    key = (tree_digest(chart()), kubernetes_digest(), tuple(a.replace(root, "") for a in args))
    if key not in HELM_ANSWERS:
        HELM_ANSWERS[key] = subprocess.run([HELM, *args], capture_output=True, text=True)
    return HELM_ANSWERS[key]


HELM_ANSWERS = {}


def template(*args):
    """`helm template` of the chart as release ebs-csi in kube-system, for
    the newest Kubernetes (helm's default is 1.20, older than the chart's
    kubeVersion)."""
    newest = f"{every_minor()[-1]}.0"
    return helm("template", "ebs-csi", str(chart()), "--namespace", "kube-system", "--kube-version", newest, *args)


def check_chart(flags):
    lint = helm("lint", "--strict", str(chart()), "--kube-version", f"{every_minor()[0]}.0")
    if lint.returncode != 0:
        fail("charts/aws-ebs-csi-driver", f"helm lint --strict: {lint.stdout}{lint.stderr}")
    for values, (mode, rules) in CHART_CASES.items():
        where = f"chart with {values or 'its defaults'}"
        rendered = template(*(["--values", str(chart() / values)] if values else []))
        if rendered.returncode != 0:
            fail(where, f"helm template: {rendered.stderr}")
            continue
        objects = [o for o in yaml.load_all(rendered.stdout, Loader=Loader) if o]
        check_objects(where, mode, objects, flags, every_minor())
        check_node_rbac(where, objects, rules)
        if ("CSIDriver", DRIVER) not in {(o["kind"], o["metadata"]["name"]) for o in objects}:
            fail(where, f"no CSIDriver {DRIVER}")
    for value, named in CHART_REFUSALS:
        refused = template("--set", value)
        if refused.returncode == 0 or named not in refused.stderr:
            fail("chart", f"--set {value} is not refused naming {named!r}: {refused.stderr or 'rendered'}")


def check_command(where, command, flags):
    """A command of the driver's binaries (the program and its subcommand,
    if any: "ebs-csi-agent plugin-dir") with flags it accepts."""
    if not command[0].startswith("/usr/bin/ebs-csi-"):
        return
    program = " ".join([Path(command[0]).name] + [c for c in command[1:2] if not c.startswith("-")])
    if program not in flags:
        fail(where, f"runs {program}, which is not a command of the binaries")
    else:
        check_args(where, flags[program], command[1:])


# The driver's own images (named by the overlays' kustomizations) and the
# CSI sidecars from registry.k8s.io, each at a release tag: nothing from
# another registry, nothing unpinned.
OWN_IMAGE = re.compile(r"localhost/ebs-csi(-helper)?:\d+\.\d+\.\d+$")
SIDECAR_IMAGE = re.compile(r"registry\.k8s\.io/sig-storage/[a-z-]+:v\d+\.\d+\.\d+$")


def check_image(where, container):
    image = container["image"]
    if not (OWN_IMAGE.match(image) or SIDECAR_IMAGE.match(image)):
        fail(where, f"image {image} is neither the driver's nor a registry.k8s.io sidecar at a release tag")
    # The sidecars deprecate --health-port for --http-endpoint
    # (kubernetes-csi/livenessprobe, cmd/livenessprobe/main.go).
    if any(arg.startswith("--health-port") for arg in container.get("args", [])):
        fail(where, "--health-port is deprecated: use --http-endpoint")


def check_examples():
    for path in sorted((DEPLOY / "kubernetes/examples").glob("*.yaml")):
        for obj in yaml.load_all(path.read_text(), Loader=Loader):
            where = f"{path.name}: {obj['kind']}/{obj['metadata']['name']}"
            # An example may need a newer Kubernetes than the driver (the
            # install guide says which): the newest schema only.
            validate_schema(where, obj, [NEWEST_KUBERNETES])
            driver = obj.get("provisioner") or obj.get("driverName") or obj.get("driver")
            if obj["kind"].endswith("Class") and driver != DRIVER:
                fail(where, f"names driver {driver!r}, not {DRIVER}")


# IAM ------------------------------------------------------------------

# Volumes the controller meets, by the tags their creator set: the in-tree
# kubernetes.io/aws-ebs plugin (k8s.io/cloud-provider's
# CloudVolumeCreatedForClaimNameTag), Go drivers before v1.0.0
# (CSIVolumeName only), a statically provisioned volume (none), and ours.
VOLUME_TAGS = {
    "in-tree": {"kubernetes.io/created-for/pvc/name": "data", "KubernetesCluster": "prod"},
    "go-driver-0.x": {"CSIVolumeName": "pvc-1"},
    "static": {},
    "ebs-csi": {"ebs.csi.aws.com/cluster": "true", "CSIVolumeName": "pvc-2"},
}
ACTIONS = ["AttachVolume", "DetachVolume", "ModifyVolume", "DeleteVolume", "CreateTags"]
# What each policy must allow: the base only what the driver tagged; with
# the migration policy, attach, detach and modify on every volume (static
# ones carry no tag a condition could test) and delete or retag only what
# Kubernetes or a Go driver created.
OWN = {("ebs-csi", action) for action in ACTIONS}
ALLOWED = {
    "iam-policy.json": OWN,
    "iam-policy-migration.json": OWN
    | {(kind, action) for kind in VOLUME_TAGS for action in ACTIONS[:3]}
    | {(kind, action) for kind in ["in-tree", "go-driver-0.x"] for action in ACTIONS[3:]},
}


def listed(value):
    return value if isinstance(value, list) else [value]


def condition_holds(operator, values, tags, request_tags):
    # IAM: a key absent from the request context never matches StringEquals
    # or StringLike; several values match if any does (IAM JSON policy
    # reference, "Condition operators"). aws:RequestTag/K is a tag the
    # request sets (a CreateVolume's TagSpecification), aws:ResourceTag/K
    # one the resource has.
    for key, expected in values.items():
        kind, _, name = key.partition("/")
        source = {"aws:ResourceTag": tags, "ec2:ResourceTag": tags, "aws:RequestTag": request_tags}.get(kind, {})
        actual = source.get(name)
        if operator not in ("StringEquals", "StringLike") or actual is None:
            return False
        matches = fnmatch.fnmatchcase if operator == "StringLike" else str.__eq__
        if not any(matches(actual, pattern) for pattern in listed(expected)):
            return False
    return True


VOLUME_ARN = "arn:aws:ec2:us-east-1:111122223333:volume/vol-0123456789abcdef0"


def allows(statements, action, tags, request_tags=None, arn=VOLUME_ARN):
    return any(
        s["Effect"] == "Allow"
        and f"ec2:{action}" in listed(s["Action"])
        and any(fnmatch.fnmatchcase(arn, r) for r in listed(s["Resource"]))
        and all(condition_holds(op, values, tags, request_tags or {}) for op, values in s.get("Condition", {}).items())
        for s in statements
    )


def check_iam_allows_the_iops_dry_run():
    """The dry-run CreateVolume that finds a zone's IOPS maximum is, to IAM,
    a CreateVolume (a dry run is authorized as the request itself: EC2 API
    Reference, "DryRun"): with the tags every volume of the controller
    carries (controller/src/tags.rs `common`; the dry run sends the
    volume's, tests/tests/controller_moto.rs checks that over the wire) the
    policy allows it, without them it does not."""
    policy = json.loads((DEPLOY / "iam-policy.json").read_text())["Statement"]
    tagged = {"ebs.csi.aws.com/cluster": "true", "CSIVolumeName": "pvc-1"}
    if not allows(policy, "CreateVolume", {}, tagged):
        fail("iam-policy.json", f"denies the IOPS dry run, a CreateVolume with the tags {tagged}")
    if allows(policy, "CreateVolume", {}, {}):
        fail("iam-policy.json", "allows CreateVolume without the tag ebs.csi.aws.com/cluster=true")


def check_iam_covers_the_controller():
    """Every AWS action the controller calls (each is observed under its
    name in CONTROLLER_CALLS) is in iam-policy.json."""
    policy = json.loads((DEPLOY / "iam-policy.json").read_text())["Statement"]
    granted = {a for s in policy for a in listed(s["Action"])}
    for source, prefix in CONTROLLER_CALLS.items():
        called = set(re.findall(r'observe\(\s*"(\w+)"', source.read_text()))
        for action in sorted(called):
            if f"{prefix}:{action}" not in granted:
                fail("iam-policy.json", f"does not grant {prefix}:{action}, which the controller calls")


# Snapshots the controller meets, by their tags: its own, the Go driver's
# before the cluster tag (CSIVolumeSnapshotName only), one shared from
# another account (its owner's tags are not this account's to test), and
# one AWS Backup made (whatever tags its plan copied, never the cluster's).
SNAPSHOT_TAGS = {
    "ebs-csi": {"ebs.csi.aws.com/cluster": "true", "CSIVolumeSnapshotName": "snapcontent-1"},
    "go-driver-0.x": {"CSIVolumeSnapshotName": "snapcontent-2"},
    "shared": {},
    "aws-backup": {"Name": "nightly"},
}
# The tags every volume and snapshot the controller creates carries
# (controller/src/tags.rs `common`).
NEW_VOLUME = {"ebs.csi.aws.com/cluster": "true", "CSIVolumeName": "pvc-3"}
NEW_SNAPSHOT = {"ebs.csi.aws.com/cluster": "true", "CSIVolumeSnapshotName": "snapcontent-3"}
# A resource a request creates has no id yet: IAM sees its type's ARN with
# `*` for the id (EC2 User Guide, "Resource-level permissions": e.g.
# CreateVolume's `arn:aws:ec2:region:account:volume/*`); a snapshot's ARN
# has no account.
NEW_VOLUME_ARN = "arn:aws:ec2:us-east-1:111122223333:volume/*"
SNAPSHOT_ARN = "arn:aws:ec2:us-east-1::snapshot/snap-0123456789abcdef0"
NEW_SNAPSHOT_ARN = "arn:aws:ec2:us-east-1::snapshot/*"
INSTANCE_ARN = "arn:aws:ec2:us-east-1:111122223333:instance/i-0123456789abcdef0"


def authorized(statements, action, sources, created, request_tags):
    """Whether IAM lets `action` read `sources` ((ARN, tags) pairs) and
    create `created` (ARNs) with `request_tags`: every resource a request
    names must be allowed (the Service Authorization Reference lists, for
    CreateSnapshot, the volume and the snapshot; CreateSnapshots, the
    instance, its volumes and the snapshots; CreateVolume, the snapshot and
    the volume; CopyVolumes, both volumes). A request's tags are condition
    keys of what it creates only: aws:RequestTag is absent when IAM
    authorizes a resource the request reads (why EC2's examples of tag
    conditions on RunInstances name the new instance and volumes alone)."""
    return all(allows(statements, action, tags, {}, arn) for arn, tags in sources) and all(
        allows(statements, action, {}, request_tags, arn) for arn in created
    )


def check_iam_snapshots_and_restores(name, statements):
    """A snapshot or clone of any volume, and a restore of any snapshot,
    as the Go driver's policy allows (its docs/example-iam-policy.json:
    CreateSnapshot on any volume, CopyVolumes from any `vol-*`, CreateVolume
    from any snapshot), each only into a volume or snapshot with the
    cluster's tag."""
    requests = [
        (f"a snapshot of a volume of {kind}", "CreateSnapshot", [(VOLUME_ARN, tags)], [NEW_SNAPSHOT_ARN], NEW_SNAPSHOT)
        for kind, tags in VOLUME_TAGS.items()
    ]
    requests += [
        (f"a group snapshot of a volume of {kind}", "CreateSnapshots", [(INSTANCE_ARN, {}), (VOLUME_ARN, tags)],
         [NEW_SNAPSHOT_ARN], NEW_SNAPSHOT)
        for kind, tags in VOLUME_TAGS.items()
    ]
    requests += [
        (f"a clone of a volume of {kind}", "CopyVolumes", [(VOLUME_ARN, tags)], [NEW_VOLUME_ARN], NEW_VOLUME)
        for kind, tags in VOLUME_TAGS.items()
    ]
    requests += [
        (f"a restore of a snapshot of {kind}", "CreateVolume", [(SNAPSHOT_ARN, tags)], [NEW_VOLUME_ARN], NEW_VOLUME)
        for kind, tags in SNAPSHOT_TAGS.items()
    ]
    for what, action, sources, created, tags in requests:
        if not authorized(statements, action, sources, created, tags):
            fail(name, f"denies {what} ({action})")
        untagged = {k: v for k, v in tags.items() if k != "ebs.csi.aws.com/cluster"}
        if authorized(statements, action, sources, created, untagged):
            fail(name, f"allows {what} ({action}) without the tag ebs.csi.aws.com/cluster=true")


def check_iam():
    check_iam_covers_the_controller()
    check_iam_allows_the_iops_dry_run()
    base = json.loads((DEPLOY / "iam-policy.json").read_text())["Statement"]
    for name, expected in ALLOWED.items():
        statements = base if name == "iam-policy.json" else base + json.loads((DEPLOY / name).read_text())["Statement"]
        check_iam_snapshots_and_restores(name, statements)
        for kind, tags in VOLUME_TAGS.items():
            for action in ACTIONS:
                allowed = allows(statements, action, tags)
                if allowed != ((kind, action) in expected):
                    verb = "allows" if allowed else "denies"
                    fail(name, f"{verb} {action} on a volume of {kind} (tags {tags})")


# Nomad ----------------------------------------------------------------

HCL_OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)


def load_hcl(name):
    with open(DEPLOY / "nomad" / name) as f:
        return hcl2.load(f, serialization_options=HCL_OPTIONS)


def unquote(key):
    return key.strip('"')


def single(blocks):
    """The one labelled block of a list like [{"label": {...}}]."""
    (label, body), = blocks[0].items()
    return unquote(label), body


def tasks(job_file):
    _, job = single(load_hcl(job_file)["job"])
    for group in job.get("group", []):
        _, group_body = single([group])
        for task in group_body.get("task", []):
            yield job, group_body, single([task])


def check_nomad(flags):
    plugins = {}
    for job_file, plugin_type, binary in [
        ("ebs-csi-controller.nomad.hcl", "controller", "ebs-csi-controller"),
        ("ebs-csi-node.nomad.hcl", "node", "ebs-csi-agent"),
    ]:
        (job, _, (name, task)), = list(tasks(job_file))
        where = f"{job_file} task {name}"
        plugin = task["csi_plugin"][0]
        plugins[plugin_type] = plugin["id"]
        if plugin["type"] != plugin_type:
            fail(where, f"csi_plugin type is {plugin['type']!r}, not {plugin_type!r}")
        for field in ("mount_dir", "health_timeout"):
            if field not in plugin:
                fail(where, f"csi_plugin has no {field}")
        base = plugin.get("stage_publish_base_dir")
        if base and (base + "/").startswith(plugin["mount_dir"].rstrip("/") + "/"):
            fail(where, "stage_publish_base_dir must not lie inside mount_dir")
        if task["config"][0].get("privileged"):
            fail(where, "the plugin must not be privileged")
        config = task["config"][0]
        if task["driver"] != "raw_exec":
            fail(where, "the plugin's socket is handed over on the host: raw_exec")
        root = check_helper_dropin(plugin["id"], flags["ebs-csi-helper"])
        if plugin_type == "node" and base != root:
            fail(where, f"stage_publish_base_dir {base!r} is not the helper's allowed root {root!r}")
        uid = AGENT_UID if plugin_type == "node" else NOBODY
        command, args = check_socket_handover(where, config, root.split("/client/csi/")[0], uid)
        if command != f"/usr/bin/{binary}":
            fail(where, f"runs {command}, not /usr/bin/{binary}")
        check_args(where, flags[binary], args)
    if plugins["controller"] != plugins["node"]:
        fail("nomad", f"plugin ids differ: {plugins}")
    volume = load_hcl("volume.hcl")
    if volume["plugin_id"] != plugins["node"]:
        fail("volume.hcl", f"plugin_id {volume['plugin_id']!r} is not {plugins['node']!r}")
    capabilities = {(c["access_mode"], c["attachment_mode"]) for c in volume["capability"]}
    for job, group, (name, task) in tasks("writer.nomad.hcl"):
        for label_and_body in group.get("volume", []):
            _, claim = single([label_and_body])
            if claim["source"] != volume["id"]:
                fail("writer.nomad.hcl", f"claims volume {claim['source']!r}, not {volume['id']!r}")
            if (claim["access_mode"], claim["attachment_mode"]) not in capabilities:
                fail("writer.nomad.hcl", "claims a capability the volume does not have")


# Nomad ≥ 1.3 dials <data_dir>/client/csi/plugins/<alloc id>/csi.sock in
# a directory it makes root 0700 (plugin_supervisor_hook.go): root binds
# the socket and hands it to the plugin, which runs with these ids and no
# privilege (setpriv(1)).
def handover(uid):
    return ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def check_socket_handover(where, config, data_dir, uid):
    """systemd-socket-activate binds Nomad's socket path, setpriv drops to
    `uid` and every privilege, then the plugin. Returns the plugin's
    command and arguments."""
    listen = f"--listen={data_dir}/client/csi/plugins/${{NOMAD_ALLOC_ID}}/csi.sock"
    args = config.get("args", [])
    if config["command"] != "/usr/bin/systemd-socket-activate" or args[:1] != [listen]:
        fail(where, f"the socket must be bound by systemd-socket-activate {listen}")
    expected = handover(uid)
    if args[1:1 + len(expected)] != expected:
        fail(where, f"the plugin must be started through {' '.join(expected)} (no privilege)")
    rest = args[1 + len(expected):]
    return (rest[0] if rest else ""), rest[1:]


def check_helper_dropin(plugin_id, helper_flags):
    """Checks the helper's Nomad drop-in; returns its --allowed-root."""
    where = "ebs-csi-helper-nomad.conf"
    text = (DEPLOY / "nomad" / where).read_text()
    exec_start = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ExecStart=")]
    if len(exec_start) != 2 or exec_start[0] != "":
        return fail(where, "must reset ExecStart, then set it once")
    args = exec_start[1].split()[1:]
    check_args(where, helper_flags, args)
    root = flag_value(args, "--allowed-root") or ""
    if not root.endswith(f"/client/csi/node/{plugin_id}"):
        fail(where, f"--allowed-root {root!r} is not <data_dir>/client/csi/node/{plugin_id}")
    if flag_value(args, "--allowed-uid") != str(AGENT_UID):
        fail(where, f"--allowed-uid must be the agent's uid {AGENT_UID}")
    if flag_value(args, "--allowed-layout") != "nomad":
        fail(where, "--allowed-layout must be nomad: kubelet's path shapes are not Nomad's")
    return root


def check_all(flags):
    for overlay in OVERLAYS:
        check_overlay(overlay, flags)
    check_selinux_component()
    check_snapshot_metadata_component(flags)
    check_chart(flags)
    check_examples()
    check_iam()
    check_nomad(flags)


# Each break: (file under deploy/, text, replacement, a part of the
# failure it must cause). The overlays are the chart's renderings: their
# breaks are the templates'.
CHART = "../charts/aws-ebs-csi-driver/"
TEMPLATES = CHART + "templates/"
BREAKS = [
    (TEMPLATES + "_node.tpl", "- --helper-socket=/run/ebs-csi/helper.sock", "- --no-such-flag", "--no-such-flag"),
    (TEMPLATES + "_node.tpl", "runAsUser: 990", "runAsUser: 0", "runAsUser is 0"),
    (TEMPLATES + "_node.tpl", "drop: [ALL]\n          # Not kubelet's default, /dev/termination-log",
     "drop: [ALL]\n              add: [SYS_ADMIN]\n          # Not kubelet's default, /dev/termination-log",
     "ebs-plugin: is privileged"),
    (TEMPLATES + "node-rbac.yaml", '"[get, patch]"', '"[get, patch, list]"', "and nothing else"),
    (TEMPLATES + "node-rbac.yaml", "verbs: [list]", "verbs: [list, watch, delete]", "and nothing else"),
    ("kubernetes/components/selinux/kustomization.yaml", "value: true", "value: false",
     "must set the CSIDriver's spec.seLinuxMount to true"),
    (TEMPLATES + "_node.tpl", "command: [/usr/bin/ebs-csi-agent, pre-stop]", "command: [/bin/sleep, '30']",
     "preStop hook must run ebs-csi-agent pre-stop"),
    (TEMPLATES + "_node.tpl", "command: [/usr/bin/ebs-csi-agent, pre-stop]",
     "command: [/usr/bin/ebs-csi-agent, pre-stop, --wait]", "--wait is not a flag"),
    ("../docs/install-kubernetes.md", "Kubernetes ≥ 1.33", "Kubernetes ≥ 1.32",
     "Kubernetes 1.32: spec: Additional properties are not allowed ('nodeAllocatableUpdatePeriodSeconds'"),
    (TEMPLATES + "node-rbac.yaml", '"[get, patch]"', '"[get]"', "and nothing else"),
    (TEMPLATES + "_node.tpl", "- serviceAccountToken:", "- secret:",
     "the agent mounts no token"),
    (TEMPLATES + "_node.tpl", "fieldPath: spec.nodeName", "fieldPath: metadata.name", "CSI_NODE_NAME"),
    (TEMPLATES + "_node.tpl", "              mountPath: /registration\n",
     "              mountPath: /registration\n            - name: node-reader-token\n              mountPath: /t\n",
     "node-driver-registrar mounts a Kubernetes token"),
    (TEMPLATES + "_node.tpl", 'image: {{ include "ebs-csi.image" (list $root.Values.image $root) }}',
     "image: busybox:1.37", "image busybox:1.37 is neither"),
    (TEMPLATES + "_node.tpl", "plugin-dir, --uid=990", "plugin-dir, --owner=990", "--owner=990 is not a flag"),
    (TEMPLATES + "_node.tpl", "[/usr/bin/ebs-csi-agent, plugin-dir,", "[/usr/bin/ebs-csi-agent, chown,",
     "runs ebs-csi-agent chown"),
    (TEMPLATES + "controller.yaml", "- --http-endpoint=0.0.0.0:9808", "- --health-port=9808", "deprecated"),
    (TEMPLATES + "controller.yaml", "  replicas: {{ $c.replicaCount }}", "  replicas: 1\n  paused: maybe", "paused"),
    (CHART + "values.yaml", "tag: v2.2.0", "tag: v1.14.0",
     "csi-resizer: v1.14.0 does not apply VolumeAttributesClasses of storage.k8s.io/v1"),
    (CHART + "values.yaml", "tag: v6.3.0", "tag: v5.3.0",
     "csi-provisioner: v5.3.0 does not apply VolumeAttributesClasses of storage.k8s.io/v1"),
    (TEMPLATES + "controller.yaml", "            - --handle-volume-inuse-error=false\n",
     "            - --handle-volume-inuse-error=false\n            - --feature-gates=VolumeAttributesClass=false\n",
     "csi-resizer: VolumeAttributesClass is turned off"),
    (TEMPLATES + "controller.yaml", "- --timeout=6m", "- --timeout=60s", "--timeout 60s"),
    (TEMPLATES + "_helpers.tpl", "    - targetPort: {{ $port }}", "    - targetPort: 8080",
     "does not scrape /metrics on port 3301"),
    (TEMPLATES + "controller.yaml", "- --probe-timeout=60s", "- --probe-timeout=1s", "--probe-timeout 1s"),
    (TEMPLATES + "controller.yaml", "timeoutSeconds: 60", "timeoutSeconds: 3", "timeoutSeconds 3"),
    (TEMPLATES + "_node.tpl", "privileged: true", "privileged: false",
     "ebs-csi-helper: is not privileged"),
    (TEMPLATES + "_node.tpl", "--allowed-uid=990", "--allowed-uid=0",
     "must allow uid and group"),
    (TEMPLATES + "_node.tpl", "hostPID: true", "hostPID: false",
     "the helper needs the node's PID namespace"),
    (TEMPLATES + "_node.tpl", "mountPath: /run/ebs-csi", "mountPath: /run/other",
     "helper's socket directory"),
    ("kubernetes/examples/volumesnapshotclass.yaml", "deletionPolicy: Delete", "deletionPolicy: Keep",
     "deletionPolicy"),
    ("kubernetes/examples/storageclass.yaml", "provisioner: ebs.csi.aws.com", "provisioner: ebs.csi.aws.org",
     "names driver"),
    ("iam-policy.json", '"ec2:DetachVolume",\n        "ec2:DeleteVolume"', '"ec2:DetachVolume"', "denies DeleteVolume on a volume of ebs-csi"),
    ("iam-policy.json", '        "ec2:LockSnapshot",\n', "", "does not grant ec2:LockSnapshot"),
    ("iam-policy.json", '"aws:RequestTag/ebs.csi.aws.com/cluster": "true"', '"aws:RequestTag/ebs.csi.aws.com/cluster": "yes"',
     "denies the IOPS dry run"),
    ("iam-policy.json", '{"StringEquals": {"aws:RequestTag/ebs.csi.aws.com/cluster": "true"}}', '{}',
     "allows CreateVolume without the tag"),
    ("iam-policy.json", '"Action": ["ec2:CreateSnapshot", "ec2:CreateSnapshots"],\n      "Resource": "arn:aws:ec2:*:*:volume/*"',
     '"Action": ["ec2:CreateSnapshot", "ec2:CreateSnapshots"],\n      "Resource": "arn:aws:ec2:*:*:volume/*",\n'
     '      "Condition": {"StringEquals": {"aws:ResourceTag/ebs.csi.aws.com/cluster": "true"}}',
     "denies a snapshot of a volume of static (CreateSnapshot)"),
    ("iam-policy.json", '"Resource": "arn:aws:ec2:*:*:volume/vol-*"', '"Resource": "arn:aws:ec2:*:*:volume/*"',
     "allows a clone of a volume of static (CopyVolumes) without the tag"),
    ("iam-policy.json", '"Action": "ec2:CreateVolume",\n      "Resource": "arn:aws:ec2:*:*:snapshot/*"',
     '"Action": "ec2:CreateVolume",\n      "Resource": "arn:aws:ec2:*:*:snapshot/*",\n'
     '      "Condition": {"StringEquals": {"aws:ResourceTag/ebs.csi.aws.com/cluster": "true"}}',
     "denies a restore of a snapshot of shared (CreateVolume)"),
    ("iam-policy-migration.json", '"ec2:ModifyVolume"]', '"ec2:ModifyVolume", "ec2:DeleteVolume"]',
     "allows DeleteVolume on a volume of static"),
    ("iam-policy-migration.json", "kubernetes.io/created-for/pvc/name", "kubernetes.io/created-for/pv/name",
     "denies DeleteVolume on a volume of in-tree"),
    ("nomad/ebs-csi-controller.nomad.hcl", '"aws-ebs0"', '"aws-ebs1"', "plugin ids differ"),
    ("nomad/ebs-csi-node.nomad.hcl", '"raw_exec"', '"exec"', "raw_exec"),
    ("nomad/ebs-csi-controller.nomad.hcl", '"raw_exec"', '"exec"', "raw_exec"),
    ("nomad/ebs-csi-node.nomad.hcl", '"--reuid=990"', '"--reuid=0"', "no privilege"),
    ("nomad/ebs-csi-node.nomad.hcl", '"--no-new-privs", ', "", "no privilege"),
    ("nomad/ebs-csi-node.nomad.hcl", 'stage_publish_base_dir = "/opt/nomad/data/client/csi/node/aws-ebs0"',
     'stage_publish_base_dir = "/local/csi"', "is not the helper's allowed root"),
    ("nomad/ebs-csi-node.nomad.hcl", "/client/csi/plugins/${NOMAD_ALLOC_ID}/csi.sock",
     "/client/csi/node/aws-ebs0/csi.sock", "bound by systemd-socket-activate"),
    ("nomad/ebs-csi-controller.nomad.hcl", '"--reuid=65534"', '"--reuid=0"', "no privilege"),
    ("nomad/ebs-csi-node.nomad.hcl", '"--helper-socket"', '"--helper-sock"', "--helper-sock is not a flag"),
    ("nomad/ebs-csi-helper-nomad.conf", "node/aws-ebs0", "node/aws-ebs9", "--allowed-root"),
    ("nomad/ebs-csi-helper-nomad.conf", "aws-ebs0 --allowed-layout nomad", "aws-ebs0", "--allowed-layout must be nomad"),
    ("nomad/volume.hcl", 'plugin_id = "aws-ebs0"', 'plugin_id = "other"', "plugin_id"),
    ("nomad/writer.nomad.hcl", 'source          = "data"', 'source          = "other"', "claims volume"),
    ("kubernetes/components/snapshot-metadata/kustomization.yaml",
     "- --csi-address=/var/lib/csi/sockets/snapshot-metadata/csi.sock",
     "- --csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock", "the sidecar dials"),
    ("kubernetes/components/snapshot-metadata/kustomization.yaml", "name: snapshot-metadata-socket-dir\n          mountPath",
     "name: socket-dir\n          mountPath", "from one volume"),
    ("kubernetes/components/snapshot-metadata/kustomization.yaml", "--snapshot-metadata-endpoint=", "--metadata-endpoint=",
     "--metadata-endpoint=unix:///var/lib/csi/sockets/snapshot-metadata/csi.sock is not a flag"),
    ("kubernetes/components/snapshot-metadata/snapshotmetadataservice.yaml", "name: ebs.csi.aws.com", "name: ebs",
     "is not named ebs.csi.aws.com"),
    ("kubernetes/components/snapshot-metadata/snapshotmetadataservice.yaml", ".kube-system:6443", ".kube-system:443",
     "is not a Service port"),
    ("iam-policy.json", '"ebs:ListSnapshotBlocks", ', "", "does not grant ebs:ListSnapshotBlocks"),
    ("kubernetes/overlays/standard/chart.yaml", "  replicas: 2", "  replicas: 3", "run make kustomize"),
    (TEMPLATES + "_node.tpl", "- --socket-group=990", "- --socket-group=0",
     "must allow uid and group"),
    (TEMPLATES + "_node.tpl", "ebs.csi.aws.com/helper: installed", "helper: installed",
     "must require the node label"),
    (TEMPLATES + "controller.yaml", "- --batching=", "- --batch=", "--batch="),
    (CHART + "values.schema.json", '"enableWindows": {\n', '"enableWindowsX": {\n',
     "/node/enableWindows"),
    (CHART + "values.yaml", "logLevel: 2\n  loggingFormat: text\n  # OpenTelemetry spans of each RPC and its helper",
     "logLevel: two\n  loggingFormat: text\n  # OpenTelemetry spans of each RPC and its helper", "helm lint --strict"),
    (TEMPLATES + "controller.yaml", "- --enable-otel-tracing=true", "- --v=9",
     "sets OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME without --enable-otel-tracing=true"),
    (TEMPLATES + "_node.tpl", "terminationMessagePath: /tmp/termination-log\n          volumeMounts:\n            - name: plugin-dir",
     "volumeMounts:\n            - name: plugin-dir",
     "its termination message /dev/termination-log is made in the host's /dev"),
]


def self_test(flags):
    """Each break in a copy of deploy/ and docs/, in as many processes as
    there are cores (each break is checked alone, in its own copy). The
    unbroken tree is checked first, so that every process starts with its
    renderings and schema answers."""
    check_all(flags)
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        missed = [m for m in pool.starmap(missed_break, [(flags, b) for b in BREAKS]) if m]
    failures.clear()
    failures.extend(missed)
    print(f"self-test: {len(BREAKS)} breaks, {len(missed)} not reported")


def missed_break(flags, brk):
    """None if check_all reports the break in a copy, else what went
    unreported."""
    global DEPLOY
    file, text, replacement, expected = brk
    original = DEPLOY
    with tempfile.TemporaryDirectory() as copy:
        DEPLOY = Path(copy) / "deploy"
        try:
            shutil.copytree(original, DEPLOY)
            shutil.copytree(original.parent / "docs", DEPLOY.parent / "docs")
            shutil.copytree(original.parent / "charts", DEPLOY.parent / "charts")
            target = DEPLOY / file
            content = target.read_text()
            if text not in content:
                return f"{file}: {text!r} is not in the file"
            target.write_text(content.replace(text, replacement, 1))
            failures.clear()
            check_all(flags)
            if not any(expected in f for f in failures):
                return f"{file}: {text!r} -> {replacement!r} was not reported ({failures})"
            return None
        finally:
            DEPLOY = original


def main():
    bin_dir = Path(sys.argv[1])
    flags = {b: accepted_flags(bin_dir, b) for b in ("ebs-csi-agent", "ebs-csi-controller", "ebs-csi-helper")}
    for command in ("plugin-dir", "pre-stop"):
        flags[f"ebs-csi-agent {command}"] = accepted_flags(bin_dir, "ebs-csi-agent", command)
    # The Go driver's mode argument: the controller's flags, the labeler's work.
    flags["ebs-csi-controller metadata-labeler"] = accepted_flags(bin_dir, "ebs-csi-controller", "metadata-labeler")
    if sys.argv[2:] == ["--self-test"]:
        self_test(flags)
    else:
        check_all(flags)
        print(f"deploy/: {len(failures)} problem(s)")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
