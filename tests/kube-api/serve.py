"""The part of the Kubernetes API the agent uses, on 127.0.0.1 over TLS:
`GET /api/v1/nodes/<name>` (the `kubernetes` metadata source), `PATCH`
of it with a JSON Patch (removing the startup taint), and `GET
/apis/storage.k8s.io/v1/volumeattachments` (the pre-stop step).

Usage: serve.py DIR [--taints JSON] [--unschedulable] [--conflicts N]
[--volume-attachments JSON] [--ciphers SPEC]. Writes DIR/ca.crt (a
fresh CA that signed the server's certificate for IP 127.0.0.1), DIR/token
(the only bearer token accepted) and DIR/client.crt and DIR/client.key (a
client certificate of that CA for the node's user, `system:node:<name>` in
`system:nodes`, accepted instead of the token), prints the port on one line,
then logs one line per request to DIR/requests.log and writes the Node as
it is after each change to DIR/node.json. --ciphers serves TLS 1.2 only,
with the OpenSSL cipher suites SPEC names (a FIPS-mode client's refusal
of ChaCha20-Poly1305 is tested so). --taints gives the Node's
`spec.taints`, --unschedulable sets `spec.unschedulable` (as `kubectl
drain` does); --conflicts N makes another writer (kubelet updating the
Node's status) change the Node between the agent's read and its next N
patches. --volume-attachments gives the VolumeAttachment objects, written
to DIR/volumeattachments.json and read again at each request, so a test
deletes one by rewriting the file (as the attach/detach controller deletes
it once the volume is detached).

Answers as kube-apiserver does (Kubernetes API reference, "Status" kind;
the messages are apiserver's, e.g. `nodes "x" not found`):
- no or another token, and no client certificate of the CA: 401 Status,
  reason Unauthorized;
- the node named `forbidden`: 403 Status, reason Forbidden, with RBAC's
  message for a service account without `get` on nodes;
- node.json's node: 200, that Node object (EKS node, `kubectl get -o json`);
- the VolumeAttachments: 200, a VolumeAttachmentList (storage.k8s.io/v1);
- any other name: 404 Status, reason NotFound;
- PATCH with `application/json-patch+json` (RFC 6902; the `test`,
  `replace`, `add` and `remove` operations): the patched Node, its
  `metadata.resourceVersion` one higher; a patch that cannot be applied (a
  `test` that fails) 422 Status, reason Invalid, as kube-apiserver answers
  it since kubernetes/kubernetes#68346; another content type 415;
- any POST (the tests' TLS endpoint for another client: the AWS SDK's
  requests reach it too): 404 Status, reason NotFound, logged.
"""

import argparse
import copy

import datetime
import http.server
import json
import os
import ssl
import sys
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
import ipaddress

TOKEN = "eyJhbGciOiJSUzI1NiJ9.ebs-csi-node-sa.test"
SERVICE_ACCOUNT = "system:serviceaccount:kube-system:ebs-csi-node-sa"
NODE = json.loads((Path(__file__).parent / "node.json").read_text())
# Patches still to meet another writer's change first (--conflicts).
conflicts = 0


def write_whole(path, text):
    """Writes `text` to `path` by renaming a file written beside it: a
    reader polling the file (a test, node.json) reads the old contents or
    the new, never a file cut short (write_text truncates first, and a read
    in between finds it empty)."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(partial, path)


def certificates(directory):
    """A CA certificate (written to ca.crt) and a server key and
    certificate for 127.0.0.1 (written to server.pem)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{NODE['metadata']['name']}"),
        ]))
        .issuer_name(ca_name)
        .public_key(client_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "client.crt").write_bytes(client.public_bytes(serialization.Encoding.PEM))
    (directory / "client.key").write_bytes(client_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pem = directory / "server.pem"
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + server.public_bytes(serialization.Encoding.PEM)
    )
    return pem


def status(code, reason, message, name=None):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if name is not None:
        body["details"] = {"name": name, "kind": "nodes"}
    return code, body


def pointer(document, path):
    """The container and key a JSON Pointer (RFC 6901) names."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for part in parents:
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document, (int(last) if isinstance(document, list) and last != "-" else last)


def apply(document, patch):
    """RFC 6902 on a copy of `document`; None if an operation fails."""
    document = copy.deepcopy(document)
    for operation in patch:
        try:
            parent, key = pointer(document, operation["path"])
            if operation["op"] == "test":
                if (parent.get(key) if isinstance(parent, dict) else parent[key]) != operation["value"]:
                    return None
            elif operation["op"] in ("replace", "add"):
                if operation["op"] == "replace" and isinstance(parent, dict) and key not in parent:
                    return None
                parent[key] = operation["value"]
            elif operation["op"] == "remove":
                del parent[key]
            else:
                return None
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return document


class Handler(http.server.BaseHTTPRequestHandler):
    log_path = None
    node_path = None
    attachments_path = None

    def authenticated(self):
        """The bearer token, or a client certificate the CA signed (the
        handshake verified it: CERT_OPTIONAL)."""
        return self.headers.get("Authorization") == f"Bearer {TOKEN}" or bool(self.request.getpeercert())

    def credential(self):
        """What the request authenticated with, for the log."""
        subject = dict(item[0] for item in (self.request.getpeercert() or {}).get("subject", ()))
        return self.headers.get("Authorization") or (f"certificate {subject['commonName']}" if subject else "")

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PATCH(self):
        global conflicts
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        content_type = self.headers.get("Content-Type", "")
        with open(self.log_path, "a") as log:
            log.write(f"PATCH {self.path} {content_type} {body}\n")
        name = NODE["metadata"]["name"]
        if not self.authenticated():
            return self.answer(*status(401, "Unauthorized", "Unauthorized"))
        if self.path != f"/api/v1/nodes/{name}":
            return self.answer(*status(404, "NotFound", "the server could not find the requested resource"))
        if content_type != "application/json-patch+json":
            return self.answer(*status(
                415, "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"))
        if conflicts:
            conflicts -= 1
            self.changed(dict(NODE, status=dict(NODE.get("status", {}), heartbeat=conflicts)))
        patched = apply(NODE, json.loads(body))
        if patched is None:
            return self.answer(*status(422, "Invalid", "the server rejected our request due to an error in our request", name))
        self.changed(patched)
        self.answer(200, NODE)

    def do_POST(self):
        with open(self.log_path, "a") as log:
            log.write(f"POST {self.path}\n")
        self.answer(*status(404, "NotFound", "the server could not find the requested resource"))

    def changed(self, node):
        """Stores `node` as the Node's next version."""
        global NODE
        node["metadata"] = dict(node["metadata"], resourceVersion=str(int(NODE["metadata"]["resourceVersion"]) + 1))
        NODE = node
        write_whole(self.node_path, json.dumps(NODE))

    def do_GET(self):
        with open(self.log_path, "a") as log:
            log.write(f"GET {self.path} {self.credential()}\n")
        prefix = "/api/v1/nodes/"
        if not self.authenticated():
            code, body = status(401, "Unauthorized", "Unauthorized")
        elif self.path == "/apis/storage.k8s.io/v1/volumeattachments":
            items = json.loads(self.attachments_path.read_text())
            code, body = 200, {"kind": "VolumeAttachmentList", "apiVersion": "storage.k8s.io/v1",
                               "metadata": {"resourceVersion": NODE["metadata"]["resourceVersion"]}, "items": items}
        elif not self.path.startswith(prefix):
            code, body = status(404, "NotFound", "the server could not find the requested resource")
        else:
            name = self.path[len(prefix):]
            if name == "forbidden":
                code, body = status(
                    403, "Forbidden",
                    f'nodes "{name}" is forbidden: User "{SERVICE_ACCOUNT}" cannot get resource "nodes" '
                    'in API group "" at the cluster scope', name)
            elif name == NODE["metadata"]["name"]:
                code, body = 200, NODE
            else:
                code, body = status(404, "NotFound", f'nodes "{name}" not found', name)
        self.answer(code, body)

    def log_message(self, *args):
        pass


def main():
    global NODE, conflicts
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--taints", type=json.loads)
    parser.add_argument("--unschedulable", action="store_true")
    parser.add_argument("--labels", type=json.loads, default={})
    parser.add_argument("--conflicts", type=int, default=0)
    parser.add_argument("--volume-attachments", type=json.loads, default=[])
    parser.add_argument("--ciphers")
    args = parser.parse_args()
    directory = args.directory
    if args.taints is not None:
        NODE = dict(NODE, spec=dict(NODE["spec"], taints=args.taints))
    if args.unschedulable:
        NODE = dict(NODE, spec=dict(NODE["spec"], unschedulable=True))
    NODE = dict(NODE, metadata=dict(NODE["metadata"], labels=dict(NODE["metadata"].get("labels", {}), **args.labels)))
    conflicts = args.conflicts
    pem = certificates(directory)
    (directory / "token").write_text(TOKEN)
    Handler.log_path = directory / "requests.log"
    Handler.node_path = directory / "node.json"
    write_whole(Handler.node_path, json.dumps(NODE))
    Handler.attachments_path = directory / "volumeattachments.json"
    write_whole(Handler.attachments_path, json.dumps(args.volume_attachments))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    context.load_verify_locations(directory / "ca.crt")
    context.verify_mode = ssl.CERT_OPTIONAL
    if args.ciphers:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(args.ciphers)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
