// A stand-in for kubernetes-csi's node-driver-registrar v2.14.0, the one
// sidecar the Go module proxy here does not serve: its v2 tags sit on a
// module path without /v2, which the proxy refuses
// (github.com/kubernetes-csi/node-driver-registrar@v2.14.0: "This module
// version is not available"; docs/testing.md, "A real cluster").
//
// It does what the real one does, on kubelet's own registration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1): it asks the driver on
// --csi-address for its name (GetPluginInfo), serves the Registration
// service on <--plugin-registration-path>/<name>-reg.sock, where kubelet's
// plugin watcher finds it, answers GetInfo with a CSIPlugin at
// --kubelet-registration-path, and touches the probe file `registration`
// beside that path; a NotifyRegistrationStatus that says the registration
// failed ends it with status 1. With --mode=kubelet-registration-probe it
// is the exec probe: status 0 when the probe file exists. It takes the
// real one's flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

var (
	csiAddress       = flag.String("csi-address", "/run/csi/socket", "the driver's CSI socket, in this container")
	registrationDir  = flag.String("plugin-registration-path", "/registration", "kubelet's plugin registration directory, in this container")
	kubeletPath      = flag.String("kubelet-registration-path", "", "the driver's CSI socket on the host, as kubelet dials it")
	mode             = flag.String("mode", "registration", "registration, or kubelet-registration-probe")
	timeout          = flag.Duration("timeout", time.Second, "the time GetPluginInfo may take")
	_                = flag.Duration("connection-timeout", 0, "deprecated, no effect")
	_                = flag.String("http-endpoint", "", "accepted; this stand-in serves no diagnostics")
	_                = flag.Int("health-port", 0, "accepted; this stand-in serves no diagnostics")
	_                = flag.Bool("enable-pprof", false, "accepted; no effect")
	showVersion      = flag.Bool("version", false, "print the version")
	supportedVersion = []string{"1.0.0"}
)

type server struct {
	registration.UnimplementedRegistrationServer
	driver, probe string
}

func (s server) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	klog.Infof("Received GetInfo call")
	if f, err := os.Create(s.probe); err != nil {
		klog.ErrorS(err, "Failed to create registration probe file", "registrationProbePath", s.probe)
	} else {
		f.Close()
	}
	return &registration.PluginInfo{Type: registration.CSIPlugin, Name: s.driver, Endpoint: *kubeletPath, SupportedVersions: supportedVersion}, nil
}

func (s server) NotifyRegistrationStatus(_ context.Context, status *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	klog.Infof("Received NotifyRegistrationStatus call: %+v", status)
	if !status.PluginRegistered {
		klog.Errorf("Registration process failed with error: %s, restarting registration container.", status.Error)
		os.Exit(1)
	}
	return &registration.RegistrationStatusResponse{}, nil
}

func main() {
	klog.InitFlags(nil)
	flag.Parse()
	if *showVersion {
		fmt.Println(os.Args[0], "v2.14.0-stand-in")
		return
	}
	if *kubeletPath == "" {
		klog.Fatal("kubelet-registration-path is a required parameter")
	}
	probe := filepath.Join(filepath.Dir(*kubeletPath), "registration")
	if *mode == "kubelet-registration-probe" {
		if _, err := os.Stat(probe); err != nil {
			klog.Fatalf("Kubelet plugin registration hasn't succeeded yet, file=%s doesn't exist.", probe)
		}
		return
	}

	conn, err := grpc.NewClient("unix://"+*csiAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		klog.Fatalf("error connecting to CSI driver: %v", err)
	}
	var info *csi.GetPluginInfoResponse
	for {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		info, err = csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			break
		}
		klog.Warningf("Still connecting to %s: %v", *csiAddress, err)
		time.Sleep(time.Second)
	}
	conn.Close()
	klog.Infof("CSI driver name: %q", info.Name)

	socket := filepath.Join(*registrationDir, info.Name+"-reg.sock")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		klog.Fatalf("failed to remove stale socket %s: %v", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		klog.Fatalf("failed to listen on socket %s: %v", socket, err)
	}
	grpcServer := grpc.NewServer()
	registration.RegisterRegistrationServer(grpcServer, server{driver: info.Name, probe: probe})
	go func() {
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
		<-signals
		grpcServer.Stop()
		os.Remove(socket)
		os.Exit(0)
	}()
	klog.Infof("Registration server started at: %s", socket)
	if err := grpcServer.Serve(listener); err != nil {
		klog.Fatalf("Registration server stopped serving: %v", err)
	}
}
