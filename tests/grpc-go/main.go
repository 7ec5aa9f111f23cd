// A CSI client dialing as kubelet before 1.26 does: grpc-go (Debian
// bookworm's 1.33, from 2020) with the bare socket path as the target and a
// unix dialer, as kubelet's plugin watcher and CSI client call grpc.Dial
// (pkg/kubelet/pluginmanager/operationexecutor and pkg/volume/csi/csi_client.go).
// grpc-go of that age sends the target, the socket path, as :authority.
//
// Usage: kubelet-dial SOCKET METHOD; the request is empty (GetPluginInfo,
// NodeGetInfo), the response is printed in hex.
package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
)

// rawCodec passes message bytes through, so no generated CSI code is needed.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func main() {
	socket, method := os.Args[1], os.Args[2]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, socket, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	request, response := []byte{}, []byte{}
	if err := conn.Invoke(ctx, method, &request, &response, grpc.ForceCodec(rawCodec{})); err != nil {
		fmt.Fprintln(os.Stderr, "invoke:", err)
		os.Exit(1)
	}
	fmt.Println(hex.EncodeToString(response))
}
