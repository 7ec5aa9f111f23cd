// A stand-in for kubernetes-csi's livenessprobe v2.16.0, which the Go
// module proxy here does not serve: its v2 tags sit on a module path
// without /v2, which the proxy refuses
// (github.com/kubernetes-csi/livenessprobe@v2.16.0: "This module version
// is not available"; docs/testing.md, "A real cluster").
//
// It does what the real one does: GET /healthz on --http-endpoint (or
// :--health-port) calls the driver's Probe on --csi-address within
// --probe-timeout and answers 200 "ok" when the driver is ready, 500 with
// the reason when it is not or cannot be asked. It takes the real one's
// flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
)

var (
	csiAddress   = flag.String("csi-address", "/run/csi/socket", "the driver's CSI socket, in this container")
	probeTimeout = flag.Duration("probe-timeout", time.Second, "the time Probe may take")
	httpEndpoint = flag.String("http-endpoint", "", "the address /healthz is served on; overrides --health-port")
	healthPort   = flag.Int("health-port", 9808, "the port /healthz is served on, on every address")
	_            = flag.String("metrics-address", "", "accepted; this stand-in serves no metrics")
	_            = flag.String("metrics-path", "/metrics", "accepted; this stand-in serves no metrics")
	showVersion  = flag.Bool("version", false, "print the version")
)

func main() {
	klog.InitFlags(nil)
	flag.Parse()
	if *showVersion {
		fmt.Println(os.Args[0], "v2.16.0-stand-in")
		return
	}
	conn, err := grpc.NewClient("unix://"+*csiAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		klog.Fatalf("failed to reach the driver at %s: %v", *csiAddress, err)
	}
	identity := csi.NewIdentityClient(conn)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *probeTimeout)
		defer cancel()
		reply, err := identity.Probe(ctx, &csi.ProbeRequest{})
		switch {
		case err != nil:
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "health check failed: %v", err)
			klog.Errorf("health check failed: %v", err)
		case reply.GetReady() != nil && !reply.GetReady().GetValue():
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, "driver responded but is not ready")
			klog.Error("driver responded but is not ready")
		default:
			fmt.Fprint(w, "ok")
			klog.V(5).Info("health check succeeded")
		}
	})
	address := *httpEndpoint
	if address == "" {
		address = ":" + strconv.Itoa(*healthPort)
	}
	klog.Infof("ServeMux listening at %q", address)
	klog.Fatal(http.ListenAndServe(address, nil))
}
