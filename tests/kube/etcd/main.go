// The etcd server Kubernetes v1.35.4 is built and tested with (its go.mod
// requires go.etcd.io/etcd/server/v3 v3.6.5), as one program: the release's
// own `etcd` is this call (go.etcd.io/etcd/server/v3/etcdmain).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
