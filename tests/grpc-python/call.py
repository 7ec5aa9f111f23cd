"""Calls one CSI method with grpcio (gRPC C-core) over a unix socket.

Usage: call.py SOCKET METHOD [AUTHORITY]. The request is empty
(GetPluginInfo, NodeGetInfo); the response is printed in hex. Without
AUTHORITY the channel has grpcio's default options, so C-core sends its own
:authority for a unix target (since 1.57 the percent-encoded socket path, leading slash dropped);
with it, grpc.default_authority sends that instead (the bare path, as
grpc-java does).
"""

import sys

import grpc


def main() -> None:
    socket, method = sys.argv[1], sys.argv[2]
    options = [("grpc.default_authority", sys.argv[3])] if len(sys.argv) > 3 else []
    with grpc.insecure_channel("unix:" + socket, options=options) as channel:
        # No serializers: the request and the response are bytes.
        print(channel.unary_unary(method)(b"", timeout=10).hex())


if __name__ == "__main__":
    main()
