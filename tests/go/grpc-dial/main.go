// A CSI client dialing as the CSI sidecars do (kubernetes-csi/csi-lib-utils
// `connection.Connect`: a current grpc-go's grpc.NewClient with a
// `unix://` target), which sends `localhost` as :authority.
//
// Usage: grpc-dial SOCKET METHOD; the request is empty (GetPluginInfo,
// NodeGetInfo), the response is printed in hex.
package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// rawCodec passes message bytes through, so no generated CSI code is needed.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func main() {
	socket, method := os.Args[1], os.Args[2]
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	request, response := []byte{}, []byte{}
	if err := conn.Invoke(ctx, method, &request, &response, grpc.ForceCodec(rawCodec{})); err != nil {
		fmt.Fprintln(os.Stderr, "invoke:", err)
		os.Exit(1)
	}
	fmt.Println(hex.EncodeToString(response))
}
